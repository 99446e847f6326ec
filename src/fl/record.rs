//! What a federated run records: each round's row of `metrics.jsonl`, the checkpoint after
//! it, the best round so far (the paper's "best over rounds on the test set", and the round
//! chosen on the validation split) and, at the end, `summary.json`.

use super::evaluate::{Evaluated, Metric};
use super::round::{RoundReport, Server};
use super::{checkpoint, FlSettings, FlSummary, RoundMetrics};
use crate::error::{Error, Result};
use std::path::Path;

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
