//! `examples/private_tabular.rs`, the library used as a user would: a model of one's own with a
//! layer kind dpcomp does not have, trained with DP-SGD on a table that is none of the tasks. It
//! must learn, spend no more than its target ε, and report the ε that `dpcomp epsilon` gives for
//! the same σ, q and steps.

use crate::common;
#[path = "../../examples/private_tabular.rs"]
mod example;

#[test]
fn the_example_learns_privately_and_its_epsilon_is_the_accountants() {
    let _serial = common::serial();
    let Some(root) = common::require_breast_cancer() else {
        return;
    };
    let csv = root.join("breast_cancer").join("breast_cancer.csv");
    let out = example::train(&csv, 3.0, 10, 0).unwrap();
    assert_eq!(out.steps, 10 * 8, "10 epochs of ⌈455 / 64⌉ = 8 steps");
    assert!(
        out.epsilon <= 3.0 && out.epsilon > 0.999 * 3.0,
        "epsilon {} for a target of 3",
        out.epsilon
    );
    // A majority-class guess scores about 63% here. One run's accuracy varies much with the
    // seed at this ε (seeds 0-7: 71.9, 84.2, 89.5, 93.9, 85.1, 95.6, 93.0, 92.1%; mean 88.2%),
    // so the claim is on the mean of eight seeds, each above the majority guess.
    let accuracies: Vec<f64> = (0..8)
        .map(|seed| {
            if seed == 0 {
                out.test_accuracy
            } else {
                example::train(&csv, 3.0, 10, seed).unwrap().test_accuracy
            }
        })
        .collect();
    let mean = accuracies.iter().sum::<f64>() / 8.0;
    assert!(mean >= 0.85, "mean test accuracy {mean}: {accuracies:?}");
    assert!(accuracies.iter().all(|&a| a > 0.65), "{accuracies:?}");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "epsilon",
            "--json",
            "--noise-multiplier",
            &out.noise_multiplier.to_string(),
            "--sample-rate",
            &out.sample_rate.to_string(),
            "--steps",
            &out.steps.to_string(),
            "--delta",
            &out.delta.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(json["epsilon"].as_f64().unwrap(), out.epsilon);
}
