//! `metrics.jsonl`: one JSON object per epoch (packed as `metrics.jsonl.gz` once the run has
//! finished, `run_log`); `upstream.csv`: the wire bits of every step; `summary.json` at the end
//! of a run.

use crate::error::{Error, Result};
use crate::json_floats::{epsilon_json, nan_if_null};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One epoch's row of `metrics.jsonl`, as `Trainer::history` and `Observer::epoch_finished`
/// see it. Non-finite losses (a diverged epoch) are written as `null` and read back as NaN.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EpochMetrics {
    /// The epoch this row is for, counted from 1.
    pub epoch: usize,
    /// Optimiser steps taken since the run started, this epoch's included.
    pub steps: u64,
    /// Mean cross-entropy (nats) of the epoch's training examples, as the steps saw them
    /// (training mode, before each step's update); with W workers, over all workers' examples.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_loss: f64,
    /// Share of the epoch's training examples predicted correctly during the steps, in [0, 1].
    #[serde(deserialize_with = "nan_if_null")]
    pub train_accuracy: f64,
    /// Mean cross-entropy (nats) on the test split after the epoch, in evaluation mode; NaN
    /// when the test split is empty.
    #[serde(deserialize_with = "nan_if_null")]
    pub test_loss: f64,
    /// Accuracy on the test split after the epoch, in [0, 1]; NaN when the test split is empty.
    #[serde(deserialize_with = "nan_if_null")]
    pub test_accuracy: f64,
    /// Training examples per second of the epoch's steps (the test evaluation not counted).
    #[serde(deserialize_with = "nan_if_null")]
    pub examples_per_second: f64,
    /// Seconds the epoch took, its test evaluation included.
    #[serde(deserialize_with = "nan_if_null")]
    pub epoch_seconds: f64,
    /// Seconds of training since the run started, summed over its epochs (the time between a
    /// stop and a resume not counted).
    #[serde(deserialize_with = "nan_if_null")]
    pub wall_seconds: f64,
    /// ε spent after this epoch (DP runs; "inf" at σ = 0).
    #[serde(default, with = "epsilon_json")]
    pub epsilon: Option<f64>,
    /// Share of the epoch's examples whose gradient norm exceeded C (DP runs).
    #[serde(default)]
    pub clipped_fraction: Option<f64>,
    /// Where the DP noise came from: "seeded" or "secure" (`privacy::noise`; DP runs).
    #[serde(default)]
    pub noise: Option<String>,
    /// Adaptive clipping's radius C_t after this epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_radius: Option<f64>,
    /// Upstream bits this worker sent in this epoch's messages (`upstream.csv` has every step).
    #[serde(default)]
    pub upstream_bits: u64,
    /// Cumulative upstream gigabits (10^9 exact wire bits) since the run started.
    #[serde(default, deserialize_with = "nan_if_null")]
    pub upstream_gigabits: f64,
    /// Cumulative upstream in the paper's unit since the run started: 64 bits per transmitted
    /// element / 8 / 2^30 (`compress::message`; the paper's "Gb").
    #[serde(default, deserialize_with = "nan_if_null")]
    pub upstream_paper_gib: f64,
    /// With W data-parallel workers: what each sent and received, and its time in the
    /// collectives (`upstream_*` above count rank 0's own messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<super::traffic::EpochTraffic>,
    /// Tensor values the epoch's steps read to the host, per step (`dpcomp::host`'s count; the
    /// logging intervals' and the epoch end's reads not included): 0 means the step queued its
    /// work on an accelerator without waiting for it. `None` in runs of older versions, which
    /// did not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_reads_per_step: Option<f64>,
}

/// What a finished run reports (`Trainer::run`'s result, written to `summary.json`): its
/// accuracy, privacy spent and upload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// The task's name (`Task`'s, e.g. "surnames"), or the name given to a model of one's own.
    pub task: String,
    /// Epochs trained, fewer than configured when the run stopped early (`stopped`).
    pub epochs: usize,
    /// Mean test accuracy of the last min(10, epochs) epochs (the paper's figure); NaN (written
    /// as null) when the test split was empty.
    #[serde(deserialize_with = "nan_if_null")]
    pub final_accuracy: f64,
    /// Test accuracy after the last epoch, in [0, 1]; NaN before any epoch or without a test
    /// split.
    #[serde(deserialize_with = "nan_if_null")]
    pub last_test_accuracy: f64,
    /// Seconds of training over the whole run, its earlier sessions included.
    #[serde(deserialize_with = "nan_if_null")]
    pub wall_seconds: f64,
    /// DP runs: (ε, δ) spent, σ, q, how batches were sampled, and why training stopped early.
    /// ε is "inf" when σ = 0 (clipping without noise), null only without privacy.
    #[serde(default, with = "epsilon_json")]
    pub epsilon: Option<f64>,
    /// δ of the (ε, δ) guarantee; `None` without privacy.
    pub delta: Option<f64>,
    /// σ, the noise's standard deviation in units of the clipping radius C (the configured or
    /// calibrated one); `None` when the configuration has none.
    pub noise_multiplier: Option<f64>,
    /// q, the probability that a step samples a given example (1 / steps per epoch); `None`
    /// without privacy.
    pub sample_rate: Option<f64>,
    /// "poisson", or the shuffle approximation with its caveat; `None` without privacy.
    pub sampling: Option<String>,
    /// "seeded" (reproducible; regenerable from config.toml's seed) or "secure" (`--secure-noise`).
    #[serde(default)]
    pub noise: Option<String>,
    /// Why the run stopped before its last epoch (the privacy budget, or `DIVERGED` and where);
    /// `None` when it trained every epoch.
    pub stopped: Option<String>,
    /// The compressor ("identity", "dgc x256", "powersgd r1", ...) and the upstream gigabits
    /// (10^9 exact wire bits) one worker sent over the whole run.
    pub compressor: String,
    /// Upstream gigabits (10^9 exact wire bits) one worker sent over the whole run.
    #[serde(deserialize_with = "nan_if_null")]
    pub upstream_gigabits: f64,
    /// The same upload in the paper's unit (64 bits per element / 8 / 2^30, its "Gb").
    #[serde(default, deserialize_with = "nan_if_null")]
    pub upstream_paper_gib: f64,
    /// W when several data-parallel workers trained the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// With `--local-noise` and W > 1: ε of the aggregate update, whose noise has σ√W (each
    /// worker's message is private on its own at `epsilon`; the aggregate, by the same steps
    /// at the larger multiplier, at this tighter ε).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "epsilon_json"
    )]
    pub aggregate_epsilon: Option<f64>,
    /// LibTorch's intra-op threads in this process when the run ended (`OMP_NUM_THREADS`, or
    /// one per core LibTorch sees); absent in summaries written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

