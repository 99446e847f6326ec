//! A CNN of one's own on a subset of CIFAR-10, trained privately to a target ε with DGC, twice:
//! through dpcomp's `Trainer` (which calibrates σ, samples, clips, noises, compresses, accounts,
//! checkpoints and resumes) and through a loop of one's own (the engine, the updater and Poisson
//! batches, each a few lines). Both sample as Opacus's `make_private` does for a data loader of
//! batch size B over N images, q = 1 / ⌈N / B⌉ (the builder's `batch_size`), so both calibrate
//! the same σ for the same ε and spend it alike.
//!
//! ```text
//! cargo run --release --example cifar_cnn -- [trainer|loop] [train images 6400] [epochs 5] [epsilon 8]
//! ```
//!
//! CIFAR-10 is read from `$DPCOMP_DATA/cifar-10-batches-bin` (`dpcomp data fetch cifar10`).

use dpcomp::prelude::*;
use std::path::Path;
use tch::{nn, Device, Reduction, Tensor};

/// Conv 3→16 → ReLU → AvgPool 2 → Conv 16→32 → ReLU → AvgPool 2 → Linear 2048→10, with group
/// norms (per-example statistics, so they do not mix a batch's examples as batch norm would).
pub struct SmallCnn {
    vs: nn::VarStore,
    convs: [(Conv2d, GroupNorm); 2],
    head: Linear,
}

impl SmallCnn {
    /// The network's weights drawn from `seed`, on `device`.
    pub fn new(seed: i64, device: Device) -> Result<Self> {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let same = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        let convs = [
            (
                Conv2d::new(&(&root / "conv1"), 3, 16, 3, same)?,
                GroupNorm::new(&(&root / "norm1"), 4, 16)?,
            ),
            (
                Conv2d::new(&(&root / "conv2"), 16, 32, 3, same)?,
                GroupNorm::new(&(&root / "norm2"), 4, 32)?,
            ),
        ];
        let head = Linear::new(&(&root / "head"), 32 * 8 * 8, 10, LinearConfig::default())?;
        Ok(SmallCnn { vs, convs, head })
    }
}

