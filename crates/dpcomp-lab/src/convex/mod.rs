//! Differentially private SGD for convex losses with α-Hölder continuous gradients
//! (Wang et al. 2022): the losses and their constants (`loss`),
//! tabular data (`dpcomp::data::tabular`), SGD with projection and noise (`sgd`), and the privacy calibrations of
//! output perturbation (`output_privacy`, Theorem 7) and gradient perturbation
//! (`gradient_privacy`, Theorem 11).
//!
//! `run` trains one model and reports train/test risk and accuracy, the excess empirical risk
//! against a long full-batch reference solve, and the privacy parameters used.
//!
//! Step size and step count, unless given, are the paper's for each algorithm
//! (`paper_schedule`: Theorems 9, 10 and 12; γ = 0.1, the confidence level).

pub mod experiment;
pub mod gradient_privacy;
pub mod loss;
pub mod output_privacy;
pub mod sgd;

use dpcomp::config::AccountantKind;
use dpcomp::data::tabular::Tabular;
use dpcomp::error::{Error, Result};
use dpcomp::privacy::calibrate;
use gradient_privacy::GradientPrivacyProblem;
use loss::Loss;
use serde::Serialize;
use sgd::SgdSettings;
use tch::{Kind, Tensor};

/// Confidence level γ in the step-size rule.
pub const GAMMA: f64 = 0.1;

/// Which of the convex paper's algorithms `run` trains with (`--algorithm
/// output|gradient|nonprivate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Algorithm 1: SGD, iterate average, Gaussian noise calibrated to Theorem 7's Δ_SGD.
    Output,
    /// Algorithm 2: Gaussian noise on every stochastic gradient, projection onto B(0, R).
    Gradient,
    /// The same SGD without noise (the baseline).
    Nonprivate,
}

/// How gradient perturbation's σ is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Calibration {
    /// Theorem 11: β search, λ and σ from the paper's closed form.
    Theorem11,
    /// The smallest σ for which the project's RDP accountant reports ε <= target (sampling rate
    /// 1/n, T steps, noise multiplier σ / Δ).
    Accountant,
}

/// What `run` trains: the loss, the algorithm and its (ε, δ), the domain B(0, R) and SGD's
/// schedule (the paper's unless given).
///
/// ```
/// use dpcomp::data::tabular as data;
/// use dpcomp_lab::convex::{self, loss::Loss, Algorithm, Calibration, ConvexSettings};
/// let data = data::synthetic(200, 5, 4.0, 0)?;
/// let settings = ConvexSettings {
///     loss: Loss::Logistic,
///     algorithm: Algorithm::Gradient,
///     calibration: Calibration::Accountant,
///     epsilon: 2.0,
///     delta: None,
///     radius: 4.0,
///     unbounded: false,
///     steps: Some(400),
///     step_size: Some(0.1),
///     seed: 0,
/// };
/// let report = convex::run(&data, &settings)?;
/// // δ defaults to 1/n², and the accountant confirms the calibrated σ stays within ε.
/// let n = report.examples as f64;
/// assert_eq!(report.delta, Some(1.0 / (n * n)));
/// assert!(report.sigma.unwrap() > 0.0);
/// assert!(report.accountant_epsilon.unwrap() <= 2.0 * (1.0 + 1e-9));
/// assert!((0.0..=1.0).contains(&report.test_accuracy));
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ConvexSettings {
    /// The convex loss of the linear model.
    pub loss: Loss,
    /// Output perturbation, gradient perturbation or non-private SGD.
    pub algorithm: Algorithm,
    /// How gradient perturbation's σ is chosen (the other algorithms ignore it).
    pub calibration: Calibration,
    /// Target ε of the whole run, > 0 and finite, a private preprocessing's share included
    /// (ignored by non-private SGD).
    pub epsilon: f64,
    /// δ; `None`: 1/n² (the paper's choice).
    pub delta: Option<f64>,
    /// R > 0 of the domain B(0, R) SGD projects onto (and the reference solve's domain).
    pub radius: f64,
    /// Output perturbation on R^d (Theorem 7(a)) instead of B(0, R) (Theorem 7(b)).
    pub unbounded: bool,
    /// T, SGD steps (one example each); `None`: the paper's (`paper_schedule`).
    pub steps: Option<u64>,
    /// η > 0, SGD's constant step size; `None`: the paper's (`paper_schedule`).
    pub step_size: Option<f64>,
    /// Seed of SGD's index and noise draws (output perturbation's noise uses `seed + 1`).
    pub seed: u64,
}

