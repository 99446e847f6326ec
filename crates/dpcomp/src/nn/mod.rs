//! Layers built from explicit parameter tensors, so that every trainable layer can later give
//! per-sample gradients from its recorded input and output gradient. Each layer is a
//! struct with public parameter tensors and a constructor taking an `nn::Path`, as in tch-rs.
//!
//! Initialisations follow PyTorch's defaults for the same layer, so that our models start from the
//! same distribution as the PyTorch baselines in `benches/`.

pub mod attention;
pub mod conv2d;
pub mod embedding;
pub(crate) mod grad_hook;
pub mod gru;
mod input;
pub mod linear;
pub mod lora;
pub mod lstm;
pub mod norm;
pub mod per_sample;
pub mod pool;
mod recurrent;
pub mod rms_norm;
pub mod tape;
pub mod tied;

pub use attention::{AttentionConfig, MultiheadAttention};
pub use conv2d::{Conv2d, Conv2dConfig};
pub use embedding::Embedding;
pub use gru::Gru;
pub use linear::{Linear, LinearConfig};
pub use lora::{LoraAdapter, LoraConfig, LoraLinear};
pub use lstm::Lstm;
pub use norm::{GroupNorm, InstanceNorm2d, LayerNorm};
pub use per_sample::{PerSample, PerSampleGradient};
pub use pool::avg_pool2x2;
pub use rms_norm::RmsNorm;
pub(crate) use tape::Record;
pub use tape::{LayerGradients, Recorded, Tape};

/// A piece of the forward pass whose backward is computed by hand rather than by autograd
/// (the LSTM's backpropagation through time: one autograd node per cell operation and time step
/// costs more than the arithmetic). It was run without autograd; its output is a leaf that
/// receives dL/d(output) from the autograd pass, and `backward` turns that into parameter
/// gradients and, through autograd again, into gradients of everything before it.
pub(crate) trait ManualBackward {
    /// Reads the output's gradient and accumulates the parameters' and the input's.
    fn backward(&self);
}

/// What a forward pass needs to know besides its input: whether dropout is on, and what the
/// layers record for the backward pass that follows.
///
/// - `Ctx::eval()`: nothing recorded; every layer is plain autograd code.
/// - `Ctx::train()`: non-private training; layers with a hand-written backward (the LSTM)
///   record a segment that `Ctx::backward` completes.
/// - `Ctx::private()`: DP training; every trainable layer writes a `Tape` record from
///   which `privacy::grad_sample` forms per-sample norms and clipped sums. Dropout is on;
///   `Ctx::private().without_dropout()` turns it off (the oracle tests compare against
///   per-example autograd, which has no dropout).
pub struct Ctx {
    /// Whether dropout is on: a model of one's own passes it to `Tensor::dropout(p, ctx.train)`.
    pub train: bool,
    segments: Vec<Box<dyn ManualBackward>>,
    tape: Option<Tape>,
}

impl Ctx {
    /// Non-private training: dropout on, no tape (gradients by `Ctx::backward`).
    pub fn train() -> Self {
        Ctx {
            train: true,
            segments: Vec::new(),
            tape: None,
        }
    }

    /// Evaluation: dropout off, nothing recorded.
    pub fn eval() -> Self {
        Ctx {
            train: false,
            segments: Vec::new(),
            tape: None,
        }
    }

    /// Records a tape for per-sample gradients, with dropout on (private training).
    pub fn private() -> Self {
        Ctx {
            train: true,
            segments: Vec::new(),
            tape: Some(Tape::default()),
        }
    }

    /// The same context with dropout off (`Ctx::private().without_dropout()`: a private
    /// forward pass comparable with per-example autograd in evaluation mode).
    pub fn without_dropout(mut self) -> Self {
        self.train = false;
        self
    }

    /// Whether layers should record a hand-differentiated segment (non-private training).
    pub(crate) fn records(&self) -> bool {
        self.train && self.tape.is_none()
    }

    /// The tape, in private mode.
    pub fn tape(&mut self) -> Option<&mut Tape> {
        self.tape.as_mut()
    }

    /// Takes the tape a private forward pass wrote (`None` outside private mode, or once
    /// taken), for `privacy::grad_sample::per_sample_gradients`.
    pub fn take_tape(&mut self) -> Option<Tape> {
        self.tape.take()
    }

    /// Records a hand-differentiated segment for `Ctx::backward` to complete.
    pub(crate) fn push(&mut self, segment: Box<dyn ManualBackward>) {
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

/// Whether every value of `t` is finite (true for integer and empty tensors): the check every
/// tensor read from disk passes before it is copied into a model, optimiser or compressor.
pub(crate) fn all_finite(t: &tch::Tensor) -> bool {
    !t.is_floating_point()
        || t.numel() == 0
        || crate::host::bool_scalar(&t.isfinite().all()).unwrap_or(false)
}

/// Checks a tensor read from `path` before it is copied into a model, optimiser or compressor:
/// the expected shape, a floating-point kind, and finite values (the manifest catches damaged
/// bytes; this catches a file that was written with NaNs or by another tool).
pub(crate) fn check_loaded(
    path: &std::path::Path,
    name: &str,
    tensor: &tch::Tensor,
    shape: &[i64],
) -> crate::error::Result<()> {
    if tensor.size() != shape {
        return Err(crate::error::Error::bad_file(
            path,
            format!("{name}: shape {:?}, expected {shape:?}", tensor.size()),
        ));
    }
    if !tensor.is_floating_point() {
        return Err(crate::error::Error::bad_file(
            path,
            format!("{name}: kind {:?}, expected floating point", tensor.kind()),
        ));
    }
    if !all_finite(tensor) {
        return Err(crate::error::Error::bad_file(
            path,
            format!("{name}: holds NaN or infinite values"),
        ));
    }
    Ok(())
}
