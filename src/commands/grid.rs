//! `dpcomp grid`: every cell of an experiment file (training, convex or federated), resumable;
//! the logs of the cells that have finished are packed (`dpcomp::run_log`).

use anyhow::{Context, Result};
use dpcomp_lab::cell_observer::{CellEvent, CellObserver};
use dpcomp_lab::experiment::ExperimentFile;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct GridArgs {
    /// The experiment file (experiments/*.toml).
    pub experiment: PathBuf,
    /// Which of the file's profiles: cpu (fits a 2-core CPU) or full (the paper's settings).
    #[arg(long, default_value = "cpu")]
    pub profile: String,
    /// Run only the cells whose axis has this value (repeatable, all must match), e.g. --only
    /// rate=16; federated grids: dataset, scheme, ratio, dp, server_momentum, seed, noise_scale.
    #[arg(long, value_name = "AXIS=VALUE")]
    pub only: Vec<String>,
    /// Folder under which runs/<experiment>/<profile>/<cell>/ are written.
    #[arg(long, default_value = "runs")]
    pub runs: PathBuf,
    /// Also copy the results table to this folder as <experiment>.<profile>.{csv,md}, and a
    /// federated or convex grid's figures as PNG to <experiment>/ (<experiment>-<profile>/ for
    /// a profile other than cpu).
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
    /// List the cells, their state and estimated upload without running anything (one line a
    /// cell; a reader that stops early, such as `| head`, ends the list quietly).
    #[arg(long)]
    pub list: bool,
    /// Write the results table of the finished cells (and copy it to --results-dir) without
    /// training anything: for grids whose cells other processes are running.
    #[arg(long)]
    pub tables_only: bool,
}

pub fn run(args: GridArgs) -> Result<()> {
    let experiment = ExperimentFile::open(&args.experiment)?;
    let only = dpcomp_lab::grid::parse_only(&args.only)?;
    if args.list {
        // Buffered (a million cells are a million lines), and a reader that stops early
        // (`| head`) ends the listing rather than a panic on the broken pipe.
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let written = experiment
            .list(&args.profile, &only, &args.runs)?
            .iter()
            .try_for_each(|cell| writeln!(out, "{}  {}  {}", cell.name, cell.state, cell.details))
            .and_then(|()| out.flush());
        return match written {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other.context("writing the list of cells"),
        };
    }
    let outcome = if args.tables_only {
        experiment.write_tables(&args.profile, &args.runs)?
    } else {
        let mut lines = CellLines::new();
        let outcome = experiment.run(&args.profile, &only, &args.runs, None, &mut lines)?;
        // Training cells are packed as each finishes; federated and audit cells here.
        let packed = dpcomp::run_log::pack_below(&outcome.folder)?;
        for (dir, owner) in &packed.in_use {
            log::info!("{}: in use ({owner}), its logs not packed", dir.display());
        }
        outcome
    };
    if let Some(dir) = &args.results_dir {
        experiment
            .copy_results(&args.profile, &args.runs, dir)
            .with_context(|| format!("copying the results to {}", dir.display()))?;
    }
    println!(
        "{}: {} finished cells; table in {}",
        experiment.name(),
        outcome.finished,
        outcome.folder.join("results.md").display()
    );
    Ok(())
}

/// The command line's view of a grid: a line per cell on stderr (its place, name, what happens
/// to it and the time so far) and progress bars for its training or rounds.
struct CellLines {
    started: std::time::Instant,
}

impl CellLines {
    fn new() -> Self {
        CellLines {
            started: std::time::Instant::now(),
        }
    }
}

impl CellObserver for CellLines {
    fn cell(
        &mut self,
        experiment: &str,
        index: usize,
        cells: usize,
        name: &str,
        event: CellEvent<'_>,
    ) {
        let what = match event {
            CellEvent::Skipped => return,
            CellEvent::Starting => "starting".to_string(),
            CellEvent::Resuming { epochs_done } => format!("resuming after epoch {epochs_done}"),
            CellEvent::InUse { owner } => {
                log::warn!("{name}: in use by another process ({owner}), skipped");
                return;
            }
            CellEvent::Finished {
                result: Some(result),
            } => result.to_string(),
            CellEvent::Finished { result: None } => return,
        };
        log::info!(
            "[{}/{cells}] {experiment} {name}: {what}  ({:.0} s so far)",
            index + 1,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn trainer_observers(&mut self) -> Vec<Box<dyn dpcomp::train::observer::Observer>> {
        vec![Box::new(dpcomp::train::observer::ProgressBars::default())]
    }

    fn round_observers(&mut self) -> Vec<Box<dyn dpcomp::fl::observer::RoundObserver>> {
        match dpcomp::fl::observer::ProgressBars::new() {
            Ok(bars) => vec![Box::new(bars)],
            Err(_) => Vec::new(),
        }
    }
}
