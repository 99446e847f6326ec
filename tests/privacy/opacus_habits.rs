//! What a program ported from Opacus brings with it: a mean-reduced loss, a batch size rather
//! than an expected batch, a batch larger than the data, a δ of 1/N or more. Each is either
//! handled as Opacus handles it or refused (or warned about) the same way by the privacy
//! engine's builder and by the `Trainer`.

use crate::common;
use common::{serial, Draws};
use dpcomp::prelude::*;
use std::sync::{Mutex, OnceLock};
use tch::{nn, Device, Kind, Reduction, Tensor};

/// A two-layer network of dpcomp's own layers.
struct Mlp {
    vs: nn::VarStore,
    hidden: Linear,
    out: Linear,
}

impl Mlp {
    fn new(seed: i64) -> Mlp {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let hidden = Linear::new(&(&root / "hidden"), 5, 7, LinearConfig::default()).unwrap();
        let out = Linear::new(&(&root / "out"), 7, 3, LinearConfig::default()).unwrap();
        Mlp { vs, hidden, out }
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut params: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        params
    }
}

impl Model for Mlp {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> dpcomp::error::Result<Tensor> {
        let Features::Rows(xs) = features else {
            return Err(Error::bad_value("features", "expected rows [B, 5]"));
        };
        let h = self.hidden.forward(xs, ctx)?.relu();
        self.out.forward(&h, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

/// The per-sample gradients of `reduction`'s loss over a batch of 8, clipped by an engine told
/// that reduction at radius `c` and σ 0: (norms, the update `privatize` returns).
fn clip_with(net: &Mlp, reduction: LossReduction, c: f64) -> (Tensor, Vec<Tensor>) {
    let mut draws = Draws::new(54);
    let xs = draws.randn(&[8, 5], Kind::Float) * 3.0;
    let labels = Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 2, 1]);
    let params = net.params();
    let mut engine = PrivacyEngine::builder()
        .noise_multiplier(0.0)
        .delta(1e-5)
        .dataset_size(400)
        .batch_size(8)
        .max_grad_norm(c)
        .loss_reduction(reduction)
        .build(&params)
        .unwrap();
    let mut ctx = Ctx::private();
    let logits = net.forward(&Features::Rows(xs), &mut ctx).unwrap();
    let torch_reduction = match reduction {
        LossReduction::Sum => Reduction::Sum,
        LossReduction::Mean => Reduction::Mean,
    };
    let loss = logits.cross_entropy_loss::<Tensor>(&labels, None, torch_reduction, -100, 0.0);
    let per_sample = per_sample_of(&mut ctx, &params, &loss).unwrap();
    let clipped = engine.clip(&per_sample);
    let update = engine.privatize(&clipped).unwrap();
    (clipped.norms, update)
}

/// Each example's gradient norm by autograd alone, one backward pass per example.
fn autograd_norms(net: &Mlp) -> Vec<f64> {
    let mut draws = Draws::new(54);
    let xs = draws.randn(&[8, 5], Kind::Float) * 3.0;
    let labels = Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 2, 1]);
    let params = net.params();
    (0..8)
        .map(|i| {
            let mut ctx = Ctx::private();
            let x = xs.narrow(0, i, 1);
            let logits = net.forward(&Features::Rows(x), &mut ctx).unwrap();
            let loss = logits.cross_entropy_loss::<Tensor>(
                &labels.narrow(0, i, 1),
                None,
                Reduction::Sum,
                -100,
                0.0,
            );
            let refs: Vec<&Tensor> = params.iter().map(|(_, p)| p).collect();
            let grads = Tensor::run_backward(&[&loss], &refs, false, false);
            grads
                .iter()
                .map(|g| g.square().sum(Kind::Double).double_value(&[]))
                .sum::<f64>()
                .sqrt()
        })
        .collect()
}

