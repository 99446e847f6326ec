//! A `Trainer` built from parts of one's own: an optimiser (SGD with Nesterov momentum), a
//! compressor (top-k with error feedback, whose residuals the encoder carries) and the privacy
//! engine's settings from `PrivacyEngine::builder()` (a target ε; the trainer supplies the
//! sampling and the length it knows). The model is a small MLP on synthetic rows (label: whether
//! the first two features sum to more than zero). Every part's state is in each checkpoint, so
//! a run killed mid-epoch resumes from its last epoch and ends where an uninterrupted one does.
//!
//! ```text
//! cargo run --release --example own_parts -- [run folder, default runs/own-parts] [epochs 4]
//! ```
//!
//! Run it again with more epochs: it resumes the folder's run.

use dpcomp::compress::{Decoder, Encoder, Message, Payload, Unpack};
use dpcomp::prelude::*;
use dpcomp::train::optimizer::take_like;
use dpcomp::train::parts::CompressorFactory;
use std::collections::HashMap;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// SGD with Nesterov momentum: v ← μv + g; w ← w − lr (g + μv). The velocities are its state.
pub struct Nesterov {
    pub lr: f64,
    pub momentum: f64,
    velocity: Vec<Tensor>,
}

impl Nesterov {
    pub fn new(lr: f64, momentum: f64) -> Self {
        Nesterov {
            lr,
            momentum,
            velocity: Vec::new(),
        }
    }
}

impl Optimizer for Nesterov {
    fn name(&self) -> String {
        format!("nesterov (lr {}, momentum {})", self.lr, self.momentum)
    }

    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) {
        if self.velocity.is_empty() {
            self.velocity = grads.iter().map(Tensor::zeros_like).collect();
        }
        tch::no_grad(|| {
            for ((p, g), v) in params.iter().zip(grads).zip(&mut self.velocity) {
                let _ = v.g_mul_scalar_(self.momentum).g_add_(g);
                let direction = g + &*v * self.momentum;
                let _ = p.shallow_clone().g_add_(&(direction * -self.lr));
            }
        });
    }

    fn state(&self, names: &[String]) -> Vec<(String, Tensor)> {
        names
            .iter()
            .zip(&self.velocity)
            .map(|(name, v)| (format!("velocity.{name}"), v.shallow_clone()))
            .collect()
    }

    fn load_state(
        &mut self,
        params: &[(String, Tensor)],
        saved: &HashMap<String, Tensor>,
        path: &Path,
    ) -> Result<()> {
        if saved.is_empty() {
            return Ok(()); // no step taken yet
        }
        self.velocity = params
            .iter()
            .map(|(name, p)| take_like(saved, &format!("velocity.{name}"), p, path))
            .collect::<Result<_>>()?;
        Ok(())
    }
}

/// Top-k with error feedback: each tensor sends its `fraction` largest-magnitude entries of
/// (update + residual) as a sparse payload and keeps the rest as the next step's residual.
pub struct TopKFeedback {
    pub fraction: f64,
}

/// The worker's side of `TopKFeedback`: the residuals it carries.
struct TopKEncoder {
    fraction: f64,
    residual: Vec<Tensor>,
}

impl Encoder for TopKEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        let payloads = update
            .iter()
            .zip(&mut self.residual)
            .map(|(u, r)| {
                let corrected = (u + &*r).flatten(0, -1);
                let numel = corrected.size()[0];
                let k = ((numel as f64 * self.fraction).ceil() as i64).clamp(1, numel);
                let (_, indices) = corrected.abs().topk(k, 0, true, false);
                let values = corrected.gather(0, &indices, false);
                let sent = corrected
                    .zeros_like()
                    .scatter(0, &indices, &values)
                    .view(u.size().as_slice());
                *r = (u + &*r) - sent;
                Payload::Sparse {
                    indices,
                    values,
                    shape: u.size(),
                    value_bits: 32,
                    index_bits: 32,
                }
            })
            .collect();
        Message::new(payloads)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.residual
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("residual.{i}"), r.shallow_clone()))
            .collect()
    }
}

impl CompressorFactory for TopKFeedback {
    fn name(&self) -> String {
        format!("top-{}% with error feedback", 100.0 * self.fraction)
    }

