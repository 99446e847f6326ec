//! Layers built from explicit parameter tensors, so that every trainable layer can later give
//! per-sample gradients from its recorded input and output gradient (issue 3). Each layer is a
//! struct with public parameter tensors and a constructor taking an `nn::Path`, as in tch-rs.
//!
//! Initialisations follow PyTorch's defaults for the same layer, so that our models start from the
//! same distribution as the PyTorch baselines in `benches/`.

pub mod conv2d;
pub mod embedding;
pub mod linear;
pub mod lstm;
pub mod norm;

pub use conv2d::Conv2d;
pub use embedding::Embedding;
pub use linear::Linear;
pub use lstm::Lstm;
pub use norm::{GroupNorm, InstanceNorm2d, LayerNorm};

/// What a forward pass needs to know besides its input: whether it trains (dropout on).
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub train: bool,
}

impl Ctx {
    pub fn train() -> Self {
        Ctx { train: true }
    }
    pub fn eval() -> Self {
        Ctx { train: false }
    }
}

/// U(-bound, bound) with bound = 1/sqrt(fan_in): PyTorch's default for Linear/Conv weights
/// (kaiming_uniform with a = sqrt(5)) and biases, and for LSTM parameters with fan_in = hidden.
pub(crate) fn uniform_init(fan_in: i64) -> tch::nn::Init {
    let bound = 1.0 / (fan_in as f64).sqrt();
    tch::nn::Init::Uniform {
        lo: -bound,
        up: bound,
    }
}
