//! Bring your own model and data: a small network with a layer kind dpcomp does not have, trained
//! with DP-SGD on a table that is none of dpcomp's tasks (the Wisconsin breast-cancer data, read
//! here as any CSV), at a target ε. The loop is the library's whole private step: a recorded
//! forward pass (`Ctx::private`), per-sample gradients (`per_sample_of`), the engine's clip and
//! privatise (noise and accountant step in one call), the optimiser.
//!
//! ```text
//! cargo run --release --example private_tabular -- [CSV, default $DPCOMP_DATA/breast_cancer/breast_cancer.csv] [epsilon 3] [epochs 10]
//! ```
//!
//! It prints the test accuracy, ε, and the `dpcomp epsilon` command that gives the same ε.

use dpcomp::prelude::*;
use std::path::Path;
use tch::{nn, Device, Kind, Reduction, Tensor};

/// A layer of one's own: y = x ⊙ w + b, a learned scale and shift per feature. Its forward pass
/// records what per-sample gradients need; `ScaleRecord` says how to form them.
pub struct FeatureScale {
    weight: Tensor,
    bias: Tensor,
}

impl FeatureScale {
    pub fn new(p: &nn::Path, dim: i64) -> Self {
        let weight = p.var("weight", &[dim], nn::Init::Const(1.0));
        let bias = p.var("bias", &[dim], nn::Init::Const(0.0));
        FeatureScale { weight, bias }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let ys = xs * &self.weight + &self.bias;
        if let Some(tape) = ctx.tape() {
            let record = ScaleRecord {
                weight: self.weight.shallow_clone(),
                bias: self.bias.shallow_clone(),
                input: xs.detach(),
            };
            tape.push(record, &ys);
        }
        ys
    }
}

/// What the forward pass kept: per example, dL/dw = x ⊙ dL/dy and dL/db = dL/dy.
struct ScaleRecord {
    weight: Tensor,
    bias: Tensor,
    input: Tensor,
}

impl Recorded for ScaleRecord {
    fn per_sample(&self, output_grad: &Tensor) -> LayerGradients {
        LayerGradients::of(vec![
            (
                self.weight.shallow_clone(),
                PerSample::Direct(&self.input * output_grad),
            ),
            (
                self.bias.shallow_clone(),
                PerSample::Direct(output_grad.shallow_clone()),
            ),
        ])
    }
}

/// Linear -> tanh -> FeatureScale -> Linear.
pub struct Net {
    pub vs: nn::VarStore,
    first: Linear,
    scale: FeatureScale,
    last: Linear,
}

impl Net {
    pub fn new(inputs: i64, hidden: i64, classes: i64) -> Result<Self> {
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let first = Linear::new(&(&root / "first"), inputs, hidden, LinearConfig::default())?;
        let scale = FeatureScale::new(&(&root / "scale"), hidden);
        let last = Linear::new(&(&root / "last"), hidden, classes, LinearConfig::default())?;
        Ok(Net {
            vs,
            first,
            scale,
            last,
        })
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let h = self.first.forward(xs, ctx)?.tanh();
        let h = self.scale.forward(&h, ctx);
        self.last.forward(&h, ctx)
    }
}

/// What a run ended with, and the accountant's inputs that reproduce its ε.
pub struct Outcome {
    pub test_accuracy: f64,
    pub epsilon: f64,
    pub noise_multiplier: f64,
    pub sample_rate: f64,
    pub steps: u64,
    pub delta: f64,
}

/// Rows of numbers with the label last; the first line may be a header. Features go through
/// dpcomp's public log map ln(max(x, 10⁻³)) (`convex::preprocess::public_log`), a fixed function
/// of each value: standardising with the training rows' mean and deviation would release those
/// statistics outside the accounted ε. A seeded 80/20 split.
pub fn read_table(path: &Path) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let rows: Vec<Vec<f32>> = text
        .lines()
        .filter_map(|l| l.split(',').map(|f| f.trim().parse().ok()).collect())
        .collect();
    let width = rows.first().map_or(0, Vec::len);
    if rows.len() < 10 || width < 2 || rows.iter().any(|r| r.len() != width) {
        return Err(Error::bad_file(
            path,
            "expected rows of numbers, the label last",
        ));
    }
    let table = Tensor::from_slice(&rows.concat()).view([rows.len() as i64, width as i64]);
    let (x, y) = (
        table.narrow(1, 0, width as i64 - 1),
        table.select(1, width as i64 - 1),
    );
    let order = Tensor::randperm(rows.len() as i64, (Kind::Int64, Device::Cpu));
    let cut = rows.len() as i64 * 4 / 5;
    let (train, test) = (
        order.narrow(0, 0, cut),
        order.narrow(0, cut, rows.len() as i64 - cut),
    );
    let x = dpcomp::data::preprocess::public_log(&x)?;
    let label = |i: &Tensor| y.index_select(0, i).to_kind(Kind::Int64);
    Ok((
        x.index_select(0, &train),
        label(&train),
        x.index_select(0, &test),
        label(&test),
    ))
}

