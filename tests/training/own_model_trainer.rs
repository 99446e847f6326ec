//! `examples/own_model_trainer.rs`: a model and data of one's own (a GRU over synthetic
//! sequences, `Features::Rows`) trained by dpcomp's `Trainer` with DP-SGD and DGC. It must learn,
//! report the accountant's ε (the one `dpcomp epsilon` gives for its σ, q, steps and δ), and a
//! run stopped after 2 epochs and resumed to 4 must equal an uninterrupted 4-epoch run bit for
//! bit (weights, optimiser and compressor state, metrics).

use crate::common;
#[path = "../../examples/own_model_trainer.rs"]
mod example;

use dpcomp::prelude::*;

#[test]
fn a_model_of_ones_own_trains_privately_and_resumes_exactly() {
    let _serial = common::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));

    let summary = example::train(&whole, 4, false).unwrap();
    // Majority guessing scores about 50%; this run 92.1% (seed 0).
    assert!(
        summary.last_test_accuracy >= 0.88,
        "test accuracy {}",
        summary.last_test_accuracy
    );
    assert_eq!(summary.task, "synthetic-gru");
    assert_eq!(summary.compressor, "dgc x4");
    assert_eq!(summary.sample_rate, Some(1.0 / 40.0));

    let first = example::train(&split, 2, false).unwrap();
    assert_eq!(first.epochs, 2);
    let resumed = example::train(&split, 4, false).unwrap();
    assert_eq!(resumed.epochs, 4);
    assert_eq!(resumed.epsilon, summary.epsilon);
    for file in [
        "model.safetensors",
        "optimizer.safetensors",
        "compressor.safetensors",
    ] {
        let (a, b) = (
            common::checkpoint_tensors(&whole, file),
            common::checkpoint_tensors(&split, file),
        );
        assert_eq!(a.len(), b.len(), "{file}");
        assert!(!a.is_empty(), "{file} is empty");
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert!(x.equal(y), "{file}: {name} differs after the resume");
        }
    }
    assert_eq!(
        common::metrics_without_timings(&whole),
        common::metrics_without_timings(&split)
    );

    // ε is the accountant's for 4 epochs of 40 steps at σ 1, q 1/40, δ 1e-5.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "epsilon",
            "--json",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            &(1.0f64 / 40.0).to_string(),
            "--steps",
            "160",
            "--delta",
            "1e-5",
        ])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        json["accountant"], "pld",
        "the run's accountant, the default"
    );
    // Bit for bit: the PLD composition's FFT is pure Rust (realfft), so its result does not
    // depend on the thread count of this test (one) or of the `dpcomp` process.
    assert_eq!(Some(json["epsilon"].as_f64().unwrap()), summary.epsilon);
}

#[test]
fn a_run_of_ones_own_is_not_mistaken_for_a_papers_task() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("own");
    example::train(&run, 1, false).unwrap();
    // Resuming through the lab's tasks (what `dpcomp train --resume` does): "synthetic-gru" is
    // not one of them, and the error says how such a run resumes.
    let err = dpcomp_lab::tasks::resume(&run, Some(2))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("task:")
            && err.contains("model of one's own")
            && err.contains("TrainerBuilder::model"),
        "{err}"
    );
    // Resuming through the framework with neither the model nor a task source: refused before
    // anything is read or written, naming both ways.
    let before = std::fs::read(run.join("config.toml")).unwrap();
    let err = Trainer::builder(&run)
        .resume(TrainOverrides::default())
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("task:")
            && err.contains("TrainerBuilder::model")
            && err.contains("TrainerBuilder::tasks"),
        "{err}"
    );
    assert_eq!(std::fs::read(run.join("config.toml")).unwrap(), before);
    // A fresh run of a name with neither: refused the same way, and no folder is left behind.
    let err = Trainer::builder(dir.path().join("c"))
        .config(TrainConfig::new("cifar10"))
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("task:") && err.contains("TrainerBuilder::tasks"),
        "{err}"
    );
    assert!(!dir.path().join("c").exists());
}

/// `data.limit_train` and `limit_test` apply to data of one's own as to a built-in task's (they
/// were silently ignored).
#[test]
fn limits_apply_to_data_of_ones_own() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let mut config = example::config(1);
    config.data.limit_train = Some(100);
    config.data.limit_test = Some(30);
    let model = Box::new(example::SequenceClassifier::new(0).unwrap());
    let trainer = Trainer::builder(dir.path().join("run"))
        .config(config)
        .model(model, example::data())
        .build()
        .unwrap();
    assert_eq!(trainer.data().train.len(), 100);
    assert_eq!(trainer.data().test.len(), 30);
    // q follows the limited split: 100 examples in the example's batches of 100, one step.
    assert_eq!(trainer.steps_per_epoch(), 1);
}
