//! The in-training gradient-error measurement (`analysis.grad_error_epochs`) as an observer of
//! the `Trainer`: at the epochs the configuration names, the run's own pipeline measured on
//! fixed batches (`gradient_error::measure`), one line per epoch in `grad_error.jsonl`.
//!
//! The trainer knows nothing of the analyses; the measurement reads it between epochs
//! (`Observer::between_epochs`). A run whose configuration names epochs to measure refuses to
//! start without a probe installed, so the setting is never silently ignored:
//!
//! ```no_run
//! # fn main() -> dpcomp::Result<()> {
//! use dpcomp_lab::analysis::probe::GradientErrorProbe;
//! use dpcomp::prelude::*;
//! let mut config = dpcomp_lab::tasks::paper_defaults(dpcomp_lab::Task::Surnames);
//! config.analysis.grad_error_epochs = vec![0, 10];
//! let mut trainer = dpcomp_lab::tasks::start(config, "runs/measured")?;
//! GradientErrorProbe::install(&mut trainer); // reads `[analysis]` from the trainer's settings
//! trainer.run()?;
//! # Ok(())
//! # }
//! ```

use super::fixed_batches;
use super::gradient_error::{self, CompressorSource, GradientErrorRecord, Mechanism};
use dpcomp::config::{AnalysisSettings, Sampling};
use dpcomp::error::Result;
use dpcomp::train::observer::Observer;
use dpcomp::train::Trainer;

/// Measures the gradient error at the epochs `analysis.grad_error_epochs` names and appends
/// each record to the run's `grad_error.jsonl` (rank 0 only).
#[derive(Debug, Clone)]
pub struct GradientErrorProbe {
    settings: AnalysisSettings,
    /// Whether the first call (the run's start) has dropped the records a resumed run will
    /// measure again.
    started: bool,
}

impl GradientErrorProbe {
    /// The probe for `settings` (epochs to measure, fixed batches, noise draws).
    pub fn new(settings: AnalysisSettings) -> Self {
        GradientErrorProbe {
            settings,
            started: false,
        }
    }

    /// Installs the probe `trainer`'s configuration asks for (`[analysis]`), if it names any
    /// epoch to measure; otherwise does nothing.
    pub fn install(trainer: &mut Trainer) {
        let settings = &trainer.config().analysis;
        if !settings.grad_error_epochs.is_empty() {
            let probe = GradientErrorProbe::new(settings.clone());
            trainer.observe(Box::new(probe));
        }
    }

    /// Measures the gradient error at `trainer`'s current weights and compressor state on the
    /// fixed batches (batches of the expected batch size, σ and C of the run, a fresh copy of
    /// the compressor state), labelled with the epochs done so far. `dpcomp analyze
    /// gradient-error` calls it on a finished or interrupted run.
    pub fn measure(&self, trainer: &Trainer) -> Result<GradientErrorRecord> {
        let config = trainer.config();
        let train = &trainer.data().train;
        let n = train.len();
        let batch_size = if config.private() && config.privacy.sampling == Sampling::Poisson {
            (trainer.sample_rate() * n as f64).round().max(1.0) as usize
        } else {
            config.optimizer.batch_size
        };
        let batches = fixed_batches(n, batch_size, self.settings.grad_error_batches);
        let max_norm = config.privacy.max_grad_norm;
        let mechanism = match config.privacy.noise_multiplier {
            Some(noise_multiplier) => Mechanism::PerSample {
                noise_multiplier,
                max_norm,
            },
            None => Mechanism::GlobalClip { max_norm },
        };
        let compressor = config.compressor()?;
        let shapes: Vec<Vec<i64>> = trainer.params().iter().map(|(_, p)| p.size()).collect();
        let state = trainer.state();
        let source = CompressorSource {
            compressor: &compressor,
            shapes: &shapes,
            state: trainer.updater().compressor.state(),
            epoch: state.epochs_done,
            device: trainer.device(),
        };
        let measured = gradient_error::measure(
            trainer.model(),
            trainer.params(),
            train,
            trainer.device(),
            mechanism,
            &source,
            &batches,
            self.settings.grad_error_draws,
        )?;
        Ok(GradientErrorRecord {
            epoch: state.epochs_done,
            steps: state.steps_done,
            noise_multiplier: config.privacy.noise_multiplier.unwrap_or(0.0),
            max_norm,
            batch_size: measured.batch_size,
            batches: batches.len(),
            draws: self.settings.grad_error_draws,
            parameters: measured.parameters,
            median_norm: measured.median_norm,
            mean_gradient_norm: measured.mean_gradient_norm,
            compressor: config.compression.label(),
            stages: measured.stages,
        })
    }
}

impl Observer for GradientErrorProbe {
    /// At the run's start, first drops the records of epochs after the checkpoint (a resumed
    /// run measures them again); then, whenever the epochs done are among those to measure and
    /// not measured yet, measures and appends the record.
    fn between_epochs(&mut self, trainer: &Trainer) -> Result<()> {
        if trainer.rank() != 0 {
            return Ok(());
        }
        let run_dir = trainer.run_dir();
        let epochs_done = trainer.state().epochs_done;
        if !self.started {
            self.started = true;
            gradient_error::truncate(run_dir, epochs_done)?;
            let measured = gradient_error::read(run_dir)?;
            if measured.iter().any(|r| r.epoch == epochs_done) {
                return Ok(());
            }
        }
        if self.settings.grad_error_epochs.contains(&epochs_done) {
            let record = self.measure(trainer)?;
            gradient_error::append(run_dir, &record)?;
        }
        Ok(())
    }

    fn carries_out(&self) -> Option<&'static str> {
        Some("analysis.grad_error_epochs")
    }
}
