//! `examples/own_parts.rs`: a `Trainer` built from an optimiser, a compressor and privacy
//! settings of one's own. The run must learn, spend at most its target ε, report the ε that
//! `dpcomp epsilon` gives for its σ, q and steps, record its parts in `config.toml`, and, killed
//! in the middle of an epoch (a child process aborts), resume from its last checkpoint to end
//! bit for bit where an uninterrupted run ends (weights, the optimiser's velocities, the
//! compressor's residuals, the metrics).

use crate::common;
#[path = "../../examples/own_parts.rs"]
mod example;

use dpcomp::prelude::*;
use std::path::PathBuf;

/// Where the killed child trains (set by the parent test for the child it starts).
const CHILD_DIR: &str = "DPCOMP_OWN_PARTS_CHILD_DIR";

/// Aborts the process at step 20 of the third epoch: a kill with no chance to clean up.
struct KillMidEpoch;

impl Observer for KillMidEpoch {
    fn step_finished(&mut self, epoch: usize, step: usize) {
        if epoch == 2 && step == 20 {
            std::process::abort();
        }
    }
}

/// The child's side of the kill: trains towards 4 epochs and is killed in the third. Runs only
/// when the parent test starts it.
#[test]
#[ignore = "started by a_trainer_of_ones_own_parts_resumes_after_a_kill"]
fn killed_child() {
    let dir = PathBuf::from(std::env::var(CHILD_DIR).expect("started by the parent test"));
    tch::set_num_threads(1);
    example::train(&dir, 4, Some(Box::new(KillMidEpoch))).unwrap();
    unreachable!("the observer kills the run in its third epoch");
}

#[test]
fn a_trainer_of_ones_own_parts_resumes_after_a_kill() {
    let _serial = common::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (whole, killed) = (dir.path().join("whole"), dir.path().join("killed"));

    let summary = example::train(&whole, 4, None).unwrap();
    // Majority guessing scores about 50%.
    assert!(
        summary.last_test_accuracy >= 0.85,
        "test accuracy {}",
        summary.last_test_accuracy
    );
    assert_eq!(summary.compressor, "top-10% with error feedback");
    assert_eq!(summary.sample_rate, Some(1.0 / 60.0));
    let epsilon = summary.epsilon.unwrap();
    assert!(epsilon <= 2.0 && epsilon > 0.99 * 2.0, "epsilon {epsilon}");

    // config.toml records the parts and the privacy settings the engine was built from.
    let config = TrainConfig::from_toml_file(&whole.join("config.toml")).unwrap();
    assert_eq!(
        config.parts.optimizer.as_deref(),
        Some("nesterov (lr 0.2, momentum 0.9)")
    );
    assert_eq!(
        config.parts.compressor.as_deref(),
        Some("top-10% with error feedback")
    );
    assert_eq!(config.privacy.target_epsilon, Some(2.0));
    assert_eq!(config.privacy.max_grad_norm, 1.0);
    let sigma = config.privacy.noise_multiplier.unwrap();

    // The child trains the same run and is killed in its third epoch.
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "own_parts::killed_child",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_DIR, &killed)
        .output()
        .unwrap();
    assert!(!child.status.success(), "the child was to be killed");
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(killed.join("checkpoint").join("state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["epochs_done"], 2, "{state}");

    // A resume must be given the parts again, under the same names.
    let refused = Trainer::builder(&killed)
        .resume(TrainOverrides::default())
        .model(Box::new(example::Mlp::new(0).unwrap()), example::data())
        .compressor(Box::new(example::TopKFeedback { fraction: 0.1 }))
        .build()
        .err()
        .expect("refused without the optimiser")
        .to_string();
    assert!(refused.contains("parts.optimizer"), "{refused}");
    let refused = Trainer::builder(&killed)
        .resume(TrainOverrides::default())
        .model(Box::new(example::Mlp::new(0).unwrap()), example::data())
        .optimizer(Box::new(example::Nesterov::new(0.2, 0.9)))
        .compressor(Box::new(example::TopKFeedback { fraction: 0.2 }))
        .build()
        .err()
        .expect("refused with another compressor")
        .to_string();
    assert!(refused.contains("top-20%"), "{refused}");

    let resumed = example::train(&killed, 4, None).unwrap();
    assert_eq!(resumed.epochs, 4);
    assert_eq!(resumed.epsilon, summary.epsilon);
    for file in [
        "model.safetensors",
        "optimizer.safetensors",
        "compressor.safetensors",
    ] {
        let (a, b) = (
            common::checkpoint_tensors(&whole, file),
            common::checkpoint_tensors(&killed, file),
        );
        assert_eq!(a.len(), b.len(), "{file}");
        assert!(!a.is_empty(), "{file} is empty");
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert!(x.equal(y), "{file}: {name} differs after the resume");
        }
    }
    assert_eq!(
        common::metrics_without_timings(&whole),
        common::metrics_without_timings(&killed)
    );

    // ε is the accountant's for 4 epochs of 60 steps at the calibrated σ, q 1/60, δ 1e-5.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "epsilon",
            "--json",
            "--noise-multiplier",
            &sigma.to_string(),
            "--sample-rate",
            &(1.0f64 / 60.0).to_string(),
            "--steps",
            "240",
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
    assert_eq!(json["epsilon"].as_f64(), Some(epsilon), "{json}");
}
