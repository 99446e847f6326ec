//! `dpcomp audit`: one training run with canaries, and the lower bound on ε they give beside the
//! accountant's ε (`dpcomp::train::audit`).

use anyhow::Result;
use dpcomp::config::TrainOverrides;
use dpcomp::privacy::canary::{CanarySettings, Observe};
use dpcomp::train::audit::{audit_training, AuditSettings, CanaryKind};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(mut_arg("task", super::task_arg))]
pub struct AuditArgs {
    /// TOML file with any of the training settings below (flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run folder (default runs/audit-<task>); audit.json is written there. An audit trains a
    /// fresh run: a folder that already holds one is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// m, the canaries (each included with probability 1/2); white-box Dirac canaries up to
    /// the model's parameter count, dense ones up to 2^29 floats in all (m x parameters).
    #[arg(long, default_value_t = 1000)]
    pub canaries: usize,
    /// Gradient canaries added to the clipped sum (the default).
    #[arg(long, conflicts_with = "black_box")]
    pub white_box: bool,
    /// Mislabelled training examples, scored by their final loss.
    #[arg(long)]
    pub black_box: bool,
    /// White box: what the auditor sees, the weights after every step or the final ones.
    #[arg(long, value_enum, default_value = "every-step")]
    pub observe: Observe,
    /// White box: dense random directions instead of one coordinate per canary.
    #[arg(long)]
    pub dense: bool,
    /// Guesses "included", for the highest scores; default m / 10.
    #[arg(long)]
    pub guesses: Option<usize>,
    /// Guesses "excluded", for the lowest scores (an included canary that Poisson sampling
    /// never picked looks excluded, so these are often wrong in a training run).
    #[arg(long, default_value_t = 0)]
    pub excluded_guesses: usize,
    /// Confidence of the lower bound.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Seed of the canaries (inclusion, directions, sampling, which examples).
    #[arg(long, default_value_t = 19)]
    pub audit_seed: u64,
    /// Print the report as JSON (as written to audit.json) instead of a line.
    #[arg(long)]
    pub json: bool,
    /// No progress bar or per-epoch lines.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: TrainOverrides,
}

pub fn run(args: AuditArgs) -> Result<()> {
    let file = match &args.config {
        Some(path) => TrainOverrides::from_toml_file(path)?,
        None => TrainOverrides::default(),
    };
    let config = dpcomp_lab::tasks::resolve(args.settings.clone().or(file))?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(format!("audit-{}", config.task)));
    if !(args.confidence > 0.0 && args.confidence < 1.0) {
        anyhow::bail!(
            "--confidence {}: expected a probability strictly between 0 and 1",
            args.confidence
        );
    }
    // An audit trains a fresh run with canaries drawn before it starts: it cannot continue
    // another run (the trainer's own refusal would suggest resuming it, which audit does not).
    if dpcomp::train::checkpoint::find(&out).is_some() {
        anyhow::bail!(
            "--out {}: already holds a run (it has a checkpoint); an audit trains a fresh run \
             with its canaries and cannot continue one: choose another run folder",
            out.display()
        );
    }
    // Black-box canaries are mislabelled examples scored on the final model: what the
    // auditor observes and the gradient directions are white-box settings.
    if args.black_box {
        if matches!(args.observe, Observe::Final) {
            anyhow::bail!(
                "--observe final: applies to white-box canaries only; a --black-box audit \
                 always scores the final model (leave out --observe or --black-box)"
            );
        }
        if args.dense {
            anyhow::bail!(
                "--dense: applies to white-box canaries only (dense gradient directions); \
                 --black-box canaries are mislabelled training examples (leave out --dense or \
                 --black-box)"
            );
        }
    }
    if args.canaries == 0 {
        anyhow::bail!("--canaries 0: expected at least one canary (an audit guesses about them)");
    }
    let settings = AuditSettings {
        kind: if args.black_box {
            CanaryKind::BlackBox
        } else {
            CanaryKind::WhiteBox
        },
        canaries: CanarySettings {
            canaries: args.canaries,
            dense: args.dense,
            observe: args.observe,
            seed: args.audit_seed,
        },
        guesses: dpcomp::privacy::audit::Guesses {
            included: args.guesses.unwrap_or((args.canaries / 10).max(1)),
            excluded: args.excluded_guesses,
        },
        beta: 1.0 - args.confidence,
    };
    let settings_sampling = config.privacy.sampling;
    let observers: Vec<Box<dyn dpcomp::train::observer::Observer>> = if args.quiet {
        Vec::new()
    } else {
        vec![Box::new(dpcomp::train::observer::ProgressBars::default())]
    };
    let report = audit_training(
        dpcomp_lab::tasks::trainer(&out),
        config,
        &settings,
        observers,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let o = &report.outcome;
        // The same caveat as `train`'s line: the accountants assume Poisson sampling.
        let caveat = match settings_sampling {
            dpcomp::config::Sampling::Shuffle => {
                " (shuffled batches: the accountant assumes Poisson sampling, so this ε is an approximation)"
            }
            dpcomp::config::Sampling::Poisson => "",
        };
        println!(
            "{} {} sigma {} ({} steps at q {:.5}): accounted epsilon {:.4}{caveat}, audited lower bound {:.4} at {:.0}% confidence (delta {:e}; {} of {} guesses right about {} canaries, {} included; at most {:.3} with every guess right){}; test accuracy {:.2}%",
            report.task,
            report.compressor,
            report.noise_multiplier,
            report.steps,
            report.sample_rate,
            report.accounted_epsilon,
            o.epsilon_lower_bound,
            100.0 * o.confidence,
            o.delta,
            o.correct,
            o.guesses,
            o.canaries,
            o.included,
            report.max_bound,
            if report.flagged { " -- FLAGGED: the audit refutes the accounted epsilon" } else { "" },
            100.0 * report.test_accuracy
        );
        if let (Some(every), Some(last)) = (&report.every_step, &report.final_weights) {
            println!(
                "white box, both auditors: every step {:.4} ({}/{} right), final weights {:.4} ({}/{} right)",
                every.epsilon_lower_bound,
                every.correct,
                every.guesses,
                last.epsilon_lower_bound,
                last.correct,
                last.guesses
            );
        }
    }
    Ok(())
}