/// Mean of the last `min(10, n)` test accuracies.
pub fn final_accuracy(history: &[EpochMetrics]) -> f64 {
    let tail = &history[history.len().saturating_sub(10)..];
    if tail.is_empty() {
        return f64::NAN;
    }
    tail.iter().map(|m| m.test_accuracy).sum::<f64>() / tail.len() as f64
}

/// Appends one epoch's row to `metrics.jsonl`, whole or not at all (`run_log::append_line`,
/// which unpacks a packed log first).
pub fn append(path: &Path, metrics: &EpochMetrics) -> Result<()> {
    let line = serde_json::to_string(metrics).expect("metrics serialise");
    crate::run_log::append_line(path, &line)
}

/// Every epoch row of `metrics.jsonl`, or of its packed form `metrics.jsonl.gz` (none when
/// neither exists); reads only, so it is safe on a log another process is appending to.
pub fn read(path: &Path) -> Result<Vec<EpochMetrics>> {
    read_first(path, usize::MAX)
}

/// Reads the first `epochs_done` rows and replaces the file with only those (atomically,
/// `run_folder::replace`), dropping what a killed run wrote after its last checkpoint: rows of
/// later epochs, or a last row cut short when the disk filled up, which would otherwise make the
/// run unresumable for good. A packed log is read and written back plain. For `resume`, which
/// holds the run's lock.
pub fn read_and_truncate(path: &Path, epochs_done: usize) -> Result<Vec<EpochMetrics>> {
    let history = read_first(path, epochs_done)?;
    let mut out = String::new();
    for m in &history {
        out.push_str(&serde_json::to_string(m).expect("metrics serialise"));
        out.push('\n');
    }
    crate::run_folder::replace(path, out.as_bytes())?;
    Ok(history)
}

/// The first `epochs` rows of `metrics.jsonl` or `metrics.jsonl.gz` (`run_log::read_rows`;
/// fewer when it has fewer, none when neither exists); what follows them is not read (see
/// `read_and_truncate`).
pub fn read_first(path: &Path, epochs: usize) -> Result<Vec<EpochMetrics>> {
    Ok(crate::run_log::read_rows(path, epochs)?.unwrap_or_default())
}

/// One step's row of `upstream.csv`: step, epoch, exact wire bits, bits in the paper's unit.
pub type UpstreamRow = (u64, usize, u64, u64);

/// Appends `step,epoch,upstream_bits,paper_bits` lines (a header first when the file is new).
pub fn append_upstream(path: &Path, rows: &[UpstreamRow]) -> Result<()> {
    let lines: Vec<String> = rows
        .iter()
        .map(|(step, epoch, bits, paper)| format!("{step},{epoch},{bits},{paper}"))
        .collect();
    crate::run_folder::append_csv(path, "step,epoch,upstream_bits,paper_bits", &lines)
}

/// Keeps the header and the rows of steps up to `steps_done` of `upstream.csv` (a killed run may
/// have written rows after its last checkpoint); returns how many step rows remain (0 when the file does not exist).
pub fn truncate_upstream(path: &Path, steps_done: u64) -> Result<u64> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut out = String::new();
    let mut rows = 0;
    for (i, line) in text.lines().enumerate() {
        let step = line.split(',').next().and_then(|s| s.parse::<u64>().ok());
        let keep = i == 0 || step.is_some_and(|step| step <= steps_done);
        if keep {
            out.push_str(line);
            out.push('\n');
            rows += u64::from(i > 0);
        }
    }
    crate::run_folder::replace(path, out.as_bytes())?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A diverged epoch (NaN losses) is written as null and read back as NaN.
    #[test]
    fn nan_losses_survive_the_log() {
        let m = EpochMetrics {
            epoch: 3,
            steps: 30,
            train_loss: f64::NAN,
            train_accuracy: 0.1,
            test_loss: f64::NAN,
            test_accuracy: 0.1,
            examples_per_second: 10.0,
            epoch_seconds: 1.0,
            wall_seconds: 3.0,
            epsilon: Some(2.0),
            clip_radius: None,
            clipped_fraction: Some(1.0),
            noise: Some("seeded".into()),
            upstream_bits: 7,
            upstream_gigabits: 1e-8,
            upstream_paper_gib: 1e-8,
            workers: None,
            host_reads_per_step: Some(0.0),
        };
        let line = serde_json::to_string(&m).unwrap();
        assert!(line.contains("\"train_loss\":null"), "{line}");
        let back: EpochMetrics = serde_json::from_str(&line).unwrap();
        assert!(back.train_loss.is_nan() && back.test_loss.is_nan());
        assert_eq!(back.test_accuracy, 0.1);
    }
}
