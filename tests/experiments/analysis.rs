//! The analyses: the reference gradient against per-example autograd, each stage's error against
//! what theory fixes exactly (no clipping -> no clip error; noise variance = m σ² C² / B²;
//! identity compression adds nothing; error = bias² + variance), the clipping model's
//! minimisers, the sweep against its own decomposition, and in-training measurements that leave
//! the training itself untouched.

use crate::common;
use common::require_shared_data;
use dpcomp::compress::Compressor;
use dpcomp::config::{DeviceChoice, TrainConfig};
use dpcomp::nn::Ctx;
use dpcomp::train::checkpoint;
use dpcomp_lab::analysis::clipping::{sweep, ClippingModel};
use dpcomp_lab::analysis::gradient_error::{self, measure, CompressorSource, Mechanism};
use dpcomp_lab::analysis::probe::GradientErrorProbe;
use dpcomp_lab::analysis::{fixed_batches, BatchGradients};
use dpcomp_lab::Task;
use std::path::Path;
use tch::{Device, Kind, Reduction, Tensor};

fn config(root: &Path) -> TrainConfig {
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.data.limit_train = Some(512);
    c.data.limit_test = Some(256);
    c.data.data_dir = Some(root.to_path_buf());
    c.device = DeviceChoice::Cpu;
    c.seed = 11;
    c.privacy.noise_multiplier = Some(0.8);
    c
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-300)
}

/// A compressor source with no prior state.
fn fresh<'a>(compressor: &'a Compressor, shapes: &'a [Vec<i64>]) -> CompressorSource<'a> {
    CompressorSource {
        compressor,
        shapes,
        state: Vec::new(),
        epoch: 0,
        device: Device::Cpu,
    }
}

#[test]
fn gradient_error_stages_match_autograd_and_theory() {
    let _guard = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let t = dpcomp_lab::tasks::start(config(&root), dir.path()).unwrap();
    let n = t.data().train.len();

    // Fixed batches: the same every time, distinct examples.
    let batches = fixed_batches(n, 32, 2);
    assert_eq!(batches.len(), 2);
    assert!(batches[0].equal(&fixed_batches(n, 32, 2)[0]));
    assert_eq!(
        batches[0].unique_dim(0, false, false, false).0.size()[0],
        32
    );

    // The reference ḡ equals autograd's gradient of the mean loss, dropout off.
    let g = BatchGradients::new(
        t.model(),
        t.params(),
        &t.data().train,
        &batches[0],
        Device::Cpu,
    )
    .unwrap();
    for (_, p) in t.params() {
        p.shallow_clone().zero_grad();
    }
    let batch = t.data().train.batch(&batches[0], Device::Cpu, false);
    let logits = t
        .model()
        .forward(&batch.features, &mut Ctx::eval())
        .unwrap();
    logits
        .cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::Mean, -100, 0.0)
        .backward();
    let autograd: Vec<Tensor> = t
        .params()
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            if g.defined() {
                g.reshape([-1])
            } else {
                p.zeros_like().reshape([-1])
            }
        })
        .collect();
    let autograd = Tensor::cat(&autograd, 0);
    let diff = (&g.mean - &autograd).abs().max().double_value(&[]);
    let scale = autograd.abs().max().double_value(&[]);
    assert!(
        diff < 1e-4 * scale,
        "reference gradient {diff} vs scale {scale}"
    );
    assert_eq!(g.parameters(), t.model().trainable_parameter_count());

    let shapes: Vec<Vec<i64>> = t.params().iter().map(|(_, p)| p.size()).collect();
    let identity = Compressor::Identity;
    let m = g.parameters() as f64;
    let run = |mechanism, spec: &Compressor, draws| {
        measure(
            t.model(),
            t.params(),
            &t.data().train,
            Device::Cpu,
            mechanism,
            &fresh(spec, &shapes),
            &batches,
            draws,
        )
        .unwrap()
    };

    // σ 0.8, C 3, no compression.
    let (sigma, c, b) = (0.8, 3.0, 32.0);
    let got = run(
        Mechanism::PerSample {
            noise_multiplier: sigma,
            max_norm: c,
        },
        &identity,
        16,
    );
    let [clip, noise, compress] = [&got.stages[0], &got.stages[1], &got.stages[2]];
    assert_eq!(
        (clip.stage.as_str(), noise.stage.as_str()),
        ("clip", "noise")
    );
    assert_eq!(clip.variance, 0.0, "clipping is deterministic");
    assert!(rel(clip.error, clip.bias2) < 1e-9);
    let theory = m * sigma * sigma * c * c / (b * b);
    assert!(
        rel(noise.variance, theory) < 0.03,
        "noise variance {} vs m σ² C² / B² = {theory}",
        noise.variance
    );
    // The noise is unbiased: its bias² is the clipping bias², up to the estimate's spread.
    assert!(
        (noise.bias2 - clip.bias2).abs() < 0.05 * theory + 0.05 * clip.bias2,
        "noise bias² {} vs clip bias² {}",
        noise.bias2,
        clip.bias2
    );
    for s in &got.stages {
        assert!(rel(s.error, s.bias2 + s.variance) < 1e-6, "{s:?}");
    }
    assert_eq!(
        compress.error, noise.error,
        "identity compression adds nothing"
    );

    // No clipping, no noise: every stage is exact.
    let exact = run(
        Mechanism::PerSample {
            noise_multiplier: 0.0,
            max_norm: f64::INFINITY,
        },
        &identity,
        2,
    );
    let scale = g.mean.square().sum(Kind::Double).double_value(&[]);
    for s in &exact.stages {
        assert!(s.error < 1e-10 * scale, "{s:?}");
    }
    let global = run(Mechanism::GlobalClip { max_norm: 1e9 }, &identity, 2);
    assert!(!global.stages.is_empty());
    assert!(global.stages.iter().all(|s| s.error < 1e-10 * scale));

    // DGC without noise: deterministic (no variance) and biased.
    let dgc = Compressor::dgc(16.0);
    let sparse = run(
        Mechanism::PerSample {
            noise_multiplier: 0.0,
            max_norm: c,
        },
        &dgc,
        3,
    );
    assert!(sparse.stages[2].variance < 1e-9 * sparse.stages[2].error);
    assert!(sparse.stages[2].bias2 > sparse.stages[0].bias2);
}