/// One trained model's results and the privacy parameters it used (`dpcomp convex --json`
/// prints it).
#[derive(Debug, Clone, Serialize)]
pub struct ConvexReport {
    /// The data set's name (`Tabular::name`).
    pub data: String,
    /// The loss as `Loss::name` writes it (`hinge`, `qhinge:1.5`, ...).
    pub loss: String,
    /// The algorithm that trained the model.
    pub algorithm: Algorithm,
    /// This model's seed.
    pub seed: u64,
    /// n, the training rows.
    pub examples: usize,
    /// d, the features.
    pub dim: i64,
    /// α of the loss's Hölder-continuous gradient.
    pub alpha: f64,
    /// L, for features of norm <= 1 (the bound the data loaders enforce).
    pub holder_constant: f64,
    /// M = sup ||∇f(0; z)||.
    pub gradient_bound_at_zero: f64,
    /// max ||x_i|| over the training rows (<= 1; informational).
    pub max_feature_norm: f64,
    /// `None`: unconstrained SGD (output perturbation, Theorem 7(a)).
    pub radius: Option<f64>,
    /// T, the SGD steps run.
    pub steps: u64,
    /// η, the step size used.
    pub step_size: f64,
    /// The run's target ε (`ConvexSettings::epsilon`); `None` for non-private SGD.
    pub epsilon: Option<f64>,
    /// The run's δ (given, or 1/n²); `None` for non-private SGD.
    pub delta: Option<f64>,
    /// The calibration asked for (it decides σ under gradient perturbation); `None` for
    /// non-private SGD.
    pub calibration: Option<Calibration>,
    /// σ of the Gaussian noise: per gradient coordinate and step (gradient perturbation) or per
    /// coordinate of the averaged model (output perturbation); `None` for non-private SGD.
    pub sigma: Option<f64>,
    /// Theorem 11's β, the share of ε the RDP steps spend (Theorem 11 calibration only).
    pub beta: Option<f64>,
    /// Theorem 11's Rényi order λ (Theorem 11 calibration only).
    pub lambda: Option<f64>,
    /// Output perturbation: Δ_SGD(δ/2) of Theorem 7.
    pub sensitivity: Option<f64>,
    /// ε of the training noise by the project's RDP accountant (at the training's δ), plus the
    /// preprocessing's ε: the run's total by the accountant, to compare with `epsilon`.
    pub accountant_epsilon: Option<f64>,
    /// How the features were scaled (`None`: generated data, not scaled).
    pub preprocess: Option<dpcomp::data::preprocess::Preprocess>,
    /// The (ε, δ) the scaling spent, charged to `epsilon` and `delta` (basic composition): the
    /// training mechanism was calibrated to ε − this and δ − `preprocess_delta`.
    pub preprocess_epsilon: f64,
    /// The δ the scaling spent (0 unless `private`).
    pub preprocess_delta: f64,
    /// False when the scaling used the training rows' own statistics outside the mechanism
    /// (`train-statistics`): `epsilon` then does not cover the whole pipeline.
    pub preprocess_private: bool,
    /// Mean loss of the released model on the training rows.
    pub train_risk: f64,
    /// Mean loss of the released model on the test rows.
    pub test_risk: f64,
    /// Share of training rows with sign(wᵀx) = y, in [0, 1].
    pub train_accuracy: f64,
    /// Share of test rows with sign(wᵀx) = y, in [0, 1].
    pub test_accuracy: f64,
    /// min over B(0, R) of the training risk (long full-batch solve).
    pub reference_risk: f64,
    /// `train_risk - reference_risk`, the paper's excess empirical risk.
    pub excess_empirical_risk: f64,
}

