//! What a federated run records after each round of Algorithm 1 (Kerkouche et al. 2021): its
//! row of `metrics.jsonl` (`RoundMetrics`), the checkpoint after it (the server's state of
//! Algorithm 3 included, `checkpoint`), the best round so far (the paper's "best over rounds on
//! the test set", and the round chosen on the validation split) and, at the end, `summary.json`
//! (`FlSummary`) with the columns of the paper's tables (the best metric, its round, the cost
//! r · n · 32 · Round · C).

use super::evaluate::{Evaluated, Metric};
use super::round::{RoundReport, Server};
use super::{checkpoint, FlSettings};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One round's record in `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoundMetrics {
    /// The round, from 1.
    pub round: usize,
    /// The clients sampled this round (canaries not counted).
    pub clients: usize,
    /// Mean cross-entropy of the global model on the test examples after the round.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub test_loss: f64,
    /// Test accuracy after the round, in [0, 1].
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub accuracy: f64,
    /// Test balanced accuracy (the mean of the per-class recalls) after the round.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub balanced_accuracy: f64,
    /// Test AUROC after the round (two-class datasets only).
    pub auroc: Option<f64>,
    /// Bits the clients sent this round.
    pub upstream_bits: u64,
    /// Bits the clients sent since the start, this round included.
    pub upstream_bits_total: u64,
    /// ε after this round (DP runs; "inf" at σ 0, never serde_json's null).
    #[serde(default, with = "crate::json_floats::epsilon_json")]
    pub epsilon: Option<f64>,
    /// The metric on the validation split (runs with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_metric: Option<f64>,
    /// DP runs: the share of this round's clients whose message was longer than S.
    pub clipped_fraction: Option<f64>,
    /// Mean norm of the clients' messages before clipping: non-finite (written as null, read back
    /// as NaN) when a client's update overflowed, which private runs clip to zero and go on.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub message_norm: f64,
    /// Seconds of the clients' part of the round: local training, then each message encoded,
    /// sent as bytes and clipped.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub client_seconds: f64,
    /// Aggregation, noise and reconstruction.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub server_seconds: f64,
    /// Seconds since the run started, up to this round's end (a resumed run's earlier starts
    /// included).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub wall_seconds: f64,
}

/// A federated run's outcome, saved as its folder's `summary.json`: the columns of the paper's
/// tables at the best round, ε, and the run's timings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlSummary {
    /// The dataset's name (`FlDataset::name`), or `own` for a model of one's own
    /// (`FederatedRunBuilder::model`).
    pub dataset: String,
    /// The scheme's label (`FlSettings::scheme_label`): "FL-CS", "FL-STD dgc x16", ...
    pub scheme: String,
    /// Actual r = m / n.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub ratio: f64,
    /// n, the model's parameter count.
    pub parameters: i64,
    /// m, the values of a message: the sketch's length (n for FL-STD), or the elements of a
    /// compressor's last message.
    pub message_length: i64,
    /// P, the sketch's DCT chunks (FL-FREQ and FL-CS only).
    pub chunks: Option<i64>,
    /// N.
    pub clients: usize,
    /// C.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub fraction: f64,
    /// The rounds run: T_cl, or fewer when stopped early.
    pub rounds_run: usize,
    /// Whether early stopping (`patience`) ended the run before its last round.
    pub stopped_early: bool,
    /// Accuracy (Fashion-MNIST) or balanced accuracy (two classes): the paper's tables' metric.
    pub metric: String,
    /// The highest test value of `metric` over the rounds (the paper's "best" figure).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub best: f64,
    /// The first round that reached `best`.
    pub best_round: usize,
    /// Test accuracy at `best_round`.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub accuracy_at_best: f64,
    /// Test balanced accuracy at `best_round`.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub balanced_accuracy_at_best: f64,
    /// Test AUROC at `best_round` (two-class datasets only).
    pub auroc_at_best: Option<f64>,
    /// The paper's cost r n 32 Round C, in bits, at the best round.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub cost_bits: f64,
    /// What the clients actually sent up to the best round.
    pub upstream_bits_at_best: u64,
    /// S, the clip radius of the clients' messages (DP runs).
    pub clip: Option<f64>,
    /// σ (DP runs).
    pub noise_multiplier: Option<f64>,
    /// ε after the last round run ("inf" at σ 0; null without DP).
    #[serde(default, with = "crate::json_floats::epsilon_json")]
    pub epsilon: Option<f64>,
    /// ε at the best round (the paper reports ε where it stopped).
    #[serde(default, with = "crate::json_floats::epsilon_json")]
    pub epsilon_at_best: Option<f64>,
    /// With a validation split: the round whose validation metric was highest, the test metric
    /// there, and ε at that round (an honest alternative to `best`, which picks on the test set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_round: Option<usize>,
    /// The test value of `metric` at `validation_round`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_at_validation_round: Option<f64>,
    /// ε at `validation_round` (DP runs).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::json_floats::epsilon_json"
    )]
    pub epsilon_at_validation_round: Option<f64>,
    /// δ of the reported ε (DP runs).
    pub delta: Option<f64>,
    /// Mean seconds per round of the server's part (`RoundMetrics::server_seconds`).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub mean_server_seconds: f64,
    /// Mean seconds per round of the clients' part (`RoundMetrics::client_seconds`).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub mean_client_seconds: f64,
    /// Seconds the run took (a resumed run's earlier starts included).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub wall_seconds: f64,
}

