//! The history both accountants read: blocks of identical DP-SGD steps. Its own module so that
//! the accountant (which calls PLD) and PLD (which reads the blocks) do not import each other.

use serde::{Deserialize, Serialize};

/// `steps` identical steps at noise multiplier σ and sampling rate q.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepBlock {
    /// σ: the Gaussian noise's standard deviation in units of the sensitivity (≥ 0).
    pub noise_multiplier: f64,
    /// q: the probability that an example is in a step's batch (0 < q ≤ 1).
    pub sample_rate: f64,
    /// How many consecutive steps ran at this σ and q.
    pub steps: u64,
}
