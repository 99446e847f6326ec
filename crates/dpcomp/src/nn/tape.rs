//! The tape a private forward pass writes: for every trainable layer, what its per-sample
//! gradients are made of (its input activation and parameters) and its output, with respect to
//! which one backward pass gives each example's output gradient. `privacy::grad_sample` turns
//! records into per-sample norms and clipped sums.
//!
//! A record is any `Recorded`: the built-in layers' records live beside the layers
//! (`LinearRecord` in `linear.rs`, ...), and a layer kind dpcomp does not have is added by
//! implementing `Recorded` for what its forward pass pushes (`examples/`).

use super::grad_hook::GradEdge;
use super::per_sample::PerSample;
use tch::{Device, Kind, Tensor};

/// What a trainable layer leaves on the tape: enough to form its parameters' per-sample
/// gradients once the gradient of Σ_i loss_i with respect to its output is known.
///
/// A layer kind of one's own: y = x ⊙ w, a learned scale per feature. Its record keeps the
/// input; with dy = d(Σ_i loss_i)/dy, example i's gradient of w is dy_i ⊙ x_i, given directly
/// (`PerSample::Direct`, [B, d]). With loss_i = Σ_j y_ij that is x_i itself:
///
/// ```
/// use dpcomp::prelude::*;
/// use tch::{nn, Device, Kind, Tensor};
///
/// struct ScaleRecord {
///     weight: Tensor,
///     input: Tensor,
/// }
///
/// impl Recorded for ScaleRecord {
///     fn per_sample(&self, output_grad: &Tensor) -> LayerGradients {
///         let gradients = output_grad * &self.input;
///         LayerGradients::of(vec![(self.weight.shallow_clone(), PerSample::Direct(gradients))])
///     }
/// }
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let weight = vs.root().var("scale", &[3], nn::Init::Const(2.0));
/// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0]).view([2, 3]);
/// let mut ctx = Ctx::private();
/// let y = &x * &weight;
/// if let Some(tape) = ctx.tape() {
///     tape.push(ScaleRecord { weight: weight.shallow_clone(), input: x.shallow_clone() }, &y);
/// }
/// let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
/// let per_sample = per_sample_of(&mut ctx, &params, &y.sum(Kind::Float))?;
/// let PerSample::Direct(gradients) = &per_sample[0].1 else { unreachable!() };
/// assert!(gradients.allclose(&x, 1e-6, 1e-6, false)); // one row per example: x_i
/// # Ok::<(), dpcomp::Error>(())
/// ```
pub trait Recorded {
    /// The recipe for each of the layer's trainable parameters, given `output_grad`
    /// [B, ...output shape] = d(Σ_i loss_i)/d(output) (row i depends on example i only).
    /// Every trainable parameter the layer used must be in the list: one that is not would
    /// escape clipping, and `train::private` refuses the step.
    fn per_sample(&self, output_grad: &Tensor) -> LayerGradients;
}

/// A record's per-sample gradients.
pub struct LayerGradients {
    /// (parameter, how its per-sample gradients are formed).
    pub parameters: Vec<(Tensor, PerSample)>,
    /// For a layer whose output is an autograd leaf (it ran without autograd, as the LSTM's
    /// recurrence does): a scalar whose gradient with respect to earlier records' outputs
    /// continues the backward pass through the layer. `None` for layers autograd ran through.
    pub upstream: Option<Tensor>,
}

impl LayerGradients {
    /// Parameters only (the layer's output is on the autograd graph). Frozen parameters
    /// (`requires_grad` false: a fine-tuning that trains a layer's bias but not its weight) are
    /// left out: only trainable parameters are clipped and updated.
    pub fn of(parameters: Vec<(Tensor, PerSample)>) -> Self {
        LayerGradients {
            parameters: parameters
                .into_iter()
                .filter(|(parameter, _)| parameter.requires_grad())
                .collect(),
            upstream: None,
        }
    }
}

/// One entry of the tape: a layer's record and the output it is the record of.
pub(crate) struct Record {
    /// What forms the layer's per-sample gradients from the output's gradient.
    pub layer: Box<dyn Recorded>,
    /// The layer's output as used downstream: where its gradient enters the graph, not the
    /// tensor itself.
    pub output: RecordedOutput,
}

/// What the tape keeps of a recorded layer's output: where its gradient enters the autograd
/// graph, its shape and placement, not its values. Holding the output itself would keep every
/// recorded layer's output alive until the backward pass, also those autograd does not save:
/// a norm layer's output, which the following ReLU does not keep, was ResNet-18's DP step's
/// largest extra (about 150 MB at batch 64, measured with `mallinfo2` between the hooks).
pub(crate) struct RecordedOutput {
    /// The output's autograd edge (`grad_hook::GradEdge`).
    pub edge: GradEdge,
    /// Its shape, kind and device (a zero gradient for a record no gradient reaches).
    pub size: Vec<i64>,
    pub kind: Kind,
    pub device: Device,
    /// Whether it requires grad, and whether it is a leaf (a layer that ran outside autograd).
    pub requires_grad: bool,
    pub is_leaf: bool,
}

impl RecordedOutput {
    /// A zero gradient shaped like the output.
    pub fn zeros(&self) -> Tensor {
        Tensor::zeros(self.size.as_slice(), (self.kind, self.device))
    }
}

/// What a private forward pass (`Ctx::private()`) writes: one record per trainable layer call,
/// in the order of the forward pass. A layer of one's own pushes its record here
/// (`if let Some(tape) = ctx.tape() { tape.push(record, &ys) }`);
/// `privacy::grad_sample::per_sample_gradients` consumes it.
#[derive(Default)]
pub struct Tape {
    pub(crate) records: Vec<Record>,
}

impl Tape {
    /// Records `layer` as the maker of `output` (the tensor the layer returns, [B, ...]): after
    /// the forward pass, the gradient of Σ_i loss_i with respect to `output` is handed to
    /// `layer.per_sample`. The tape does not hold `output` (only where its gradient enters the
    /// graph), so it is freed as it would be in a non-private pass; an in-place change of
    /// `output` after this call leaves the record with the layer's own output.
    ///
    /// # Panics
    /// If LibTorch cannot give the output's autograd edge (it always can for a tensor).
    pub fn push(&mut self, layer: impl Recorded + 'static, output: &Tensor) {
        let edge = GradEdge::of(output).expect("a tensor's autograd edge");
        self.records.push(Record {
            layer: Box::new(layer),
            output: RecordedOutput {
                edge,
                size: output.size(),
                kind: output.kind(),
                device: output.device(),
                requires_grad: output.requires_grad(),
                is_leaf: output.is_leaf(),
            },
        });
    }
}
