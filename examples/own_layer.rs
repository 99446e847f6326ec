//! Layers of one's own, and the check that their per-sample gradients are right: every example's
//! gradient from the recorded forward pass (one backward for the whole batch) against the same
//! example's gradient by autograd alone (one backward per example).
//!
//! Two layer kinds dpcomp does not have, each telling the tape how its per-sample gradients are
//! formed (`Recorded`):
//! - `LowRankLinear`, y = (x U) Vᵀ: both factors' gradients are sums of outer products
//!   (`PerSample::Outer`), so the engine takes their norms by the ghost identity without
//!   forming them;
//! - `PRelu`, y = max(x, 0) + a ⊙ min(x, 0) with a slope per channel: a form of its own
//!   (`PerSample::Custom`, the `PerSampleGradient` trait).
//!
//! ```text
//! cargo run --release --example own_layer
//! ```

use dpcomp::prelude::*;
use tch::{nn, Device, Kind, Reduction, Tensor};

/// y = (x U) Vᵀ with U [in, rank] and V [out, rank]: a linear map of rank at most `rank`.
pub struct LowRankLinear {
    u: Tensor,
    v: Tensor,
}

impl LowRankLinear {
    pub fn new(p: &nn::Path, input: i64, output: i64, rank: i64) -> Self {
        let init = |fan_in: i64| {
            let bound = 1.0 / (fan_in as f64).sqrt();
            nn::Init::Uniform {
                lo: -bound,
                up: bound,
            }
        };
        LowRankLinear {
            u: p.var("u", &[input, rank], init(input)),
            v: p.var("v", &[output, rank], init(rank)),
        }
    }

    /// `xs` [B, in] → [B, out].
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let xu = xs.matmul(&self.u);
        let ys = xu.matmul(&self.v.tr());
        if let Some(tape) = ctx.tape() {
            let record = LowRankRecord {
                u: self.u.shallow_clone(),
                v: self.v.shallow_clone(),
                xs: xs.detach(),
                xu: xu.detach(),
            };
            tape.push(record, &ys);
        }
        ys
    }
}

struct LowRankRecord {
    u: Tensor,
    v: Tensor,
    xs: Tensor,
    xu: Tensor,
}

impl Recorded for LowRankRecord {
    /// With dy = dL/dy [B, out]: dL/dU = xᵀ (dy V), an outer product of x [in] and dy V [rank];
    /// dL/dV = dyᵀ (x U), of dy [out] and x U [rank]. `Outer` takes a [B, T, ·] (here T = 1) and
    /// b [B, T, ·] for g_i = Σ_t b_it a_itᵀ.
    fn per_sample(&self, dy: &Tensor) -> LayerGradients {
        let steps = |t: &Tensor| t.unsqueeze(1);
        let outer = |a: Tensor, b: Tensor, shape: Vec<i64>| PerSample::Outer {
            a: Activations::Held(steps(&a)),
            b: steps(&b),
            shape,
            ghost: true,
        };
        LayerGradients::of(vec![
            (
                self.u.shallow_clone(),
                outer(dy.matmul(&self.v), self.xs.shallow_clone(), self.u.size()),
            ),
            (
                self.v.shallow_clone(),
                outer(self.xu.shallow_clone(), dy.shallow_clone(), self.v.size()),
            ),
        ])
    }
}

/// y = max(x, 0) + a ⊙ min(x, 0), a learned slope per channel (the last dimension).
pub struct PRelu {
    slope: Tensor,
}

impl PRelu {
    pub fn new(p: &nn::Path, channels: i64) -> Self {
        PRelu {
            slope: p.var("slope", &[channels], nn::Init::Const(0.25)),
        }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let negative = xs.clamp_max(0.0);
        let ys = xs.relu() + &negative * &self.slope;
        if let Some(tape) = ctx.tape() {
            let record = PReluRecord {
                slope: self.slope.shallow_clone(),
                negative: negative.detach(),
            };
            tape.push(record, &ys);
        }
        ys
    }
}

struct PReluRecord {
    slope: Tensor,
    negative: Tensor,
}

impl Recorded for PReluRecord {
    fn per_sample(&self, dy: &Tensor) -> LayerGradients {
        let gradient = SlopeGradient {
            terms: &self.negative * dy,
        };
        LayerGradients::of(vec![(
            self.slope.shallow_clone(),
            PerSample::Custom(Box::new(gradient)),
        )])
    }
}

/// g_i = min(x_i, 0) ⊙ dy_i for the slopes, [B, channels].
struct SlopeGradient {
    terms: Tensor,
}

impl PerSampleGradient for SlopeGradient {
    fn squared_norms(&self) -> Tensor {
        self.terms.square().sum_dim_intlist(1, false, Kind::Float)
    }