/// T and η as the paper prescribes for n examples in d dimensions (γ = `GAMMA`):
///
/// - gradient perturbation and non-private SGD, Theorem 12: T = n for α >= 1/2, n^((2-α)/(1+α))
///   below; η = 1 / (T max{a, b}), a = sqrt(log(n) log(n/γ) log(1/γ) / n),
///   b = sqrt(d log(1/δ)) log(1/γ)^(1/4) / (n ε);
/// - output perturbation on B(0, R), Theorem 10: the same T; η = 1 / (T max{a', b'}),
///   a' = sqrt(log(n/δ) log(n) log(1/γ) / n), b' = (d log(1/δ))^(1/4) sqrt(log(n/δ))
///   log(1/γ)^(1/8) / sqrt(n ε);
/// - output perturbation on R^d, Theorem 9: T = n^((6 - 3α - α²)/((1+α)(3+α))) for
///   α <= (sqrt(73) - 7)/4, n above; η = n^(1/(3+α)) / (T log(1/γ)^(1/(3+α))).
pub fn paper_schedule(
    algorithm: Algorithm,
    unbounded: bool,
    alpha: f64,
    n: usize,
    d: i64,
    epsilon: f64,
    delta: f64,
) -> (u64, f64) {
    let nf = n as f64;
    let log_g = (1.0 / GAMMA).ln();
    if algorithm == Algorithm::Output && unbounded {
        let exponent = if alpha <= (73f64.sqrt() - 7.0) / 4.0 {
            (6.0 - 3.0 * alpha - alpha * alpha) / ((1.0 + alpha) * (3.0 + alpha))
        } else {
            1.0
        };
        let steps = nf.powf(exponent).ceil() as u64;
        let eta = nf.powf(1.0 / (3.0 + alpha)) / (steps as f64 * log_g.powf(1.0 / (3.0 + alpha)));
        return (steps, eta);
    }
    let steps = if alpha >= 0.5 {
        nf
    } else {
        nf.powf((2.0 - alpha) / (1.0 + alpha))
    }
    .ceil() as u64;
    let log_d = (1.0 / delta).ln();
    let (a, b) = if algorithm == Algorithm::Output {
        let log_nd = (nf / delta).ln();
        (
            (log_nd * nf.ln() * log_g / nf).sqrt(),
            (d as f64 * log_d).powf(0.25) * log_nd.sqrt() * log_g.powf(0.125)
                / (nf * epsilon).sqrt(),
        )
    } else {
        (
            (nf.ln() * (nf / GAMMA).ln() * log_g / nf).sqrt(),
            (d as f64 * log_d).sqrt() * log_g.powf(0.25) / (nf * epsilon),
        )
    };
    (steps, 1.0 / (steps as f64 * a.max(b)))
}

fn risk_and_accuracy(loss: Loss, w: &Tensor, x: &Tensor, y: &Tensor) -> (f64, f64) {
    let risk = dpcomp::host::f64_scalar(&loss.values(w, x, y).mean(Kind::Double));
    let predictions = x.mv(w).sign();
    let accuracy = dpcomp::host::f64_scalar(
        &predictions
            .eq_tensor(y)
            .to_kind(Kind::Double)
            .mean(Kind::Double),
    );
    (risk, accuracy)
}

/// Trains and evaluates one model (seed `settings.seed`).
pub fn run(data: &Tabular, settings: &ConvexSettings) -> Result<ConvexReport> {
    Ok(run_seeds(data, settings, &[settings.seed])?.remove(0))
}

/// What to change when Theorem 11 has no feasible β for `problem` (the training's ε, which is
/// the total ε divided by `total_per_training`, the rest going to the preprocessing): the
/// smallest total `epsilon` that has one at the same n, T and δ, and the accountant's
/// calibration, which has a σ at every ε.
fn feasible_epsilon_hint(problem: &GradientPrivacyProblem, total_per_training: f64) -> String {
    let accountant = "or `calibration` accountant (σ from the RDP accountant, at any epsilon)";
    match problem.smallest_feasible_epsilon(1e4) {
        Some(training) => {
            // Three significant digits, rounded up.
            let total = training * total_per_training;
            let decimals = (2.0 - total.log10().floor()).max(0.0) as i32;
            let scale = 10f64.powi(decimals);
            let shown = ((total * scale).ceil() / scale, decimals as usize);
            format!(
                "give `epsilon` {:.*} or more (the smallest with a feasible beta at this n, T and delta), {accountant}",
                shown.1, shown.0
            )
        }
        None => format!(
            "no epsilon up to 1e4 has a feasible beta at this n, T and delta: give fewer `steps` {accountant}"
        ),
    }
}

