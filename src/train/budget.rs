//! The privacy budget of a run: how many steps a target ε allows, what is said when it stops
//! one, the ε shown while it runs, and with `--local-noise` the aggregate's ε.

use super::Trainer;
use crate::error::{Error, Result};
use crate::privacy::accountant::Accountant;

impl Trainer {
    /// How many more DP steps the --target-epsilon budget allows (ε is monotone in the number
    /// of steps, so one bisection at the start of `run` replaces a check before every step).
    pub(super) fn steps_within_budget(&self) -> Result<Option<u64>> {
        let (Some(target), Some(engine)) = (self.config.privacy.target_epsilon, &self.privacy)
        else {
            return Ok(None);
        };
        let (sigma, accountant) = (engine.noise_multiplier(), engine.accountant());
        let q = self.sample_rate();
        let fits = |extra: u64| -> Result<bool> {
            if extra == 0 {
                return Ok(accountant
                    .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                    .0
                    <= target);
            }
            let mut next = accountant.clone();
            next.step(sigma, q, extra)?;
            Ok(next
                .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                .0
                <= target)
        };
        let remaining = ((self.config.epochs - self.state.epochs_done) as u64)
            .checked_mul(self.steps_per_epoch() as u64)
            .ok_or_else(|| {
                Error::bad_value(
                    "epochs",
                    format!(
                        "{}: at {} steps an epoch that is more steps than a run can count (2^64)",
                        self.config.epochs,
                        self.steps_per_epoch()
                    ),
                )
            })?;
        if fits(remaining)? {
            return Ok(Some(remaining));
        }
        if !fits(0)? {
            return Ok(Some(0));
        }
        let (mut lo, mut hi) = (0u64, remaining); // fits(lo), !fits(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Some(lo))
    }

    pub(super) fn budget_message(&self) -> Result<String> {
        let target = self.config.privacy.target_epsilon.unwrap_or(f64::NAN);
        let sigma = self.config.privacy.noise_multiplier.unwrap_or(0.0);
        let accountant = self.accountant().cloned().unwrap_or_default();
        let mut next = accountant.clone();
        next.step(sigma, self.sample_rate(), 1)?;
        let eps = next
            .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
            .0;
        Ok(format!(
            "stopped after {} steps: one more step would spend epsilon {eps:.4} > target {target} (delta {})",
            accountant.steps(),
            self.config.privacy.delta
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
            || !self.config.compression.kind.exchanged_by_sum()
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