#[test]
fn clipping_model_minimisers_and_measured_sweep() {
    // Model: G 2, ||ḡ|| 1, m 1000, σ 1, B 10 -> m σ² / B² = 10.
    let model = ClippingModel {
        median_norm: 2.0,
        mean_gradient_norm: 1.0,
        parameters: 1000,
        noise_multiplier: 1.0,
        batch_size: 10,
    };
    assert!(rel(model.minimiser_median(), 2.0 / 11.0) < 1e-12);
    assert!(rel(model.minimiser_mean(), 2.0 / 41.0) < 1e-12);
    for (c, e) in [
        (
            model.minimiser_median(),
            &ClippingModel::error_median as &dyn Fn(&ClippingModel, f64) -> f64,
        ),
        (model.minimiser_mean(), &ClippingModel::error_mean),
    ] {
        assert!(e(&model, c) < e(&model, c * 1.01) && e(&model, c) < e(&model, c * 0.99));
    }
    let noiseless = ClippingModel {
        noise_multiplier: 0.0,
        ..model
    };
    assert_eq!(noiseless.minimiser_median(), 2.0);
    assert_eq!(noiseless.minimiser_mean(), 2.0);
    assert_eq!(noiseless.error_median(3.0), 0.0);

    let _guard = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let t = dpcomp_lab::tasks::start(config(&root), dir.path()).unwrap();
    let batches = fixed_batches(t.data().train.len(), 32, 2);
    let sweeps = sweep(
        "surnames",
        0,
        t.model(),
        t.params(),
        &t.data().train,
        Device::Cpu,
        &batches,
        &[0.0, 0.8],
        4,
        12,
    )
    .unwrap();
    assert_eq!(sweeps.len(), 2);
    let s = &sweeps[1];
    let m = s.model.parameters as f64;
    // Clipping bias falls as C grows; measured error = clip bias² + m σ² C² / B² (drawn).
    for pair in s.points.windows(2) {
        assert!(pair[1].clip_bias2 <= pair[0].clip_bias2 * (1.0 + 1e-5) + 1e-12);
    }
    for p in &s.points {
        let noise = m * 0.64 * p.max_norm * p.max_norm / (32.0 * 32.0);
        assert!(
            (p.measured - p.clip_bias2 - noise).abs() < 0.05 * noise + 0.05 * p.clip_bias2,
            "C {}: measured {} vs {} + {noise}",
            p.max_norm,
            p.measured,
            p.clip_bias2
        );
    }
    assert!(s.measured_minimum <= s.measured_at_median_norm);
    assert!(s.model_median_minimiser < s.model.median_norm);
    // The sweep file round-trips and figure 6 is drawn from it.
    let out = tempfile::tempdir().unwrap();
    dpcomp_lab::analysis::clipping::write(out.path(), &sweeps).unwrap();
    let read = dpcomp_lab::analysis::clipping::read(out.path()).unwrap();
    assert_eq!(read.len(), 2);
    assert_eq!(read[1].points.len(), s.points.len());
    let figures = dpcomp_lab::plot::analysis::clipping_figures(&read, out.path()).unwrap();
    assert!(figures.contains(&out.path().join("clipping_sigma0.8.png")));
    // Without noise the error only falls with C, to zero once no example is clipped.
    let quiet = &sweeps[0];
    assert_eq!(quiet.points.last().unwrap().measured, 0.0);
    assert_eq!(quiet.measured_minimum, 0.0);
    assert!(quiet.points[0].measured > 0.0);
}