/// A mean-reduced loss told to the engine (`LossReduction::Mean`, Opacus's
/// `loss_reduction="mean"`) clips the same per-example gradients as the summed loss: the same
/// norms (each example's own, by autograd), the same clipped and noised update. Before the
/// setting existed a mean loss gave norms B = 8 times too small, and a radius that never bound.
#[test]
fn a_mean_loss_clips_as_the_summed_loss_when_the_engine_is_told() {
    let _guard = serial();
    let net = Mlp::new(3);
    let expected = autograd_norms(&net);
    let (sum_norms, sum_update) = clip_with(&net, LossReduction::Sum, 1.0);
    let (mean_norms, mean_update) = clip_with(&net, LossReduction::Mean, 1.0);
    let sum_norms: Vec<f64> = Vec::<f64>::try_from(sum_norms.to_kind(Kind::Double)).unwrap();
    let mean_norms: Vec<f64> = Vec::<f64>::try_from(mean_norms.to_kind(Kind::Double)).unwrap();
    for i in 0..8 {
        assert!(
            (sum_norms[i] - expected[i]).abs() < 1e-5 * expected[i],
            "sum, example {i}: {} vs autograd {}",
            sum_norms[i],
            expected[i]
        );
        assert!(
            (mean_norms[i] - expected[i]).abs() < 1e-5 * expected[i],
            "mean, example {i}: {} vs autograd {}",
            mean_norms[i],
            expected[i]
        );
    }
    // The radius binds: some example's gradient is longer than 1.
    assert!(expected.iter().any(|&n| n > 1.0), "{expected:?}");
    for (s, m) in sum_update.iter().zip(&mean_update) {
        assert!(s.allclose(m, 1e-5, 1e-7, false), "{s:?} vs {m:?}");
    }
    // A mean loss given to an engine that expects the sum (the default) has per-sample
    // gradients 1/B of the examples' own: what the setting is for.
    tch::manual_seed(0);
    let mut ctx = Ctx::private();
    let mut draws = Draws::new(54);
    let xs = draws.randn(&[8, 5], Kind::Float) * 3.0;
    let labels = Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 2, 1]);
    let logits = net.forward(&Features::Rows(xs), &mut ctx).unwrap();
    let loss = logits.cross_entropy_loss::<Tensor>(&labels, None, Reduction::Mean, -100, 0.0);
    let per_sample = per_sample_of(&mut ctx, &net.params(), &loss).unwrap();
    let engine = PrivacyEngine::builder()
        .noise_multiplier(0.0)
        .delta(1e-5)
        .dataset_size(400)
        .batch_size(8)
        .max_grad_norm(1.0)
        .build(&net.params())
        .unwrap();
    assert_eq!(engine.loss_reduction(), LossReduction::Sum);
    let norms: Vec<f64> =
        Vec::<f64>::try_from(engine.clip(&per_sample).norms.to_kind(Kind::Double)).unwrap();
    assert!((norms[0] * 8.0 - expected[0]).abs() < 1e-5 * expected[0]);
}

/// The builder's `batch_size` samples as the `Trainer` does for `optimizer.batch_size`
/// (q = 1 / ⌈N / B⌉, ⌈N / B⌉ steps an epoch, dividing by qN), so the same settings calibrate
/// the same σ: Opacus's `make_private_with_epsilon` on a data loader of batch 256 over 50,000
/// examples, ε 8 at δ 1e-5, 20 epochs. `expected_batch_size` keeps q = E / N exactly, which
/// differs when B does not divide N.
#[test]
fn the_builder_and_the_trainer_sample_the_same_batch_size_alike() {
    let build = |b: PrivacyEngineBuilderFn| {
        b(PrivacyEngine::builder()
            .target_epsilon(8.0)
            .delta(1e-5)
            .epochs(20)
            .dataset_size(50_000)
            .max_grad_norm(1.0))
        .build(&[Tensor::zeros([2], (Kind::Float, Device::Cpu))])
        .unwrap()
    };
    let by_batch = build(|b| b.batch_size(256));
    assert_eq!(by_batch.sample_rate(), 1.0 / 196.0); // ⌈50,000 / 256⌉ = 196
    assert_eq!(by_batch.steps_per_epoch(), 196);
    assert_eq!(by_batch.steps_left(), Some(20 * 196));
    assert_eq!(by_batch.expected_batch_size(), 50_000.0 / 196.0);
    // The trainer's own calibration and engine for the same N, B, epochs, ε and δ.
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut config = TrainConfig::new("sigma-check");
    config.device = DeviceChoice::Cpu;
    config.epochs = 20;
    config.optimizer.batch_size = 256;
    config.privacy.target_epsilon = Some(8.0);
    config.privacy.delta = 1e-5;
    let data = TaskData {
        train: Dataset::new(
            Features::Rows(Tensor::zeros([50_000, 5], (Kind::Float, Device::Cpu))),
            Tensor::zeros([50_000], (Kind::Int64, Device::Cpu)),
            None,
        ),
        test: Dataset::new(
            Features::Rows(Tensor::zeros([4, 5], (Kind::Float, Device::Cpu))),
            Tensor::zeros([4], (Kind::Int64, Device::Cpu)),
            None,
        ),
        classes: vec!["a".into(), "b".into(), "c".into()],
    };
    let trainer = Trainer::builder(dir.path().join("run"))
        .config(config)
        .model(Box::new(Mlp::new(4)), data)
        .build()
        .unwrap();
    let engine = trainer.privacy().unwrap();
    assert_eq!(trainer.sample_rate(), by_batch.sample_rate());
    assert_eq!(trainer.steps_per_epoch() as u64, by_batch.steps_per_epoch());
    assert_eq!(engine.sample_rate(), by_batch.sample_rate());
    assert_eq!(engine.expected_batch_size(), by_batch.expected_batch_size());
    assert_eq!(engine.noise_multiplier(), by_batch.noise_multiplier());
    // E[B] = 256 exactly: q = 256 / 50,000, a slightly larger q and so a larger σ.
    let by_expected = build(|b| b.expected_batch_size(256.0));
    assert_eq!(by_expected.sample_rate(), 256.0 / 50_000.0);
    assert!(by_expected.noise_multiplier() > by_batch.noise_multiplier());
    // B dividing N: the two rules agree.
    let divides = |b: PrivacyEngineBuilderFn| {
        b(PrivacyEngine::builder()
            .noise_multiplier(1.0)
            .delta(1e-5)
            .dataset_size(51_200))
        .max_grad_norm(1.0)
        .build(&[Tensor::zeros([2], (Kind::Float, Device::Cpu))])
        .unwrap()
        .sample_rate()
    };
    assert_eq!(
        divides(|b| b.batch_size(256)),
        divides(|b| b.expected_batch_size(256.0))
    );
}

