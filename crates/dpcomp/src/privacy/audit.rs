//! The one-run privacy audit's bound (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
//! Training Run", NeurIPS 2023): m canaries, each included in training independently with
//! probability ½; after the run an auditor guesses "included" or "excluded" for r of them
//! (abstaining on the rest) and v guesses are right. If the training is (ε, δ)-DP, the number of
//! right guesses is dominated by that of ε-randomised response plus a δ term (their Theorem 5.2
//! and its algorithm), so
//!
//!   P[≥ v right] ≤ β(ε) + α(ε) · 2 m δ,
//!   β = P[Binomial(r, q) ≥ v],  q = e^ε / (1 + e^ε),
//!   α = max over i = 1..v of P[v − i ≤ Binomial(r, q) < v] / i.
//!
//! `p_value` is that bound (capped at 1); `epsilon_lower_bound` is the largest ε (by bisection,
//! as the paper's code) whose p-value stays below 1 − confidence: with that confidence, the run
//! is not (ε', δ)-DP for any ε' below it. An honest run's bound never exceeds its accounted ε
//! except with probability 1 − confidence; a bound above it flags a bug.
//!
//! Binomial probabilities are summed in log space from `libm::lgamma` (what the RDP accountant
//! uses), exact to about 1e-12 relative for the m of an audit (thousands); `benches/audit_reference.py`
//! computes the same with scipy for the golden values of the tests.

use crate::error::{Error, Result};

/// ln P[Binomial(r, q) = k], with ln q and ln(1 − q) given (−∞ allowed).
fn log_pmf(r: u64, k: u64, ln_q: f64, ln_1mq: f64) -> f64 {
    let choose = libm::lgamma(r as f64 + 1.0)
        - libm::lgamma(k as f64 + 1.0)
        - libm::lgamma((r - k) as f64 + 1.0);
    // 0 · ln 0 = 0: the edge terms are left out rather than formed as 0 · (−∞).
    let successes = if k == 0 { 0.0 } else { k as f64 * ln_q };
    let failures = if k == r { 0.0 } else { (r - k) as f64 * ln_1mq };
    choose + successes + failures
}

fn check_counts(m: u64, r: u64, v: u64) -> Result<()> {
    if !(v <= r && r <= m) {
        return Err(Error::bad_value(
            "audit counts",
            format!("m {m}, r {r}, v {v}: expected 0 <= v (right guesses) <= r (guesses) <= m (canaries)"),
        ));
    }
    Ok(())
}

/// The probability, under (ε, δ)-DP, of at least `v` right guesses out of `r` guesses about `m`
/// canaries (Steinke et al. 2023, the p-value of their audit), capped at 1.
pub fn p_value(m: u64, r: u64, v: u64, epsilon: f64, delta: f64) -> Result<f64> {
    check_counts(m, r, v)?;
    if epsilon.is_nan() || epsilon < 0.0 || !(0.0..=1.0).contains(&delta) {
        return Err(Error::bad_value(
            "epsilon/delta",
            format!("epsilon {epsilon}, delta {delta}: expected epsilon >= 0 and 0 <= delta <= 1"),
        ));
    }
    // q = 1 / (1 + e^-ε): ln q = -ln(1 + e^-ε), ln(1 - q) = -ln(1 + e^ε) (−∞ for huge ε).
    let ln_q = -(-epsilon).exp().ln_1p();
    let ln_1mq = -epsilon.exp().ln_1p();
    let pmf = |k: u64| log_pmf(r, k, ln_q, ln_1mq).exp();
    // β = P[Binomial(r, q) >= v].
    let beta: f64 = (v..=r).map(pmf).sum();
    // α = max_i P[v - i <= Binomial(r, q) < v] / i.
    let mut alpha = 0.0f64;
    let mut below = 0.0;
    for i in 1..=v {
        below += pmf(v - i);
        alpha = alpha.max(below / i as f64);
    }
    Ok((beta + alpha * delta * 2.0 * m as f64).min(1.0))
}