#[test]
fn training_measures_at_chosen_epochs_without_changing_the_run() {
    let _guard = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let mut base = config(&root);
    base.data.limit_train = Some(256);
    base.epochs = 2;
    base.set_compressor(&Compressor::dgc(16.0)).unwrap();
    let mut measured = base.clone();
    measured.analysis.grad_error_epochs = vec![0, 2];
    measured.analysis.grad_error_batches = 1;
    measured.analysis.grad_error_draws = 2;
    // Without the probe installed, a run that names epochs to measure is refused by name
    // before its first step, rather than run without measuring.
    let refused = tempfile::tempdir().unwrap();
    let err = dpcomp_lab::tasks::start(measured.clone(), refused.path())
        .unwrap()
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("analysis.grad_error_epochs") && err.contains("GradientErrorProbe::install"),
        "{err}"
    );
    assert!(!refused.path().join("metrics.jsonl").exists());
    let weights = |c: TrainConfig, dir: &Path| {
        let mut t = dpcomp_lab::tasks::start(c, dir).unwrap();
        GradientErrorProbe::install(&mut t);
        t.run().unwrap();
        let ckpt = checkpoint::find(dir).unwrap();
        let mut named = Tensor::read_safetensors(ckpt.join("model.safetensors")).unwrap();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    };
    let (a, grid) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = grid.path().join("cell");
    let plain = weights(base, a.path());
    let with = weights(measured, &b);
    assert!(!plain.is_empty() && plain.len() == with.len());
    for ((name, x), (_, y)) in plain.iter().zip(&with) {
        assert!(
            x.equal(y),
            "{name} differs when the gradient error is measured"
        );
    }
    let records = gradient_error::read(&b).unwrap();
    let epochs: Vec<usize> = records.iter().map(|r| r.epoch).collect();
    assert_eq!(epochs, vec![0, 2]);
    assert_eq!(records[1].compressor, "dgc x16");
    assert!(records
        .iter()
        .all(|r| r.stages.len() == 3 && r.noise_multiplier == 0.8));
    assert!(
        !a.path().join(gradient_error::FILE).exists(),
        "no file without measurements"
    );
    // Figures 4 and 5 and the table come from the log.
    let out = grid.path().join("figures");
    let written = dpcomp_lab::plot::plot(grid.path(), &out, "test").unwrap();
    for name in [
        "accuracy_vs_gradient_error.png",
        "gradient_error_bias_variance_epoch0.svg",
        "gradient_error_bias_variance_epoch2.png",
        "gradient_error.csv",
    ] {
        assert!(written.contains(&out.join(name)), "{name} missing");
        assert!(std::fs::metadata(out.join(name)).unwrap().len() > 100);
    }
    let table = std::fs::read_to_string(out.join("gradient_error.csv")).unwrap();
    assert_eq!(
        table.lines().count(),
        1 + 2 * 3,
        "header + 2 epochs x 3 stages"
    );
    gradient_error::truncate(&b, 1).unwrap();
    assert_eq!(gradient_error::read(&b).unwrap().len(), 1);
}

/// A resumed run's probe drops the records of epochs after the checkpoint (a continuation that
/// was lost) and measures those epochs again, once each; epochs already measured before the
/// checkpoint are not measured twice.
#[test]
fn a_resumed_run_measures_the_lost_epochs_again_and_no_epoch_twice() {
    let _guard = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let mut c = config(&root);
    c.data.limit_train = Some(128);
    c.epochs = 1;
    c.analysis.grad_error_epochs = vec![0, 1, 2];
    c.analysis.grad_error_batches = 1;
    c.analysis.grad_error_draws = 2;
    let dir = tempfile::tempdir().unwrap();
    let mut t = dpcomp_lab::tasks::start(c, dir.path()).unwrap();
    GradientErrorProbe::install(&mut t);
    t.run().unwrap();
    drop(t);
    let mut records = gradient_error::read(dir.path()).unwrap();
    assert_eq!(records.iter().map(|r| r.epoch).collect::<Vec<_>>(), [0, 1]);
    // A record of epoch 2 from a continuation whose checkpoint never landed.
    let mut lost = records[1].clone();
    (lost.epoch, lost.median_norm) = (2, -1.0);
    records.push(lost);
    gradient_error::write(dir.path(), &records).unwrap();
    let mut t = dpcomp_lab::tasks::resume(dir.path(), Some(2)).unwrap();
    GradientErrorProbe::install(&mut t);
    t.run().unwrap();
    let records = gradient_error::read(dir.path()).unwrap();
    assert_eq!(
        records.iter().map(|r| r.epoch).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(records[2].median_norm > 0.0, "epoch 2 measured again");
}