/// DP-SGD on the table at `path` for `epochs` epochs of expected batch 64, with the σ that spends
/// `target_epsilon` at δ = 1e-5 over exactly those steps (RDP, as Opacus).
pub fn train(path: &Path, target_epsilon: f64, epochs: usize, seed: i64) -> Result<Outcome> {
    tch::manual_seed(seed);
    let (x, y, x_test, y_test) = read_table(path)?;
    let (n, delta) = (x.size()[0], 1e-5);
    let net = Net::new(x.size()[1], 16, 2)?;
    let mut params: Vec<(String, Tensor)> = net.vs.variables().into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let mut engine = PrivacyEngine::builder()
        .target_epsilon(target_epsilon)
        .delta(delta)
        .epochs(epochs as u64)
        .dataset_size(n as u64)
        .batch_size(64)
        .max_grad_norm(1.0)
        .build(&params)?;
    // Poisson batches for a batch size of 64: ⌈n / 64⌉ steps an epoch at q = 1 / ⌈n / 64⌉, as the
    // Trainer samples (and Opacus for a data loader of batch size 64).
    let (q, steps_per_epoch) = (engine.sample_rate(), engine.steps_per_epoch() as usize);
    let mut sgd = Sgd::new(0.5, 0.9);
    for _ in 0..epochs {
        for index in poisson_batches(n, q, steps_per_epoch) {
            let mut ctx = Ctx::private();
            let logits = net.forward(&x.index_select(0, &index), &mut ctx)?;
            let labels = y.index_select(0, &index);
            let loss =
                logits.cross_entropy_loss::<Tensor>(&labels, None, Reduction::Sum, -100, 0.0);
            let per_sample = per_sample_of(&mut ctx, &params, &loss)?;
            let clipped = engine.clip(&per_sample);
            let grads = engine.privatize(&clipped)?; // noise + the accountant's step
            tch::no_grad(|| sgd.step(&tensors, &grads));
        }
    }
    let logits = tch::no_grad(|| net.forward(&x_test, &mut Ctx::eval()))?;
    let right = logits
        .argmax(-1, false)
        .eq_tensor(&y_test)
        .to_kind(Kind::Double);
    Ok(Outcome {
        test_accuracy: right.mean(Kind::Double).double_value(&[]),
        epsilon: engine.epsilon()?,
        noise_multiplier: engine.noise_multiplier(),
        sample_rate: q,
        steps: engine.accountant().steps(),
        delta,
    })
}

#[allow(dead_code)] // a test includes this file as a module and calls `train`
fn main() -> Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        // The data folder as dpcomp resolves it: $DPCOMP_DATA, else data/ (data/README.md).
        let data = dpcomp::data::data_dir(None);
        data.join("breast_cancer/breast_cancer.csv")
            .to_string_lossy()
            .into_owned()
    });
    let arg = |k: usize, default: f64| {
        std::env::args()
            .nth(k)
            .map_or(default, |a| a.parse().unwrap_or(default))
    };
    let out = train(
        Path::new(&path),
        arg(2, 3.0),
        arg(3, 10.0) as usize,
        arg(4, 0.0) as i64,
    )?;
    println!("test accuracy {:.1}%", 100.0 * out.test_accuracy);
    println!(
        "epsilon {:.4} at delta {} (sigma {:.4}, q {:.5}, {} steps)",
        out.epsilon, out.delta, out.noise_multiplier, out.sample_rate, out.steps
    );
    println!(
        "the same from the accountant alone: dpcomp epsilon --noise-multiplier {} --sample-rate {} --steps {} --delta {}",
        out.noise_multiplier, out.sample_rate, out.steps, out.delta
    );
    Ok(())
}