/// The largest ε that `v` right guesses out of `r` about `m` canaries refute at confidence
/// 1 − `beta` (e.g. `beta` 0.05 for 95%): the audited lower bound on the run's ε at `delta`.
/// 0 when the guesses refute nothing. Bisection as the paper's code: ε_max grows by 1 until its
/// p-value reaches `beta`, then 60 halvings (the paper's 30 leave 1e-9 of ε_max; ours 1e-18).
pub fn epsilon_lower_bound(m: u64, r: u64, v: u64, delta: f64, beta: f64) -> Result<f64> {
    check_counts(m, r, v)?;
    if !(beta > 0.0 && beta < 1.0) {
        return Err(Error::bad_value(
            "confidence",
            format!("1 - confidence {beta}: expected a probability strictly between 0 and 1"),
        ));
    }
    let refuted = |epsilon: f64| -> Result<bool> { Ok(p_value(m, r, v, epsilon, delta)? < beta) };
    let (mut low, mut high) = (0.0f64, 1.0f64);
    if !refuted(low)? {
        return Ok(0.0);
    }
    while refuted(high)? {
        high += 1.0;
    }
    for _ in 0..60 {
        let middle = 0.5 * (low + high);
        if refuted(middle)? {
            low = middle;
        } else {
            high = middle;
        }
    }
    Ok(low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_terms_sum_to_one_and_match_a_direct_formula() {
        let (r, q) = (12u64, 0.7f64);
        let (ln_q, ln_1mq) = (q.ln(), (1.0 - q).ln());
        let total: f64 = (0..=r).map(|k| log_pmf(r, k, ln_q, ln_1mq).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
        // C(12, 5) 0.7^5 0.3^7 = 792 · 0.16807 · 0.0002187.
        let direct = 792.0 * 0.7f64.powi(5) * 0.3f64.powi(7);
        assert!((log_pmf(r, 5, ln_q, ln_1mq).exp() / direct - 1.0).abs() < 1e-12);
        // q = 1 (ε = ∞): all mass at k = r, no NaN from 0 · ln 0.
        assert_eq!(log_pmf(4, 4, 0.0, f64::NEG_INFINITY).exp(), 1.0);
        assert_eq!(log_pmf(4, 3, 0.0, f64::NEG_INFINITY).exp(), 0.0);
    }
}

/// A white-box audit of the privatising step itself (gradient canaries observed every
/// step): m canaries, each a gradient C u_i of exactly the clip norm with u_i a unit
/// vector (Dirac: coordinate i; dense: a seeded random direction), included in the run
/// independently with probability ½; in every step each included canary is Poisson-sampled at
/// the rate q and its gradient goes through the engine's clipping into the clipped sum, which the
/// step under audit privatises. Each canary's score is Σ_t ⟨g_t, u_i⟩ over the privatised
/// gradients; the auditor guesses "included" for the `guesses / 2` highest scores and
/// "excluded" for as many lowest, and `epsilon_lower_bound` turns the right guesses into the
/// audited ε. No model: this audits what every compressor sees (post-processing of g_t cannot
/// raise the bound, so the bound of a compressed run's decoded update is at most this).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WhiteBoxSettings {
    /// m, the number of canaries (each included with probability ½).
    pub canaries: usize,
    /// Coordinates of the audited gradient (at least `canaries` for Dirac canaries).
    pub dimension: i64,
    /// The number of privatised steps the auditor observes.
    pub steps: usize,
    /// q, the probability that an included canary is in a step's batch.
    pub sample_rate: f64,
    /// C: every canary gradient has exactly this norm (the clip radius, the worst case).
    pub clip: f64,
    /// Dense random directions instead of Dirac ones.
    pub dense: bool,
    /// Guesses made (half "included", half "excluded"); at most `canaries`.
    pub guesses: usize,
    /// The δ the lower bound on ε is stated at.
    pub delta: f64,
    /// 1 − confidence.
    pub beta: f64,
    /// Seeds the canaries' inclusion, sampling and dense directions (never LibTorch's generator).
    pub seed: u64,
}

/// One auditor's result: how its guesses about the canaries went, and the lower bound on ε
/// they prove (Steinke, Nasr and Jagielski 2023).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AuditOutcome {
    /// m, the number of canaries.
    pub canaries: usize,
    /// How many canaries were included in training (about m / 2).
    pub included: usize,
    /// r, the guesses made (the auditor abstained on the other m − r canaries).
    pub guesses: usize,
    /// Of `guesses`, how many were "included" (the rest "excluded").
    pub guessed_included: usize,
    /// v, the right guesses.
    pub correct: usize,
    /// 1 − β: the probability with which the bound holds.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub confidence: f64,
    /// The δ the bound is stated at.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub delta: f64,
    /// With probability `confidence`, the run is not (ε', δ)-DP for any ε' below this (0 when
    /// the guesses show nothing).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub epsilon_lower_bound: f64,
}