impl Model for SmallCnn {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Images(xs) = features else {
            return Err(Error::bad_value(
                "features",
                "expected images [B, 3, 32, 32]",
            ));
        };
        let mut xs = xs.shallow_clone();
        for (conv, norm) in &self.convs {
            let ys = norm.forward(&conv.forward(&xs, ctx)?, ctx)?.relu();
            xs = ys.avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None::<i64>);
        }
        self.head.forward(&xs.flatten(1, -1), ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

/// What a run ended with.
#[derive(Debug)]
pub struct Outcome {
    pub test_accuracy: f64,
    pub epsilon: f64,
    pub noise_multiplier: f64,
    pub upstream_bits: u64,
}

/// The settings both programs share: the first `train_images` images, 2,000 test images, an
/// expected batch of 128, C = 1, δ = 1e-5, SGD at lr 0.5 with momentum 0.9, DGC at rate 16.
pub struct Settings {
    pub train_images: i64,
    pub epochs: usize,
    pub target_epsilon: f64,
    pub seed: i64,
}

const BATCH: usize = 128;
const TEST_IMAGES: i64 = 2000;

fn cifar10() -> Result<TaskData> {
    let root = dpcomp::data::data_dir(None);
    dpcomp::data::cifar::load_cifar10(&root.join("cifar-10-batches-bin"), false)
}

/// Through the `Trainer`: the private setup is the configuration's lines.
pub fn with_trainer(run_dir: &Path, s: &Settings) -> Result<Outcome> {
    let mut config = TrainConfig::new("cifar10-subset-cnn");
    config.epochs = s.epochs;
    config.seed = s.seed as u64;
    config.data.limit_train = Some(s.train_images as usize);
    config.data.limit_test = Some(TEST_IMAGES as usize);
    config.optimizer.batch_size = BATCH;
    config.optimizer.lr = 0.5;
    config.optimizer.momentum = 0.9;
    config.privacy.target_epsilon = Some(s.target_epsilon);
    config.privacy.max_grad_norm = 1.0;
    config.set_compressor(&Compressor::dgc(16.0))?;
    // The model is built where the run trains: `device = "auto"` is CUDA when there is a GPU.
    let device = config.device.device()?;
    let model = Box::new(SmallCnn::new(s.seed, device)?);
    let mut trainer = Trainer::builder(run_dir)
        .config(config)
        .model(model, cifar10()?)
        .build()?;
    let summary = trainer.run()?;
    Ok(Outcome {
        test_accuracy: summary.last_test_accuracy,
        epsilon: summary.epsilon.unwrap_or(f64::NAN),
        noise_multiplier: trainer
            .privacy()
            .map_or(0.0, PrivacyEngine::noise_multiplier),
        upstream_bits: (summary.upstream_gigabits * 1e9).round() as u64,
    })
}

/// Through a loop of one's own: the engine, the updater, Poisson batches.
pub fn with_own_loop(s: &Settings) -> Result<Outcome> {
    let data = cifar10()?;
    let (train, test) = (
        data.train.truncate(s.train_images),
        data.test.truncate(TEST_IMAGES),
    );
    let model = SmallCnn::new(s.seed, Device::Cpu)?;
    let params = model.trainable_variables();
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let mut engine = PrivacyEngine::builder()
        .target_epsilon(s.target_epsilon)
        .delta(1e-5)
        .epochs(s.epochs as u64)
        .dataset_size(train.len() as u64)
        .batch_size(BATCH as u64) // q = 1 / ⌈N / B⌉, as the Trainer's optimizer.batch_size
        .max_grad_norm(1.0)
        .build(&params)?;
    let mut updater =
        Updater::with_compressor(Sgd::new(0.5, 0.9), &Compressor::dgc(16.0), &tensors)?;
    let mut upstream_bits = 0;
    for epoch in 0..s.epochs {
        let steps = engine.steps_per_epoch() as usize;
        for index in poisson_batches(train.len(), engine.sample_rate(), steps) {
            let batch = train.batch(&index, Device::Cpu, true);
            let mut ctx = Ctx::private();
            let logits = model.forward(&batch.features, &mut ctx)?;
            let loss =
                logits.cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::Sum, -100, 0.0);
            let per_sample = per_sample_of(&mut ctx, &params, &loss)?;
            let grads = engine.privatize(&engine.clip(&per_sample))?; // noise + accountant step
            upstream_bits += updater.apply(epoch, &tensors, &grads)?;
        }
    }
    let (_, test_accuracy) = evaluate(&model, &test, 1024, Device::Cpu)?;
    Ok(Outcome {
        test_accuracy,
        epsilon: engine.epsilon()?,
        noise_multiplier: engine.noise_multiplier(),
        upstream_bits,
    })
}

#[allow(dead_code)] // a test includes this file as a module
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |k: usize, default: f64| -> Result<f64> {
        args.get(k).map_or(Ok(default), |a| {
            a.parse().map_err(|_| {
                Error::bad_value(
                    format!("argument {}", k + 1),
                    format!("{a:?}: expected a number"),
                )
            })
        })
    };
    let settings = Settings {
        train_images: number(1, 6400.0)? as i64,
        epochs: number(2, 5.0)? as usize,
        target_epsilon: number(3, 8.0)?,
        seed: 0,
    };
    let out = match args.first().map_or("trainer", String::as_str) {
        "trainer" => with_trainer(Path::new("runs/cifar-cnn"), &settings)?,
        "loop" => with_own_loop(&settings)?,
        other => {
            return Err(Error::bad_value(
                "argument 1",
                format!("{other:?}: expected trainer or loop"),
            ))
        }
    };
    println!(
        "test accuracy {:.1}%, ε {:.3} at δ 1e-5 (σ {:.4}), {:.1} Mb sent",
        100.0 * out.test_accuracy,
        out.epsilon,
        out.noise_multiplier,
        out.upstream_bits as f64 / 1e6
    );
    Ok(())
}
