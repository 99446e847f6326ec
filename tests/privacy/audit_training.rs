//! Audits of real training runs (`train::audit`, `privacy::canary`, issue 19): canaries enter
//! the clipped sum exactly as the engine clips an example; a run without noise is audited near
//! the most its canaries can show; an honest noised run, compressed or not, never audits above
//! its accounted ε; mislabelled-input canaries are detected without noise; the audit grid
//! writes its table.

use crate::common;
use common::require_shared_data;
use dpcomp::compress::CompressorKind;
use dpcomp::config::{AccountantKind, DeviceChoice, TrainConfig};
use dpcomp::privacy::audit::Guesses;
use dpcomp::privacy::canary::{CanarySettings, GradientCanaries, Observe};
use dpcomp::privacy::engine::{Clipped, Clipping};
use dpcomp::train::audit::{audit_training, AuditReport, AuditSettings, CanaryKind};
use dpcomp_lab::Task;
use std::path::Path;
use tch::{Device, Kind, Tensor};

fn params() -> Vec<Tensor> {
    vec![
        Tensor::zeros([3, 4], (Kind::Float, Device::Cpu)),
        Tensor::zeros([5], (Kind::Float, Device::Cpu)),
    ]
}

fn canaries(dense: bool, clipping: &Clipping) -> GradientCanaries {
    let settings = CanarySettings {
        canaries: 8,
        dense,
        observe: Observe::Final,
        seed: 3,
    };
    // Sampling rate 1: every included canary joins every step.
    GradientCanaries::new(settings, &params(), clipping, 2.0, 1.0, (0.1, 0.0)).unwrap()
}

#[test]
fn gradient_canaries_enter_the_clipped_sum_as_clipped_examples() {
    let _serial = common::serial();
    let p = params();
    // Flat clipping at C = 2: a Dirac canary adds exactly C on its own coordinate.
    let flat = Clipping::Flat { max_norm: 2.0 };
    let mut c = canaries(false, &flat);
    let included = c.included.iter().filter(|&&b| b).count();
    assert!(included > 0 && included < 8, "{:?}", c.included);
    let mut sum = Clipped::empty(&p);
    c.inject(&mut sum, &p, &flat);
    assert_eq!(sum.examples() as usize, included);
    assert_eq!(c.samples as usize, included);
    let all = Tensor::cat(
        &sum.sums.iter().map(|s| s.reshape([-1])).collect::<Vec<_>>(),
        0,
    );
    let nonzero = Vec::<f32>::try_from(&all.masked_select(&all.ne(0.0))).unwrap();
    assert_eq!(
        nonzero.len(),
        included,
        "one coordinate per included canary"
    );
    for v in nonzero {
        assert!(
            (v - 2.0).abs() < 1e-5,
            "{v}: a canary is C u_i, unchanged by clipping at C"
        );
    }
    let norms = Vec::<f32>::try_from(&sum.norms).unwrap();
    assert!(norms.iter().all(|n| (n - 2.0).abs() < 1e-5), "{norms:?}");
    // Per-layer clipping at C_l = C / sqrt(2) cuts each Dirac canary to its layer's radius.
    let per_layer = Clipping::per_layer_even(2.0, 2);
    let mut c = canaries(false, &per_layer);
    let mut sum = Clipped::empty(&p);
    c.inject(&mut sum, &p, &per_layer);
    let all = Tensor::cat(
        &sum.sums.iter().map(|s| s.reshape([-1])).collect::<Vec<_>>(),
        0,
    );
    let nonzero = Vec::<f32>::try_from(&all.masked_select(&all.ne(0.0))).unwrap();
    let radius = 2.0 / 2f32.sqrt();
    assert!(
        nonzero.iter().all(|v| (v - radius).abs() < 1e-4),
        "{nonzero:?}"
    );
    // Dense canaries: random unit directions of norm C over both tensors, each clipped as one
    // example (norm C before clipping; the sum is their sum).
    let mut c = canaries(true, &flat);
    let included = c.included.iter().filter(|&&b| b).count();
    let mut sum = Clipped::empty(&p);
    c.inject(&mut sum, &p, &flat);
    let norms = Vec::<f32>::try_from(&sum.norms).unwrap();
    assert_eq!(norms.len(), included);
    assert!(norms.iter().all(|n| (n - 2.0).abs() < 1e-4), "{norms:?}");
    let spread = sum
        .sums
        .iter()
        .filter(|s| s.abs().sum(Kind::Float).double_value(&[]) > 0.0);
    assert_eq!(spread.count(), 2, "a dense canary touches every parameter");
}

fn config(root: &Path, sigma: f64) -> TrainConfig {
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.epochs = 3;
    c.data.limit_train = Some(2000);
    c.data.limit_test = Some(500);
    c.data.data_dir = Some(root.to_path_buf());
    c.device = DeviceChoice::Cpu;
    c.privacy.noise_multiplier = Some(sigma);
    c
}

fn settings(kind: CanaryKind) -> AuditSettings {
    AuditSettings {
        kind,
        canaries: CanarySettings {
            canaries: 200,
            dense: false,
            observe: Observe::EveryStep,
            seed: 19,
        },
        guesses: Guesses {
            included: 40,
            excluded: 0,
        },
        beta: 0.05,
    }
}