type PrivacyEngineBuilderFn = fn(
    dpcomp::privacy::builder::PrivacyEngineBuilder,
) -> dpcomp::privacy::builder::PrivacyEngineBuilder;

/// A batch larger than the data set: the builder refuses it (`batch_size` or
/// `expected_batch_size`, naming the data set's size), and so does a private `Trainer`, naming
/// `optimizer.batch_size`, instead of training at q = 1.
#[test]
fn a_batch_larger_than_the_data_is_refused_by_the_builder_and_the_trainer() {
    let params = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
    let base = || {
        PrivacyEngine::builder()
            .noise_multiplier(1.0)
            .delta(1e-5)
            .dataset_size(100)
            .max_grad_norm(1.0)
    };
    let e = base()
        .batch_size(200)
        .build(&params)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("batch_size") && e.contains("200") && e.contains("100 examples"),
        "{e}"
    );
    let e = base()
        .expected_batch_size(200.0)
        .build(&params)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("expected_batch_size") && e.contains("200") && e.contains("dataset_size 100"),
        "{e}"
    );
    assert!(base().batch_size(100).build(&params).is_ok());

    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut config = TrainConfig::new("big-batch");
    config.device = DeviceChoice::Cpu;
    config.epochs = 1;
    config.optimizer.batch_size = 64;
    config.privacy.noise_multiplier = Some(1.0);
    let data = || {
        let mut draws = Draws::new(7);
        let rows = |n: i64, draws: &mut Draws| {
            Dataset::new(
                Features::Rows(draws.randn(&[n, 5], Kind::Float)),
                Tensor::zeros([n], (Kind::Int64, Device::Cpu)),
                None,
            )
        };
        TaskData {
            train: rows(40, &mut draws),
            test: rows(10, &mut draws),
            classes: vec!["a".into(), "b".into(), "c".into()],
        }
    };
    let e = Trainer::builder(dir.path().join("run"))
        .config(config.clone())
        .model(Box::new(Mlp::new(1)), data())
        .build()
        .err()
        .expect("a batch of 64 over 40 examples is refused")
        .to_string();
    assert!(
        e.contains("optimizer.batch_size") && e.contains("64") && e.contains("40 examples"),
        "{e}"
    );
    // Without privacy the batch is only capped (no sampling rate is claimed).
    config.privacy.noise_multiplier = None;
    assert!(Trainer::builder(dir.path().join("plain"))
        .config(config)
        .model(Box::new(Mlp::new(1)), data())
        .build()
        .is_ok());
}

/// The warnings the library sent through the `log` facade, kept by this test binary's logger.
fn warnings() -> &'static Mutex<Vec<String>> {
    static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    static LOGGER: Keep = Keep;
    struct Keep;
    impl log::Log for Keep {
        fn enabled(&self, metadata: &log::Metadata) -> bool {
            metadata.level() <= log::Level::Warn
        }
        fn log(&self, record: &log::Record) {
            if self.enabled(record.metadata()) {
                warnings().lock().unwrap().push(record.args().to_string());
            }
        }
        fn flush(&self) {}
    }
    WARNINGS.get_or_init(|| {
        let _ = log::set_logger(&LOGGER);
        log::set_max_level(log::LevelFilter::Warn);
        Mutex::new(Vec::new())
    })
}

