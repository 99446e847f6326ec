//! `dpcomp grid`: every cell of an experiment file (training, convex or federated), resumable.

use anyhow::{Context, Result};
use dpcomp::data;
use dpcomp::error::Error;
use std::path::PathBuf;

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

pub fn run(args: GridArgs) -> Result<()> {
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