fn audit(c: TrainConfig, kind: CanaryKind) -> AuditReport {
    let dir = tempfile::tempdir().unwrap();
    let report = audit_training(
        dpcomp_lab::tasks::trainer(dir.path().join("run")),
        c,
        &settings(kind),
        Vec::new(),
    )
    .unwrap();
    let written: AuditReport =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run/audit.json")).unwrap())
            .unwrap();
    assert_eq!(
        written.outcome, report.outcome,
        "audit.json holds the report"
    );
    report
}

#[test]
fn a_run_without_noise_is_audited_near_the_most_its_canaries_show() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let r = audit(config(&root, 0.0), CanaryKind::WhiteBox);
    // 40 "included" guesses about 200 canaries at 95%: 2.508 with every guess right.
    assert!((r.max_bound - 2.5075).abs() < 1e-3, "{}", r.max_bound);
    assert!(r.accounted_epsilon.is_infinite() && !r.flagged);
    for o in [r.every_step.unwrap(), r.final_weights.unwrap()] {
        assert!(
            o.correct >= 38,
            "{o:?}: without noise the canaries stand out"
        );
        assert!(o.epsilon_lower_bound > 2.0, "{o:?}");
    }
    assert_eq!(r.outcome, r.every_step.unwrap());
    // Every included canary is Poisson-sampled about 3 times over 189 steps at q = 1/63.
    let included = r.outcome.included as f64;
    let samples = r.canary_samples.unwrap() as f64;
    assert!(
        (samples / (3.0 * included) - 1.0).abs() < 0.15,
        "{samples} samples of {included}"
    );
}

#[test]
fn honest_noised_runs_never_audit_above_their_accounted_epsilon() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let mut dgc = config(&root, 1.0);
    dgc.compression = dpcomp::config::CompressionSettings::from_flags(
        CompressorKind::Dgc,
        Some(16.0),
        None,
        dpcomp::compress::Setting::parse_all(&["budget=elements"]).unwrap(),
    )
    .unwrap();
    for c in [config(&root, 1.0), dgc] {
        assert_eq!(c.privacy.accountant, AccountantKind::Pld);
        let delta = c.privacy.delta;
        let r = audit(c, CanaryKind::WhiteBox);
        // The default accountant's (PLD's) ε for σ 1 over the run's steps at q = 1/63: the tight
        // one, so the audit is held to the smallest claim (RDP would claim 1.4865).
        assert!(
            (r.accounted_epsilon - 1.1569).abs() < 1e-3,
            "{}",
            r.accounted_epsilon
        );
        let expected = dpcomp::privacy::calibrate::epsilon_with(
            AccountantKind::Pld,
            r.noise_multiplier,
            r.sample_rate,
            r.steps,
            delta,
        )
        .unwrap();
        assert_eq!(r.accounted_epsilon, expected);
        assert!(!r.flagged, "{r:?}");
        for o in [r.every_step.unwrap(), r.final_weights.unwrap()] {
            assert!(o.epsilon_lower_bound <= r.accounted_epsilon, "{o:?}");
        }
    }
}

#[test]
fn mislabelled_input_canaries_are_found_without_noise() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let r = audit(config(&root, 0.0), CanaryKind::BlackBox);
    assert!(r.every_step.is_none() && r.canary_samples.is_none());
    // The excluded canaries left the training split: 2000 - 200 + the included.
    let steps_per_epoch = (2000 - 200 + r.outcome.included as u64).div_ceil(32);
    assert_eq!(r.steps, 3 * steps_per_epoch);
    // Half of random guesses would be right; the fitted wrong labels give more.
    assert!(r.outcome.correct >= 26, "{:?}", r.outcome);
    assert!(r.outcome.epsilon_lower_bound > 0.0, "{:?}", r.outcome);
}

#[test]
fn an_audit_grid_runs_its_cells_once_and_writes_the_table() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit_tiny.toml");
    std::fs::write(
        &file,
        format!(
            "kind = \"audit\"\nname = \"audit_tiny\"\n[audit]\ncanaries = 100\nguesses = 20\n\
             [base]\ntask = \"surnames\"\nlimit_train = 600\nlimit_test = 200\ndevice = \"cpu\"\n\
             data_dir = {:?}\n[grid]\nnoise_multiplier = [0.0, 1.0]\n[profiles.cpu]\nepochs = 1\n",
            root.to_str().unwrap()
        ),
    )
    .unwrap();
    let experiment = dpcomp_lab::experiment::ExperimentFile::open(&file).unwrap();
    let runs = dir.path().join("runs");
    let outcome = experiment.run("cpu", &[], &runs, None, &mut ()).unwrap();
    assert_eq!(outcome.finished, 2);
    let cell = outcome.folder.join("noise_multiplier-0/audit.json");
    let written = std::fs::metadata(&cell).unwrap().modified().unwrap();
    let table = std::fs::read_to_string(outcome.folder.join("results.md")).unwrap();
    assert!(
        table.contains("| noise_multiplier-0 | identity | 0 |"),
        "{table}"
    );
    assert!(
        table.contains("| noise_multiplier-1 | identity | 1 |"),
        "{table}"
    );
    assert!(table.contains("20 \"included\""), "{table}");
    // Finished cells are not audited again.
    let again = experiment.run("cpu", &[], &runs, None, &mut ()).unwrap();
    assert_eq!(again.finished, 2);
    assert_eq!(
        std::fs::metadata(&cell).unwrap().modified().unwrap(),
        written
    );
}