/// δ ≥ 1/N is accepted (it is a valid δ) but warned about through `log`, by the builder and by
/// the trainer (whose engine the builder makes); δ below 1/N is not.
#[test]
fn a_delta_of_one_over_n_or_more_is_warned_about() {
    let _guard = serial();
    let said = |f: &dyn Fn()| {
        warnings().lock().unwrap().clear();
        f();
        let w = warnings().lock().unwrap().clone();
        w.into_iter()
            .filter(|w| w.contains("delta"))
            .collect::<Vec<_>>()
    };
    let params = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
    let engine = |delta: f64| {
        PrivacyEngine::builder()
            .noise_multiplier(1.0)
            .delta(delta)
            .dataset_size(1_000)
            .batch_size(10)
            .max_grad_norm(1.0)
            .build(&params)
            .unwrap();
    };
    let w = said(&|| engine(0.5));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("0.5") && w[0].contains("1 / 1000"), "{w:?}");
    assert_eq!(said(&|| engine(1e-3)).len(), 1); // exactly 1/N
    assert!(said(&|| engine(1e-5)).is_empty());

    let dir = tempfile::tempdir().unwrap();
    let w = said(&|| {
        let mut config = TrainConfig::new("weak-delta");
        config.device = DeviceChoice::Cpu;
        config.epochs = 1;
        config.optimizer.batch_size = 8;
        config.privacy.noise_multiplier = Some(1.0);
        config.privacy.delta = 0.5;
        let mut draws = Draws::new(8);
        let rows = |n: i64, draws: &mut Draws| {
            Dataset::new(
                Features::Rows(draws.randn(&[n, 5], Kind::Float)),
                Tensor::zeros([n], (Kind::Int64, Device::Cpu)),
                None,
            )
        };
        let data = TaskData {
            train: rows(40, &mut draws),
            test: rows(10, &mut draws),
            classes: vec!["a".into(), "b".into(), "c".into()],
        };
        Trainer::builder(dir.path().join("run"))
            .config(config)
            .model(Box::new(Mlp::new(2)), data)
            .build()
            .unwrap();
    });
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("1 / 40"), "{w:?}");
}

/// A model built from `tch::nn::Linear` (which records nothing on the tape) is refused, and the
/// refusal names dpcomp's `Linear`, the layer to build it from instead.
#[test]
fn a_tch_linear_is_refused_naming_dpcomps_linear() {
    let vs = nn::VarStore::new(Device::Cpu);
    let layer = nn::linear(vs.root() / "fc", 3, 2, Default::default());
    let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    let mut ctx = Ctx::private();
    let xs = Tensor::ones([4, 3], (Kind::Float, Device::Cpu));
    let loss = nn::Module::forward(&layer, &xs).sum(Kind::Float);
    let e = per_sample_of(&mut ctx, &params, &loss)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("escape clipping") && e.contains("dpcomp::nn::Linear"),
        "{e}"
    );
}

/// The CIFAR normalisation constants are public, for using a model trained here elsewhere.
#[test]
fn the_cifar_normalisation_constants_are_public() {
    use dpcomp::data::cifar::{CIFAR100_MEAN, CIFAR100_STD, CIFAR10_MEAN, CIFAR10_STD};
    assert_eq!(CIFAR10_MEAN, [0.4914, 0.4822, 0.4465]);
    assert_eq!(CIFAR10_STD, [0.2470, 0.2435, 0.2616]);
    assert_eq!((CIFAR100_MEAN[0], CIFAR100_STD[0]), (0.5071, 0.2673));
}

/// `Dataset::truncated` borrows: the subset and the whole set side by side.
#[test]
fn a_data_set_is_truncated_without_giving_it_up() {
    let rows = Tensor::arange(12, (Kind::Float, Device::Cpu)).view([6, 2]);
    let whole = Dataset::new(
        Features::Rows(rows),
        Tensor::zeros([6], (Kind::Int64, Device::Cpu)),
        None,
    );
    let subset = whole.truncated(4);
    assert_eq!((subset.len(), whole.len()), (4, 6));
    assert_eq!(whole.truncated(10).len(), 6);
    assert_eq!(whole.truncate(2).len(), 2);
}
