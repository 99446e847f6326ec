//! The privacy engine (`privacy::engine`): flat and per-layer clipping against per-example
//! autograd, the noise's scale (σ x sensitivity, sqrt(Σ C_l²) per layer), one accounted step per
//! noised step, and settings it refuses.

mod common;

use dpcomp::bench::device_check::per_example_gradients;
use dpcomp::config::{ClippingMode, Task, TrainConfig};
use dpcomp::data::{Batch, Features};
use dpcomp::models::Model;
use dpcomp::nn::{Ctx, Linear};
use dpcomp::privacy::engine::{Clipping, PrivacyEngine};
use dpcomp::privacy::noise::NoiseSource;
use dpcomp::train::private::per_sample_in_order;
use dpcomp::train::Trainer;
use std::collections::HashMap;
use tch::{nn, Device, Kind, Tensor};

/// Linear -> tanh -> Linear on rows (carried as `Features::Images` until model input opens).
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
        let first = Linear::new(&(&root / "first"), 5, 7, true);
        let last = Linear::new(&(&root / "last"), 7, 3, true);
        vs.double();
        Mlp { vs, first, last }
    }
}

impl Model for Mlp {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> dpcomp::error::Result<Tensor> {
        let Features::Images(xs) = features else {
            panic!("rows expected");
        };
        let h = self.first.forward(xs, ctx).tanh();
        Ok(self.last.forward(&h, ctx))
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

fn batch() -> Batch {
    tch::manual_seed(4);
    Batch {
        features: Features::Images(Tensor::randn([8, 5], (Kind::Double, Device::Cpu)) * 2.0),
        labels: Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 0, 1]),
    }
}

fn engine(clipping: Clipping, parameters: usize) -> PrivacyEngine {
    PrivacyEngine::new(1.0, 0.25, clipping, NoiseSource::Seeded, parameters).unwrap()
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
            };
            let norm = match &clipping {
                Clipping::Flat { .. } => &total,
                Clipping::PerLayer { .. } => &per_param[k],
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
    let clipping = Clipping::PerLayer {
        max_norms: vec![3.0, 4.0],
    };
    let mut engine = PrivacyEngine::new(0.7, 0.01, clipping, NoiseSource::Seeded, 2).unwrap();
    assert!((engine.noise_std() - 0.7 * 5.0).abs() < 1e-12);
    tch::manual_seed(12);
    let zeros = [
        Tensor::zeros([300_000], (Kind::Double, Device::Cpu)),
        Tensor::zeros([200_000], (Kind::Double, Device::Cpu)),
    ];
    for step in 1..=3u64 {
        let noisy = engine.privatize(&zeros, 10.0).unwrap();
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

#[test]
fn the_engine_refuses_what_it_cannot_account() {
    let err = |r: dpcomp::error::Result<PrivacyEngine>| r.err().expect("refused").to_string();
    let flat = |c: f64| Clipping::Flat { max_norm: c };
    let e = err(PrivacyEngine::new(
        1.0,
        0.1,
        flat(f64::INFINITY),
        NoiseSource::Seeded,
        2,
    ));
    assert!(e.contains("infinite"), "{e}");
    let e = err(PrivacyEngine::new(
        1.0,
        0.1,
        flat(-1.0),
        NoiseSource::Seeded,
        2,
    ));
    assert!(e.contains("positive"), "{e}");
    let e = err(PrivacyEngine::new(
        1.0,
        0.0,
        flat(1.0),
        NoiseSource::Seeded,
        2,
    ));
    assert!(e.contains("0 < q <= 1"), "{e}");
    let per_layer = Clipping::PerLayer {
        max_norms: vec![1.0; 3],
    };
    let e = err(PrivacyEngine::new(
        1.0,
        0.1,
        per_layer,
        NoiseSource::Seeded,
        2,
    ));
    assert!(e.contains("3 radii for 2"), "{e}");
    // A checkpoint's history at another σ is refused on resume.
    let mut other = engine(flat(1.0), 2);
    let _ = other.privatize(&[Tensor::zeros([3], (Kind::Float, Device::Cpu))], 1.0);
    let history = other.accountant().clone();
    let mut engine = PrivacyEngine::new(2.0, 0.25, flat(1.0), NoiseSource::Seeded, 2).unwrap();
    let e = engine.resume(history).unwrap_err().to_string();
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
        let mut c = TrainConfig::paper_defaults(Task::Surnames);
        c.epochs = 1;
        c.limit_train = Some(1280);
        c.limit_test = Some(256);
        c.data_dir = Some(root.clone());
        c.device = dpcomp::config::DeviceChoice::Cpu;
        c.noise_multiplier = Some(0.8);
        c.clipping = clipping;
        c
    };
    let run = |clipping: ClippingMode, name: &str| {
        let mut t = Trainer::new(config(clipping), &work.path().join(name)).unwrap();
        t.progress = false;
        let summary = t.run().unwrap();
        let weights: Vec<Tensor> = t.params.iter().map(|(_, p)| p.copy()).collect();
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
    plain.noise_multiplier = None;
    let e = Trainer::new(plain, &work.path().join("plain"))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("clipping") && e.contains("--noise-multiplier"),
        "{e}"
    );
}

/// `with_epsilon` (Opacus's `make_private_with_epsilon`): the σ it picks spends at most the
/// target over the planned steps, within 0.1% of it, on both accountants, and the engine's own
/// accountant agrees after those steps are taken.
#[test]
fn with_epsilon_picks_the_smallest_safe_sigma() {
    use dpcomp::config::AccountantKind;
    use dpcomp::privacy::calibrate::epsilon_with;
    let (q, steps, delta) = (1.0 / 50.0, 200u64, 1e-5);
    for (kind, target) in [(AccountantKind::Rdp, 3.0), (AccountantKind::Pld, 1.5)] {
        let clipping = Clipping::Flat { max_norm: 1.0 };
        let mut engine = PrivacyEngine::with_epsilon(
            target,
            delta,
            kind,
            q,
            steps,
            clipping,
            NoiseSource::Seeded,
            1,
        )
        .unwrap();
        let sigma = engine.noise_multiplier();
        let eps = epsilon_with(kind, sigma, q, steps, delta).unwrap();
        assert!(
            eps <= target && eps > 0.999 * target,
            "{kind:?}: σ {sigma} gives ε {eps}"
        );
        let tiny = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
        for _ in 0..steps {
            engine.privatize(&tiny, 1.0).unwrap();
        }
        assert_eq!(engine.epsilon(kind, delta).unwrap(), eps, "{kind:?}");
    }
}
