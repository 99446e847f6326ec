//! The privacy budget of a run as the trainer reports it: what is said when the engine's step
//! budget stops a run, the ε shown while it runs, and with `--local-noise` the aggregate's ε.

use super::Trainer;
use crate::error::Result;
use crate::privacy::accountant::Accountant;

impl Trainer {
    /// Why a private run stopped before its epochs were done: its engine's step budget
    /// (`PrivacyEngine::steps_left`) ran out because one more step would exceed the target ε.
    pub(super) fn budget_message(&self) -> Result<String> {
        let engine = self
            .privacy
            .as_ref()
            .expect("only a private run has a step budget");
        Ok(format!(
            "stopped after {} steps: one more step would spend epsilon {:.4} > target {} (delta {})",
            engine.accountant().steps(),
            engine.epsilon_after_next_step()?,
            engine.target_epsilon().unwrap_or(f64::NAN),
            engine.delta()
        ))
    }

    /// ε for the progress bar: live, or as of the last epoch's end.
    pub(super) fn epsilon_shown(&self, live: bool) -> Result<Option<f64>> {
        if live {
            self.epsilon()
        } else {
            Ok(self
                .history
                .last()
                .and_then(|m| m.epsilon)
                .or(self.config.private().then_some(0.0)))
        }
    }

    /// With `--local-noise` and W > 1 workers, ε of the aggregate update: every step it took,
    /// at the multiplier σ√W of the W workers' summed noise (`None` otherwise).
    pub(super) fn aggregate_epsilon(&self) -> Result<Option<f64>> {
        let workers = self.workers();
        let Some(engine) = self.privacy.as_ref() else {
            return Ok(None);
        };
        // Only an update formed from the sum of the noised messages has the summed noise.
        if workers == 1
            || !self.config.privacy.local_noise
            || !super::parts::exchanged_by_sum(&self.config)
        {
            return Ok(None);
        }
        let mut aggregate = Accountant::default();
        for block in &engine.accountant().history {
            aggregate.step(
                block.noise_multiplier * (workers as f64).sqrt(),
                block.sample_rate,
                block.steps,
            )?;
        }
        Ok(Some(
            aggregate
                .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                .0,
        ))
    }
}
