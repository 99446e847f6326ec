//! The one-run audit bound (Steinke, Nasr and Jagielski 2023; `privacy::audit`) against golden
//! values from `benches/audit_reference.py` (scipy's binomial distribution, the paper's
//! algorithm), with its δ term and edge cases, and the properties an auditor relies on.

use crate::common;
use dpcomp::privacy::audit::{epsilon_lower_bound, p_value};

/// (m, r, v, ε, δ, p-value) from `benches/audit_reference.py`.
const P_VALUES: [(u64, u64, u64, f64, f64, f64); 7] = [
    (1000, 100, 90, 1.0, 0.0, 2.7358128007661584e-05),
    (1000, 100, 90, 1.0, 1e-5, 0.0008412885614385305),
    (1000, 100, 90, 2.0, 1e-5, 0.3449868367938024),
    (10000, 1000, 700, 0.5, 1e-5, 0.0018660565715199332),
    (1000, 1000, 500, 0.0, 0.0, 0.5126125090891802),
    (200, 50, 50, 3.0, 1e-3, 0.1854493007669381),
    (200, 50, 0, 1.0, 1e-5, 1.0),
];

/// (m, r, v, δ, 1 − confidence, ε lower bound) from `benches/audit_reference.py`.
const BOUNDS: [(u64, u64, u64, f64, f64, f64); 9] = [
    (1000, 100, 90, 0.0, 0.05, 1.6308231927409742),
    (1000, 100, 90, 1e-5, 0.05, 1.6261434806957262),
    (1000, 100, 100, 1e-5, 0.05, 3.4653763478110453),
    (10000, 1000, 700, 1e-5, 0.05, 0.7292532390257122),
    (10000, 1000, 1000, 1e-5, 0.05, 5.529349602846353),
    (1000, 1000, 1000, 1e-5, 0.05, 5.782283135394014),
    (1000, 100, 60, 1e-5, 0.05, 0.04954866064484633),
    (1000, 100, 50, 1e-5, 0.05, 0.0),
    (5000, 400, 380, 1e-5, 0.01, 2.382468937917361),
];

#[test]
fn p_values_match_the_reference() {
    for (m, r, v, eps, delta, want) in P_VALUES {
        let got = p_value(m, r, v, eps, delta).unwrap();
        assert!(
            (got - want).abs() <= 1e-9 * want.max(1e-300) + 1e-15,
            "m {m} r {r} v {v} eps {eps} delta {delta}: {got} vs {want}"
        );
    }
}

#[test]
fn epsilon_lower_bounds_match_the_reference() {
    for (m, r, v, delta, beta, want) in BOUNDS {
        let got = epsilon_lower_bound(m, r, v, delta, beta).unwrap();
        assert!(
            (got - want).abs() < 1e-7,
            "m {m} r {r} v {v} delta {delta} beta {beta}: {got} vs {want}"
        );
    }
}

