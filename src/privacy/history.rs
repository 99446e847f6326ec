//! The history both accountants read: blocks of identical DP-SGD steps. Its own module so that
//! the accountant (which calls PLD) and PLD (which reads the blocks) do not import each other.

use serde::{Deserialize, Serialize};

/// `steps` identical steps at noise multiplier σ and sampling rate q.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepBlock {
    pub noise_multiplier: f64,
    pub sample_rate: f64,
    pub steps: u64,
}
