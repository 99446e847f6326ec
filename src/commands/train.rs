//! `dpcomp train`: one training run (or its resumption) into a run folder.

use anyhow::{Context, Result};
use dpcomp::comm::{CommChoice, Communicator, Shared};
use dpcomp::config::{TrainConfig, TrainOverrides};
use dpcomp::data;
use dpcomp::error::Error;
use dpcomp::train;
use dpcomp::train::distributed::{train_in_threads, Start};
use dpcomp_lab::tasks::{self, PaperTasks, Task};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(mut_arg("task", super::task_arg))]
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
    /// Train with W data-parallel workers as W threads of this process (one computes at a
    /// time): what `mpiexec -n W dpcomp train ...` computes, without MPI. W is 1 to 256: each
    /// thread holds its own model replica and LibTorch thread pool, so W threads take W times
    /// the memory and time of one (more workers run as MPI ranks). Under an MPI launcher the
    /// workers are the job's ranks and this flag is not needed.
    #[arg(long, value_name = "W")]
    pub thread_workers: Option<usize>,
    /// Under torchrun, the c10d backend the workers exchange over: auto (NCCL for a CUDA run
    /// where this build has it, Gloo for the CPU), gloo, or nccl (CUDA only: the messages go
    /// GPU to GPU; small host-side values over Gloo). Outside torchrun only auto applies.
    #[arg(long, value_enum, default_value_t = CommChoice::Auto)]
    pub comm: CommChoice,
    #[command(flatten)]
    pub settings: TrainOverrides,
}

pub fn run(args: TrainArgs) -> Result<()> {
    if let Some(workers) = args.thread_workers {
        super::check_thread_workers("--thread-workers", workers)?;
        return run_in_threads(args, workers);
    }
    let (world, transport) = super::world_on(run_device(&args)?, args.comm)?;
    if world.size() == 1 {
        return run_with(args, None, transport);
    }
    // W ranks of an MPI job: an error on any rank ends the whole job (the others would wait
    // for it in their next collective), after saying which rank failed and why.
    let shared = Shared::new(world);
    dpcomp::comm::end_job_on_panic(&shared);
    if let Err(e) = run_with(args, Some(shared.clone()), transport) {
        dpcomp::comm::end_job(&mut shared.clone(), &format!("{e:#}"));
        // The error is printed; a transport without an abort (c10d) returns here: exit
        // rather than print it a second time.
        std::process::exit(1);
    }
    Ok(())
}

/// The device the run trains on, as its settings resolve it (the flag, else --config's file,
/// else a resumed run's config.toml, else auto), for the choice of its transport.
fn run_device(args: &TrainArgs) -> Result<tch::Device> {
    let file = match &args.config {
        Some(path) => TrainOverrides::from_toml_file(path)?.device,
        None => None,
    };
    let saved = match (&args.out, args.resume) {
        (Some(out), true) => TrainOverrides::from_toml_file(&out.join("config.toml"))
            .ok()
            .and_then(|o| o.device),
        _ => None,
    };
    let choice = args.settings.device.or(file).or(saved).unwrap_or_default();
    Ok(choice.device()?)
}

/// The settings a fresh run starts with: the TOML file's, overridden by the flags.
fn fresh_config(args: &TrainArgs) -> Result<(TrainConfig, PathBuf)> {
    let file = match &args.config {
        Some(path) => TrainOverrides::from_toml_file(path)?,
        None => TrainOverrides::default(),
    };
    let config = tasks::resolve(args.settings.clone().or(file))?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&config.task));
    Ok((config, out))
}

/// `--thread-workers W`: the run trained by W threads, rank 0's summary printed.
fn run_in_threads(args: TrainArgs, workers: usize) -> Result<()> {
    let (start, out) = if args.resume {
        let out = args.out.clone().ok_or_else(|| {
            Error::bad_value("--resume", "needs --out naming the run to continue")
        })?;
        let file = match &args.config {
            Some(path) => TrainOverrides::from_toml_file(path)?,
            None => TrainOverrides::default(),
        };
        (Start::Resume(args.settings.clone().or(file)), out)
    } else {
        let (config, out) = fresh_config(&args)?;
        (Start::Fresh(config), out)
    };
    if !args.quiet {
        eprintln!(
            "{workers} data-parallel workers as threads of this process, run folder {}",
            out.display()
        );
    }
    let observers: Vec<Box<dyn dpcomp::train::observer::Observer + Send>> = if args.quiet {
        Vec::new()
    } else {
        vec![Box::new(dpcomp::train::observer::ProgressBars::default())]
    };
    let summaries = train_in_threads(workers, start, &out, PaperTasks::shared(), observers)
        .with_context(|| format!("training {} with {workers} thread workers", out.display()))?;
    let summary = &summaries[0];
    refuse_diverged(summary, &out)?;
    if let Some(e) = summary.epsilon {
        println!(
            "epsilon {e:.4} at delta {}",
            super::delta_text(summary.delta.unwrap_or(f64::NAN))
        );
    }
    if let Some(e) = summary.aggregate_epsilon {
        println!("aggregate epsilon {e:.4} (the {workers} workers' summed noise; each worker's message alone: the epsilon above)");
    }
    print_accuracy(summary);
    Ok(())
}