/// Runs the audit on `step`, which privatises one clipped batch into the gradient the auditor
/// sees (`PrivacyEngine::privatize` for the real engine); the canaries are clipped by `clipping`
/// (the engine's). Canary draws (inclusion, sampling,
/// dense directions) come from generators of their own seeded with `settings.seed`, never
/// LibTorch's global one; the noise is the step's own.
pub fn white_box_audit(
    settings: &WhiteBoxSettings,
    clipping: &super::engine::Clipping,
    step: &mut dyn FnMut(&super::engine::Clipped, f64) -> Result<Vec<tch::Tensor>>,
) -> Result<AuditOutcome> {
    use rand::{Rng, SeedableRng};
    use tch::{Device, Kind, Tensor};
    let s = settings;
    if s.canaries == 0 || s.guesses > s.canaries || s.guesses == 0 {
        return Err(Error::bad_value(
            "canaries/guesses",
            format!(
                "{} canaries, {} guesses: expected 0 < guesses <= canaries",
                s.canaries, s.guesses
            ),
        ));
    }
    if !s.dense && s.dimension < s.canaries as i64 {
        return Err(Error::bad_value(
            "dimension",
            format!(
                "{} coordinates for {} Dirac canaries: expected at least one coordinate per canary",
                s.dimension, s.canaries
            ),
        ));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(s.seed);
    let included: Vec<bool> = (0..s.canaries).map(|_| rng.random::<bool>()).collect();
    // Directions [m, d], unit rows.
    let directions = if s.dense {
        let values: Vec<f32> = (0..s.canaries as i64 * s.dimension)
            .map(|_| rng.sample::<f32, _>(rand_distr::StandardNormal))
            .collect();
        let raw = Tensor::from_slice(&values).view([s.canaries as i64, s.dimension]);
        &raw / raw.norm_scalaropt_dim(2.0, [1i64].as_slice(), true)
    } else {
        Tensor::eye_m(s.canaries as i64, s.dimension, (Kind::Float, Device::Cpu))
    };
    let parameter = Tensor::zeros([s.dimension], (Kind::Float, Device::Cpu));
    let expected_batch = s.sample_rate * s.canaries as f64 / 2.0;
    let mut scores = Tensor::zeros([s.canaries as i64], (Kind::Double, Device::Cpu));
    for _ in 0..s.steps {
        let sampled: Vec<i64> = (0..s.canaries)
            .filter(|&i| included[i] && rng.random::<f64>() < s.sample_rate)
            .map(|i| i as i64)
            .collect();
        let batch = if sampled.is_empty() {
            super::engine::Clipped::empty(std::slice::from_ref(&parameter))
        } else {
            let rows = directions.index_select(0, &Tensor::from_slice(&sampled)) * s.clip;
            clipping.clip(&[(
                parameter.shallow_clone(),
                crate::nn::PerSample::Direct(rows),
            )])
        };
        let gradient = step(&batch, expected_batch.max(1.0))?;
        let g = gradient[0].to_kind(Kind::Float).view([s.dimension, 1]);
        scores += directions.mm(&g).view([-1]).to_kind(Kind::Double);
    }
    let scores: Vec<f64> =
        crate::host::to_vec_f64(&scores).map_err(|e| Error::bad_value("scores", e.to_string()))?;
    outcome_of(
        &scores,
        &included,
        Guesses::split(s.guesses),
        s.delta,
        s.beta,
    )
}

/// Both auditors' outcomes of a white-box run's canaries (every step; final weights).
pub fn audit_scores(
    scores: &super::canary::CanaryScores,
    guesses: Guesses,
    delta: f64,
    beta: f64,
) -> Result<(AuditOutcome, AuditOutcome)> {
    Ok((
        outcome_of(&scores.every_step, &scores.included, guesses, delta, beta)?,
        outcome_of(
            &scores.final_weights,
            &scores.included,
            guesses,
            delta,
            beta,
        )?,
    ))
}

/// A white-box run's audit by both auditors beside its accounted ε (`dpcomp fl --audit-canaries`;
/// training runs report `train::audit::AuditReport`, which holds the same and more).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CanaryAudit {
    /// ε by the run's accountant at `every_step.delta` (∞ at σ 0, written "inf").
    #[serde(serialize_with = "crate::json_floats::epsilon_f64::serialize")]
    pub accounted_epsilon: f64,
    /// The auditor that sees the weights after every step (`Observe::EveryStep`).
    pub every_step: AuditOutcome,
    /// The auditor that sees the final weights only (`Observe::Final`).
    pub final_weights: AuditOutcome,
    /// The bound had every guess been right: the audit's power.
    pub max_bound: f64,
    /// Canary gradients that joined a step, summed over the run's steps.
    pub canary_samples: u64,
    /// Either auditor's bound exceeds the accounted ε: the privacy claim is refuted.
    pub flagged: bool,
}

