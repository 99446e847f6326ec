//! What W workers' exchanges cost: a row per worker and step (`traffic.csv`), every rank's rows
//! brought together each epoch, and the epoch's totals per rank in `metrics.jsonl`.

use super::exchange::StepTraffic;
use crate::comm::{Communicator, Traffic};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One worker's cost of one step, a row of `traffic.csv`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrafficRow {
    /// The run's step count after this step (1-based, since the run started).
    pub step: u64,
    /// The worker's rank.
    pub rank: usize,
    /// Seconds of the step outside the exchange (forward, backward, clipping, noise, optimiser).
    pub compute_seconds: f64,
    /// Bytes through the transport and the seconds of the exchange's phases.
    pub cost: StepTraffic,
}

impl TrafficRow {
    const FIELDS: usize = 8;

    fn to_values(self) -> [f64; Self::FIELDS] {
        [
            self.step as f64,
            self.rank as f64,
            self.cost.traffic.sent as f64,
            self.cost.traffic.received as f64,
            self.compute_seconds,
            self.cost.encode_seconds,
            self.cost.comm_seconds,
            self.cost.decode_seconds,
        ]
    }

    fn from_values(v: &[f64]) -> TrafficRow {
        TrafficRow {
            step: v[0] as u64,
            rank: v[1] as usize,
            compute_seconds: v[4],
            cost: StepTraffic {
                traffic: Traffic {
                    sent: v[2] as u64,
                    received: v[3] as u64,
                },
                encode_seconds: v[5],
                comm_seconds: v[6],
                decode_seconds: v[7],
            },
        }
    }
}

/// Every rank's rows of an epoch, on every rank, in rank order (byte counts are exact in f64
/// below 2^53).
pub fn gather_traffic(comm: &mut dyn Communicator, mine: &[TrafficRow]) -> Result<Vec<TrafficRow>> {
    let bytes: Vec<u8> = mine
        .iter()
        .flat_map(|r| r.to_values())
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let all = comm.all_gather(&bytes)?;
    let mut rows = Vec::new();
    for bytes in all {
        let values: Vec<f64> = bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        rows.extend(
            values
                .chunks_exact(TrafficRow::FIELDS)
                .map(TrafficRow::from_values),
        );
    }
    Ok(rows)
}

/// Appends rows to `traffic.csv` (a header first when the file is new); `metrics::truncate_upstream`
/// cuts it back to a checkpoint's steps, its first column being the step too.
pub(crate) fn append_traffic(path: &Path, rows: &[TrafficRow]) -> Result<()> {
    let lines: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{},{},{},{},{:.6},{:.6},{:.6},{:.6}",
                r.step,
                r.rank,
                r.cost.traffic.sent,
                r.cost.traffic.received,
                r.compute_seconds,
                r.cost.encode_seconds,
                r.cost.comm_seconds,
                r.cost.decode_seconds
            )
        })
        .collect();
    crate::run_folder::append_csv(
        path,
        "step,rank,sent_bytes,received_bytes,compute_seconds,encode_seconds,comm_seconds,decode_seconds",
        &lines,
    )
}

/// An epoch's exchange over all workers, in `metrics.jsonl` (`traffic.csv` has every step).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EpochTraffic {
    /// W, the number of workers (the length of every vector below).
    pub workers: usize,
    /// Bytes each rank handed to the transport in the epoch's exchanges, in rank order.
    pub sent_bytes: Vec<u64>,
    /// Bytes each rank received from it.
    pub received_bytes: Vec<u64>,
    /// Seconds each rank spent in the collectives of the exchanges.
    pub comm_seconds: Vec<f64>,
    /// Seconds each rank spent outside them (computing, encoding, decoding).
    pub compute_seconds: Vec<f64>,
    /// Bytes (sent + received, all ranks) of the other collectives: the checks at the start,
    /// the epoch's totals, the checkpoint's compressor states.
    pub control_bytes: u64,
}

impl EpochTraffic {
    /// Totals per rank of an epoch's rows.
    pub(crate) fn of(workers: usize, rows: &[TrafficRow], control_bytes: u64) -> EpochTraffic {
        let mut t = EpochTraffic {
            workers,
            sent_bytes: vec![0; workers],
            received_bytes: vec![0; workers],
            comm_seconds: vec![0.0; workers],
            compute_seconds: vec![0.0; workers],
            control_bytes,
        };
        for r in rows.iter().filter(|r| r.rank < workers) {
            t.sent_bytes[r.rank] += r.cost.traffic.sent;
            t.received_bytes[r.rank] += r.cost.traffic.received;
            t.comm_seconds[r.rank] += r.cost.comm_seconds;
            t.compute_seconds[r.rank] +=
                r.compute_seconds + r.cost.encode_seconds + r.cost.decode_seconds;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_rows_round_trip_through_values() {
        let row = TrafficRow {
            step: 12,
            rank: 3,
            compute_seconds: 0.25,
            cost: StepTraffic {
                traffic: Traffic {
                    sent: 123_456_789,
                    received: 987,
                },
                encode_seconds: 0.5,
                comm_seconds: 0.125,
                decode_seconds: 0.0625,
            },
        };
        assert_eq!(TrafficRow::from_values(&row.to_values()), row);
    }
}
