//! Issue 38's ablation options are post-processing of the privatised gradient: the second
//! clipping `compression.clip_noised` bounds the update's norm before any compressor, and no
//! option (error feedback off, a residual decay, the second clipping) changes ε.

use crate::common;
use dpcomp::compress::{CompressorKind, Setting};
use dpcomp::config::{CompressionSettings, TrainConfig};
use dpcomp::train::sgd::Sgd;
use dpcomp::train::update::Updater;
use dpcomp_lab::Task;
use tch::{Device, Kind, Tensor};

/// `[compression]` as `--compressor kind --rate rate --compressor-option ...` give it.
fn flags(kind: CompressorKind, rate: f64, options: &[&str]) -> CompressionSettings {
    let options = Setting::parse_all(options).unwrap();
    CompressionSettings::from_flags(kind, Some(rate), None, options).unwrap()
}

#[test]
fn clip_noised_bounds_the_updates_norm_before_the_compressor() {
    let _serial = common::serial();
    let params = [
        Tensor::zeros([30], (Kind::Float, Device::Cpu)),
        Tensor::zeros([4, 5], (Kind::Float, Device::Cpu)),
    ];
    // Plain SGD at lr 1: the weights move by minus what the optimiser receives.
    for (scale, radius) in [(10.0, 2.0), (0.01, 2.0), (3.0, 0.5)] {
        let mut updater = Updater::plain(Sgd::new(1.0, 0.0));
        updater.clip_noised = Some(radius);
        for p in &params {
            let _ = tch::no_grad(|| p.shallow_clone().zero_());
        }
        tch::manual_seed(3);
        let grads: Vec<Tensor> = params.iter().map(|p| p.randn_like() * scale).collect();
        let norm = |ts: &[Tensor]| {
            ts.iter()
                .map(|t| t.square().sum(Kind::Double).double_value(&[]))
                .sum::<f64>()
                .sqrt()
        };
        let before = norm(&grads);
        updater.apply(0, &params, &grads).unwrap();
        let moved = norm(&params);
        let want = before.min(radius);
        assert!(
            (moved - want).abs() < 1e-4 * want,
            "grad norm {before}, radius {radius}: moved {moved}, want {want}"
        );
        // The direction is kept.
        let cosine: f64 = params
            .iter()
            .zip(&grads)
            .map(|(p, g)| (p * g).sum(Kind::Double).double_value(&[]))
            .sum::<f64>()
            / (moved * before);
        assert!((cosine + 1.0).abs() < 1e-5, "cosine {cosine}");
    }
}

#[test]
fn the_ablation_options_leave_epsilon_unchanged() {
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let run = |name: &str, edit: &dyn Fn(&mut TrainConfig)| {
        let mut c = common::small_surnames(&root, 1, 512, 64);
        c.privacy.noise_multiplier = Some(0.8);
        edit(&mut c);
        let mut t = dpcomp_lab::tasks::start(c, work.path().join(name)).unwrap();
        t.run().unwrap()
    };
    let plain = run("plain", &|_| {});
    type Edit<'a> = &'a dyn Fn(&mut TrainConfig);
    let arms: [(&str, Edit); 4] = [
        ("clip-noised", &|c| c.compression.clip_noised = Some(3.0)),
        ("dgc-no-ef", &|c| {
            c.compression = flags(CompressorKind::Dgc, 16.0, &["error_feedback=false"]);
        }),
        ("dgc-decay", &|c| {
            c.compression = flags(CompressorKind::Dgc, 16.0, &["residual_decay=0.5"]);
            c.compression.clip_noised = Some(3.0);
        }),
        ("powersgd-no-ef", &|c| {
            c.compression = flags(CompressorKind::Powersgd, 1.0, &["error_feedback=false"]);
        }),
    ];
    for (name, edit) in arms {
        let summary = run(name, edit);
        assert_eq!(summary.epsilon, plain.epsilon, "{name}");
        assert!(summary.last_test_accuracy.is_finite(), "{name}");
    }
    // A bad radius is refused, naming the setting.
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.compression.clip_noised = Some(f64::NAN);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.starts_with("compression.clip_noised: NaN"), "{e}");
}

/// Through the binary: each bad use of the ablation options is an error naming the flag or
/// option, and nothing is written.
#[test]
fn bad_ablation_settings_are_refused_by_name_before_anything_is_written() {
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--thread-workers", "2", "--clip-noised", "3"],
            "--clip-noised: 3 with 2 workers",
        ),
        (
            &["--clip-noised=-1"],
            "--clip-noised: -1: expected a positive, finite radius",
        ),
        (
            &[
                "--compressor",
                "dgc",
                "--rate",
                "16",
                "--compressor-option",
                "error_feedback=maybe",
            ],
            "--compressor-option: error_feedback: \"maybe\": invalid type: string \"maybe\", expected a boolean (dgc)",
        ),
        (
            &[
                "--compressor",
                "powersgd",
                "--compressor-option",
                "error_feedback=false",
                "--compressor-option",
                "residual_decay=0.5",
            ],
            "--compressor-option: residual_decay: 0.5 with error_feedback = false",
        ),
    ];
    for (i, (args, expected)) in cases.iter().enumerate() {
        let out_dir = work.path().join(format!("run{i}"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args([
                "train",
                "--task",
                "surnames",
                "--epochs",
                "1",
                "--limit-train",
                "64",
            ])
            .args(["--limit-test", "32", "--quiet", "--data-dir"])
            .arg(&root)
            .arg("--out")
            .arg(&out_dir)
            .args(*args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!out_dir.exists(), "{args:?} wrote {}", out_dir.display());
    }
}
