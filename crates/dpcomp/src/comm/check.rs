//! `dpcomp check-comm`: every collective once with inputs whose results are known exactly, on
//! whatever transport the process has (one process, W threads, or MPI across machines), with its
//! time and the bytes it moved: what to run on a new hostfile before a long job.

use super::{Communicator, Traffic};
use crate::error::Result;
use crate::host;
use std::time::Instant;
use tch::{Device, Tensor};

/// One collective's check on this rank.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckRow {
    /// `all_reduce_sum`, `all_gather`, `broadcast` or `barrier`; `all_reduce_tensor` or
    /// `all_gather_tensor` (`check_tensor_collectives`).
    pub collective: &'static str,
    /// Wall-clock time of the collective on this rank.
    pub seconds: f64,
    /// Bytes this rank handed to the transport (checked against the expected count).
    pub sent_bytes: u64,
    /// Bytes this rank received from the transport (checked against the expected count).
    pub received_bytes: u64,
}

/// Rank r's value at position i of the all-reduce check: small integers, so that every sum is
/// exact in f32 whatever order a transport adds in.
fn reduce_value(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (i % 7)) as f32
}

/// Rank r's bytes in the all-gather check: 3 (r + 1) + `extra` bytes, so lengths differ.
fn gather_bytes(rank: usize, extra: usize) -> Vec<u8> {
    (0..3 * (rank + 1) + extra)
        .map(|j| ((rank * 31 + j) % 251) as u8)
        .collect()
}

/// Runs all-reduce (`elements` values), all-gather (lengths differing by rank), broadcast (from
/// the last rank) and barrier, checks every result and every byte count, and returns one row per
/// collective. An error names the collective and what differed.
pub fn check_collectives(comm: &mut dyn Communicator, elements: usize) -> Result<Vec<CheckRow>> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut rows = Vec::new();
    let _ = comm.take_traffic();
    let mut row =
        |comm: &mut dyn Communicator, collective: &'static str, started: Instant, want: Traffic| {
            let got = comm.take_traffic();
            // With one rank nothing crosses.
            let want = if comm.size() == 1 {
                Traffic::default()
            } else {
                want
            };
            if got != want {
                return Err(comm.error(format!("{collective} moved {got:?}, expected {want:?}")));
            }
            rows.push(CheckRow {
                collective,
                seconds: started.elapsed().as_secs_f64(),
                sent_bytes: got.sent,
                received_bytes: got.received,
            });
            Ok(())
        };

    let started = Instant::now();
    let mut values: Vec<f32> = (0..elements).map(|i| reduce_value(rank, i)).collect();
    comm.all_reduce_sum(&mut values)?;
    for (i, v) in values.iter().enumerate() {
        let want: f32 = (0..size).map(|r| reduce_value(r, i)).sum();
        if *v != want {
            return Err(comm.error(format!(
                "all_reduce_sum: element {i} is {v}, expected {want}"
            )));
        }
    }
    let bytes = 4 * elements as u64;
    row(
        comm,
        "all_reduce_sum",
        started,
        Traffic {
            sent: bytes,
            received: bytes,
        },
    )?;

    let started = Instant::now();
    let extra = elements % 1000;
    let gathered = comm.all_gather(&gather_bytes(rank, extra))?;
    if gathered.len() != size {
        return Err(comm.error(format!("all_gather returned {} buffers", gathered.len())));
    }
    for (r, got) in gathered.iter().enumerate() {
        if *got != gather_bytes(r, extra) {
            return Err(comm.error(format!(
                "all_gather: rank {r}'s {} bytes arrived wrong",
                got.len()
            )));
        }
    }
    let mine = gather_bytes(rank, extra).len() as u64;
    let all: u64 = (0..size).map(|r| gather_bytes(r, extra).len() as u64).sum();
    row(
        comm,
        "all_gather",
        started,
        Traffic {
            sent: mine,
            received: all - mine,
        },
    )?;

    let started = Instant::now();
    let root = size - 1;
    let message = format!("from rank {root} of {size}").into_bytes();
    let mut bytes = if rank == root {
        message.clone()
    } else {
        Vec::new()
    };
    comm.broadcast(root, &mut bytes)?;
    if bytes != message {
        return Err(comm.error(format!("broadcast: rank {root}'s bytes arrived wrong")));
    }
    let length = message.len() as u64;
    let want = if rank == root {
        Traffic {
            sent: length,
            received: 0,
        }
    } else {
        Traffic {
            sent: 0,
            received: length,
        }
    };
    row(comm, "broadcast", started, want)?;

    let started = Instant::now();
    comm.barrier()?;
    row(comm, "barrier", started, Traffic::default())?;
    Ok(rows)
}

/// Rank r's `n` bytes in the tensor all-gather check (one length on every rank, as the
/// collective wants).
fn tensor_gather_bytes(rank: usize, n: usize) -> Vec<u8> {
    (0..n).map(|j| ((rank * 31 + j) % 251) as u8).collect()
}

