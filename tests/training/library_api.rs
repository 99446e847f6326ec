//! The library's API as a user of Opacus would meet it (issue 36): a `Trainer` given only a
//! target ε calibrates σ itself, says it through the run's settings, and ends at the target.

use crate::common;
use dpcomp::config::TrainConfig;
use dpcomp::privacy::calibrate::noise_multiplier_for;
use dpcomp::train::Trainer;
use dpcomp_lab::Task;

#[test]
fn the_trainer_with_only_a_target_epsilon_calibrates_sigma_and_ends_at_the_target() {
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut config = common::small_surnames(&root, 2, 512, 128);
    config.privacy.target_epsilon = Some(3.0);
    assert_eq!(config.privacy.noise_multiplier, None);
    let mut trainer = dpcomp_lab::tasks::start(config.clone(), work.path().join("run")).unwrap();
    // 512 examples in batches of 32: 16 steps an epoch at q 1/16, 32 steps in all.
    assert_eq!(trainer.steps_per_epoch(), 16);
    let want = noise_multiplier_for(
        config.privacy.accountant,
        3.0,
        1.0 / 16.0,
        32,
        config.privacy.delta,
    )
    .unwrap();
    assert_eq!(trainer.config().privacy.noise_multiplier, Some(want));
    let summary = trainer.run().unwrap();
    let epsilon = summary.epsilon.unwrap();
    assert!(epsilon <= 3.0 && epsilon > 0.999 * 3.0, "epsilon {epsilon}");
    assert_eq!(summary.noise_multiplier, Some(want));
    // The run's config.toml holds the σ it chose, so a resume reads it back.
    let saved = TrainConfig::from_toml_file(&work.path().join("run").join("config.toml")).unwrap();
    assert_eq!(saved.privacy.noise_multiplier, Some(want));
    assert_eq!(saved.privacy.target_epsilon, Some(3.0));
}

