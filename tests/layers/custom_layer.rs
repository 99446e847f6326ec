//! A layer kind dpcomp does not have, written outside the library as a user would: its forward
//! pass pushes its own `Recorded` onto the tape, one parameter's per-sample gradients come in a
//! form of its own (`PerSampleGradient`), the other as a built-in `PerSample::Direct`. Between two
//! built-in linear layers, its per-sample gradients, norms and clipped sum equal per-example
//! autograd (f64); a record that leaves a parameter out makes the private step refuse.

use crate::common;
use dpcomp::data::{Batch, Features};
use dpcomp::models::Model;
use dpcomp::nn::{
    Ctx, LayerGradients, Linear, LinearConfig, PerSample, PerSampleGradient, Recorded,
};
use dpcomp::privacy::grad_sample::clip_and_sum;
use dpcomp::train::private::{per_sample_in_order, PerSampleBatch};
use dpcomp_lab::bench::device_check::per_example_gradients;
use tch::{nn, Device, Kind, Tensor};

/// y = x ⊙ w + b per feature (w, b in R^d): a learned per-feature scale and shift.
struct FeatureScale {
    weight: Tensor,
    bias: Tensor,
    forget_bias: bool,
}

impl FeatureScale {
    fn new(p: &nn::Path, dim: i64) -> Self {
        FeatureScale {
            weight: p.var("weight", &[dim], nn::Init::Uniform { lo: 0.5, up: 1.5 }),
            bias: p.var("bias", &[dim], nn::Init::Uniform { lo: -0.5, up: 0.5 }),
            forget_bias: false,
        }
    }

    fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let ys = xs * &self.weight + &self.bias;
        if let Some(tape) = ctx.tape() {
            let record = FeatureScaleRecord {
                weight: self.weight.shallow_clone(),
                bias: (!self.forget_bias).then(|| self.bias.shallow_clone()),
                input: xs.detach(),
            };
            tape.push(record, &ys);
        }
        ys
    }
}

struct FeatureScaleRecord {
    weight: Tensor,
    bias: Option<Tensor>,
    input: Tensor,
}

/// g_i(w) = x_i ⊙ b_i, kept as the two factors.
struct ScaleGradient {
    input: Tensor,
    output_grad: Tensor,
}

impl PerSampleGradient for ScaleGradient {
    fn squared_norms(&self) -> Tensor {
        (&self.input * &self.output_grad)
            .square()
            .sum_dim_intlist(1, false, Kind::Double)
    }
    fn weighted_sum(&self, c: &Tensor) -> Tensor {
        (&self.input * &self.output_grad * c.view([-1, 1])).sum_dim_intlist(0, false, Kind::Double)
    }
    fn materialize(&self) -> Tensor {
        &self.input * &self.output_grad
    }
}

impl Recorded for FeatureScaleRecord {
    fn per_sample(&self, output_grad: &Tensor) -> LayerGradients {
        let custom = ScaleGradient {
            input: self.input.shallow_clone(),
            output_grad: output_grad.shallow_clone(),
        };
        let mut parameters = vec![(
            self.weight.shallow_clone(),
            PerSample::Custom(Box::new(custom)),
        )];
        if let Some(bias) = &self.bias {
            parameters.push((
                bias.shallow_clone(),
                PerSample::Direct(output_grad.shallow_clone()),
            ));
        }
        LayerGradients::of(parameters)
    }
}

/// Linear -> tanh -> FeatureScale -> Linear. `forget_bias` makes the custom record leave its
/// bias out (a mistake a user can make): that parameter would escape clipping.
struct Net {
    vs: nn::VarStore,
    first: Linear,
    scale: FeatureScale,
    last: Linear,
}

impl Net {
    fn new(seed: i64) -> Self {
        tch::manual_seed(seed);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let (first, scale, last) = (
            Linear::new(&(&root / "first"), 6, 8, LinearConfig::default()).unwrap(),
            FeatureScale::new(&(&root / "scale"), 8),
            Linear::new(&(&root / "last"), 8, 3, LinearConfig::default()).unwrap(),
        );
        vs.double();
        Net {
            vs,
            first,
            scale,
            last,
        }
    }
}

