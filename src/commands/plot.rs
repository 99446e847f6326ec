//! `dpcomp plot`: the figures of one grid's run folder (training, convex, federated or a
//! clipping sweep, told apart by the files it holds).

use anyhow::Result;
use std::path::PathBuf;

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
    /// Another training grid's run folder whose cells are drawn beside these (repeatable): an
    /// ablation next to the grid it varies.
    #[arg(long, value_name = "RUNS")]
    pub beside: Vec<PathBuf>,
}

pub fn run(args: PlotArgs) -> Result<()> {
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
    let clipping = args.runs.join(dpcomp_lab::analysis::clipping::FILE);
    let convex = args.runs.join("results.csv");
    let is_convex = std::fs::read_to_string(&convex)
        .is_ok_and(|t| t.starts_with("data,loss,algorithm,epsilon"));
    let is_fl =
        std::fs::read_to_string(&convex).is_ok_and(|t| t.starts_with("dataset,scheme,ratio,dp"));
    if !args.beside.is_empty() && (is_fl || is_convex || clipping.is_file()) {
        anyhow::bail!(
            "--beside: {} is not a training grid's run folder; --beside draws training grids together",
            args.runs.display()
        );
    }
    let written = if is_fl {
        let cells = dpcomp_lab::fl_experiment::read_cells(&args.runs)?;
        dpcomp_lab::plot::fl::figures(&cells, &out)?
    } else if is_convex {
        let rows = dpcomp_lab::convex::experiment::read_rows(&convex)?;
        dpcomp_lab::plot::convex::figures_of(&rows, &out)?
    } else if clipping.is_file() {
        let sweeps = dpcomp_lab::analysis::clipping::read(&args.runs)?;
        dpcomp_lab::plot::analysis::clipping_figures(&sweeps, &out)?
    } else {
        dpcomp_lab::plot::plot_beside(&args.runs, &args.beside, &out, &title)?
    };
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