/// What an observer hears: every epoch's start and its metrics row (the same as `history` and
/// `metrics.jsonl`), every step, the running totals every `interval` steps; and a run without
/// one writes nothing to stderr (`dpcomp train --quiet` installs none).
#[test]
fn an_observer_sees_every_epochs_metrics_row_and_the_library_is_silent_without_one() {
    use dpcomp::train::metrics::EpochMetrics;
    use dpcomp::train::observer::{LiveProgress, Observer};
    use std::cell::RefCell;
    use std::rc::Rc;
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    #[derive(Default)]
    struct Heard {
        started: Vec<(usize, usize, usize)>,
        steps: usize,
        live: Vec<LiveProgress>,
        rows: Vec<EpochMetrics>,
        /// (epochs done, rows in the trainer's history) at each `between_epochs`.
        between: Vec<(usize, usize)>,
    }
    struct Recorder(Rc<RefCell<Heard>>);
    impl Observer for Recorder {
        fn epoch_started(&mut self, epoch: usize, epochs: usize, steps: usize) {
            self.0.borrow_mut().started.push((epoch, epochs, steps));
        }
        fn step_finished(&mut self, _epoch: usize, _step: usize) {
            self.0.borrow_mut().steps += 1;
        }
        fn interval(&self) -> usize {
            5
        }
        fn progress(&mut self, live: &LiveProgress) {
            self.0.borrow_mut().live.push(live.clone());
        }
        fn epoch_finished(&mut self, metrics: &EpochMetrics) {
            self.0.borrow_mut().rows.push(metrics.clone());
        }
        fn between_epochs(&mut self, trainer: &Trainer) -> dpcomp::Result<()> {
            let seen = (trainer.state().epochs_done, trainer.history().len());
            self.0.borrow_mut().between.push(seen);
            Ok(())
        }
    }
    /// A second observer at its own interval: each hears what it asked for.
    struct EveryOther(Rc<RefCell<usize>>);
    impl Observer for EveryOther {
        fn interval(&self) -> usize {
            2
        }
        fn progress(&mut self, _live: &LiveProgress) {
            *self.0.borrow_mut() += 1;
        }
    }
    let work = tempfile::tempdir().unwrap();
    let mut config = common::small_surnames(&root, 3, 320, 64);
    config.privacy.noise_multiplier = Some(1.0);
    let run_dir = work.path().join("run");
    let mut trainer = dpcomp_lab::tasks::start(config, &run_dir).unwrap();
    let heard = Rc::new(RefCell::new(Heard::default()));
    trainer.observe(Box::new(Recorder(heard.clone())));
    let every_other = Rc::new(RefCell::new(0));
    trainer.observe(Box::new(EveryOther(every_other.clone())));
    trainer.run().unwrap();
    let heard = heard.borrow();
    assert_eq!(
        *every_other.borrow(),
        15,
        "steps 2, 4, .., 10 of each epoch"
    );
    // Between epochs: at the start, then after each epoch's row.
    assert_eq!(heard.between, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
    // 320 examples in batches of 32: 10 steps an epoch (Poisson batches: 10 of them).
    assert_eq!(heard.started, vec![(0, 3, 10), (1, 3, 10), (2, 3, 10)]);
    assert_eq!(heard.steps, 30);
    assert_eq!(heard.live.len(), 6, "steps 5 and 10 of each epoch");
    assert!(heard
        .live
        .iter()
        .all(|l| l.epsilon.is_some() && l.loss.is_finite()));
    assert_eq!(heard.rows, trainer.history());
    let logged = dpcomp::train::metrics::read(&run_dir.join("metrics.jsonl")).unwrap();
    assert_eq!(logged.len(), 3);
    for (row, line) in heard.rows.iter().zip(&logged) {
        assert_eq!(row.epoch, line.epoch);
        assert_eq!(row.test_accuracy, line.test_accuracy);
        assert_eq!(row.epsilon, line.epsilon);
    }
    // The command line without its observer (--quiet): nothing on stderr.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "train",
            "--task",
            "surnames",
            "--epochs",
            "1",
            "--limit-train",
            "64",
            "--limit-test",
            "32",
            "--data-dir",
            &root.display().to_string(),
            "--out",
            &work.path().join("quiet").display().to_string(),
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// Typed compressor settings: their `Default`s are the command line's defaults, both forms
/// build the same encoder (the same bytes for the same updates), and settings no compressor
/// can run with are refused, naming the field.
#[test]
fn typed_compressor_settings_equal_the_command_lines_and_are_checked() {
    use dpcomp::compress::{Compressor, CompressorKind, Denoise, Dgc, PowerSgd, Setting};
    use dpcomp::config::CompressionSettings;
    use tch::{Device, Kind};
    let parsed = |kind, rate, rank| {
        CompressionSettings::from_flags(kind, Some(rate), Some(rank), Vec::new())
            .unwrap()
            .compressor
    };
    assert_eq!(
        parsed(CompressorKind::Dgc, 16.0, 1),
        Compressor::Dgc(Dgc::default())
    );
    assert_eq!(
        parsed(CompressorKind::Powersgd, 1.0, 1),
        Compressor::PowerSgd(PowerSgd::default())
    );
    assert_eq!(
        parsed(CompressorKind::Denoise, 16.0, 1),
        Compressor::Denoise(Denoise::default())
    );
    let typed = Compressor::Dgc(Dgc {
        rate: 256.0,
        residual_decay: 0.0,
        ..Default::default()
    });
    let spec = CompressionSettings::from_flags(
        CompressorKind::Dgc,
        Some(256.0),
        None,
        Setting::parse_all(&["error_feedback=false"]).unwrap(),
    )
    .unwrap()
    .compressor;
    assert_eq!(spec, typed);
    let shapes = [vec![40, 70], vec![40]];
    let (mut a, mut b) = (
        typed.link(&shapes, Device::Cpu).unwrap(),
        spec.link(&shapes, Device::Cpu).unwrap(),
    );
    let mut draws = common::Draws::new(5);
    for _ in 0..3 {
        let update = [
            draws.randn(&[40, 70], Kind::Float),
            draws.randn(&[40], Kind::Float),
        ];
        let (x, y) = (a.round_trip(&update).0, b.round_trip(&update).0);
        assert_eq!(x.to_bytes().unwrap(), y.to_bytes().unwrap());
    }
    let refused = |c: Compressor| c.link(&shapes, Device::Cpu).err().unwrap().to_string();
    for (c, expected) in [
        (
            Compressor::Dgc(Dgc {
                rate: 0.5,
                ..Default::default()
            }),
            "compressor setting rate: 0.5",
        ),
        (
            Compressor::Dgc(Dgc {
                residual_decay: 1.5,
                ..Default::default()
            }),
            "compressor setting residual_decay: 1.5",
        ),
        (
            Compressor::PowerSgd(PowerSgd {
                rank: 0,
                ..Default::default()
            }),
            "compressor setting rank: 0",
        ),
        (
            Compressor::Denoise(Denoise {
                value_bits: 40,
                ..Default::default()
            }),
            "compressor setting value_bits: 40",
        ),
    ] {
        let e = refused(c);
        assert!(e.starts_with(expected), "{e}");
    }
}

/// `Updater::apply` takes the epoch, so DGC's warm-up cannot be left off by forgetting to
/// start it: epoch 0 of a 2-epoch warm-up sends at rate 4, epoch 2 at the full rate.
#[test]
fn the_updater_takes_the_epoch_so_the_warm_up_runs() {
    use dpcomp::compress::{Compressor, Dgc};
    use dpcomp::prelude::{Sgd, Updater};
    use tch::{Device, Kind, Tensor};
    let params = [Tensor::zeros([4096], (Kind::Float, Device::Cpu))];
    let dgc = Compressor::Dgc(Dgc {
        rate: 64.0,
        warmup_epochs: 2,
        budget: dpcomp::compress::encoding::Budget::Elements,
        ..Default::default()
    });
    let mut updater = Updater::with_compressor(Sgd::new(0.1, 0.0), &dgc, &params).unwrap();
    let grads = [Tensor::ones([4096], (Kind::Float, Device::Cpu))];
    let paper_bits = |u: &Updater| u.last_paper_bits;
    updater.apply(0, &params, &grads).unwrap();
    // Rate min(64, 4^1) = 4 in epoch 0: 1024 elements of 64 bits in the paper's unit.
    assert_eq!(paper_bits(&updater), 1024 * 64);
    updater.apply(1, &params, &grads).unwrap();
    assert_eq!(paper_bits(&updater), 256 * 64);
    updater.apply(2, &params, &grads).unwrap();
    assert_eq!(paper_bits(&updater), 64 * 64);
}

/// The trainer's builder names what it was not given, or given twice.
#[test]
fn the_trainer_builder_refuses_contradictory_starts() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("run");
    let config = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    let err = |b: dpcomp::train::builder::TrainerBuilder| b.build().err().unwrap().to_string();
    let e = err(dpcomp_lab::tasks::trainer(&dir));
    assert!(e.starts_with("trainer: neither config"), "{e}");
    let e = err(dpcomp_lab::tasks::trainer(&dir)
        .config(config.clone())
        .resume(Default::default()));
    assert!(e.starts_with("trainer: given both config"), "{e}");
    let e = err(dpcomp_lab::tasks::trainer(&dir)
        .resume(Default::default())
        .edit_data(Box::new(Ok)));
    assert!(e.starts_with("edit_data: applies to a fresh run"), "{e}");
    assert!(!dir.exists(), "nothing is written for a refused start");
}
