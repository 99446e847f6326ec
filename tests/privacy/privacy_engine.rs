//! The privacy engine (`privacy::engine`): flat and per-layer clipping against per-example
//! autograd, the noise's scale (σ x sensitivity, sqrt(Σ C_l²) per layer), one accounted step per
//! noised step, and settings it refuses; adaptive clipping (Andrew et al. 2021). Every test holds
//! `common::serial()`: LibTorch's generator is global, and draws made beside a trainer test would
//! shift that run's noise.

use crate::common;
use dpcomp::config::{AccountantKind, ClippingMode};
use dpcomp::data::{Batch, Features};
use dpcomp::models::Model;
use dpcomp::nn::{Ctx, Linear, LinearConfig};
use dpcomp::privacy::engine::{AdaptiveClipping, Clipped, Clipping, PrivacyEngine};
use dpcomp::train::private::per_sample_in_order;
use dpcomp_lab::bench::device_check::per_example_gradients;
use dpcomp_lab::Task;
use std::collections::HashMap;
use tch::{nn, Device, Kind, Tensor};

/// Linear -> tanh -> Linear on rows (`Features::Rows`).
struct Mlp {
    vs: nn::VarStore,
    first: Linear,
    last: Linear,
}

impl Mlp {
    fn new() -> Self {
        tch::manual_seed(8);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let first = Linear::new(&(&root / "first"), 5, 7, LinearConfig::default()).unwrap();
        let last = Linear::new(&(&root / "last"), 7, 3, LinearConfig::default()).unwrap();
        vs.double();
        Mlp { vs, first, last }
    }
}

