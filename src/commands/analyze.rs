//! `dpcomp analyze`: the paper's gradient-error and clipping-radius analyses.

use anyhow::{Context, Result};
use clap::Subcommand;
use dpcomp::config::TrainOverrides;
use dpcomp::error::Error;
use dpcomp::train::checkpoint;
use dpcomp_lab::tasks;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum AnalyzeCommand {
    /// Gradient error after clipping, noise and compression (bias² and variance) at the final
    /// checkpoint of runs, appended to each run's grad_error.jsonl. Diagnostic: reads training
    /// data outside the privacy accountant.
    GradientError(GradientErrorArgs),
    /// Gradient error against the clipping radius C: measured on fixed batches and modelled
    /// (analysis::clipping), with both minimisers; writes clipping.{json,csv} and figures.
    /// Diagnostic: reads training data outside the privacy accountant.
    Clipping(Box<ClippingArgs>),
    /// How compressible federated client updates are: the share of their energy in
    /// the top 5/10/20% of coordinates, of shuffled-chunk DCT coefficients (FL-CS's domain),
    /// and in each chunk's first DCT rows, for each Fashion-MNIST network.
    FlSparsity(FlSparsityArgs),
}

#[derive(Debug, clap::Args)]
pub struct FlSparsityArgs {
    #[arg(long, value_delimiter = ',', default_value = "lenet,fedavg-cnn")]
    pub models: Vec<dpcomp::fl::model::FlNet>,
    /// FedAvg rounds measured (the global model moves by the clients' mean update after each).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Clients measured per round.
    #[arg(long, default_value_t = 5)]
    pub clients: usize,
    /// N, the clients the training set is split among (IID, equal sizes).
    #[arg(long, default_value_t = 1000)]
    pub clients_total: usize,
    #[arg(long, default_value_t = 10)]
    pub local_steps: usize,
    #[arg(long, default_value_t = 20)]
    pub local_batch: usize,
    #[arg(long, default_value_t = 0.05)]
    pub local_lr: f64,
    #[arg(long, value_delimiter = ',', default_value = "0.05,0.1,0.2")]
    pub ratios: Vec<f64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

fn fl_sparsity(args: FlSparsityArgs) -> Result<()> {
    let dir = dpcomp::data::data_dir(args.data_dir.as_deref());
    let data = dpcomp::fl::data::FlData::load(dpcomp::fl::data::FlDataset::FashionMnist, &dir)?;
    let local = dpcomp::fl::client::LocalTraining {
        steps: args.local_steps,
        batch: args.local_batch,
        learning_rate: args.local_lr,
    };
    let mut reports = Vec::new();
    for &net in &args.models {
        reports.push(dpcomp::fl::sparsity::measure(
            &data,
            net,
            args.clients_total,
            args.clients,
            args.rounds,
            &local,
            &args.ratios,
            args.seed,
        )?);
    }
    if args.json {
        println!("{}", serde_json::to_string(&reports)?);
        return Ok(());
    }
    println!(
        "share of a client update's energy kept ({} rounds x {} clients of {}, {} local steps of {}, lr {}):",
        args.rounds, args.clients, args.clients_total, args.local_steps, args.local_batch, args.local_lr
    );
    println!(
        "{:<11} {:>10} {:>6} {:>12} {:>14} {:>16} {:>18}",
        "model", "n", "r", "top coords", "top shuf. DCT", "first shuf. rows", "first rows (FREQ)"
    );
    for report in &reports {
        for s in &report.shares {
            println!(
                "{:<11} {:>10} {:>6.2} {:>12.3} {:>14.3} {:>16.3} {:>18.3}",
                report.model,
                report.parameters,
                s.ratio,
                s.top_coordinates,
                s.top_shuffled_dct,
                s.first_shuffled_dct_rows,
                s.first_dct_rows_unshuffled
            );
        }
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct GradientErrorArgs {
    /// Run folders, or grid folders (runs/<experiment>/<profile>) whose cells are all measured.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Fixed batches per measurement.
    #[arg(long, default_value_t = 4)]
    pub batches: usize,
    /// Noise draws per batch.
    #[arg(long, default_value_t = 8)]
    pub draws: usize,
    /// Measure again when the final epoch already has a record (replacing it).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
#[command(mut_arg("task", super::task_arg))]
pub struct ClippingArgs {
    /// TOML file with training settings (as `dpcomp train --config`); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Analyse this run's final weights (its settings replace --config and the flags).
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// Noise multipliers to sweep at (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0.4,0.8")]
    pub sigmas: Vec<f64>,
    /// Fixed batches (of the task's batch size).
    #[arg(long, default_value_t = 4)]
    pub batches: usize,
    /// Noise draws per batch and radius.
    #[arg(long, default_value_t = 4)]
    pub draws: usize,
    /// Log-spaced radii (G and both model minimisers are added).
    #[arg(long, default_value_t = 40)]
    pub points: usize,
    /// Output folder: clipping.json, clipping.csv and the figures.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub settings: TrainOverrides,
}

/// The run folders named by `paths`: a folder with config.toml is a run, any other folder is a
/// grid whose sub-folders with config.toml are its runs (sorted).
fn run_folders(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut runs = Vec::new();
    for path in paths {
        if path.join("config.toml").is_file() {
            runs.push(path.clone());
            continue;
        }
        let mut cells: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("config.toml").is_file())
            .collect();
        if cells.is_empty() {
            return Err(Error::bad_value(
                "runs",
                format!(
                    "{}: neither a run (config.toml) nor a folder of runs",
                    path.display()
                ),
            )
            .into());
        }
        cells.sort();
        runs.extend(cells);
    }
    Ok(runs)
}

fn gradient_error(args: GradientErrorArgs) -> Result<()> {
    use dpcomp_lab::analysis::gradient_error;
    use dpcomp_lab::analysis::probe::GradientErrorProbe;
    for run in run_folders(&args.runs)? {
        let trainer = dpcomp_lab::tasks::resume(&run, None)
            .with_context(|| format!("loading {}", run.display()))?;
        let mut settings = trainer.config().analysis.clone();
        settings.grad_error_batches = args.batches;
        settings.grad_error_draws = args.draws;
        let mut checked = trainer.config().clone();
        checked.analysis = settings.clone();
        checked.validate()?;
        let probe = GradientErrorProbe::new(settings);
        let epoch = trainer.state().epochs_done;
        // Records of epochs after the checkpoint belong to a lost continuation.
        gradient_error::truncate(&run, epoch)?;
        let mut records = gradient_error::read(&run)?;
        if records.iter().any(|r| r.epoch == epoch) {
            if !args.force {
                println!(
                    "{}: epoch {epoch} already measured (--force to redo)",
                    run.display()
                );
                continue;
            }
            records.retain(|r| r.epoch != epoch);
        }
        let record = probe.measure(&trainer)?;
        records.push(record.clone());
        records.sort_by_key(|r| r.epoch);
        gradient_error::write(&run, &records)?;
        let stage = |name: &str| {
            record.stage(name).map_or(String::new(), |s| {
                format!(
                    "{name} {:.4e} (bias² {:.3e}, var {:.3e})",
                    s.error, s.bias2, s.variance
                )
            })
        };
        println!(
            "{} epoch {epoch}: {}  {}  {}  |ḡ| {:.4} median |g_i| {:.4}",
            run.display(),
            stage("clip"),
            stage("noise"),
            stage("compress"),
            record.mean_gradient_norm,
            record.median_norm
        );
    }
    Ok(())
}

fn clipping(args: ClippingArgs) -> Result<()> {
    use dpcomp_lab::analysis::{clipping, fixed_batches};
    clipping::check_sigmas(&args.sigmas)?;
    let (config, weights) = match &args.run {
        Some(run) => {
            let config = dpcomp_lab::tasks::config_from_file(&run.join("config.toml"))?;
            let dir = checkpoint::find(run).ok_or_else(|| {
                Error::bad_value("--run", format!("{}: no checkpoint", run.display()))
            })?;
            checkpoint::verify(&dir)?;
            let epochs = checkpoint::read_state(&dir)?.epochs_done;
            (config, Some((dir, epochs)))
        }
        None => {
            let file = match &args.config {
                Some(path) => TrainOverrides::from_toml_file(path)?,
                None => TrainOverrides::default(),
            };
            (dpcomp_lab::tasks::resolve(args.settings.or(file))?, None)
        }
    };
    let (device, data, model) = tasks::prepare(&config)?;
    let epoch = match &weights {
        Some((dir, epochs)) => {
            checkpoint::load_weights(model.var_store(), &dir.join("model.safetensors"))?;
            *epochs
        }
        None => 0,
    };
    let params = model.trainable_variables();
    let batches = fixed_batches(data.train.len(), config.optimizer.batch_size, args.batches);
    let sweeps = clipping::sweep(
        &config.task.to_string(),
        epoch,
        model.as_ref(),
        &params,
        &data.train,
        device,
        &batches,
        &args.sigmas,
        args.draws,
        args.points,
    )?;
    clipping::write(&args.out, &sweeps)?;
    for s in &sweeps {
        println!(
            "{} sigma {}: median norm G {:.4}, |mean grad| {:.4}, m {}, B {}; C* measured {:.4} (error {:.4e}), model median-only {:.4} (measured error there {:.4e}), model mean-informed {:.4} ({:.4e}); at C = G: {:.4e}",
            s.task,
            s.model.noise_multiplier,
            s.model.median_norm,
            s.model.mean_gradient_norm,
            s.model.parameters,
            s.model.batch_size,
            s.measured_minimiser,
            s.measured_minimum,
            s.model_median_minimiser,
            s.measured_at_model_median,
            s.model_mean_minimiser,
            s.measured_at_model_mean,
            s.measured_at_median_norm
        );
    }
    for path in dpcomp_lab::plot::analysis::clipping_figures(&sweeps, &args.out)? {
        println!("{}", path.display());
    }
    Ok(())
}

pub fn run(command: AnalyzeCommand) -> Result<()> {
    match command {
        AnalyzeCommand::GradientError(args) => gradient_error(args),
        AnalyzeCommand::Clipping(args) => clipping(*args),
        AnalyzeCommand::FlSparsity(args) => fl_sparsity(args),
    }
}
