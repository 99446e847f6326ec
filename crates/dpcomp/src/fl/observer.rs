//! What a federated run reports while it runs, to whoever attached an observer
//! (`FederatedRunBuilder::observer`): the library itself writes nothing to stderr. Several may be
//! attached; each hears every call, in the order attached. Without one the run is silent, and
//! its results are the values `FederatedRun::run` returns (and the run folder's files).
//!
//! ```
//! use dpcomp::fl::observer::RoundObserver;
//! use dpcomp::fl::RoundMetrics;
//! /// Keeps each round's test accuracy.
//! struct Accuracies(Vec<f64>);
//! impl RoundObserver for Accuracies {
//!     fn round_finished(&mut self, metrics: &RoundMetrics) {
//!         self.0.push(metrics.accuracy);
//!     }
//! }
//! ```
//!
//! `ProgressBars` is the command line's: one bar over the rounds, on stderr (it needs the
//! `progress` feature, which the binary has).

use super::{FlSummary, RoundMetrics};
use crate::error::{Error, Result};
use crate::progress_bar::Bar;
use std::path::PathBuf;

/// A run as it starts, for `RoundObserver::started`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStart {
    /// T_cl, the rounds the run is set to.
    pub rounds: usize,
    /// The rounds a resumed run had done before (0 for a fresh run); the next is `rounds_done + 1`.
    pub rounds_done: usize,
    /// The summary's metric: `accuracy` (Fashion-MNIST) or `balanced_accuracy` (two classes).
    pub metric: &'static str,
    /// The run folder, when the run has one.
    pub folder: Option<PathBuf>,
}

/// Callbacks of a federated run; every one has an empty default.
pub trait RoundObserver {
    /// The run starts (after a resumed run's earlier rounds were read back).
    fn started(&mut self, _start: &RunStart) {}

    /// Round `round` (from 1) starts.
    fn round_started(&mut self, _round: usize) {}

    /// The round's row of `metrics.jsonl`, after the global model was evaluated.
    fn round_finished(&mut self, _metrics: &RoundMetrics) {}

    /// The run stopped after round `round` with its checkpoint saved, as asked
    /// (`FederatedRunBuilder::stop_after`): no summary.
    fn stopped(&mut self, _round: usize) {}

    /// The run finished (its last round, or early stopping): its summary, as `summary.json`.
    fn finished(&mut self, _summary: &FlSummary) {}
}

/// The bar's layout: the rounds done, the last round's metric and ε, the time so far.
const TEMPLATE: &str = "round [{bar:30}] {pos}/{len} {msg} ({elapsed})";

/// The command line's observer: a bar over the rounds with the last round's metric and ε, on
/// stderr, and a line when a run resumes.
pub struct ProgressBars {
    bar: Bar,
    metric: &'static str,
}

impl ProgressBars {
    /// The bars, or an error naming the `progress` feature when dpcomp was built without it
    /// (there is nothing to draw them with).
    pub fn new() -> Result<ProgressBars> {
        if !cfg!(feature = "progress") {
            return Err(Error::bad_value(
                "progress",
                "progress bars need dpcomp's `progress` feature: add `features = [\"progress\"]` to the dependency, or turn progress off",
            ));
        }
        Ok(ProgressBars {
            bar: Bar::hidden(),
            metric: "accuracy",
        })
    }
}

impl RoundObserver for ProgressBars {
    fn started(&mut self, start: &RunStart) {
        if let (Some(folder), true) = (&start.folder, start.rounds_done > 0) {
            eprintln!(
                "resuming {} after round {}",
                folder.display(),
                start.rounds_done
            );
        }
        self.metric = start.metric;
        // `new` checked the feature, without which no bar is drawn.
        self.bar = Bar::new(true, start.rounds as u64, TEMPLATE, "progress")
            .unwrap_or_else(|_| Bar::hidden());
        self.bar.inc(start.rounds_done as u64);
    }

    fn round_finished(&mut self, m: &RoundMetrics) {
        let value = match self.metric {
            "balanced_accuracy" => m.balanced_accuracy,
            _ => m.accuracy,
        };
        let eps = m.epsilon.map_or(String::new(), |e| format!(" eps {e:.3}"));
        self.bar
            .set_message(format!("{} {value:.4}{eps}", self.metric));
        self.bar.inc(1);
    }

    fn stopped(&mut self, _round: usize) {
        self.bar.finish_and_clear();
    }

    fn finished(&mut self, _summary: &FlSummary) {
        self.bar.finish_and_clear();
    }
}