impl Model for Mlp {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> dpcomp::error::Result<Tensor> {
        let Features::Rows(xs) = features else {
            panic!("rows expected");
        };
        let h = self.first.forward(xs, ctx)?.tanh();
        self.last.forward(&h, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

fn batch() -> Batch {
    tch::manual_seed(4);
    Batch {
        features: Features::Rows(Tensor::randn([8, 5], (Kind::Double, Device::Cpu)) * 2.0),
        labels: Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 0, 1]),
    }
}

fn engine(clipping: Clipping, parameters: usize) -> PrivacyEngine {
    common::engine(1.0, 0.25, 1.0, clipping, parameters).unwrap()
}

/// Clipped sums given directly (nothing clipped, `examples` summed), for the noise tests.
fn sums_of(sums: &[Tensor], examples: i64) -> Clipped {
    Clipped {
        sums: sums.iter().map(|s| s.shallow_clone()).collect(),
        norms: Tensor::zeros([examples], (Kind::Float, Device::Cpu)),
        clipped: Tensor::zeros([], (Kind::Int64, Device::Cpu)),
    }
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

/// Per-example norm of each parameter's oracle gradient, [B].
fn norms(g: &Tensor) -> Tensor {
    g.flatten(1, -1)
        .square()
        .sum_dim_intlist(1, false, Kind::Double)
        .sqrt()
}

fn weighted(g: &Tensor, c: &Tensor) -> Tensor {
    let mut shape = vec![-1i64];
    shape.extend(std::iter::repeat_n(1, g.dim() - 1));
    (g * c.view(shape.as_slice())).sum_dim_intlist(0, false, Kind::Double)
}

#[test]
fn flat_and_per_layer_clipping_equal_the_per_example_oracle() {
    let _serial = common::serial();
    let model = Mlp::new();
    let batch = batch();
    let params = model.trainable_variables();
    let oracle: HashMap<String, Tensor> =
        per_example_gradients(&model, &batch.features, &batch.labels).unwrap();
    let per_param: Vec<Tensor> = params.iter().map(|(n, _)| norms(&oracle[n])).collect();
    let total = Tensor::stack(&per_param, 0)
        .square()
        .sum_dim_intlist(0, false, Kind::Double)
        .sqrt();
    // Flat: the radius at the median total norm. Per layer: the first weight's radius at its
    // median norm, every other radius above all norms: some examples are clipped, in one
    // layer only, and their other layers are left whole.
    let median = |t: &Tensor| t.median().double_value(&[]);
    let per_layer: Vec<f64> = per_param
        .iter()
        .enumerate()
        .map(|(k, n)| match k {
            1 => median(n),
            _ => 2.0 * n.max().double_value(&[]),
        })
        .collect();
    assert_eq!(params[1].0, "first.weight");
    let cases = [
        (
            "flat",
            Clipping::Flat {
                max_norm: median(&total),
            },
        ),
        (
            "per layer",
            Clipping::PerLayer {
                max_norms: per_layer.clone(),
            },
        ),
        // Adaptive clipping clips like flat clipping at its current radius.
        (
            "adaptive",
            Clipping::Adaptive(AdaptiveClipping {
                radius: 0.8 * median(&total),
                target_quantile: 0.5,
                learning_rate: 0.2,
                count_noise: 1.0,
            }),
        ),
    ];
    for (label, clipping) in cases {
        let engine = engine(clipping.clone(), params.len());
        let recipes = per_sample_in_order(&model, &params, &batch, false).unwrap();
        let clipped = engine.clip(&recipes.per_sample);
        assert!(max_rel_diff(&clipped.norms, &total) < 1e-12, "{label}");
        let mut any_clipped = Tensor::zeros([8], (Kind::Bool, Device::Cpu));
        for (k, (name, _)) in params.iter().enumerate() {
            let radius = match &clipping {
                Clipping::Flat { max_norm } => *max_norm,
                Clipping::PerLayer { max_norms } => max_norms[k],
                Clipping::Adaptive(a) => a.radius,
            };
            let norm = match &clipping {
                Clipping::PerLayer { .. } => &per_param[k],
                _ => &total,
            };
            let factors = (radius / (norm + 1e-6)).clamp_max(1.0);
            any_clipped = any_clipped.logical_or(&factors.lt(1.0));
            let want = weighted(&oracle[name], &factors);
            assert!(
                max_rel_diff(&clipped.sums[k], &want) < 1e-12,
                "{label} {name}: {}",
                max_rel_diff(&clipped.sums[k], &want)
            );
            // No clipped example contributes more than its radius to any parameter.
            let contributions = norms(&oracle[name]) * &factors;
            assert!(contributions.max().double_value(&[]) <= radius * (1.0 + 1e-9));
        }
        let count = clipped.clipped.int64_value(&[]);
        assert_eq!(
            count,
            any_clipped.sum(Kind::Int64).int64_value(&[]),
            "{label}"
        );
        assert!(count > 0 && count < 8, "{label}: {count} of 8 clipped");
    }
    // The per-layer sensitivity is the norm of the radii.
    let s = Clipping::PerLayer {
        max_norms: per_layer.clone(),
    }
    .sensitivity();
    let want = per_layer.iter().map(|c| c * c).sum::<f64>().sqrt();
    assert!((s - want).abs() < 1e-12);
    let even = Clipping::per_layer_even(3.0, 4);
    assert_eq!(
        even,
        Clipping::PerLayer {
            max_norms: vec![1.5; 4]
        }
    );
    assert!((even.sensitivity() - 3.0).abs() < 1e-12);
}

#[test]
fn privatize_adds_noise_at_sigma_times_sensitivity_and_counts_one_step() {
    let _serial = common::serial();
    let clipping = Clipping::PerLayer {
        max_norms: vec![3.0, 4.0],
    };
    let mut engine = common::engine(0.7, 0.01, 10.0, clipping, 2).unwrap();
    assert!((engine.noise_std() - 0.7 * 5.0).abs() < 1e-12);
    tch::manual_seed(12);
    let zeros = [
        Tensor::zeros([300_000], (Kind::Double, Device::Cpu)),
        Tensor::zeros([200_000], (Kind::Double, Device::Cpu)),
    ];
    for step in 1..=3u64 {
        let noisy = engine.privatize(&sums_of(&zeros, 10)).unwrap();
        let all = Tensor::cat(&[noisy[0].shallow_clone(), noisy[1].shallow_clone()], 0) * 10.0;
        let std = all.std(true).double_value(&[]);
        // 500k draws: the sample std is within 0.5% of 3.5 with overwhelming probability.
        assert!((std / 3.5 - 1.0).abs() < 5e-3, "step {step}: std {std}");
        assert!(all.mean(Kind::Double).double_value(&[]).abs() < 0.05);
        assert_eq!(
            engine.accountant().steps(),
            step,
            "one accounted step per noised step"
        );
    }
}

/// `replay_noise` leaves the seeded generator where `steps` privatize calls leave it, so a
/// resumed run draws the uninterrupted run's next noise: the 4th step's noisy sum is the same
/// after 3 real steps as after a resume (their accountant and radius) with 3 replayed ones, for
/// flat and adaptive clipping (whose noisy count draws one more normal), and differs without
/// the replay. The replay itself counts nothing.
#[test]
fn replayed_noise_leaves_the_generator_where_the_steps_left_it() {
    let _serial = common::serial();
    let zeros = [
        Tensor::zeros([1_000], (Kind::Float, Device::Cpu)),
        Tensor::zeros([37], (Kind::Float, Device::Cpu)),
    ];
    let adaptive = || {
        Clipping::Adaptive(AdaptiveClipping {
            radius: 1.0,
            target_quantile: 0.5,
            learning_rate: 0.2,
            count_noise: 5.0,
        })
    };
    let flat = || Clipping::Flat { max_norm: 2.0 };
    for clipping in [flat as fn() -> Clipping, adaptive] {
        let label = clipping().label();
        let new_engine = || {
            tch::manual_seed(31);
            common::engine(0.9, 0.1, 4.0, clipping(), 2).unwrap()
        };
        let fourth = |engine: &mut PrivacyEngine| {
            Tensor::cat(&engine.privatize(&sums_of(&zeros, 4)).unwrap(), 0)
        };
        let mut stepped = new_engine();
        for _ in 0..3 {
            stepped.privatize(&sums_of(&zeros, 4)).unwrap();
        }
        let (accountant, radius) = (stepped.accountant().clone(), stepped.clip_radius());
        let expected = fourth(&mut stepped);
        // One generator for all: each engine's steps run before the next engine reseeds it.
        let mut resumed = new_engine();
        resumed.replay_noise(&zeros, 3);
        assert_eq!(
            resumed.accountant().steps(),
            0,
            "{label}: a replay counts nothing"
        );
        resumed.resume(accountant.clone(), radius).unwrap();
        assert!(fourth(&mut resumed).equal(&expected), "{label}");
        let mut unreplayed = new_engine();
        unreplayed.resume(accountant, radius).unwrap();
        assert!(!fourth(&mut unreplayed).equal(&expected), "{label}");
        assert_eq!(resumed.accountant().steps(), 4);
    }
}

#[test]
fn w_workers_each_draw_a_wth_of_the_noise_variance_and_their_sum_has_sigma_c() {
    let _serial = common::serial();
    let (sigma, c, workers) = (1.3, 2.0, 4usize);
    let zeros = [Tensor::zeros([400_000], (Kind::Double, Device::Cpu))];
    let mut total = Tensor::zeros([400_000], (Kind::Double, Device::Cpu));
    let mut single = common::engine(sigma, 0.02, 1.0, Clipping::Flat { max_norm: c }, 1).unwrap();
    single.privatize(&sums_of(&zeros, 10)).unwrap();
    let single_epsilon = single.epsilon().unwrap();
    for rank in 0..workers {
        // Each rank divides by E[B] / W; E[B] = W makes that 1, as the single engine's.
        let expected = workers as f64;
        let mut engine =
            common::engine(sigma, 0.02, expected, Clipping::Flat { max_norm: c }, 1).unwrap();
        engine.share_noise_among(workers).unwrap();
        assert!((engine.noise_std() - sigma * c / 2.0).abs() < 1e-12);
        // Each rank its own stream.
        tch::manual_seed(40 + rank as i64);
        let noisy = engine.privatize(&sums_of(&zeros, 10)).unwrap();
        let std = noisy[0].std(true).double_value(&[]);
        // 400k draws: the sample std is within 0.5% of σC/sqrt(W) with overwhelming probability.
        assert!(
            (std / (sigma * c / 2.0) - 1.0).abs() < 5e-3,
            "rank {rank}: std {std}"
        );
        total += &noisy[0];
        // The accountant counts the step at σ, as the single-process engine does.
        assert_eq!(engine.accountant().steps(), 1);
        assert_eq!(engine.epsilon().unwrap(), single_epsilon);
    }
    let std = total.std(true).double_value(&[]);
    assert!(
        (std / (sigma * c) - 1.0).abs() < 5e-3,
        "sum over ranks: std {std}"
    );
    // Adaptive clipping's count is per rank: refused with several workers.
    let adaptive = Clipping::Adaptive(AdaptiveClipping {
        radius: 1.0,
        target_quantile: 0.5,
        learning_rate: 0.2,
        count_noise: 10.0,
    });
    let mut engine = common::engine(sigma, 0.02, 1.0, adaptive, 1).unwrap();
    let message = engine.share_noise_among(2).unwrap_err().to_string();
    assert!(message.contains("adaptive with 2 workers"), "{message}");
    assert!(engine.share_noise_among(1).is_ok());
}

#[test]
fn the_engine_refuses_what_it_cannot_account() {
    let _serial = common::serial();
    let err = |r: dpcomp::error::Result<PrivacyEngine>| r.err().expect("refused").to_string();
    let flat = |c: f64| Clipping::Flat { max_norm: c };
    let e = err(common::engine(1.0, 0.1, 1.0, flat(f64::INFINITY), 2));
    assert!(e.contains("infinite"), "{e}");
    let e = err(common::engine(1.0, 0.1, 1.0, flat(-1.0), 2));
    assert!(e.contains("positive"), "{e}");
    let e = err(common::engine(1.0, 0.0, 1.0, flat(1.0), 2));
    assert!(e.contains("0 < q <= 1"), "{e}");
    let per_layer = Clipping::PerLayer {
        max_norms: vec![1.0; 3],
    };
    let e = err(common::engine(1.0, 0.1, 1.0, per_layer, 2));
    assert!(e.contains("3 radii for 2"), "{e}");
    // A checkpoint's history at another σ is refused on resume.
    let mut other = engine(flat(1.0), 2);
    let _ = other.privatize(&sums_of(
        &[Tensor::zeros([3], (Kind::Float, Device::Cpu))],
        1,
    ));
    let history = other.accountant().clone();
    let mut engine = common::engine(2.0, 0.25, 1.0, flat(1.0), 2).unwrap();
    let e = engine.resume(history, None).unwrap_err().to_string();
    assert!(
        e.contains("sigma 1 and q 0.25, but this run's are sigma 2"),
        "{e}"
    );
}

/// `--clipping per-layer` trains, is private at the same ε as flat clipping (same σ, q, steps,
/// sensitivity C), differs from it in the weights, and is refused without DP.
#[test]
fn per_layer_clipping_trains_at_the_flat_runs_epsilon() {
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let config = |clipping: ClippingMode| {
        let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
        c.epochs = 1;
        c.data.limit_train = Some(1280);
        c.data.limit_test = Some(256);
        c.data.data_dir = Some(root.clone());
        c.device = dpcomp::config::DeviceChoice::Cpu;
        c.privacy.noise_multiplier = Some(0.8);
        c.privacy.clipping = clipping;
        c
    };
    let run = |clipping: ClippingMode, name: &str| {
        let mut t = dpcomp_lab::tasks::start(config(clipping), work.path().join(name)).unwrap();
        let summary = t.run().unwrap();
        let weights: Vec<Tensor> = t.params().iter().map(|(_, p)| p.copy()).collect();
        (summary, weights)
    };
    let (flat, w_flat) = run(ClippingMode::Flat, "flat");
    let (layer, w_layer) = run(ClippingMode::PerLayer, "layer");
    assert_eq!(flat.epsilon, layer.epsilon);
    assert!(layer.epsilon.unwrap().is_finite());
    let moved: f64 = w_flat
        .iter()
        .zip(&w_layer)
        .map(|(a, b)| (a - b).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(moved > 1e-6, "per-layer clipping changed nothing");
    let mut plain = config(ClippingMode::PerLayer);
    plain.privacy.noise_multiplier = None;
    let e = dpcomp_lab::tasks::start(plain, work.path().join("plain"))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.starts_with("privacy.clipping:") && e.contains("`privacy.noise_multiplier`"),
        "{e}"
    );
}

/// The builder's `target_epsilon` (Opacus's `make_private_with_epsilon`): the σ it picks spends
/// at most the target over the planned steps, within 0.1% of it, on both accountants; it is
/// the σ `dpcomp epsilon --target-epsilon` prints; the engine's own accountant agrees after
/// those steps, and a step past the budget is refused without drawing noise or counting.
#[test]
fn the_builder_calibrates_sigma_and_holds_the_step_budget() {
    let _serial = common::serial();
    use dpcomp::privacy::calibrate::epsilon_with;
    // 4 epochs over 500 examples at an expected batch of 10: q = 1/50, 200 steps.
    let (n, batch, epochs, delta) = (500u64, 10.0, 4u64, 1e-5);
    let (q, steps) = (1.0 / 50.0, 200u64);
    for (kind, target) in [(AccountantKind::Rdp, 3.0), (AccountantKind::Pld, 1.5)] {
        let tiny = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
        let mut engine = PrivacyEngine::builder()
            .target_epsilon(target)
            .delta(delta)
            .accountant(kind)
            .epochs(epochs)
            .dataset_size(n)
            .expected_batch_size(batch)
            .max_grad_norm(1.0)
            .build(&tiny)
            .unwrap();
        assert_eq!(engine.steps_left(), Some(steps));
        assert_eq!(engine.sample_rate(), q);
        assert_eq!(engine.expected_batch_size(), batch);
        let sigma = engine.noise_multiplier();
        let eps = epsilon_with(kind, sigma, q, steps, delta).unwrap();
        assert!(
            eps <= target && eps > 0.999 * target,
            "{kind:?}: σ {sigma} gives ε {eps}"
        );
        // The command line calibrates the same σ.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args([
                "epsilon",
                "--json",
                "--target-epsilon",
                &target.to_string(),
                "--sample-rate",
                &q.to_string(),
                "--steps",
                &steps.to_string(),
                "--delta",
                &delta.to_string(),
                "--accountant",
                if kind == AccountantKind::Rdp {
                    "rdp"
                } else {
                    "pld"
                },
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["noise_multiplier"].as_f64(), Some(sigma), "{json}");
        for _ in 0..steps {
            engine.privatize(&sums_of(&tiny, 1)).unwrap();
        }
        assert_eq!(engine.epsilon().unwrap(), eps, "{kind:?}");
        assert_eq!(engine.steps_left(), Some(0));
        let e = engine
            .privatize(&sums_of(&tiny, 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("budget of 200 steps is spent"), "{e}");
        assert_eq!(
            engine.accountant().steps(),
            steps,
            "the refused step is not counted"
        );
    }
}

/// The builder names what is missing or contradictory.
#[test]
fn the_builder_names_the_setting_it_needs() {
    let params = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
    let complete = || {
        PrivacyEngine::builder()
            .noise_multiplier(1.0)
            .delta(1e-5)
            .dataset_size(100)
            .expected_batch_size(10.0)
            .max_grad_norm(1.0)
    };
    assert!(complete().build(&params).is_ok());
    let refused = |b: dpcomp::privacy::builder::PrivacyEngineBuilder| {
        b.build(&params).err().expect("refused").to_string()
    };
    let cases = [
        (
            PrivacyEngine::builder()
                .delta(1e-5)
                .dataset_size(100)
                .expected_batch_size(10.0)
                .max_grad_norm(1.0),
            "noise_multiplier: not set",
        ),
        (
            complete().target_epsilon(1.0),
            "target_epsilon: with noise_multiplier it is a budget that stops the training early, which needs the training's length",
        ),
        (
            PrivacyEngine::builder()
                .target_epsilon(1.0)
                .delta(1e-5)
                .dataset_size(100)
                .expected_batch_size(10.0)
                .max_grad_norm(1.0),
            "target_epsilon: needs the training's length",
        ),
        (
            PrivacyEngine::builder()
                .noise_multiplier(1.0)
                .dataset_size(100)
                .expected_batch_size(10.0)
                .max_grad_norm(1.0),
            "delta: not set",
        ),
        (
            PrivacyEngine::builder()
                .noise_multiplier(1.0)
                .delta(1e-5)
                .expected_batch_size(10.0)
                .max_grad_norm(1.0),
            "sample_rate: not enough sampling settings",
        ),
        (
            complete().sample_rate(0.5),
            "expected_batch_size: 10: differs from sample_rate 0.5 x dataset_size 100",
        ),
        (
            PrivacyEngine::builder()
                .noise_multiplier(1.0)
                .delta(1e-5)
                .dataset_size(100)
                .expected_batch_size(10.0),
            "max_grad_norm: not set",
        ),
        (
            complete().epochs(2).steps(3),
            "steps: set together with epochs",
        ),
        (complete().epochs(0), "epochs: 0"),
        (complete().delta(2.0), "delta: 2"),
        (
            complete().expected_batch_size(0.0),
            "expected_batch_size: 0",
        ),
    ];
    for (builder, expected) in cases {
        let e = refused(builder);
        assert!(e.starts_with(expected), "{e}\nexpected {expected}");
    }
    // The step budget from epochs: ⌈N / E[B]⌉ steps an epoch (the Trainer's count).
    let engine = complete()
        .expected_batch_size(30.0)
        .epochs(3)
        .build(&params)
        .unwrap();
    assert_eq!(engine.steps_left(), Some(12));
}

/// Per-sample gradients of one [B, 1] parameter whose norms are exactly 1, 2, ..., B.
fn fixed_norms(b: i64) -> Vec<(Tensor, dpcomp::nn::PerSample)> {
    let g = Tensor::arange_start(1, b + 1, (Kind::Double, Device::Cpu)).view([b, 1]);
    let p = Tensor::zeros([1], (Kind::Double, Device::Cpu));
    vec![(p, dpcomp::nn::PerSample::Direct(g))]
}

/// The adaptive radius lives on the device (issue 37): a step clips at it, noises with it and
/// moves it without a host read, and it moves as the host formula moves it. Over fractions and
/// radii across their range `updated` on 0-d tensors equals `update` on f64s but for the last
/// bit or two where LibTorch's exp and the C library's round differently (a few percent of
/// draws); an engine's steps on norms 1..100 with σ_b = 0 land where `update` on the known
/// counts does.
#[test]
fn the_adaptive_radius_moves_on_the_device_as_the_host_formula_says() {
    let mut draws = common::Draws::new(37);
    let fractions = draws.rand(&[4000], Kind::Double) * 3.0 - 1.0;
    let radii = (draws.randn(&[4000], Kind::Double) * 8.0).exp();
    let rule = AdaptiveClipping {
        radius: 1.0,
        target_quantile: 0.3,
        learning_rate: 0.7,
        count_noise: 0.0,
    };
    let (mut differ, mut worst) = (0, 0.0f64);
    for i in 0..4000 {
        let (b, r) = (fractions.get(i), radii.get(i));
        let mut host = AdaptiveClipping {
            radius: dpcomp::host::f64_scalar(&r),
            ..rule.clone()
        };
        host.update(dpcomp::host::f64_scalar(&b));
        let device = dpcomp::host::f64_scalar(&rule.updated(&r, &b));
        if device != host.radius {
            differ += 1;
            worst = worst.max((device / host.radius - 1.0).abs());
        }
    }
    assert!(
        differ < 400 && worst <= 4.0 * f64::EPSILON,
        "{differ} updates differ, by up to {worst:e} relative"
    );

    let start = 64.5;
    let mut engine = common::engine(
        0.0,
        0.1,
        100.0,
        Clipping::Adaptive(AdaptiveClipping {
            radius: start,
            target_quantile: 0.5,
            learning_rate: 0.2,
            count_noise: 0.0,
        }),
        1,
    )
    .unwrap();
    let mut host = AdaptiveClipping {
        radius: start,
        target_quantile: 0.5,
        learning_rate: 0.2,
        count_noise: 0.0,
    };
    let per_sample = fixed_norms(100);
    for step in 0..20 {
        let reads = dpcomp::host::HostReads::start();
        let clipped = engine.clip(&per_sample);
        engine.privatize(&clipped).unwrap();
        assert_eq!(reads.since(), 0, "step {step} read from the device");
        // Norms 1..100 at radius C: those above C + 1e-6 are clipped.
        let unclipped = (1..=100)
            .filter(|&n| n as f64 <= host.radius + 1e-6)
            .count() as f64;
        host.update((unclipped - 50.0) / 100.0 + 0.5);
        let radius = engine.clip_radius().unwrap();
        assert!(
            (radius / host.radius - 1.0).abs() < 1e-13,
            "step {step}: {radius} against {}",
            host.radius
        );
    }
}

/// Adaptive clipping without noise (σ = 0, σ_b = 0): the geometric update drives the radius to
/// the γ-quantile of fixed norms 1..100 (Andrew et al. 2021, Section 2), from above and below.
#[test]
fn the_adaptive_radius_converges_to_the_target_quantile_without_noise() {
    let _serial = common::serial();
    let per_sample = fixed_norms(100);
    for (gamma, start) in [(0.5, 400.0), (0.9, 3.0), (0.2, 0.5)] {
        let adaptive = AdaptiveClipping {
            radius: start,
            target_quantile: gamma,
            learning_rate: 0.2,
            count_noise: 0.0,
        };
        let mut engine = common::engine(0.0, 0.1, 100.0, Clipping::Adaptive(adaptive), 1).unwrap();
        let mut tail = Vec::new();
        for step in 0..400 {
            let clipped = engine.clip(&per_sample);
            assert_eq!(clipped.examples(), 100);
            engine.privatize(&clipped).unwrap();
            if step >= 300 {
                tail.push(engine.clip_radius().unwrap());
            }
        }
        let mean = tail.iter().sum::<f64>() / tail.len() as f64;
        // The γ-quantile of 1..100 is 100 γ; the update settles within one norm step of the
        // fraction, i.e. within a few norms of it.
        let want = 100.0 * gamma;
        assert!(
            (mean - want).abs() <= 3.0,
            "gamma {gamma} from {start}: radius {mean}, want ~{want}"
        );
        assert_eq!(engine.accountant().steps(), 400);
    }
}

/// With noise: the gradient is noised at σ_Δ = (σ^-2 - (2σ_b)^-2)^-1/2 times the current radius,
/// the unclipped count at σ_b (the log-radius steps have std η σ_b / E[B] around -η (b - γ)),
/// and the accountant records each step at σ, so ε equals flat clipping's at σ.
#[test]
fn adaptive_clipping_noises_at_sigma_delta_and_costs_what_flat_costs() {
    let _serial = common::serial();
    let (sigma, count_noise, eta, gamma, expected) = (1.0, 2.0, 0.2, 0.5, 100.0);
    let adaptive = AdaptiveClipping {
        radius: 30.5,
        target_quantile: gamma,
        learning_rate: eta,
        count_noise,
    };
    let make = || {
        common::engine(
            sigma,
            0.01,
            expected,
            Clipping::Adaptive(adaptive.clone()),
            1,
        )
        .unwrap()
    };
    let sigma_delta = (1.0f64 - 1.0 / 16.0).powf(-0.5);
    let engine = make();
    assert!((engine.gradient_noise_multiplier() - sigma_delta).abs() < 1e-12);
    assert!((engine.noise_std() - sigma_delta * 30.5).abs() < 1e-9);

    // The gradient noise: 400k draws on a zero sum, before the radius moves.
    tch::manual_seed(21);
    let mut engine = make();
    let zero = [Tensor::zeros([400_000], (Kind::Double, Device::Cpu))];
    let noisy = engine.privatize(&sums_of(&zero, 100)).unwrap();
    let std = (&noisy[0] * expected).std(true).double_value(&[]);
    assert!(
        (std / (sigma_delta * 30.5) - 1.0).abs() < 5e-3,
        "noise std {std}, want {}",
        sigma_delta * 30.5
    );

    // The count noise: 3000 single steps from C = 30.5 on norms 1..100 (30 unclipped, b = 0.3).
    tch::manual_seed(22);
    let per_sample = fixed_norms(100);
    let steps: Vec<f64> = (0..3000)
        .map(|_| {
            let mut engine = make();
            let clipped = engine.clip(&per_sample);
            engine.privatize(&clipped).unwrap();
            (engine.clip_radius().unwrap() / 30.5).ln()
        })
        .collect();
    let n = steps.len() as f64;
    let mean = steps.iter().sum::<f64>() / n;
    let sd = (steps.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let (want_mean, want_sd) = (-eta * (0.3 - gamma), eta * count_noise / expected);
    assert!(
        (mean - want_mean).abs() < 4.0 * want_sd / n.sqrt(),
        "mean {mean}, want {want_mean}"
    );
    assert!((sd / want_sd - 1.0).abs() < 0.05, "sd {sd}, want {want_sd}");

    // ε: the adaptive engine's accountant equals a flat engine's after the same steps.
    let mut adaptive_engine = make();
    let mut flat =
        common::engine(sigma, 0.01, expected, Clipping::Flat { max_norm: 1.0 }, 1).unwrap();
    for _ in 0..50 {
        let clipped = adaptive_engine.clip(&per_sample);
        adaptive_engine.privatize(&clipped).unwrap();
        flat.privatize(&sums_of(
            &[Tensor::zeros([1], (Kind::Double, Device::Cpu))],
            100,
        ))
        .unwrap();
    }
    let kind = dpcomp::config::AccountantKind::Rdp;
    assert_eq!(
        adaptive_engine.epsilon_at(kind, 1e-5).unwrap(),
        flat.epsilon_at(kind, 1e-5).unwrap()
    );
}

/// What adaptive clipping refuses: a count noised too little for σ (it would cost more than σ),
/// a quantile outside (0, 1), and a resume that lost the radius.
#[test]
fn adaptive_clipping_refuses_what_would_break_its_guarantee() {
    let _serial = common::serial();
    let adaptive = |count_noise: f64, gamma: f64| {
        Clipping::Adaptive(AdaptiveClipping {
            radius: 1.0,
            target_quantile: gamma,
            learning_rate: 0.2,
            count_noise,
        })
    };
    let refuse = |c: Clipping| {
        common::engine(1.0, 0.1, 10.0, c, 1)
            .err()
            .expect("refused")
            .to_string()
    };
    let e = refuse(adaptive(0.5, 0.5));
    assert!(
        e.starts_with("count_noise:") && e.contains("sigma / 2"),
        "{e}"
    );
    let e = refuse(adaptive(0.0, 0.5));
    assert!(e.starts_with("count_noise:"), "{e}");
    let e = refuse(adaptive(5.0, 1.0));
    assert!(e.starts_with("target_quantile:"), "{e}");
    let mut engine = common::engine(1.0, 0.1, 10.0, adaptive(5.0, 0.5), 1).unwrap();
    let zero = [Tensor::zeros([1], (Kind::Double, Device::Cpu))];
    engine.privatize(&sums_of(&zero, 1)).unwrap();
    let history = engine.accountant().clone();
    let mut fresh = common::engine(1.0, 0.1, 1.0, adaptive(5.0, 0.5), 1).unwrap();
    let e = fresh.resume(history.clone(), None).unwrap_err().to_string();
    assert!(e.contains("needs its current positive radius"), "{e}");
    fresh.resume(history.clone(), Some(0.75)).unwrap();
    assert_eq!(fresh.clip_radius(), Some(0.75));
    let mut flat = common::engine(1.0, 0.1, 1.0, Clipping::Flat { max_norm: 1.0 }, 1).unwrap();
    let e = flat.resume(history, Some(0.75)).unwrap_err().to_string();
    assert!(e.contains("adaptive radius but this run clips flat"), "{e}");
}

/// `--clipping adaptive` on Surnames: the radius moves and is logged, a run resumed after one
/// epoch ends with the uninterrupted run's weights and radius (C_t is checkpointed), and ε is
/// flat clipping's at the same σ.
#[test]
fn an_adaptive_clipping_run_resumes_to_the_uninterrupted_run() {
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let config = |epochs: usize, clipping: ClippingMode| {
        let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
        c.epochs = epochs;
        c.data.limit_train = Some(640);
        c.data.limit_test = Some(128);
        c.data.data_dir = Some(root.clone());
        c.device = dpcomp::config::DeviceChoice::Cpu;
        c.privacy.noise_multiplier = Some(0.8);
        c.privacy.clipping = clipping;
        c.privacy.max_grad_norm = 0.5;
        c
    };
    let work = tempfile::tempdir().unwrap();
    let (straight, split) = (work.path().join("straight"), work.path().join("split"));
    let mut t = dpcomp_lab::tasks::start(config(2, ClippingMode::Adaptive), &straight).unwrap();
    let summary = t.run().unwrap();
    let weights: Vec<Tensor> = t.params().iter().map(|(_, p)| p.copy()).collect();
    let history = t.history().to_vec();
    drop(t);
    let radii: Vec<f64> = history.iter().map(|m| m.clip_radius.unwrap()).collect();
    assert!(
        (radii[0] - 0.5).abs() > 0.05,
        "the radius did not move from 0.5: {radii:?}"
    );
    let mut t = dpcomp_lab::tasks::start(config(1, ClippingMode::Adaptive), &split).unwrap();
    t.run().unwrap();
    drop(t);
    let mut t = dpcomp_lab::tasks::resume(&split, Some(2)).unwrap();
    let resumed = t.run().unwrap();
    for ((name, p), w) in t.params().iter().zip(&weights) {
        assert!(p.equal(w), "{name} differs after the resume");
    }
    assert_eq!(t.history()[1].clip_radius, history[1].clip_radius);
    assert_eq!(summary.epsilon, resumed.epsilon);
    let mut t =
        dpcomp_lab::tasks::start(config(2, ClippingMode::Flat), work.path().join("flat")).unwrap();
    assert_eq!(t.run().unwrap().epsilon, summary.epsilon);
}

/// The adaptive settings are refused with another clipping mode (a flag that does not apply).
#[test]
fn adaptive_settings_without_adaptive_clipping_are_refused() {
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.privacy.noise_multiplier = Some(1.0);
    c.privacy.count_noise = Some(3.0);
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("privacy.count_noise:") && e.contains("`privacy.clipping` adaptive"),
        "{e}"
    );
    c.privacy.clipping = ClippingMode::Adaptive;
    c.validate().unwrap();
    c.privacy.clipping = ClippingMode::PerLayer;
    c.privacy.count_noise = None;
    c.privacy.target_quantile = 0.9;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("target_quantile"), "{e}");
}

/// σ and a target ε together: σ stays, and the step budget is the most steps whose ε stays
/// within the target, found against the accountant itself (one more step exceeds it).
#[test]
fn a_target_epsilon_given_with_sigma_is_the_step_budget() {
    // `privatize` draws from LibTorch's global generator, which the trainings here seed.
    let _serial = common::serial();
    let params = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
    let (sigma, q, delta) = (0.8, 0.01, 1e-5);
    for (kind, target) in [(AccountantKind::Rdp, 2.0), (AccountantKind::Pld, 2.0)] {
        let mut engine = PrivacyEngine::builder()
            .noise_multiplier(sigma)
            .target_epsilon(target)
            .accountant(kind)
            .delta(delta)
            .sample_rate(q)
            .dataset_size(10_000)
            .max_grad_norm(1.0)
            .epochs(50)
            .build(&params)
            .unwrap();
        assert_eq!(engine.noise_multiplier(), sigma);
        assert_eq!(engine.target_epsilon(), Some(target));
        let budget = engine.steps_left().unwrap();
        assert!(budget > 0 && budget < 5_000, "{kind:?}: budget {budget}");
        let epsilon = |steps: u64| {
            dpcomp::privacy::calibrate::epsilon_with(kind, sigma, q, steps, delta).unwrap()
        };
        assert!(epsilon(budget) <= target, "{kind:?}: {}", epsilon(budget));
        assert!(
            epsilon(budget + 1) > target,
            "{kind:?}: {}",
            epsilon(budget + 1)
        );
        // Every step spends the budget, and the step after the last is refused without noise.
        let clipped = Clipped::empty(&params);
        let mut resumed = dpcomp::privacy::accountant::Accountant::default();
        resumed.step(sigma, q, budget - 1).unwrap();
        engine.resume(resumed, None).unwrap();
        assert_eq!(engine.steps_left(), Some(1));
        assert!(engine.epsilon_after_next_step().unwrap() <= target);
        engine.privatize(&clipped).unwrap();
        assert_eq!(engine.steps_left(), Some(0));
        assert!(engine.epsilon_after_next_step().unwrap() > target);
        assert!(engine.privatize(&clipped).is_err());
    }
    // A length the target does not cut is the budget itself.
    let engine = PrivacyEngine::builder()
        .noise_multiplier(5.0)
        .target_epsilon(8.0)
        .delta(delta)
        .sample_rate(q)
        .dataset_size(10_000)
        .max_grad_norm(1.0)
        .epochs(2)
        .build(&params)
        .unwrap();
    assert_eq!(engine.steps_left(), Some(200));
}