#[test]
fn the_bound_behaves_as_an_auditor_needs() {
    // More right guesses refute more; δ only weakens the bound; a higher confidence too.
    let bound = |v, delta, beta| epsilon_lower_bound(1000, 200, v, delta, beta).unwrap();
    let by_v: Vec<f64> = (120..=200)
        .step_by(20)
        .map(|v| bound(v, 1e-5, 0.05))
        .collect();
    assert!(by_v.windows(2).all(|w| w[1] > w[0]), "{by_v:?}");
    assert!(bound(180, 1e-3, 0.05) < bound(180, 1e-5, 0.05));
    assert!(bound(180, 1e-5, 0.01) < bound(180, 1e-5, 0.05));
    // Guessing at chance (half right) refutes nothing; so does abstaining on every canary.
    assert_eq!(bound(100, 1e-5, 0.05), 0.0);
    assert_eq!(epsilon_lower_bound(1000, 0, 0, 1e-5, 0.05).unwrap(), 0.0);
    // All r right: the bound is finite and grows like ln of r (randomised response's limit).
    let all_right: Vec<f64> = [10u64, 100, 1000]
        .iter()
        .map(|&r| epsilon_lower_bound(1000, r, r, 0.0, 0.05).unwrap())
        .collect();
    assert!(
        all_right.iter().all(|e| e.is_finite() && *e > 0.0),
        "{all_right:?}"
    );
    assert!(all_right.windows(2).all(|w| w[1] > w[0]));
    // The p-value at the bound is the confidence level (the bisection's invariant).
    let eps = bound(180, 1e-5, 0.05);
    assert!(p_value(1000, 200, 180, eps, 1e-5).unwrap() < 0.05);
    assert!(p_value(1000, 200, 180, eps + 1e-6, 1e-5).unwrap() >= 0.05);
    // Counts out of order and confidences outside (0, 1) are refused, naming what was wrong.
    let error = p_value(10, 20, 5, 1.0, 0.0).unwrap_err().to_string();
    assert!(
        error.contains("v (right guesses) <= r (guesses) <= m (canaries)"),
        "{error}"
    );
    let error = epsilon_lower_bound(10, 5, 5, 0.0, 1.0)
        .unwrap_err()
        .to_string();
    assert!(error.contains("1 - confidence"), "{error}");
    assert!(p_value(10, 5, 5, -1.0, 0.0).is_err());
}

/// The engine's privatising step audited with 1,000 Dirac gradient canaries observed every step
/// (σ 3, q 0.05, 100 steps): the audited lower bound
/// stays below the accounted ε. The same step with its noise deliberately removed, still
/// accounted by the engine, is flagged: the canaries' scores separate, and the bound exceeds
/// the accounted ε several times over.
#[test]
fn the_engine_passes_a_white_box_audit_and_a_step_without_its_noise_is_flagged() {
    use dpcomp::privacy::audit::{white_box_audit, WhiteBoxSettings};
    use dpcomp::privacy::engine::Clipping;
    let _serial = common::serial();
    tch::manual_seed(19);
    let settings = WhiteBoxSettings {
        canaries: 1000,
        dimension: 1000,
        steps: 100,
        sample_rate: 0.05,
        clip: 1.0,
        dense: false,
        guesses: 200,
        delta: 1e-5,
        beta: 0.05,
        seed: 0,
    };
    let clipping = Clipping::Flat { max_norm: 1.0 };
    // The audit divides by the expected batch q x canaries / 2 = 25, as the engine does.
    let engine = || common::engine(3.0, 0.05, 25.0, clipping.clone(), 1).unwrap();
    let mut honest = engine();
    let outcome = white_box_audit(&settings, &clipping, &mut |batch, expected| {
        assert_eq!(expected, honest.expected_batch_size());
        honest.privatize(batch)
    })
    .unwrap();
    let accounted = honest.epsilon().unwrap();
    assert!(accounted > 0.2 && accounted < 1.0, "{accounted}");
    assert!(
        outcome.epsilon_lower_bound <= accounted,
        "audited {} above accounted {accounted}: {outcome:?}",
        outcome.epsilon_lower_bound
    );
    assert!(outcome.included > 400 && outcome.included < 600);
    // The bug: the engine counts each step (its accountant says the same ε), but the gradient
    // the run uses is the clipped sum without the noise.
    let mut buggy = engine();
    let flagged = white_box_audit(&settings, &clipping, &mut |batch, expected| {
        buggy.privatize(batch)?;
        Ok(batch.sums.iter().map(|s| s / expected).collect())
    })
    .unwrap();
    let still_accounted = buggy.epsilon().unwrap();
    assert_eq!(still_accounted, accounted);
    assert!(
        flagged.epsilon_lower_bound > 3.0 * accounted,
        "audited {} vs accounted {accounted}: {flagged:?}",
        flagged.epsilon_lower_bound
    );
    assert!(flagged.correct >= 195, "{flagged:?}");
    eprintln!(
        "accounted {accounted:.4}; honest audit {:.4} ({} of {} right); without noise {:.4} ({} right)",
        outcome.epsilon_lower_bound, outcome.correct, outcome.guesses, flagged.epsilon_lower_bound, flagged.correct
    );
}
