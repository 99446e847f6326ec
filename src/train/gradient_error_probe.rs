//! The in-training gradient-error measurement (`analysis.grad_error_epochs`): at the epochs it
//! names, the run's own pipeline measured on fixed batches (`analysis::gradient_error`).

use super::Trainer;
use crate::analysis::{fixed_batches, gradient_error};
use crate::config::Sampling;
use crate::error::Result;

impl Trainer {
    /// Measures the gradient error at the current weights and compressor state on the fixed
    /// batches (`analysis::gradient_error`; batches of the expected batch size, σ and C of the
    /// run, a fresh copy of the compressor state), labelled with the epochs done so far.
    pub fn measure_gradient_error(&self) -> Result<gradient_error::GradientErrorRecord> {
        let n = self.data.train.len();
        let batch_size =
            if self.config.private() && self.config.privacy.sampling == Sampling::Poisson {
                (self.sample_rate() * n as f64).round().max(1.0) as usize
            } else {
                self.config.optimizer.batch_size
            };
        let batches = fixed_batches(n, batch_size, self.config.analysis.grad_error_batches);
        let max_norm = self.config.privacy.max_grad_norm;
        let mechanism = match self.config.privacy.noise_multiplier {
            Some(noise_multiplier) => gradient_error::Mechanism::PerSample {
                noise_multiplier,
                max_norm,
            },
            None => gradient_error::Mechanism::GlobalClip { max_norm },
        };
        let spec = self.config.compressor_spec()?;
        let shapes: Vec<Vec<i64>> = self.params.iter().map(|(_, p)| p.size()).collect();
        let source = gradient_error::CompressorSource {
            spec: &spec,
            shapes: &shapes,
            state: self.updater.compressor.state(),
            epoch: self.state.epochs_done,
            device: self.device,
        };
        let measured = gradient_error::measure(
            self.model.as_ref(),
            &self.params,
            &self.data.train,
            self.device,
            mechanism,
            &source,
            &batches,
            self.config.analysis.grad_error_draws,
        )?;
        Ok(gradient_error::GradientErrorRecord {
            epoch: self.state.epochs_done,
            steps: self.state.steps_done,
            noise_multiplier: self.config.privacy.noise_multiplier.unwrap_or(0.0),
            max_norm,
            batch_size: measured.batch_size,
            batches: batches.len(),
            draws: self.config.analysis.grad_error_draws,
            parameters: measured.parameters,
            median_norm: measured.median_norm,
            mean_gradient_norm: measured.mean_gradient_norm,
            compressor: spec.label(),
            stages: measured.stages,
        })
    }

    /// Measures and logs the gradient error when the configuration asks for it after
    /// `epochs_done` epochs.
    pub(super) fn gradient_error_if_due(&self) -> Result<()> {
        if self
            .config
            .analysis
            .grad_error_epochs
            .contains(&self.state.epochs_done)
        {
            let record = self.measure_gradient_error()?;
            gradient_error::append(&self.run_dir, &record)?;
        }
        Ok(())
    }
}
