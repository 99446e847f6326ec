//! Privacy at the edges of what the accountants accept: a target ε under the tight (PLD)
//! accountant with more steps than any run takes, and σ calibrated for them. The PLD
//! accountant used to report ε 0 there, so training ran on past its target and calibration
//! returned σ 1.67e-10 (no noise at all).

use crate::common;
use dpcomp::config::AccountantKind;
use dpcomp::privacy::accountant::Accountant;
use dpcomp::privacy::calibrate::{epsilon_for, noise_multiplier_for};
use std::process::Command;

/// σ calibrated for 10^12 steps at q 0.25, ε 5, δ 8e-5 with the PLD accountant: the history is
/// beyond what the PLD composition is validated for, so the bound is RDP's, and the σ returned
/// gives ε ≤ 5 by RDP as well (it was 1.67e-10, ε 0 by the failed composition).
#[test]
fn calibration_for_a_huge_step_count_returns_a_noise_that_meets_the_target() {
    let steps = 1_000_000_000_000u64;
    let sigma = noise_multiplier_for(AccountantKind::Pld, 5.0, 0.25, steps, 8e-5).unwrap();
    let rdp = epsilon_for(sigma, 0.25, steps, 8e-5).unwrap();
    assert!(sigma > 1e4 && rdp <= 5.0, "σ {sigma}: RDP ε {rdp}");
    let mut a = Accountant::default();
    a.step(sigma, 0.25, steps).unwrap();
    let pld = a.epsilon(AccountantKind::Pld, 8e-5).unwrap().0;
    assert!(pld <= 5.0 && pld >= 0.99 * rdp, "PLD {pld}, RDP {rdp}");
}

/// The calibration's search reaches σ 10^6, as its error message says (it stopped doubling at
/// 524,288): at q 1, 2e10 steps, δ 1e-5 and a target of 1, RDP needs σ between the two.
#[test]
fn calibration_searches_sigma_up_to_a_million() {
    let sigma = noise_multiplier_for(AccountantKind::Rdp, 1.0, 1.0, 20_000_000_000, 1e-5).unwrap();
    assert!(sigma > 524_288.0 && sigma <= 1e6, "σ {sigma}");
    let err = noise_multiplier_for(AccountantKind::Rdp, 0.1, 1.0, 20_000_000_000, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("target_epsilon: 0.1: not reachable with any sigma up to 1e6"),
        "{err}"
    );
}

/// `dpcomp epsilon --accountant pld` with more steps than the composition is validated for
/// (q 0.01, σ 1, 10^12 steps): ε is the RDP bound, about 9.2e7 (it was 0.0000), and the note
/// says so and why.
#[test]
fn the_epsilon_command_says_when_the_rdp_bound_replaces_the_pld_composition() {
    let (v, stderr) = epsilon_json(&["0.01", "1", "1000000000000", "1e-5"]);
    let epsilon = v["epsilon"].as_f64().unwrap();
    assert!(epsilon > 9e7 && epsilon < 1e8, "{v}");
    assert!(
        stderr.contains("epsilon is the RDP accountant's bound")
            && stderr.contains("more steps than the PLD composition is validated for"),
        "{stderr}"
    );
}

/// `dpcomp epsilon --accountant pld` at q 0.25, σ 1e-9, 12 steps, δ 8e-5 (it printed 0.0000):
/// every sampled step then reveals the example, with loss 1/(2σ²) = 5e17, and at least 9 of 12
/// steps sample it with probability 4e-4 > δ, so the true ε is about 9 · 5e17 = 4.5e18. The
/// answer is at least that and at most the RDP bound (6.6e18), on a grid coarsened to fit,
/// which the note says.
#[test]
fn the_epsilon_command_at_a_negligible_noise_is_at_least_the_loss_of_nine_sampled_steps() {
    let (v, stderr) = epsilon_json(&["0.25", "1e-9", "12", "8e-5"]);
    let epsilon = v["epsilon"].as_f64().unwrap();
    assert!((4.4e18..=6.6e18).contains(&epsilon), "{v}");
    assert!(
        stderr.contains("the bound is valid but looser")
            || stderr.contains("epsilon is the RDP accountant's bound"),
        "{stderr}"
    );
}

/// `dpcomp epsilon --accountant pld --json` at (q, σ, steps, δ): the JSON and the stderr notes.
fn epsilon_json(args: &[&str; 4]) -> (serde_json::Value, String) {
    let [q, sigma, steps, delta] = args;
    let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "epsilon",
            "--accountant",
            "pld",
            "--sample-rate",
            q,
            "--noise-multiplier",
            sigma,
            "--steps",
            steps,
            "--delta",
            delta,
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (serde_json::from_slice(&out.stdout).unwrap(), stderr)
}

/// `train --noise-multiplier 1 --target-epsilon 5 --accountant pld --epochs 250000000000`: the
/// budget is checked against the ε the steps actually spend, so training stops at the target
/// (it trained on to ε 21.9 and beyond: the composition said 0 for all the planned steps).
#[test]
fn a_target_epsilon_stops_a_run_of_any_length_under_the_tight_accountant() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "train",
            "--task",
            "surnames",
            "--limit-train",
            "100",
            "--limit-test",
            "20",
            "--noise-multiplier",
            "1",
            "--target-epsilon",
            "5",
            "--accountant",
            "pld",
            "--epochs",
            "250000000000",
            "--quiet",
            "--data-dir",
            &data.display().to_string(),
            "--out",
            &run.display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let epsilon = summary["epsilon"].as_f64().unwrap();
    assert!(epsilon <= 5.0 && epsilon > 4.0, "{summary}");
    assert!(
        summary["stopped"]
            .as_str()
            .unwrap()
            .contains("one more step would spend epsilon"),
        "{summary}"
    );
    // The ε of the steps taken, recomputed from the run's (q, σ, steps) by both accountants.
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    let steps = last["steps"].as_u64().unwrap();
    let q = summary["sample_rate"].as_f64().unwrap();
    let mut a = Accountant::default();
    a.step(1.0, q, steps).unwrap();
    let pld = a.epsilon(AccountantKind::Pld, 8e-5).unwrap().0;
    assert!(
        (pld - epsilon).abs() < 1e-9 && pld <= 5.0,
        "{pld} vs {epsilon}"
    );
}