/// The rounds run so far (a resumed run's earlier ones included) and what the summary takes
/// from them.
pub(crate) struct History {
    /// Every round's row, in order.
    pub rows: Vec<RoundMetrics>,
    /// The metric the best round is taken on.
    metric: Metric,
    /// (highest test metric, its first round).
    best: Option<(f64, usize)>,
    /// (highest validation metric, its first round): the round chosen on validation.
    chosen: Option<(f64, usize)>,
}

impl History {
    /// The history of `rows` (a resumed run's, read back from `metrics.jsonl`).
    pub fn new(metric: Metric, rows: Vec<RoundMetrics>) -> History {
        let mut history = History {
            rows: Vec::with_capacity(rows.len()),
            metric,
            best: None,
            chosen: None,
        };
        for row in rows {
            history.push(row);
        }
        history
    }

    /// Records a round's row.
    pub fn push(&mut self, row: RoundMetrics) {
        let value = self.metric.pick(row.accuracy, row.balanced_accuracy);
        if self.best.is_none_or(|(b, _)| value > b) {
            self.best = Some((value, row.round));
        }
        if let Some(v) = row.validation_metric {
            if self.chosen.is_none_or(|(b, _)| v > b) {
                self.chosen = Some((v, row.round));
            }
        }
        self.rows.push(row);
    }

    /// Bits sent since the start, up to the last round recorded.
    pub fn upstream_bits_total(&self) -> u64 {
        self.rows.last().map_or(0, |r| r.upstream_bits_total)
    }

    /// Seconds of the earlier starts of a resumed run.
    pub fn wall_seconds(&self) -> f64 {
        self.rows.last().map_or(0.0, |r| r.wall_seconds)
    }

    /// Early stopping after round `round`: `patience` rounds (0: never) without a better metric,
    /// on the validation split when there is one, else on the test set.
    pub fn out_of_patience(&self, patience: usize, round: usize) -> bool {
        let best_round = self.chosen.or(self.best).map_or(0, |(_, r)| r);
        patience > 0 && round - best_round >= patience
    }

