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

/// A piece of the forward pass whose backward is computed by hand rather than by autograd
/// (the LSTM's backpropagation through time: one autograd node per cell operation and time step
/// costs more than the arithmetic). It was run without autograd; its output is a leaf that
/// receives dL/d(output) from the autograd pass, and `backward` turns that into parameter
/// gradients and, through autograd again, into gradients of everything before it.
pub trait ManualBackward {
    fn backward(&self);
}

/// What a forward pass needs to know besides its input: whether it trains (dropout on), and,
/// when training, the hand-differentiated segments it recorded, which `backward` completes.
pub struct Ctx {
    pub train: bool,
    segments: Vec<Box<dyn ManualBackward>>,
}

impl Ctx {
    /// Training mode: dropout on; layers with a hand-written backward record themselves, so the
    /// forward must be followed by `Ctx::backward`.
    pub fn train() -> Self {
        Ctx {
            train: true,
            segments: Vec::new(),
        }
    }

    /// Evaluation mode: dropout off, every layer differentiable by plain autograd.
    pub fn eval() -> Self {
        Ctx {
            train: false,
            segments: Vec::new(),
        }
    }

    /// Whether layers should record a hand-differentiated segment.
    pub fn records(&self) -> bool {
        self.train
    }

    pub fn push(&mut self, segment: Box<dyn ManualBackward>) {
        self.segments.push(segment);
    }

    /// d(loss)/d(every trainable parameter), accumulated into `.grad()` as `loss.backward()` does:
    /// autograd first, then the recorded segments from the last to the first (each one's output
    /// gradient is complete once everything after it has been differentiated).
    pub fn backward(&mut self, loss: &tch::Tensor) {
        loss.backward();
        while let Some(segment) = self.segments.pop() {
            segment.backward();
        }
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
