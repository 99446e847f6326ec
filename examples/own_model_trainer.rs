//! Bring your own model and data, and let dpcomp's `Trainer` run it: Poisson sampling, the
//! privacy engine and its accountant, a compressor (DGC), checkpoints every epoch, metrics, and
//! a resume that continues exactly. The model is a GRU over sequences of vectors, written from
//! dpcomp's layers in this file; the data are synthetic (label: whether the first feature sums
//! to more than zero over the sequence), held as `Features::Rows`.
//!
//! ```text
//! cargo run --release --example own_model_trainer -- [run folder, default runs/own-gru] [epochs 6]
//! ```
//!
//! Run it twice with a larger epoch count the second time: it resumes the folder's run.

use dpcomp::prelude::*;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// GRU over the sequence, then a linear layer on its last state.
pub struct SequenceClassifier {
    vs: nn::VarStore,
    gru: Gru,
    head: Linear,
}

impl SequenceClassifier {
    pub fn new(seed: i64) -> Result<Self> {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let gru = Gru::new(&(vs.root() / "gru"), FEATURES, 16)?;
        let head = Linear::new(&(vs.root() / "head"), 16, 2, LinearConfig::default())?;
        Ok(SequenceClassifier { vs, gru, head })
    }
}

impl Model for SequenceClassifier {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Rows(xs) = features else {
            return Err(Error::bad_value("features", "expected rows [B, T, 4]"));
        };
        let states = self.gru.forward(xs, ctx)?;
        let last = states.select(1, states.size()[1] - 1);
        self.head.forward(&last, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

const FEATURES: i64 = 4;
const STEPS: i64 = 10;

/// `n` sequences [n, 10, 4] of N(0, 1) values; label 1 when Σ_t x_t0 > 0.
fn sequences(n: i64, seed: i64) -> Dataset {
    tch::manual_seed(seed);
    let xs = Tensor::randn([n, STEPS, FEATURES], (Kind::Float, Device::Cpu));
    let labels = xs
        .select(2, 0)
        .sum_dim_intlist(1, false, Kind::Float)
        .gt(0.0);
    Dataset::new(Features::Rows(xs), labels.to_kind(Kind::Int64), None)
}

pub fn data() -> TaskData {
    TaskData {
        train: sequences(4000, 1),
        test: sequences(1000, 2),
        classes: vec!["negative".into(), "positive".into()],
    }
}

/// DP-SGD at σ 1 with momentum, DGC at rate 4, batches of 100 of 4000 (q = 1/40).
pub fn config(epochs: usize) -> TrainConfig {
    let mut config = TrainConfig::new("synthetic-gru");
    config.epochs = epochs;
    config.optimizer.batch_size = 100;
    config.optimizer.lr = 0.1;
    config.optimizer.momentum = 0.9;
    config.privacy.noise_multiplier = Some(1.0);
    config.privacy.max_grad_norm = 1.0;
    config.compression.compressor = Compressor::dgc(4.0);
    config.device = DeviceChoice::Cpu;
    config
}

/// Trains (or continues) the run in `run_dir` to `epochs` epochs.
pub fn train(run_dir: &Path, epochs: usize, progress: bool) -> Result<Summary> {
    let model = Box::new(SequenceClassifier::new(0)?);
    let mut trainer = if run_dir.join("config.toml").exists() {
        let more = TrainOverrides {
            epochs: Some(epochs),
            ..TrainOverrides::default()
        };
        Trainer::builder(run_dir)
            .resume(more)
            .model(model, data())
            .build()?
    } else {
        Trainer::builder(run_dir)
            .config(config(epochs))
            .model(model, data())
            .build()?
    };
    if progress {
        trainer.observe(Box::new(dpcomp::train::observer::ProgressBars::default()));
    }
    trainer.run()
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run_dir = args.first().map_or("runs/own-gru", String::as_str);
    let epochs = args
        .get(1)
        .map_or(Ok(6), |e| e.parse())
        .map_err(|e| Error::bad_value("epochs", format!("{e}: expected a whole number")))?;
    let summary = train(Path::new(run_dir), epochs, true)?;
    println!(
        "{}: test accuracy {:.1}% after {} epochs, ε {:.2} at δ {}, {} sent {:.4} Gb",
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
