//! The privacy accountant of a run: the history of DP-SGD steps, from which either the RDP
//! accountant (Opacus's) or the tighter PLD accountant computes ε. The history is part of every
//! checkpoint, so a resumed run continues its ε.

use super::history::StepBlock;
use super::AccountantKind;
use super::{pld, rdp, validate, validate_delta};
use crate::error::Result;
use serde::{Deserialize, Serialize};

/// The steps a run has taken, as blocks of equal (σ, q), and ε from them by either accountant.
/// A [`PrivacyEngine`](super::engine::PrivacyEngine) owns one and records every step it
/// noises; on its own it answers "what ε do these steps cost" (`dpcomp epsilon`).
///
/// ```
/// use dpcomp::privacy::{accountant::Accountant, AccountantKind};
/// let mut a = Accountant::default();
/// a.step(1.1, 256.0 / 60_000.0, 2_344)?; // 10 epochs of MNIST at batch 256
/// let (epsilon, order) = a.epsilon(AccountantKind::Rdp, 1e-5)?;
/// assert!(epsilon > 0.5 && epsilon < 2.0 && order.is_some());
/// assert_eq!(a.steps(), 2_344);
/// # Ok::<(), dpcomp::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accountant {
    /// RDP orders (Opacus's defaults).
    pub orders: Vec<f64>,
    /// The steps taken, in order; consecutive steps with the same (σ, q) share one block.
    pub history: Vec<StepBlock>,
}

impl Default for Accountant {
    fn default() -> Self {
        Accountant {
            orders: rdp::default_orders(),
            history: Vec::new(),
        }
    }
}

impl Accountant {
    /// Records `steps` more steps; consecutive steps with the same (σ, q) share one block.
    pub fn step(&mut self, noise_multiplier: f64, sample_rate: f64, steps: u64) -> Result<()> {
        validate(sample_rate, noise_multiplier, steps)?;
        match self.history.last_mut() {
            Some(b) if b.noise_multiplier == noise_multiplier && b.sample_rate == sample_rate => {
                b.steps += steps
            }
            _ => self.history.push(StepBlock {
                noise_multiplier,
                sample_rate,
                steps,
            }),
        }
        Ok(())
    }

    /// The number of steps recorded, over all blocks.
    pub fn steps(&self) -> u64 {
        self.history.iter().map(|b| b.steps).sum()
    }

    /// Total RDP at every order: the sum over steps (composition).
    pub fn rdp(&self) -> Vec<f64> {
        self.orders
            .iter()
            .map(|&alpha| {
                self.history
                    .iter()
                    .map(|b| {
                        b.steps as f64 * rdp::rdp_one_step(b.sample_rate, b.noise_multiplier, alpha)
                    })
                    .sum()
            })
            .collect()
    }

    /// RDP: (ε, optimal order) at δ; (0, NaN) before any step.
    pub fn epsilon_rdp(&self, delta: f64) -> Result<(f64, f64)> {
        validate_delta(delta)?;
        if self.history.is_empty() {
            return Ok((0.0, f64::NAN));
        }
        Ok(rdp::epsilon_from_rdp(&self.orders, &self.rdp(), delta))
    }

    /// PLD: ε at δ, an upper bound (add-or-remove adjacency); 0 before any step. Refuses δ below
    /// `pld::MIN_PLD_DELTA` (before any step too, so that a run learns it at its start).
    pub fn epsilon_pld(&self, delta: f64) -> Result<f64> {
        pld::validate_pld_delta(delta)?;
        if self.history.is_empty() {
            return Ok(0.0);
        }
        pld::epsilon_for_blocks(&self.history, delta)
    }

    /// ε with the chosen accountant, and the optimal RDP order where there is one.
    pub fn epsilon(&self, kind: AccountantKind, delta: f64) -> Result<(f64, Option<f64>)> {
        match kind {
            AccountantKind::Rdp => self.epsilon_rdp(delta).map(|(e, a)| (e, Some(a))),
            AccountantKind::Pld => self.epsilon_pld(delta).map(|e| (e, None)),
        }
    }
}
