//! `dpcomp eval`: the test accuracy of a run's checkpoint.

use anyhow::{Context, Result};
use dpcomp::config::DeviceChoice;
use dpcomp::error::Error;
use dpcomp::train::{self, checkpoint};
use dpcomp_lab::tasks;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A run folder (or its checkpoint/ folder).
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[arg(long, value_enum)]
    pub device: Option<DeviceChoice>,
    /// Data folder (default: the run's, else $DPCOMP_DATA, else data/); its test split must be
    /// the one the run evaluated on (the checkpoint's data fingerprint), as for --resume.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EvalArgs) -> Result<()> {
    let (run_dir, ckpt) = if args.checkpoint.join("state.json").is_file() {
        let run = args
            .checkpoint
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default();
        (run, args.checkpoint.clone())
    } else {
        let ckpt = checkpoint::find(&args.checkpoint).ok_or_else(|| {
            Error::bad_value(
                "--checkpoint",
                format!("{}: no checkpoint here", args.checkpoint.display()),
            )
        })?;
        (args.checkpoint.clone(), ckpt)
    };
    checkpoint::verify(&ckpt)?;
    let mut config = dpcomp_lab::tasks::config_from_file(&run_dir.join("config.toml"))?;
    if let Some(d) = args.device {
        config.device = d;
    }
    let data_flag = if args.data_dir.is_some() {
        "--data-dir"
    } else {
        "the data folder"
    };
    if args.data_dir.is_some() {
        config.data.data_dir = args.data_dir;
    }
    // A stored config.toml is user data too (a batch size of 0 would reach LibTorch).
    config
        .validate()
        .with_context(|| format!("{}", run_dir.join("config.toml").display()))?;
    let (device, data, model) = tasks::prepare(&config)?;
    // The test split the run evaluated on, as `--resume` checks it (`state.json`'s data
    // fingerprint): a data folder whose files changed would measure the model on other
    // examples or labels. Only the test split is compared: it is all eval reads (an audit's
    // black-box canaries edit the training split). A checkpoint made before fingerprints were
    // recorded is not checked.
    let state = checkpoint::read_state(&ckpt)?;
    if let Some(saved) = state.data.as_deref() {
        let now = train::distributed::data_fingerprint(&data);
        let test = |print: &str| print.split_once("; test: ").map(|(_, t)| t.to_string());
        if let (Some(saved_test), Some(now_test)) = (test(saved), test(&now)) {
            if saved_test != now_test {
                anyhow::bail!(
                    "{data_flag} {}: holds another test split than {} was trained and evaluated \
                     on (the checkpoint's: {saved_test}; now: {now_test}); evaluate with the \
                     run's data (eval measures a checkpoint on the data its run used, as \
                     `train --resume` checks; copy the run's data back, or point --data-dir at \
                     it)",
                    dpcomp::data::data_dir(config.data.data_dir.as_deref()).display(),
                    run_dir.display()
                );
            }
        }
    }
    checkpoint::load_weights(model.var_store(), &ckpt.join("model.safetensors"))?;
    let (loss, accuracy) = train::evaluate(
        model.as_ref(),
        &data.test,
        config.data.eval_batch_size,
        device,
    )?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"task": config.task, "test_loss": loss, "test_accuracy": accuracy, "examples": data.test.len()})
        );
    } else {
        println!(
            "{}: test accuracy {:.2}% (loss {:.4}) on {} examples",
            config.task,
            100.0 * accuracy,
            loss,
            data.test.len()
        );
    }
    Ok(())
}