    /// The run's summary: the paper's columns at the best round, ε, and the timings.
    pub fn summary(
        &self,
        settings: &FlSettings,
        server: &Server,
        stopped_early: bool,
        wall_seconds: f64,
    ) -> Result<FlSummary> {
        let rows = &self.rows;
        let (best_value, best_round) = self.best.unwrap_or((f64::NAN, 0));
        let at_best = &rows[best_round.max(1) - 1];
        let at = |round: usize| &rows[round - 1];
        let mean =
            |f: &dyn Fn(&RoundMetrics) -> f64| rows.iter().map(f).sum::<f64>() / rows.len() as f64;
        let m = server.message_length;
        Ok(FlSummary {
            dataset: settings.dataset.name().to_string(),
            scheme: settings.scheme_label()?,
            ratio: m as f64 / server.parameters as f64,
            parameters: server.parameters,
            message_length: m,
            chunks: server.chunks,
            clients: settings.clients,
            fraction: settings.fraction,
            rounds_run: rows.len(),
            stopped_early,
            metric: self.metric.name().to_string(),
            best: best_value,
            best_round,
            accuracy_at_best: at_best.accuracy,
            balanced_accuracy_at_best: at_best.balanced_accuracy,
            auroc_at_best: at_best.auroc,
            cost_bits: m as f64 * 32.0 * best_round as f64 * settings.fraction,
            upstream_bits_at_best: at_best.upstream_bits_total,
            clip: settings.privacy.map(|p| p.clip),
            noise_multiplier: settings.privacy.map(|p| p.noise_multiplier),
            epsilon: rows.last().and_then(|r| r.epsilon),
            epsilon_at_best: at_best.epsilon,
            validation_round: self.chosen.map(|(_, r)| r),
            test_at_validation_round: self
                .chosen
                .map(|(_, r)| self.metric.pick(at(r).accuracy, at(r).balanced_accuracy)),
            epsilon_at_validation_round: self.chosen.and_then(|(_, r)| at(r).epsilon),
            delta: settings.privacy.map(|p| p.delta),
            mean_server_seconds: mean(&|r| r.server_seconds),
            mean_client_seconds: mean(&|r| r.client_seconds),
            wall_seconds,
        })
    }
}

/// Round `round`'s row: what its clients sent (`report`), the evaluation after it, ε after it,
/// and the bits sent before it (`upstream_before`).
pub(crate) fn round_row(
    round: usize,
    report: &RoundReport,
    evaluated: &Evaluated,
    epsilon: Option<f64>,
    upstream_before: u64,
    wall_seconds: f64,
) -> RoundMetrics {
    let test = &evaluated.test;
    RoundMetrics {
        round,
        clients: report.clients,
        test_loss: test.loss,
        accuracy: test.accuracy,
        balanced_accuracy: test.balanced_accuracy,
        auroc: test.auroc,
        upstream_bits: report.bits,
        upstream_bits_total: upstream_before + report.bits,
        epsilon,
        validation_metric: evaluated.validation_metric,
        clipped_fraction: report
            .clipped
            .map(|clipped| clipped as f64 / report.clients.max(1) as f64),
        message_norm: report.message_norm,
        client_seconds: report.client_seconds,
        server_seconds: report.server_seconds,
        wall_seconds,
    }
}

/// Appends `row` to the folder's `metrics.jsonl` (runs with one); then a diverged model (a
/// non-finite test loss) stops the run with an error saying where, since its results would be
/// a NaN model's.
pub(crate) fn log_round(out: Option<&Path>, row: &RoundMetrics) -> Result<()> {
    if let Some(dir) = out {
        super::append_row(&dir.join("metrics.jsonl"), row)?;
    }
    if !row.test_loss.is_finite() {
        return Err(Error::bad_value(
            "fl",
            format!(
                "training diverged: non-finite test loss after round {} (mean message norm {:.4}); lower `local.learning_rate` or `server_learning_rate`",
                row.round, row.message_norm
            ),
        ));
    }
    Ok(())
}

/// Saves the server's state after round `round` into the folder's checkpoint (`checkpoint`).
pub(crate) fn save_checkpoint(dir: &Path, round: usize, server: &Server) -> Result<()> {
    let state = checkpoint::FlState {
        rounds_done: round,
        message_length: server.message_length,
        accountant: server.engine.as_ref().map(|e| e.accountant().clone()),
    };
    checkpoint::save(
        dir,
        &state,
        &server.w,
        server.momentum.as_ref(),
        &server.messages.state(),
    )
}

/// Writes a finished run's `summary.json` and removes its checkpoint (the summary is what
/// stays).
pub(crate) fn write_summary(dir: &Path, summary: &FlSummary) -> Result<()> {
    let text = serde_json::to_string_pretty(summary).expect("summary serialises");
    std::fs::write(dir.join("summary.json"), text)
        .map_err(|e| Error::io(dir.join("summary.json"), e))?;
    crate::train::checkpoint::remove(dir);
    Ok(())
}