/// A user's rows travel as `Features::Rows`.
impl Model for Net {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> dpcomp::error::Result<Tensor> {
        let Features::Rows(xs) = features else {
            panic!("rows expected");
        };
        let h = self.first.forward(xs, ctx)?.tanh();
        let h = self.scale.forward(&h, ctx);
        self.last.forward(&h, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

fn batch() -> Batch {
    tch::manual_seed(3);
    Batch {
        features: Features::Rows(Tensor::randn([5, 6], (Kind::Double, Device::Cpu))),
        labels: Tensor::from_slice(&[0i64, 2, 1, 1, 0]),
    }
}

#[test]
fn a_user_defined_layer_gives_the_per_example_autograd_gradients() {
    // The weights and the batch are drawn after a `manual_seed` from LibTorch's global generator.
    let _serial = common::serial();
    let net = Net::new(21);
    let batch = batch();
    let params = net.trainable_variables();
    assert_eq!(params.len(), 6);
    let expected = per_example_gradients(&net, &batch.features, &batch.labels).unwrap();

    // One tape, one backward pass, in the order of `params` (every one must be on the tape).
    let PerSampleBatch { per_sample, .. } =
        per_sample_in_order(&net, &params, &batch, false).unwrap();
    for ((name, _), (_, recipe)) in params.iter().zip(&per_sample) {
        let (got, want) = (recipe.materialize(), &expected[name]);
        assert_eq!(got.size(), want.size(), "{name}");
        assert!(
            max_rel_diff(&got, want) < 1e-12,
            "{name}: {}",
            max_rel_diff(&got, want)
        );
    }

    // Norms over all parameters and the clipped sum, at a radius that clips some examples and
    // not others, against the oracle's gradients.
    let squares: Vec<Tensor> = params
        .iter()
        .map(|(name, _)| {
            expected[name]
                .flatten(1, -1)
                .square()
                .sum_dim_intlist(1, false, Kind::Double)
        })
        .collect();
    let norms = Tensor::stack(&squares, 0)
        .sum_dim_intlist(0, false, Kind::Double)
        .sqrt();
    let max_norm = norms.median().double_value(&[]);
    let clipped = clip_and_sum(&per_sample, max_norm);
    assert!(max_rel_diff(&clipped.norms, &norms) < 1e-12);
    let factors = (max_norm / (&norms + 1e-6)).clamp_max(1.0);
    let n_clipped = factors.lt(1.0).sum(Kind::Int64).int64_value(&[]);
    assert!(n_clipped > 0 && n_clipped < 5, "{n_clipped} of 5 clipped");
    for ((name, _), (_, sum)) in params.iter().zip(&clipped.grads) {
        let g = &expected[name];
        let mut shape = vec![-1i64];
        shape.extend(std::iter::repeat_n(1, g.dim() - 1));
        let want = (g * factors.view(shape.as_slice())).sum_dim_intlist(0, false, Kind::Double);
        assert!(max_rel_diff(sum, &want) < 1e-12, "{name}: clipped sum");
    }
}

#[test]
fn a_parameter_missing_from_the_tape_is_refused() {
    // The weights and the batch are drawn after a `manual_seed` from LibTorch's global generator.
    let _serial = common::serial();
    let mut net = Net::new(21);
    net.scale.forget_bias = true;
    let params = net.trainable_variables();
    let e = per_sample_in_order(&net, &params, &batch(), false)
        .err()
        .expect("the bias escapes clipping")
        .to_string();
    assert!(
        e.contains("scale.bias") && e.contains("escape clipping"),
        "{e}"
    );
}

/// y = x ⊙ w per feature, recorded with its input: example i's gradient of w is dy_i ⊙ x_i.
struct ScaleRecord {
    weight: Tensor,
    input: Tensor,
}

impl Recorded for ScaleRecord {
    fn per_sample(&self, output_grad: &Tensor) -> LayerGradients {
        let gradients = output_grad * &self.input;
        LayerGradients::of(vec![(
            self.weight.shallow_clone(),
            PerSample::Direct(gradients),
        )])
    }
}

#[test]
fn a_record_keeps_its_layers_own_output_when_the_output_is_changed_in_place() {
    // The tape holds where the output's gradient enters the graph, not the output: an in-place
    // ReLU after the push leaves the record with the layer's own output, so its gradient is
    // d(Σ relu(y))/dy = 1[y > 0] and example i's gradient of w is 1[y_i > 0] ⊙ x_i (not x_i, the
    // gradient with respect to the ReLU's output).
    let weight = Tensor::ones([3], (Kind::Double, Device::Cpu)).set_requires_grad(true);
    let x = Tensor::from_slice(&[1.0f64, -2.0, 3.0, -1.0, 0.5, -4.0]).view([2, 3]);
    let mut ctx = Ctx::private();
    let mut y = &x * &weight;
    if let Some(tape) = ctx.tape() {
        tape.push(
            ScaleRecord {
                weight: weight.shallow_clone(),
                input: x.shallow_clone(),
            },
            &y,
        );
    }
    let _ = y.relu_();
    let loss = y.sum(Kind::Double);
    let params = vec![("scale".to_string(), weight.shallow_clone())];
    let per_sample = dpcomp::privacy::grad_sample::per_sample_of(&mut ctx, &params, &loss).unwrap();
    let PerSample::Direct(gradients) = &per_sample[0].1 else {
        panic!("a direct recipe")
    };
    let want = Tensor::from_slice(&[1.0f64, 0.0, 3.0, 0.0, 0.5, 0.0]).view([2, 3]);
    assert!(
        gradients.allclose(&want, 0.0, 0.0, false),
        "{gradients} against {want}"
    );
}
