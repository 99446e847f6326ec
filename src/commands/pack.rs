//! `dpcomp pack`: packs the logs of finished runs (`dpcomp::run_log`), as `dpcomp grid` does for
//! each cell it finishes.

use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// Folders searched for finished runs: a run folder, a grid's runs/<experiment>/<profile>,
    /// or a whole runs folder.
    #[arg(required = true, value_name = "FOLDER")]
    pub folders: Vec<PathBuf>,
}

pub fn run(args: PackArgs) -> Result<()> {
    for folder in &args.folders {
        let report = dpcomp::run_log::pack_below(folder)?;
        for (dir, owner) in &report.in_use {
            log::warn!("{}: in use ({owner}), not packed", dir.display());
        }
        println!(
            "{}: {} finished runs, {} logs packed now",
            folder.display(),
            report.finished,
            report.packed
        );
    }
    Ok(())
}
