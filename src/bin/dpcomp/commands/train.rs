//! `dpcomp train`: one training run (or its resumption) into a run folder.

use anyhow::{Context, Result};
use dpcomp::config::{Task, TrainOverrides};
use dpcomp::data;
use dpcomp::error::Error;
use dpcomp::train::{self, Trainer};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// TOML file with any of the settings below (flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run folder (default runs/<task>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in --out from its last checkpoint. Only --epochs (to extend it),
    /// --data-dir (a moved data folder), --device and --quiet may change; any other setting given
    /// must equal the run's config.toml, or the resume is refused naming both values.
    #[arg(long)]
    pub resume: bool,
    /// No progress bar or per-epoch lines.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: TrainOverrides,
}

pub fn run(args: TrainArgs) -> Result<()> {
    let mut trainer = if args.resume {
        let out = args.out.clone().ok_or_else(|| {
            Error::bad_value("--resume", "needs --out naming the run to continue")
        })?;
        let file = match &args.config {
            Some(path) => TrainOverrides::from_toml_file(path)?,
            None => TrainOverrides::default(),
        };
        Trainer::resume_with(&out, args.settings.or(file))
            .with_context(|| format!("resuming {}", out.display()))?
    } else {
        let file = match &args.config {
            Some(path) => TrainOverrides::from_toml_file(path)?,
            None => TrainOverrides::default(),
        };
        let config = args.settings.or(file).resolve()?;
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("runs").join(config.task.to_string()));
        Trainer::new(config, &out)?
    };
    trainer.progress = !args.quiet;
    let c = &trainer.config;
    if !args.quiet {
        eprintln!(
            "{}: {} train / {} test examples, {} trainable of {} parameters, device {:?}, run folder {}",
            c.task,
            trainer.data.train.len(),
            trainer.data.test.len(),
            trainer.model.trainable_parameter_count(),
            trainer.model.parameter_count(),
            trainer.device,
            trainer.run_dir.display()
        );
        if c.task == Task::Snli {
            let dir = data::data_dir(c.data.data_dir.as_deref()).join("snli_1.0");
            eprintln!(
                "snli: training on {} (evaluating on snli_1.0_test.jsonl)",
                data::snli::train_file(&dir).display()
            );
        }
    }
    let summary = trainer.run()?;
    if let Some(reason) = summary
        .stopped
        .as_deref()
        .filter(|r| r.starts_with(train::DIVERGED))
    {
        return Err(anyhow::anyhow!(
            "{reason}; the run's logs and summary are in {} (try a lower --lr)",
            trainer.run_dir.display()
        ));
    }
    if let Some(e) = summary.epsilon {
        let caveat = match trainer.config.privacy.sampling {
            dpcomp::config::Sampling::Shuffle => {
                " (shuffled batches: the accountant assumes Poisson sampling, so this ε is an approximation)"
            }
            dpcomp::config::Sampling::Poisson => "",
        };
        println!(
            "epsilon {e:.4} at delta {}, {} noise{caveat}",
            trainer.config.privacy.delta,
            trainer.noise_label().unwrap_or_default()
        );
    }
    println!(
        "{}: final test accuracy {:.2}% (mean of the last {} epochs), last epoch {:.2}%, {:.1}s",
        summary.task,
        100.0 * summary.final_accuracy,
        summary.epochs.min(10),
        100.0 * summary.last_test_accuracy,
        summary.wall_seconds
    );
    Ok(())
}