/// Trains and evaluates one model per seed, the seeds' SGD runs side by side
/// (`sgd::average_iterates`); the calibration and the reference solve are shared.
pub fn run_seeds(
    data: &Tabular,
    settings: &ConvexSettings,
    seeds: &[u64],
) -> Result<Vec<ConvexReport>> {
    if seeds.is_empty() {
        return Err(Error::bad_value("seeds", "expected at least one seed"));
    }
    let n = data.train_len();
    let d = data.dim();
    let loss = settings.loss;
    if !(settings.radius > 0.0 && settings.radius.is_finite()) {
        return Err(Error::bad_value(
            "radius",
            format!("{}: expected a positive radius", settings.radius),
        ));
    }
    if let Some(eta) = settings.step_size {
        if !(eta > 0.0 && eta.is_finite()) {
            return Err(Error::bad_value(
                "step_size",
                format!("{eta}: expected a positive, finite step size"),
            ));
        }
    }
    if settings.steps == Some(0) {
        return Err(Error::bad_value("steps", "0: expected at least one step"));
    }
    if settings.algorithm != Algorithm::Nonprivate
        && !(settings.epsilon > 0.0 && settings.epsilon.is_finite())
    {
        return Err(Error::bad_value(
            "epsilon",
            format!("{}: expected a positive, finite epsilon", settings.epsilon),
        ));
    }
    if let Some(delta) = settings.delta {
        dpcomp::privacy::validate_delta(delta)?;
    }
    let delta = settings.delta.unwrap_or(1.0 / (n as f64 * n as f64));
    let private = settings.algorithm != Algorithm::Nonprivate;
    // The scaling's share of the budget (`preprocess`): training gets the rest.
    let (preprocess_epsilon, preprocess_delta) =
        data.preprocess.map_or((0.0, 0.0), |c| (c.epsilon, c.delta));
    let (epsilon, train_delta) = (
        settings.epsilon - preprocess_epsilon,
        delta - preprocess_delta,
    );
    if private && !(epsilon > 0.0 && train_delta > 0.0) {
        return Err(Error::bad_value(
            "epsilon/delta",
            format!(
                "epsilon {} and delta {delta:e} leave nothing for training after the preprocessing's ({preprocess_epsilon}, {preprocess_delta:e}): expected a smaller preprocess share",
                settings.epsilon
            ),
        ));
    }
    // The constants use the public bound ||x|| <= 1 that `data` enforces by projection, not the
    // data's own maximum (which would leak); the latter is reported alongside.
    let holder = loss.holder_constant(dpcomp::data::tabular::FEATURE_NORM_BOUND);
    let m = loss.gradient_bound_at_zero(dpcomp::data::tabular::FEATURE_NORM_BOUND);
    let (paper_steps, paper_eta) = paper_schedule(
        settings.algorithm,
        settings.unbounded,
        loss.alpha(),
        n,
        d,
        epsilon,
        train_delta,
    );
    let steps = settings.steps.unwrap_or(paper_steps);
    let step_size = settings.step_size.unwrap_or(paper_eta);
    let radius = (!(settings.unbounded && settings.algorithm == Algorithm::Output))
        .then_some(settings.radius);
    // G = M + L R^α bounds every gradient on B(0, R); 2 G is a step's replace-one sensitivity.
    let gradient_bound = m + holder * settings.radius.powf(loss.alpha());
    let mut sensitivity = None;
    let (sigma, beta, lambda) = if settings.algorithm == Algorithm::Output {
        let problem = output_privacy::OutputPrivacyProblem {
            loss,
            examples: n,
            steps,
            step_size,
            holder_constant: holder,
            gradient_bound_at_zero: m,
            loss_at_zero: loss.value_at_zero(),
            radius,
        };
        let delta_sgd = problem.sensitivity(train_delta / 2.0)?;
        sensitivity = Some(delta_sgd);
        (
            Some(output_privacy::analytic_gaussian_sigma(
                epsilon,
                train_delta / 2.0,
                delta_sgd,
            )?),
            None,
            None,
        )
    } else if private {
        let problem = GradientPrivacyProblem {
            examples: n,
            steps,
            epsilon,
            delta: train_delta,
            gradient_bound,
        };
        match settings.calibration {
            Calibration::Theorem11 => {
                let c = problem.calibrate().map_err(|e| match e {
                    Error::BadValue { field, what } if field == "epsilon" => {
                        let share = if preprocess_epsilon > 0.0 {
                            format!(
                                " (the training's share: the preprocessing spent epsilon {preprocess_epsilon} of {})",
                                settings.epsilon
                            )
                        } else {
                            String::new()
                        };
                        Error::BadValue {
                            field,
                            what: format!(
                                "{what}{share}; {}",
                                feasible_epsilon_hint(&problem, settings.epsilon / epsilon)
                            ),
                        }
                    }
                    e => e,
                })?;
                (Some(c.sigma), Some(c.beta), Some(c.lambda))
            }
            Calibration::Accountant => {
                let multiplier = calibrate::noise_multiplier_for(
                    AccountantKind::Rdp,
                    epsilon,
                    1.0 / n as f64,
                    steps,
                    train_delta,
                )?;
                (Some(multiplier * 2.0 * gradient_bound), None, None)
            }
        }
    } else {
        (None, None, None)
    };
    let accountant_epsilon = match sigma.filter(|_| settings.algorithm == Algorithm::Gradient) {
        Some(s) => Some(
            calibrate::epsilon_for(
                s / (2.0 * gradient_bound),
                1.0 / n as f64,
                steps,
                train_delta,
            )? + preprocess_epsilon,
        ),
        None => None,
    };
    let gradient_noise = match settings.algorithm {
        Algorithm::Gradient => sigma.unwrap_or(0.0),
        _ => 0.0,
    };
    let averages = sgd::average_iterates(
        loss,
        &data.x_train,
        &data.y_train,
        &SgdSettings {
            steps,
            step_size,
            radius,
            gradient_noise,
            seed: settings.seed,
        },
        seeds,
    );
    let models: Vec<Tensor> = seeds
        .iter()
        .enumerate()
        .map(|(k, &seed)| {
            let average = averages.get(k as i64);
            match (settings.algorithm, sigma) {
                // The output noise has its own stream (seed + 1), independent of SGD's draws.
                (Algorithm::Output, Some(s)) => sgd::perturb(&average, s, seed.wrapping_add(1)),
                _ => average,
            }
        })
        .collect();
    // A step size too large for the loss sends SGD to infinity: NaN weights would otherwise be
    // reported as a model (accuracy 0, risk NaN).
    for w in &models {
        let finite = dpcomp::host::bool_scalar(&w.isfinite().all()).unwrap_or(false);
        if !finite {
            return Err(Error::bad_value(
                "step_size",
                format!(
                    "{step_size:e}: the weights are not finite after {steps} steps (SGD diverged); \
                     expected a smaller step size (the paper's for this data and algorithm is {paper_eta:.4e})"
                ),
            ));
        }
    }
    let (_, reference_risk) = sgd::empirical_minimiser(
        loss,
        &data.x_train,
        &data.y_train,
        radius,
        3000,
        settings.radius,
        &models,
    );
    let reports = seeds
        .iter()
        .zip(models)
        .map(|(&seed, w)| {
            let (train_risk, train_accuracy) =
                risk_and_accuracy(loss, &w, &data.x_train, &data.y_train);
            let (test_risk, test_accuracy) =
                risk_and_accuracy(loss, &w, &data.x_test, &data.y_test);
            ConvexReport {
                data: data.name.clone(),
                loss: loss.name(),
                algorithm: settings.algorithm,
                seed,
                examples: n,
                dim: d,
                alpha: loss.alpha(),
                holder_constant: holder,
                gradient_bound_at_zero: m,
                max_feature_norm: data.max_norm(),
                radius,
                steps,
                step_size,
                epsilon: private.then_some(settings.epsilon),
                delta: private.then_some(delta),
                calibration: private.then_some(settings.calibration),
                sigma,
                beta,
                lambda,
                sensitivity,
                accountant_epsilon,
                preprocess: data.preprocess.map(|c| c.preprocess),
                preprocess_epsilon,
                preprocess_delta,
                preprocess_private: data.preprocess.is_none_or(|c| c.is_private()),
                train_risk,
                test_risk,
                train_accuracy,
                test_accuracy,
                reference_risk,
                excess_empirical_risk: train_risk - reference_risk,
            }
        })
        .collect::<Vec<ConvexReport>>();
    if let Some(r) = reports.iter().find(|r| !r.train_risk.is_finite()) {
        return Err(Error::bad_value(
            "convex",
            format!(
                "training diverged: non-finite training risk for seed {} after {} steps at step size {}; lower `step_size`",
                r.seed, r.steps, r.step_size
            ),
        ));
    }
    Ok(reports)
}