    fn weighted_sum(&self, c: &Tensor) -> Tensor {
        (&self.terms * c.unsqueeze(1)).sum_dim_intlist(0, false, Kind::Float)
    }

    fn materialize(&self) -> Tensor {
        self.terms.shallow_clone()
    }
}

/// Linear → PReLU → LowRankLinear.
pub struct Net {
    pub vs: nn::VarStore,
    first: Linear,
    act: PRelu,
    last: LowRankLinear,
}

impl Net {
    pub fn new(inputs: i64, hidden: i64, classes: i64) -> Result<Self> {
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        Ok(Net {
            first: Linear::new(&(&root / "first"), inputs, hidden, LinearConfig::default())?,
            act: PRelu::new(&(&root / "act"), hidden),
            last: LowRankLinear::new(&(&root / "last"), hidden, classes, 2),
            vs,
        })
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let h = self.first.forward(xs, ctx)?;
        let h = self.act.forward(&h, ctx);
        Ok(self.last.forward(&h, ctx))
    }
}

/// The largest differences between the recorded forward pass and per-example autograd over a
/// batch, relative to the largest autograd value: in the gradients g_i, their squared norms,
/// and a weighted sum Σ_i c_i g_i (what clipping computes).
#[derive(Debug)]
pub struct Agreement {
    pub gradients: f64,
    pub squared_norms: f64,
    pub weighted_sums: f64,
}

/// `batch` random examples through `Net`, both ways.
pub fn check(batch: i64, seed: i64) -> Result<Agreement> {
    tch::manual_seed(seed);
    let net = Net::new(6, 8, 3)?;
    let xs = Tensor::randn([batch, 6], (Kind::Float, Device::Cpu));
    let labels = Tensor::randint(3, [batch], (Kind::Int64, Device::Cpu));
    let loss_of = |logits: &Tensor, labels: &Tensor| {
        logits.cross_entropy_loss::<Tensor>(labels, None, Reduction::Sum, -100, 0.0)
    };
    // One recorded forward pass and one backward for the batch.
    let params: Vec<(String, Tensor)> = {
        let mut p: Vec<_> = net.vs.variables().into_iter().collect();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        p
    };
    let mut ctx = Ctx::private();
    let loss = loss_of(&net.forward(&xs, &mut ctx)?, &labels);
    let recipes = per_sample_of(&mut ctx, &params, &loss)?;
    // Autograd, one example at a time.
    let mut autograd: Vec<Vec<Tensor>> = (0..params.len()).map(|_| Vec::new()).collect();
    for i in 0..batch {
        for (_, p) in &params {
            let mut p = p.shallow_clone();
            p.zero_grad();
        }
        let logits = net.forward(&xs.narrow(0, i, 1), &mut Ctx::eval())?;
        loss_of(&logits, &labels.narrow(0, i, 1)).backward();
        for (k, (_, p)) in params.iter().enumerate() {
            autograd[k].push(p.grad().copy());
        }
    }
    let c = Tensor::rand([batch], (Kind::Float, Device::Cpu));
    let relative = |ours: &Tensor, theirs: &Tensor| {
        let scale = theirs.abs().max().double_value(&[]).max(1e-12);
        (ours - theirs).abs().max().double_value(&[]) / scale
    };
    let mut worst = Agreement {
        gradients: 0.0,
        squared_norms: 0.0,
        weighted_sums: 0.0,
    };
    for ((_, recipe), per_example) in recipes.iter().zip(&autograd) {
        let theirs = Tensor::stack(per_example, 0);
        let norms = theirs
            .flatten(1, -1)
            .square()
            .sum_dim_intlist(1, false, Kind::Float);
        let each: Vec<i64> = std::iter::once(batch)
            .chain(std::iter::repeat_n(1, theirs.dim() - 1))
            .collect();
        let sum = (&theirs * c.view(each.as_slice())).sum_dim_intlist(0, false, Kind::Float);
        worst.gradients = worst
            .gradients
            .max(relative(&recipe.materialize(), &theirs));
        worst.squared_norms = worst
            .squared_norms
            .max(relative(&recipe.squared_norms(), &norms));
        worst.weighted_sums = worst
            .weighted_sums
            .max(relative(&recipe.weighted_sum(&c), &sum));
    }
    Ok(worst)
}

#[allow(dead_code)] // a test includes this file as a module
fn main() -> Result<()> {
    let agreement = check(16, 0)?;
    println!(
        "recorded vs per-example autograd, largest relative difference over 16 examples: gradients {:.1e}, squared norms {:.1e}, weighted sums {:.1e}",
        agreement.gradients, agreement.squared_norms, agreement.weighted_sums
    );
    Ok(())
}
