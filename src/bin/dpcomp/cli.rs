//! The `dpcomp` command line: train, eval, data fetch, bench.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use dpcomp::bench;
use dpcomp::config::{AccountantKind, DeviceChoice, Task, TrainConfig, TrainOverrides};
use dpcomp::data::{self, fetch};
use dpcomp::error::Error;
use dpcomp::privacy;
use dpcomp::tasks;
use dpcomp::train::{self, checkpoint, Trainer};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "dpcomp",
    version,
    about = "Differentially private training with gradient compression"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a task's model; writes config.toml, metrics.jsonl, checkpoints and summary.json.
    Train(Box<TrainArgs>),
    /// Report the test accuracy of a run's checkpoint.
    Eval(EvalArgs),
    /// Datasets: download the official archives.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Run every cell of an experiment file (skipping finished cells, resuming interrupted
    /// ones) and write its results table.
    Grid(GridArgs),
    /// The paper's figures (PNG and SVG) from the runs of one grid: runs/<experiment>/<profile>.
    Plot(PlotArgs),
    /// Privacy budget of DP-SGD: epsilon for (q, sigma, steps, delta), or the sigma for a target
    /// epsilon.
    Epsilon(EpsilonArgs),
    /// DP-SGD for convex losses (hinge, q-norm hinge, logistic) on tabular data: output
    /// perturbation (Theorem 7), gradient perturbation (Theorem 11 or the RDP accountant), or
    /// non-private SGD.
    Convex(ConvexArgs),
    /// Federated learning (FL-STD, FL-RND, FL-FREQ, FL-CS), with or without client-level DP;
    /// writes config.json, metrics.jsonl (one row a round) and summary.json.
    Fl(Box<FlArgs>),
    /// The paper's analyses: gradient error of finished runs, clipping-radius sweeps.
    Analyze {
        #[command(subcommand)]
        command: AnalyzeCommand,
    },
    /// Benchmarks whose output is quoted in the README and the issues.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Correctness on one device (the GPU kit's first step): per-sample gradients of the four
    /// models against per-example autograd, and every compressor against its CPU result. Exits
    /// non-zero when a check fails.
    CheckDevice(bench::device_check::CheckDeviceArgs),
}

#[derive(Debug, clap::Args)]
pub struct GridArgs {
    /// The experiment file (experiments/*.toml).
    pub experiment: PathBuf,
    /// Which of the file's profiles: cpu (fits a 2-core CPU) or full (the paper's settings).
    #[arg(long, default_value = "cpu")]
    pub profile: String,
    /// Run only the cells whose axis has this value (repeatable), e.g. --only rate=16.
    #[arg(long, value_name = "AXIS=VALUE")]
    pub only: Vec<String>,
    /// Folder under which runs/<experiment>/<profile>/<cell>/ are written.
    #[arg(long, default_value = "runs")]
    pub runs: PathBuf,
    /// Also copy the results table to this folder as <experiment>.<profile>.{csv,md}.
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
    /// List the cells and their state without running anything.
    #[arg(long)]
    pub list: bool,
    /// Write the results table of the finished cells (and copy it to --results-dir) without
    /// training anything: for grids whose cells other processes are running.
    #[arg(long)]
    pub tables_only: bool,
}