/// One process's part of the run: all of it, or rank `comm.rank()`'s of a job over
/// `transport`.
fn run_with(args: TrainArgs, comm: Option<Shared>, transport: &str) -> Result<()> {
    let rank = comm.as_ref().map_or(0, |c| c.rank());
    let boxed = |c: Shared| -> Box<dyn Communicator> { Box::new(c) };
    let mut calibrating = false;
    let mut trainer = if args.resume {
        let out = args.out.clone().ok_or_else(|| {
            Error::bad_value("--resume", "needs --out naming the run to continue")
        })?;
        let file = match &args.config {
            Some(path) => TrainOverrides::from_toml_file(path)?,
            None => TrainOverrides::default(),
        };
        let overrides = args.settings.clone().or(file);
        let builder = tasks::trainer(&out).resume(overrides);
        match comm {
            Some(c) => builder.communicator(boxed(c)),
            None => builder,
        }
        .build()
        .with_context(|| format!("resuming {}", out.display()))?
    } else {
        let (config, out) = fresh_config(&args)?;
        calibrating =
            config.privacy.noise_multiplier.is_none() && config.privacy.target_epsilon.is_some();
        let builder = tasks::trainer(&out).config(config);
        match comm {
            Some(c) => builder.communicator(boxed(c)),
            None => builder,
        }
        .build()?
    };
    // Rank 0 speaks for the job.
    let quiet = args.quiet || rank > 0;
    if !quiet {
        trainer.observe(Box::new(dpcomp::train::observer::ProgressBars::default()));
    }
    dpcomp_lab::analysis::probe::GradientErrorProbe::install(&mut trainer);
    let c = &trainer.config();
    if !quiet {
        if trainer.workers() > 1 {
            eprintln!(
                "{} data-parallel workers over {transport} (this is rank 0)",
                trainer.workers()
            );
        }
        eprintln!(
            "{}: {} train / {} test examples, {} trainable of {} parameters, device {:?}, run folder {}",
            c.task,
            trainer.data().train.len(),
            trainer.data().test.len(),
            trainer.model().trainable_parameter_count(),
            trainer.model().parameter_count(),
            trainer.device(),
            trainer.run_dir().display()
        );
        if let (true, Some(sigma), Some(target)) = (
            calibrating,
            c.privacy.noise_multiplier,
            c.privacy.target_epsilon,
        ) {
            eprintln!(
                "noise multiplier {sigma:.4}: the smallest that keeps {} epochs of {} steps (q {:.6}) within epsilon {target} at delta {} ({:?} accountant)",
                c.epochs,
                trainer.steps_per_epoch(),
                1.0 / trainer.steps_per_epoch() as f64,
                super::delta_text(c.privacy.delta),
                c.privacy.accountant
            );
        }
        if c.task == Task::Snli.name() {
            let dir = data::data_dir(c.data.data_dir.as_deref()).join("snli_1.0");
            eprintln!(
                "snli: training on {} (evaluating on snli_1.0_test.jsonl)",
                data::snli::train_file(&dir).display()
            );
        }
    }
    let summary = trainer.run()?;
    if rank > 0 {
        return Ok(());
    }
    refuse_diverged(&summary, trainer.run_dir())?;
    if let Some(e) = summary.epsilon {
        let caveat = match trainer.config().privacy.sampling {
            dpcomp::config::Sampling::Shuffle => {
                " (shuffled batches: the accountant assumes Poisson sampling, so this ε is an approximation)"
            }
            dpcomp::config::Sampling::Poisson => "",
        };
        println!(
            "epsilon {e:.4} at delta {}, {} noise{caveat}",
            super::delta_text(trainer.config().privacy.delta),
            trainer.noise_label().unwrap_or_default()
        );
    }
    if let Some(e) = summary.aggregate_epsilon {
        println!(
            "aggregate epsilon {e:.4} (the {} workers' summed noise; each worker's message alone: the epsilon above)",
            trainer.workers()
        );
    }
    print_accuracy(&summary);
    Ok(())
}

/// A run that stopped because its loss became non-finite is a failure (exit 1), however it
/// was run (one process, W threads, W MPI ranks).
fn refuse_diverged(
    summary: &dpcomp::train::metrics::Summary,
    run_dir: &std::path::Path,
) -> Result<()> {
    match summary
        .stopped
        .as_deref()
        .filter(|r| r.starts_with(train::DIVERGED))
    {
        Some(reason) => Err(anyhow::anyhow!(
            "{reason}; the run's logs and summary are in {} (a learning rate too high for the model is the usual cause: try a lower --lr)",
            run_dir.display()
        )),
        None => Ok(()),
    }
}

fn print_accuracy(summary: &dpcomp::train::metrics::Summary) {
    println!(
        "{}: final test accuracy {:.2}% (mean of the last {} epochs), last epoch {:.2}%, {:.1}s",
        summary.task,
        100.0 * summary.final_accuracy,
        summary.epochs.min(10),
        100.0 * summary.last_test_accuracy,
        summary.wall_seconds
    );
}