/// Runs the tensor collectives on `device` (`all_reduce_tensor` of `elements` f32 values, then
/// `all_gather_tensor` of 3 + `elements` % 1000 bytes a rank), checks every result (read back to
/// the host after the collective, outside its time) and every byte count, and returns one row
/// per collective. With a transport that moves tensors (c10d on Gloo or NCCL) they stay on
/// `device`; others pass them through host memory. An error names the collective and what
/// differed.
pub fn check_tensor_collectives(
    comm: &mut dyn Communicator,
    elements: usize,
    device: Device,
) -> Result<Vec<CheckRow>> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut rows = Vec::new();
    let _ = comm.take_traffic();
    let crossed = |bytes: u64, received: u64| {
        if size == 1 {
            Traffic::default()
        } else {
            Traffic {
                sent: bytes,
                received,
            }
        }
    };

    let mine: Vec<f32> = (0..elements).map(|i| reduce_value(rank, i)).collect();
    let mut flat = host::upload(&Tensor::from_slice(&mine), device);
    host::wait_for(device);
    let started = Instant::now();
    comm.all_reduce_tensor(&mut flat)?;
    host::wait_for(device);
    let seconds = started.elapsed().as_secs_f64();
    let got = comm.take_traffic();
    if flat.device() != device {
        return Err(comm.error(format!(
            "all_reduce_tensor: the sum is on {:?}, expected {device:?}",
            flat.device()
        )));
    }
    let values = host::to_vec_f32(&flat.to_device(Device::Cpu))
        .map_err(|e| comm.error(format!("all_reduce_tensor: reading the sum back: {e}")))?;
    for (i, v) in values.iter().enumerate() {
        let want: f32 = (0..size).map(|r| reduce_value(r, i)).sum();
        if *v != want {
            return Err(comm.error(format!(
                "all_reduce_tensor on {device:?}: element {i} is {v}, expected {want}"
            )));
        }
    }
    let bytes = 4 * elements as u64;
    let want = crossed(bytes, bytes);
    if got != want {
        return Err(comm.error(format!(
            "all_reduce_tensor moved {got:?}, expected {want:?}"
        )));
    }
    rows.push(CheckRow {
        collective: "all_reduce_tensor",
        seconds,
        sent_bytes: got.sent,
        received_bytes: got.received,
    });

    let n = 3 + elements % 1000;
    let message = host::upload(&Tensor::from_slice(&tensor_gather_bytes(rank, n)), device);
    host::wait_for(device);
    let started = Instant::now();
    let gathered = comm.all_gather_tensor(&message)?;
    host::wait_for(device);
    let seconds = started.elapsed().as_secs_f64();
    let got = comm.take_traffic();
    if gathered.len() != size {
        return Err(comm.error(format!(
            "all_gather_tensor returned {} tensors",
            gathered.len()
        )));
    }
    for (r, t) in gathered.iter().enumerate() {
        if t.device() != device {
            return Err(comm.error(format!(
                "all_gather_tensor: rank {r}'s bytes are on {:?}, expected {device:?}",
                t.device()
            )));
        }
        if host::to_bytes(&t.to_device(Device::Cpu).contiguous()) != tensor_gather_bytes(r, n) {
            return Err(comm.error(format!(
                "all_gather_tensor on {device:?}: rank {r}'s {n} bytes arrived wrong"
            )));
        }
    }
    let want = crossed(n as u64, (size as u64 - 1) * n as u64);
    if got != want {
        return Err(comm.error(format!(
            "all_gather_tensor moved {got:?}, expected {want:?}"
        )));
    }
    rows.push(CheckRow {
        collective: "all_gather_tensor",
        seconds,
        sent_bytes: got.sent,
        received_bytes: got.received,
    });
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{SingleProcess, ThreadGroup};

    #[test]
    fn every_collective_checks_out_on_one_process_and_on_threads() {
        let rows = check_collectives(&mut SingleProcess, 1000).unwrap();
        assert_eq!(rows.len(), 4);
        for size in [2, 4] {
            let handles: Vec<_> = ThreadGroup::ranks(size)
                .into_iter()
                .map(|mut comm| std::thread::spawn(move || check_collectives(&mut comm, 10_001)))
                .collect();
            for (rank, handle) in handles.into_iter().enumerate() {
                let rows = handle.join().unwrap().unwrap();
                assert_eq!(rows[0].sent_bytes, 40_004, "rank {rank}");
                assert_eq!(rows[1].sent_bytes, 3 * (rank as u64 + 1) + 1, "rank {rank}");
            }
        }
    }

    #[test]
    fn the_tensor_collectives_check_out_on_one_process_and_on_threads() {
        let rows = check_tensor_collectives(&mut SingleProcess, 1000, Device::Cpu).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.collective).collect();
        assert_eq!(names, ["all_reduce_tensor", "all_gather_tensor"]);
        assert_eq!(rows[0].sent_bytes, 0);
        let handles: Vec<_> = ThreadGroup::ranks(3)
            .into_iter()
            .map(|mut comm| {
                std::thread::spawn(move || check_tensor_collectives(&mut comm, 2001, Device::Cpu))
            })
            .collect();
        for (rank, handle) in handles.into_iter().enumerate() {
            let rows = handle.join().unwrap().unwrap();
            assert_eq!(rows[0].sent_bytes, 8004, "rank {rank}");
            // 3 + 2001 % 1000 = 4 bytes from each rank, 8 from the two others.
            assert_eq!(
                (rows[1].sent_bytes, rows[1].received_bytes),
                (4, 8),
                "rank {rank}"
            );
        }
    }
}