#[derive(Debug, clap::Args)]
pub struct PlotArgs {
    /// A grid's run folder, runs/<experiment>/<profile>.
    pub runs: PathBuf,
    /// Where the figures go (default: <runs>/figures).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Title prefix of every figure (default: the folder's experiment name).
    #[arg(long)]
    pub title: Option<String>,
}

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

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A run folder (or its checkpoint/ folder).
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[arg(long, value_enum)]
    pub device: Option<DeviceChoice>,
    /// Data folder (default: the run's, else $DPCOMP_DATA, else data/).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct EpsilonArgs {
    /// Sampling rate q of each step (Poisson sampling).
    #[arg(long)]
    pub sample_rate: f64,
    /// Noise multiplier sigma (noise std = sigma * C).
    #[arg(
        long,
        required_unless_present = "target_epsilon",
        conflicts_with = "target_epsilon"
    )]
    pub noise_multiplier: Option<f64>,
    /// Print the sigma that reaches this epsilon instead.
    #[arg(long)]
    pub target_epsilon: Option<f64>,
    #[arg(long)]
    pub steps: u64,
    #[arg(long)]
    pub delta: f64,
    #[arg(long, value_enum, default_value = "rdp")]
    pub accountant: AccountantKind,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Download, verify (SHA-256) and unpack a dataset: names, cifar10, cifar100 or snli.
    Fetch {
        dataset: String,
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Replace an existing copy.
        #[arg(long)]
        force: bool,
        /// A mirror of the official archive (same file).
        #[arg(long)]
        url: Option<String>,
        /// The expected SHA-256 of the archive at --url.
        #[arg(long)]
        sha256: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
pub struct ConvexArgs {
    /// breast_cancer (../shared/data), csv:PATH (features..., label 0/1 or -1/+1), or
    /// synthetic:N:D (separable with margin, hinge optimum 0 known).
    #[arg(long, default_value = "breast_cancer")]
    pub data: String,
    /// hinge, qhinge:Q (1 < Q <= 2), logistic or least_squares.
    #[arg(long, default_value = "hinge")]
    pub loss: String,
    #[arg(long, value_enum, default_value = "gradient")]
    pub algorithm: dpcomp::convex::Algorithm,
    #[arg(long, value_enum, default_value = "theorem11")]
    pub calibration: dpcomp::convex::Calibration,
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
    /// T (default: Theorem 12's).
    #[arg(long)]
    pub steps: Option<u64>,
    /// η (default: Theorem 12's).
    #[arg(long)]
    pub step_size: Option<f64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Data folder (default: $DPCOMP_DATA, else data/).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct FlArgs {
    #[arg(long, value_enum, default_value = "fashion-mnist")]
    pub dataset: dpcomp::fl::data::FlDataset,
    #[arg(long, value_enum, default_value = "cs")]
    pub scheme: dpcomp::fl::scheme::Scheme,
    /// r = m / n (FL-STD sends everything and ignores it).
    #[arg(long, default_value_t = 0.1)]
    pub ratio: f64,
    /// P, chunks of FL-FREQ and FL-CS (default ⌈n / 1024⌉).
    #[arg(long)]
    pub chunks: Option<i64>,
    /// DCT rows kept per chunk: the first ones (the paper's) or a shared-seed random subset.
    #[arg(long, value_enum, default_value = "first")]
    pub rows: dpcomp::fl::sketch::DctRows,
    /// Client-level DP (needs --target-epsilon or --noise-multiplier).
    #[arg(long)]
    pub dp: bool,
    /// Calibrate σ so that ε after --rounds rounds is at most this.
    #[arg(long, conflicts_with = "noise_multiplier")]
    pub target_epsilon: Option<f64>,
    /// σ: noise N(0, σ² S²) on the sum of the sampled clients' messages.
    #[arg(long)]
    pub noise_multiplier: Option<f64>,
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    /// S, the clip radius of a message in the domain it is sent in (default: --full-clip × √r).
    #[arg(long)]
    pub clip: Option<f64>,
    /// S₁, the clip radius for a whole update (default: the dataset's, see `dpcomp fl --help`).
    #[arg(long)]
    pub full_clip: Option<f64>,
    #[arg(long, value_enum, default_value = "rdp")]
    pub accountant: AccountantKind,
    /// N (default: 1000 for Fashion-MNIST, 50 for breast cancer).
    #[arg(long)]
    pub clients: Option<usize>,
    /// C, the probability that a client takes part in a round.
    #[arg(long)]
    pub fraction: Option<f64>,
    /// T_gd, local steps a round.
    #[arg(long)]
    pub local_steps: Option<usize>,
    /// Examples per local step (0: full-batch gradient descent).
    #[arg(long)]
    pub local_batch: Option<usize>,
    #[arg(long)]
    pub local_lr: Option<f64>,
    /// T_cl.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Stop after this many rounds without improvement (0: never).
    #[arg(long, default_value_t = 0)]
    pub patience: usize,
    /// iid, dirichlet:ALPHA or shards:K.
    #[arg(long, default_value = "iid")]
    pub non_iid: String,
    #[arg(long, default_value_t = 1.0)]
    pub server_lr: f64,
    #[arg(long, default_value_t = 0.0)]
    pub server_momentum: f64,
    /// FL-CS: BPDN's λ as a fraction of ‖Aᵀy‖∞ per chunk.
    #[arg(long)]
    pub lambda: Option<f64>,
    /// FL-CS: OWL-QN iterations per round.
    #[arg(long)]
    pub owlqn_iterations: Option<usize>,
    /// Test examples evaluated after each round (0: all).
    #[arg(long, default_value_t = 0)]
    pub eval_examples: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run folder for config.json, metrics.jsonl, summary.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Data folder (default: $DPCOMP_DATA, else data/); Fashion-MNIST is read from
    /// <data-dir>/fashion-mnist, else /usr/share/datasets/fashion-mnist.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceChoice,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

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

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Mean time of one non-private training step on a fixed batch.
    Train(bench::TrainBenchArgs),
    /// Non-private versus DP-SGD step time and peak memory, side by side.
    Dp(bench::DpBenchArgs),
    /// A compressor's compress + decompress time against the model's backward pass, and its
    /// wire bits against dense fp32.
    Compress(bench::compress::CompressBenchArgs),
    /// FL-CS's chunked OWL-QN reconstruction per round against one round of client training
    /// (n = 10^5 and 10^6), and the recovery error of first versus random DCT rows.
    FlReconstruction(bench::fl::FlBenchArgs),
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train_command(*args),
        Command::Eval(args) => eval_command(args),
        Command::Data {
            command:
                DataCommand::Fetch {
                    dataset,
                    data_dir,
                    force,
                    url,
                    sha256,
                },
        } => {
            let mut source = fetch::official_source(&dataset)?;
            if let Some(url) = url {
                source.url = url;
                source.sha256 = sha256;
            } else if sha256.is_some() {
                return Err(Error::bad_value("--sha256", "only meaningful with --url").into());
            }
            let dir = data::data_dir(data_dir.as_deref());
            let fetched = fetch::fetch(&source, &dir, force, true)?;
            println!(
                "{}: {} files in {} (archive SHA-256 {})",
                source.dataset,
                fetched.files,
                fetched.folder.display(),
                fetched.sha256
            );
            Ok(())
        }
        Command::Epsilon(args) => epsilon_command(args),
        Command::Grid(args) => grid_command(args),
        Command::Plot(args) => {
            let out = args
                .out
                .clone()
                .unwrap_or_else(|| args.runs.join("figures"));
            let title = args.title.clone().unwrap_or_else(|| {
                let profile = args.runs.file_name().unwrap_or_default().to_string_lossy();
                let parent = args.runs.parent().and_then(|p| p.file_name());
                format!(
                    "{} ({profile})",
                    parent.unwrap_or_default().to_string_lossy()
                )
            });
            let clipping = args.runs.join(dpcomp::analysis::clipping::FILE);
            let convex = args.runs.join("results.csv");
            let is_convex = std::fs::read_to_string(&convex)
                .is_ok_and(|t| t.starts_with("data,loss,algorithm,epsilon"));
            let is_fl = std::fs::read_to_string(&convex)
                .is_ok_and(|t| t.starts_with("dataset,scheme,ratio,dp"));
            let written = if is_fl {
                let cells = dpcomp::fl::experiment::read_cells(&args.runs)?;
                dpcomp::fl::experiment::figures(&cells, &out)?
            } else if is_convex {
                let rows = dpcomp::convex::experiment::read_rows(&convex)?;
                dpcomp::convex::experiment::figures_of(&rows, &out)?
            } else if clipping.is_file() {
                let sweeps = dpcomp::analysis::clipping::read(&args.runs)?;
                dpcomp::plot::analysis::clipping_figures(&sweeps, &out)?
            } else {
                dpcomp::plot::plot(&args.runs, &out, &title)?
            };
            for path in written {
                println!("{}", path.display());
            }
            Ok(())
        }
        Command::Convex(args) => convex_command(args),
        Command::Fl(args) => fl_command(*args),
        Command::Analyze {
            command: AnalyzeCommand::GradientError(args),
        } => gradient_error_command(args),
        Command::Analyze {
            command: AnalyzeCommand::Clipping(args),
        } => clipping_command(*args),
        Command::Bench {
            command: BenchCommand::Train(args),
        } => Ok(bench::train_bench(args)?),
        Command::Bench {
            command: BenchCommand::Dp(args),
        } => Ok(bench::dp_bench(args)?),
        Command::Bench {
            command: BenchCommand::Compress(args),
        } => Ok(bench::compress::compress_bench(args)?),
        Command::Bench {
            command: BenchCommand::FlReconstruction(args),
        } => Ok(bench::fl::fl_bench(args)?),
        Command::CheckDevice(args) => check_device_command(args),
    }
}

fn check_device_command(args: bench::device_check::CheckDeviceArgs) -> Result<()> {
    let report = bench::device_check::run(&args)?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.json_out {
        std::fs::write(path, &json).map_err(|e| Error::io(path, e))?;
    }
    println!("{json}");
    for check in report.checks.iter().filter(|c| !c.passed) {
        eprintln!(
            "FAILED {}: error {:e} above {:e} ({})",
            check.name, check.error, check.tolerance, check.detail
        );
    }
    if !report.passed {
        return Err(anyhow::anyhow!(
            "check-device: some checks failed on {}",
            report.device
        ));
    }
    Ok(())
}

fn train_command(args: TrainArgs) -> Result<()> {
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
            .unwrap_or_else(|| PathBuf::from("runs").join(config.task.name()));
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
            let dir = data::data_dir(c.data_dir.as_deref()).join("snli_1.0");
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
        let caveat = match trainer.config.sampling {
            dpcomp::config::Sampling::Shuffle => {
                " (shuffled batches: the accountant assumes Poisson sampling, so this ε is an approximation)"
            }
            dpcomp::config::Sampling::Poisson => "",
        };
        println!(
            "epsilon {e:.4} at delta {}, {} noise{caveat}",
            trainer.config.delta,
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

fn eval_command(args: EvalArgs) -> Result<()> {
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
    let mut config = TrainConfig::from_toml_file(&run_dir.join("config.toml"))?;
    if let Some(d) = args.device {
        config.device = d;
    }
    if args.data_dir.is_some() {
        config.data_dir = args.data_dir;
    }
    // A stored config.toml is user data too (a batch size of 0 would reach LibTorch).
    config
        .validate()
        .with_context(|| format!("{}", run_dir.join("config.toml").display()))?;
    let (device, data, model) = tasks::prepare(&config)?;
    checkpoint::load_weights(model.var_store(), &ckpt.join("model.safetensors"))?;
    let (loss, accuracy) =
        train::evaluate(model.as_ref(), &data.test, config.eval_batch_size, device)?;
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

fn epsilon_command(args: EpsilonArgs) -> Result<()> {
    let sigma = match (args.noise_multiplier, args.target_epsilon) {
        (Some(sigma), _) => sigma,
        (None, Some(target)) => privacy::calibrate::noise_multiplier_for(
            args.accountant,
            target,
            args.sample_rate,
            args.steps,
            args.delta,
        )?,
        (None, None) => unreachable!("clap requires one of the two"),
    };
    let mut accountant = privacy::accountant::Accountant::default();
    accountant.step(sigma, args.sample_rate, args.steps)?;
    // PLD also reports its grid spacing: coarser than 1e-4 when the loss range needed it.
    let (epsilon, alpha, pld_interval) = match args.accountant {
        AccountantKind::Pld => {
            let p = privacy::pld::epsilon_detailed(&accountant.history, args.delta)?;
            (p.epsilon, None, Some(p))
        }
        AccountantKind::Rdp => {
            let (e, a) = accountant.epsilon_rdp(args.delta)?;
            (e, Some(a), None)
        }
    };
    let order = alpha.map_or(String::new(), |a| format!(" (optimal RDP order {a})"));
    if let Some(p) = pld_interval.filter(|p| p.coarsened()) {
        eprintln!(
            "note: PLD grid spacing {:.3e} instead of {:e} to stay within {} points \
             (small sigma or many steps); the bound is valid but looser",
            p.interval,
            privacy::pld::DEFAULT_INTERVAL,
            privacy::pld::MAX_FFT_LEN
        );
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({"epsilon": epsilon, "alpha": alpha, "noise_multiplier": sigma,
                "accountant": args.accountant, "pld_interval": pld_interval.map(|p| p.interval)})
        );
    } else if args.target_epsilon.is_some() {
        println!(
            "noise multiplier {sigma:.6} gives epsilon {epsilon:.4}{order} at delta {}",
            args.delta
        );
    } else {
        println!("epsilon {epsilon:.4}{order} at delta {}", args.delta);
    }
    Ok(())
}

fn grid_command(args: GridArgs) -> Result<()> {
    if dpcomp::convex::experiment::is_convex(&args.experiment)? {
        return convex_grid_command(&args);
    }
    if dpcomp::fl::experiment::is_fl(&args.experiment)? {
        return fl_grid_command(&args);
    }
    let experiment = dpcomp::grid::Experiment::from_file(&args.experiment)?;
    let only = dpcomp::grid::parse_only(&args.only)?;
    if args.list {
        let root = args.runs.join(&experiment.name).join(&args.profile);
        let cells = experiment.cells(&args.profile, &only)?;
        let uploads = dpcomp::grid::upload_estimates(&cells);
        for (cell, upload) in cells.iter().zip(uploads) {
            let state = dpcomp::grid::cell_state(&root.join(&cell.name), &cell.config)?;
            let upload = match upload {
                Ok(u) => format!(
                    "upload {} steps, {:.4} Gb on the wire, {:.2} in the paper's unit",
                    u.steps,
                    u.gigabits(),
                    u.paper_gib()
                ),
                Err(e) => format!("upload not estimated ({e})"),
            };
            let in_use = dpcomp::run_lock::holder(&root.join(&cell.name))
                .map_or(String::new(), |owner| format!(" (running: {owner})"));
            println!(
                "{}  {:?}{in_use}  epochs {}  {upload}",
                cell.name, state, cell.config.epochs
            );
        }
        return Ok(());
    }
    let rows = if args.tables_only {
        dpcomp::grid::write_results(&experiment, &args.profile, &args.runs)?
    } else {
        dpcomp::grid::run(&experiment, &args.profile, &only, &args.runs, true)?
    };
    let root = args.runs.join(&experiment.name).join(&args.profile);
    if let Some(dir) = &args.results_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for ext in ["csv", "md"] {
            let from = root.join(format!("results.{ext}"));
            let to = dir.join(format!("{}.{}.{ext}", experiment.name, args.profile));
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
    }
    println!(
        "{}: {} finished cells; table in {}",
        experiment.name,
        rows.len(),
        root.join("results.md").display()
    );
    Ok(())
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

fn gradient_error_command(args: GradientErrorArgs) -> Result<()> {
    use dpcomp::analysis::gradient_error;
    for run in run_folders(&args.runs)? {
        let mut trainer =
            Trainer::resume(&run, None).with_context(|| format!("loading {}", run.display()))?;
        trainer.config.grad_error_batches = args.batches;
        trainer.config.grad_error_draws = args.draws;
        trainer.config.validate()?;
        let epoch = trainer.state.epochs_done;
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
        let record = trainer.measure_gradient_error()?;
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

fn clipping_command(args: ClippingArgs) -> Result<()> {
    use dpcomp::analysis::{clipping, fixed_batches};
    let (config, weights) = match &args.run {
        Some(run) => {
            let config = TrainConfig::from_toml_file(&run.join("config.toml"))?;
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
            (args.settings.or(file).resolve()?, None)
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
    let batches = fixed_batches(data.train.len(), config.batch_size, args.batches);
    let sweeps = clipping::sweep(
        config.task.name(),
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
    for path in dpcomp::plot::analysis::clipping_figures(&sweeps, &args.out)? {
        println!("{}", path.display());
    }
    Ok(())
}

fn convex_command(args: ConvexArgs) -> Result<()> {
    use dpcomp::convex::{self, loss::Loss, ConvexSettings};
    let data = dpcomp::convex::data::named(&args.data, args.data_dir.as_deref())?;
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

/// `dpcomp grid` on a `kind = "fl"` file: every dataset × scheme × ratio × DP cell not yet
/// finished, into runs/<name>/<profile>/ (and --results-dir: <name>.<profile>.{csv,md} and
/// <name>/ figures).
fn fl_grid_command(args: &GridArgs) -> Result<()> {
    use dpcomp::fl::experiment::{self, FlExperiment};
    let e = FlExperiment::from_file(&args.experiment)?;
    if !args.only.is_empty() {
        return Err(Error::bad_value("--only", "not supported for federated experiments").into());
    }
    let out = args.runs.join(&e.name).join(&args.profile);
    if args.list {
        for (dataset, name, settings) in e.cells(&args.profile)? {
            let noise = settings.privacy.map_or(String::new(), |p| {
                format!("  S {:.4} sigma {:.4}", p.clip, p.noise_multiplier)
            });
            println!("{dataset}/{name}  rounds {}{noise}", settings.rounds);
        }
        return Ok(());
    }
    let data_dir = data::data_dir(None);
    let cells = experiment::run(&e, &args.profile, &data_dir, &out, true)?;
    if let Some(dir) = &args.results_dir {
        copy_results(&out, dir, &e.name, &args.profile)?;
    }
    println!(
        "{}: {} cells; table in {}",
        e.name,
        cells.len(),
        out.join("results.md").display()
    );
    Ok(())
}

/// Copies `results.{csv,md}` of `out` to `<dir>/<name>.<profile>.{csv,md}` and the figures
/// (`*.png`, `*.svg`) to `<dir>/<name>/`.
fn copy_results(
    out: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    profile: &str,
) -> Result<()> {
    let figures = dir.join(name);
    std::fs::create_dir_all(&figures).with_context(|| format!("creating {}", figures.display()))?;
    for entry in std::fs::read_dir(out)? {
        let path = entry?.path();
        if !path.is_file() {
            continue;
        }
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let to = match file.as_str() {
            "results.csv" | "results.md" => {
                dir.join(format!("{name}.{profile}.{}", &file["results.".len()..]))
            }
            _ if file.ends_with(".png") || file.ends_with(".svg") => figures.join(&file),
            _ => continue,
        };
        std::fs::copy(&path, &to)
            .with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
    }
    Ok(())
}

/// `dpcomp grid` on a `kind = "convex"` file: every setting over the profile's seeds, into
/// runs/<name>/<profile>/ (and --results-dir: <name>.<profile>.{csv,md} and <name>/ figures).
fn convex_grid_command(args: &GridArgs) -> Result<()> {
    use dpcomp::convex::experiment::{self, ConvexExperiment};
    if args.list || !args.only.is_empty() {
        return Err(Error::bad_value(
            "--list/--only",
            "not supported for convex experiments (they run as one sweep)",
        )
        .into());
    }
    let e = ConvexExperiment::from_file(&args.experiment)?;
    let out = args.runs.join(&e.name).join(&args.profile);
    let rows = experiment::run(&e, &args.profile, None, &out, true)?;
    if let Some(dir) = &args.results_dir {
        copy_results(&out, dir, &e.name, &args.profile)?;
    }
    println!(
        "{}: {} settings; table in {}",
        e.name,
        rows.len(),
        out.join("results.md").display()
    );
    Ok(())
}

/// The settings `dpcomp fl` runs with: the dataset's defaults, overridden by the flags, and σ
/// calibrated when --target-epsilon is given.
pub fn fl_settings(args: &FlArgs) -> Result<dpcomp::fl::FlSettings> {
    use dpcomp::fl::{default_clip, default_full_clip, FlPrivacy, FlSettings};
    let mut s = FlSettings::defaults(args.dataset);
    s.scheme = args.scheme;
    s.ratio = if args.scheme == dpcomp::fl::scheme::Scheme::Std {
        1.0
    } else {
        args.ratio
    };
    s.chunks = args.chunks;
    s.rows = args.rows;
    s.clients = args.clients.unwrap_or(s.clients);
    s.fraction = args.fraction.unwrap_or(s.fraction);
    s.local.steps = args.local_steps.unwrap_or(s.local.steps);
    s.local.batch = args.local_batch.unwrap_or(s.local.batch);
    s.local.learning_rate = args.local_lr.unwrap_or(s.local.learning_rate);
    s.rounds = args.rounds.unwrap_or(s.rounds);
    s.patience = args.patience;
    s.partition = dpcomp::data::partition::Partition::parse(&args.non_iid)?;
    s.server_learning_rate = args.server_lr;
    s.server_momentum = args.server_momentum;
    s.lambda = args.lambda.unwrap_or(s.lambda);
    s.owlqn_iterations = args.owlqn_iterations.unwrap_or(s.owlqn_iterations);
    s.eval_examples = args.eval_examples;
    s.seed = args.seed;
    s.device = args.device;
    if args.dp {
        let noise_multiplier = match (args.noise_multiplier, args.target_epsilon) {
            (Some(sigma), None) => sigma,
            (None, Some(target)) => privacy::calibrate::noise_multiplier_for(
                args.accountant,
                target,
                s.fraction,
                s.rounds as u64,
                args.delta,
            )?,
            _ => {
                return Err(Error::bad_value(
                    "--dp",
                    "expected --target-epsilon E or --noise-multiplier SIGMA",
                )
                .into())
            }
        };
        let full = args.full_clip.unwrap_or(default_full_clip(args.dataset));
        s.privacy = Some(FlPrivacy {
            clip: args.clip.unwrap_or(default_clip(full, s.scheme, s.ratio)),
            noise_multiplier,
            delta: args.delta,
            accountant: args.accountant,
        });
    } else if args.target_epsilon.is_some() || args.noise_multiplier.is_some() {
        return Err(
            Error::bad_value("--target-epsilon/--noise-multiplier", "only with --dp").into(),
        );
    }
    s.validate()?;
    Ok(s)
}

fn fl_command(args: FlArgs) -> Result<()> {
    let settings = fl_settings(&args)?;
    let data_dir = data::data_dir(args.data_dir.as_deref());
    let fl_data = dpcomp::fl::data::FlData::load(settings.dataset, &data_dir)?;
    let summary = dpcomp::fl::run(&settings, &fl_data, args.out.as_deref(), !args.json)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    println!(
        "{} on {}: n {}, m {} (r {:.4}{}), {} clients, C {}, {} rounds{}",
        summary.scheme,
        summary.dataset,
        summary.parameters,
        summary.message_length,
        summary.ratio,
        summary.chunks.map_or(String::new(), |p| format!(", P {p}")),
        summary.clients,
        summary.fraction,
        summary.rounds_run,
        if summary.stopped_early {
            " (stopped early)"
        } else {
            ""
        }
    );
    if let (Some(s), Some(sigma), Some(eps), Some(delta)) = (
        summary.clip,
        summary.noise_multiplier,
        summary.epsilon,
        summary.delta,
    ) {
        println!(
            "client-level DP: S {s:.4}, sigma {sigma:.4}, epsilon {eps:.4} at delta {delta:e}"
        );
    }
    println!(
        "best {} {:.4} at round {} (accuracy {:.4}{}), cost {:.2} kB (r n 32 round C)",
        summary.metric,
        summary.best,
        summary.best_round,
        summary.accuracy_at_best,
        summary
            .auroc_at_best
            .map_or(String::new(), |a| format!(", AUROC {a:.4}")),
        summary.cost_bits / 8e3
    );
    println!(
        "mean seconds a round: clients {:.3}, server {:.3}; wall {:.1} s",
        summary.mean_client_seconds, summary.mean_server_seconds, summary.wall_seconds
    );
    Ok(())
}