/// The bound had every one of the `guesses` about `canaries` canaries been right: the most an
/// audit of that shape can show (its power), whatever the mechanism.
pub fn audit_power(canaries: usize, guesses: Guesses, delta: f64, beta: f64) -> Result<f64> {
    let r = guesses.total() as u64;
    epsilon_lower_bound(canaries as u64, r, r, delta, beta)
}

/// Some audit's lower bound exceeds the accounted ε: the run's privacy claim is refuted (with
/// the audits' confidence), a bug in the mechanism or its accounting.
pub fn refutes<'a>(
    outcomes: impl IntoIterator<Item = &'a AuditOutcome>,
    accounted_epsilon: f64,
) -> bool {
    outcomes
        .into_iter()
        .any(|o| o.epsilon_lower_bound > accounted_epsilon)
}

impl CanaryAudit {
    /// Audits `scores` (from [`GradientCanaries::finish`](super::canary::GradientCanaries::finish))
    /// with both auditors making `guesses` at δ `delta` and confidence 1 − `beta`, and flags
    /// the run if either bound exceeds `accounted_epsilon`. Errors if `guesses` is 0 or more
    /// than the canaries.
    pub fn of(
        scores: &super::canary::CanaryScores,
        guesses: Guesses,
        delta: f64,
        beta: f64,
        accounted_epsilon: f64,
    ) -> Result<Self> {
        let (every_step, final_weights) = audit_scores(scores, guesses, delta, beta)?;
        Ok(CanaryAudit {
            accounted_epsilon,
            every_step,
            final_weights,
            max_bound: audit_power(scores.included.len(), guesses, delta, beta)?,
            canary_samples: scores.samples,
            flagged: refutes([&every_step, &final_weights], accounted_epsilon),
        })
    }
}

/// How many canaries the auditor guesses about: "included" for the `included` highest
/// scores, "excluded" for the `excluded` lowest, abstaining on the rest. Under Poisson sampling
/// an included canary may never be sampled and then looks excluded, so guessing "included"
/// alone is the stronger audit of a training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Guesses {
    /// Guesses "included", for the highest scores.
    pub included: usize,
    /// Guesses "excluded", for the lowest scores.
    pub excluded: usize,
}

impl Guesses {
    /// `total` guesses, half each way (the odd one "excluded").
    pub fn split(total: usize) -> Self {
        Guesses {
            included: total / 2,
            excluded: total - total / 2,
        }
    }

    /// r, the guesses made either way.
    pub fn total(&self) -> usize {
        self.included + self.excluded
    }
}

/// The audit's `guesses` from canary scores (higher: more likely included), the right ones
/// turned into the audited lower bound on ε at `delta` with confidence 1 − `beta`.
pub fn outcome_of(
    scores: &[f64],
    included: &[bool],
    guesses: Guesses,
    delta: f64,
    beta: f64,
) -> Result<AuditOutcome> {
    let m = scores.len();
    if m != included.len() || guesses.total() == 0 || guesses.total() > m {
        return Err(Error::bad_value(
            "guesses",
            format!(
                "{guesses:?} about {m} scores of {} canaries: expected 0 < guesses <= canaries, one score each",
                included.len()
            ),
        ));
    }
    let mut order: Vec<usize> = (0..m).collect();
    // NaN scores (a diverged run) sort as the lowest: never guessed "included".
    order.sort_by(|&a, &b| {
        let key = |i: usize| {
            if scores[i].is_nan() {
                f64::NEG_INFINITY
            } else {
                scores[i]
            }
        };
        key(b).total_cmp(&key(a))
    });
    let (positive, negative) = (guesses.included, guesses.excluded);
    let correct = order[..positive].iter().filter(|&&i| included[i]).count()
        + order[m - negative..]
            .iter()
            .filter(|&&i| !included[i])
            .count();
    let bound = epsilon_lower_bound(
        m as u64,
        guesses.total() as u64,
        correct as u64,
        delta,
        beta,
    )?;
    Ok(AuditOutcome {
        canaries: m,
        included: included.iter().filter(|&&b| b).count(),
        guesses: guesses.total(),
        guessed_included: guesses.included,
        correct,
        confidence: 1.0 - beta,
        delta,
        epsilon_lower_bound: bound,
    })
}
