//! What a training run reports while it runs, to whoever installed an observer: the library
//! itself writes nothing to stderr. `Trainer::observe(..)` installs one (several may be
//! installed; each hears every call, in the order installed); without one the run is silent and its results are the values `Trainer::run` returns and `history` holds.
//!
//! ```
//! use dpcomp::train::metrics::EpochMetrics;
//! use dpcomp::train::observer::Observer;
//! /// Keeps each epoch's test accuracy.
//! struct Accuracies(Vec<f64>);
//! impl Observer for Accuracies {
//!     fn epoch_finished(&mut self, metrics: &EpochMetrics) {
//!         self.0.push(metrics.test_accuracy);
//!     }
//! }
//! ```
//!
//! `ProgressBars` is the command line's: a bar per epoch and a line per epoch on stderr (with the
//! `progress` feature, which the binary has).

use super::metrics::EpochMetrics;
use super::Trainer;
use crate::error::Result;
#[cfg(feature = "progress")]
use indicatif::{ProgressBar, ProgressStyle};

/// The running totals of an epoch, read from the device every `Observer::interval` steps
/// (reading them synchronises the device, so only then).
#[derive(Debug, Clone, PartialEq)]
pub struct LiveProgress {
    /// 0-based epoch and step within it.
    pub epoch: usize,
    /// The step just finished, 0-based within the epoch.
    pub step: usize,
    /// Mean training cross-entropy (nats) of this worker's examples of the epoch so far.
    pub loss: f64,
    /// Share of those examples predicted correctly, in [0, 1].
    pub accuracy: f64,
    /// ε so far: live with the RDP accountant, as of the epoch's start with the PLD (whose
    /// FFTs run once per epoch); `None` without privacy.
    pub epsilon: Option<f64>,
    /// True when `epsilon` is up to this step (RDP), false when it is the epoch start's (PLD).
    pub epsilon_is_live: bool,
    /// Upstream traffic of the whole run so far, in 10^9 bits.
    pub upstream_gigabits: f64,
    /// This worker's training examples per second since the epoch started.
    pub examples_per_second: f64,
}

/// Callbacks of a training run; every one has an empty default.
pub trait Observer {
    /// Epoch `epoch` (0-based) of `epochs` starts, with `steps` steps.
    fn epoch_started(&mut self, _epoch: usize, _epochs: usize, _steps: usize) {}

    /// A step of the epoch finished (no tensor value is read for it).
    fn step_finished(&mut self, _epoch: usize, _step: usize) {}

    /// Every how many steps `progress` is called; 0 (the default): never, so no values are
    /// read from the device during the epoch.
    fn interval(&self) -> usize {
        0
    }

    /// The epoch's running totals, every `interval()` steps.
    fn progress(&mut self, _live: &LiveProgress) {}

    /// The epoch's row of `metrics.jsonl`, after it is evaluated.
    fn epoch_finished(&mut self, _metrics: &EpochMetrics) {}

    /// The run stopped before its last epoch (the privacy budget, divergence): why.
    fn stopped(&mut self, _reason: &str) {}

    /// The trainer as it stands between epochs: at the run's start (after the epochs a resumed
    /// run had done) and after each epoch's row, before its checkpoint. A measurement of one's
    /// own reads the model, the data and the compressor state here
    /// (`analysis::probe::GradientErrorProbe` is one); an error stops the run.
    fn between_epochs(&mut self, _trainer: &Trainer) -> Result<()> {
        Ok(())
    }

    /// The configuration setting this observer carries out, if any (the gradient-error probe:
    /// `"analysis.grad_error_epochs"`). A run whose configuration sets one refuses to start
    /// without an observer that carries it out, rather than ignore it.
    fn carries_out(&self) -> Option<&'static str> {
        None
    }
}

/// The command line's observer: an indicatif bar per epoch with live loss, accuracy, ε and
/// throughput every 50 steps, then one line per epoch, on stderr.
#[cfg(feature = "progress")]
pub struct ProgressBars {
    bar: ProgressBar,
    epochs: usize,
}

#[cfg(feature = "progress")]
impl Default for ProgressBars {
    fn default() -> Self {
        ProgressBars {
            bar: ProgressBar::hidden(),
            epochs: 0,
        }
    }
}

#[cfg(feature = "progress")]
impl Observer for ProgressBars {
    fn epoch_started(&mut self, epoch: usize, epochs: usize, steps: usize) {
        self.epochs = epochs;
        self.bar = ProgressBar::new(steps as u64);
        self.bar.set_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        self.bar.set_prefix(format!("{}/{epochs}", epoch + 1));
    }

    fn step_finished(&mut self, _epoch: usize, _step: usize) {
        self.bar.inc(1);
    }

    fn interval(&self) -> usize {
        50
    }

    fn progress(&mut self, live: &LiveProgress) {
        let eps = match (live.epsilon, live.epsilon_is_live) {
            (Some(e), true) => format!(" eps {e:.2}"),
            (Some(e), false) => format!(" eps {e:.2} (epoch start)"),
            _ => String::new(),
        };
        self.bar.set_message(format!(
            "loss {:.4} acc {:.2}%{eps} up {:.3} Gb {:.0} ex/s",
            live.loss,
            100.0 * live.accuracy,
            live.upstream_gigabits,
            live.examples_per_second
        ));
    }

    fn epoch_finished(&mut self, m: &EpochMetrics) {
        self.bar.finish_and_clear();
        let eps = m
            .epsilon
            .map_or(String::new(), |e| format!("  epsilon {e:.3}"));
        eprintln!(
            "epoch {}/{}  train loss {:.4} acc {:.2}%  test loss {:.4} acc {:.2}%{eps}  upstream {:.4} Gb ({:.4} in the paper's unit)  {:.0} ex/s  {:.1}s",
            m.epoch,
            self.epochs,
            m.train_loss,
            100.0 * m.train_accuracy,
            m.test_loss,
            100.0 * m.test_accuracy,
            m.upstream_gigabits,
            m.upstream_paper_gib,
            m.examples_per_second,
            m.epoch_seconds
        );
    }

    fn stopped(&mut self, reason: &str) {
        self.bar.finish_and_clear();
        eprintln!("{reason}");
    }
}