    fn encoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Encoder>> {
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(Error::bad_value(
                "fraction",
                format!(
                    "{}: expected a share of the entries in (0, 1]",
                    self.fraction
                ),
            ));
        }
        let residual = shapes
            .iter()
            .map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, device)))
            .collect();
        Ok(Box::new(TopKEncoder {
            fraction: self.fraction,
            residual,
        }))
    }

    fn decoder(&self, _shapes: &[Vec<i64>], _device: Device) -> Result<Box<dyn Decoder>> {
        Ok(Box::new(Unpack::per_parameter()))
    }
}

/// Two linear layers with a ReLU between them.
pub struct Mlp {
    vs: nn::VarStore,
    hidden: Linear,
    out: Linear,
}

impl Mlp {
    pub fn new(seed: i64) -> Result<Self> {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let hidden = Linear::new(
            &(vs.root() / "hidden"),
            FEATURES,
            32,
            LinearConfig::default(),
        )?;
        let out = Linear::new(&(vs.root() / "out"), 32, 2, LinearConfig::default())?;
        Ok(Mlp { vs, hidden, out })
    }
}

impl Model for Mlp {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Rows(x) = features else {
            return Err(Error::bad_value("features", "expected rows [B, 8]"));
        };
        let h = self.hidden.forward(x, ctx)?.relu();
        self.out.forward(&h, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

const FEATURES: i64 = 8;

/// `n` rows of 8 N(0, 1) features; label 1 when x_0 + x_1 > 0.
fn rows(n: i64, seed: i64) -> Dataset {
    tch::manual_seed(seed);
    let x = Tensor::randn([n, FEATURES], (Kind::Float, Device::Cpu));
    let y = (x.select(1, 0) + x.select(1, 1)).gt(0.0);
    Dataset::new(Features::Rows(x), y.to_kind(Kind::Int64), None)
}

pub fn data() -> TaskData {
    TaskData {
        train: rows(6000, 1),
        test: rows(2000, 2),
        classes: vec!["negative".into(), "positive".into()],
    }
}

/// The run's own settings: its name, epochs and batch size (q = 1 / ⌈6000 / 100⌉ = 1/60).
pub fn config(epochs: usize) -> TrainConfig {
    let mut config = TrainConfig::new("synthetic-mlp");
    config.epochs = epochs;
    config.optimizer.batch_size = 100;
    config.device = DeviceChoice::Cpu;
    config
}

/// ε 2 at δ 1e-5 over the run's epochs, clipping at 1.
pub fn privacy() -> dpcomp::privacy::builder::PrivacyEngineBuilder {
    PrivacyEngine::builder()
        .target_epsilon(2.0)
        .delta(1e-5)
        .max_grad_norm(1.0)
}

/// Trains (or continues) the run in `run_dir` to `epochs` epochs with the parts above;
/// `observer` hears of its progress.
pub fn train(
    run_dir: &Path,
    epochs: usize,
    observer: Option<Box<dyn Observer>>,
) -> Result<Summary> {
    let builder = Trainer::builder(run_dir);
    let builder = if run_dir.join("config.toml").exists() {
        builder.resume(TrainOverrides {
            epochs: Some(epochs),
            ..TrainOverrides::default()
        })
    } else {
        builder.config(config(epochs)).privacy(privacy())
    };
    let mut builder = builder
        .model(Box::new(Mlp::new(0)?), data())
        .optimizer(Box::new(Nesterov::new(0.2, 0.9)))
        .compressor(Box::new(TopKFeedback { fraction: 0.1 }));
    if let Some(observer) = observer {
        builder = builder.observer(observer);
    }
    builder.build()?.run()
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run_dir = args.first().map_or("runs/own-parts", String::as_str);
    let epochs = args
        .get(1)
        .map_or(Ok(4), |e| e.parse())
        .map_err(|e| Error::bad_value("epochs", format!("{e}: expected a whole number")))?;
    let bars = Box::new(dpcomp::train::observer::ProgressBars::default());
    let summary = train(Path::new(run_dir), epochs, Some(bars))?;
    println!(
        "{}: test accuracy {:.1}% after {} epochs, ε {:.3} at δ {}, {} sent {:.4} Gb",
        run_dir,
        100.0 * summary.last_test_accuracy,
        summary.epochs,
        summary.epsilon.unwrap_or(f64::NAN),
        summary.delta.unwrap_or(f64::NAN),
        summary.compressor,
        summary.upstream_gigabits
    );
    Ok(())
}
