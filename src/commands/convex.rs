//! `dpcomp convex`: DP-SGD for convex losses on tabular data.

use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ConvexArgs {
    /// breast_cancer (breast_cancer/breast_cancer.csv in the data folder), csv:PATH (features...,
    /// label 0/1 or -1/+1), or synthetic:N:D (separable with margin, hinge optimum 0 known;
    /// 10 <= N <= 1,000,000 rows, N x D <= 10,000,000 values).
    #[arg(long, default_value = "breast_cancer")]
    pub data: String,
    /// hinge, qhinge:Q (1 < Q <= 2), logistic or least_squares.
    #[arg(long, default_value = "hinge")]
    pub loss: String,
    #[arg(long, value_enum, default_value = "gradient")]
    pub algorithm: dpcomp_lab::convex::Algorithm,
    #[arg(long, value_enum, default_value = "theorem11")]
    pub calibration: dpcomp_lab::convex::Calibration,
    #[arg(long, default_value_t = 1.0)]
    pub epsilon: f64,
    /// Default 1/n² (the paper's choice).
    #[arg(long)]
    pub delta: Option<f64>,
    /// R of the domain B(0, R).
    #[arg(long, default_value_t = 1.0)]
    pub radius: f64,
    /// Output perturbation without projection (Theorem 7(a), unbounded domain).
    #[arg(long)]
    pub unbounded: bool,
    /// T (default: the paper's for the algorithm: Theorem 12's for gradient perturbation and
    /// SGD, the same for output perturbation on the ball, Theorem 9's without projection).
    #[arg(long)]
    pub steps: Option<u64>,
    /// η (default: the paper's for the algorithm: Theorem 12's for gradient perturbation and
    /// SGD, Theorem 10's for output perturbation on the ball, Theorem 9's without projection).
    #[arg(long)]
    pub step_size: Option<f64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How the features are scaled: private (ln(max(x, 1e-3)) centred by a DP mean, charged
    /// --preprocess-share of ε and δ), public (the log map alone, free) or train-statistics
    /// (standardised by the training rows' mean and deviation: NOT private).
    #[arg(long, value_enum, default_value = "private")]
    pub preprocess: dpcomp::data::preprocess::Preprocess,
    /// Share of ε and δ the private mean spends (the rest goes to training).
    #[arg(long, default_value_t = dpcomp::data::preprocess::DEFAULT_SHARE)]
    pub preprocess_share: f64,
    /// Clip B of the log-mapped rows for the private mean.
    #[arg(long, default_value_t = dpcomp::data::preprocess::DEFAULT_CLIP)]
    pub preprocess_clip: f64,
    /// Data folder (default: $DPCOMP_DATA, else data/).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ConvexArgs) -> Result<()> {
    use dpcomp_lab::convex::{self, loss::Loss, ConvexSettings};
    let private = args.algorithm != dpcomp_lab::convex::Algorithm::Nonprivate;
    // Checked as given, before the preprocessing takes its share of them (an error about the
    // share would show a number the user never typed).
    if private && !(args.epsilon.is_finite() && args.epsilon > 0.0) {
        anyhow::bail!("--epsilon {}: expected a finite epsilon > 0", args.epsilon);
    }
    if let Some(delta) = args.delta.filter(|d| !(*d > 0.0 && *d < 1.0)) {
        anyhow::bail!("--delta {delta}: expected 0 < delta < 1");
    }
    let scaling = dpcomp_lab::convex::experiment::scaling(
        args.preprocess,
        args.preprocess_share,
        args.preprocess_clip,
        private.then_some(args.epsilon),
        args.delta,
    );
    let data = dpcomp::data::tabular::named(&args.data, args.data_dir.as_deref(), &scaling)?;
    let settings = ConvexSettings {
        loss: Loss::parse(&args.loss)?,
        algorithm: args.algorithm,
        calibration: args.calibration,
        epsilon: args.epsilon,
        delta: args.delta,
        radius: args.radius,
        unbounded: args.unbounded,
        steps: args.steps,
        step_size: args.step_size,
        seed: args.seed,
    };
    let report = convex::run(&data, &settings)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{} ({} train examples, d {}), {} loss (alpha {}, L {:.4}, M {:.4}), {:?}, R {}, T {}, eta {:.5}",
        report.data,
        report.examples,
        report.dim,
        report.loss,
        report.alpha,
        report.holder_constant,
        report.gradient_bound_at_zero,
        report.algorithm,
        report
            .radius
            .map_or("unbounded".to_string(), |r| r.to_string()),
        report.steps,
        report.step_size
    );
    if let (Some(eps), Some(delta), Some(sigma)) = (report.epsilon, report.delta, report.sigma) {
        let beta = report
            .beta
            .map_or(String::new(), |b| format!(", beta {b:.3e}"));
        let lambda = report
            .lambda
            .map_or(String::new(), |l| format!(", lambda {l:.2}"));
        let delta_sgd = report
            .sensitivity
            .map_or(String::new(), |d| format!(", Delta_SGD {d:.4e}"));
        let check = report.accountant_epsilon.map_or(String::new(), |e| {
            format!("; RDP accountant epsilon of this noise {e:.4}")
        });
        println!(
            "privacy: epsilon {eps}, delta {delta:.3e}, sigma {sigma:.4e}{beta}{lambda}{delta_sgd}{check}"
        );
    }
    if let Some(preprocess) = report.preprocess {
        let cost = if report.preprocess_epsilon > 0.0 {
            format!(
                ": epsilon {:.4}, delta {:.3e} of the budget (training got the rest)",
                report.preprocess_epsilon, report.preprocess_delta
            )
        } else if report.preprocess_private {
            ": a fixed map of each row, no privacy cost".to_string()
        } else {
            ": the training rows' own statistics, NOT covered by epsilon".to_string()
        };
        println!("preprocessing {}{cost}", preprocess.name());
    }
    println!(
        "train risk {:.4} (accuracy {:.2}%), test risk {:.4} (accuracy {:.2}%), excess empirical risk {:.4} (reference min {:.4})",
        report.train_risk,
        100.0 * report.train_accuracy,
        report.test_risk,
        100.0 * report.test_accuracy,
        report.excess_empirical_risk,
        report.reference_risk
    );
    Ok(())
}
