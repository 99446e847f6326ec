//! The `dpcomp` command line: the subcommands and their dispatch. Each command's flags and its
//! code live in one file of `commands/`.

use crate::commands::{
    analyze, audit, bench, check_comm, check_device, convex, data, epsilon, eval, export, fl, grid,
    pack, plot, train,
};
use anyhow::Result;
use clap::{Parser, Subcommand};

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
    ///
    /// LibTorch uses one intra-op thread per core it sees; where processes share the cores (grid
    /// workers, MPI ranks, a loaded machine) give each its share with OMP_NUM_THREADS=N set before
    /// dpcomp starts. summary.json records the thread count the run used (`threads`).
    Train(Box<train::TrainArgs>),
    /// Train once with canaries and audit the run: the accounted epsilon beside an empirical
    /// lower bound (Steinke, Nasr and Jagielski 2023); writes audit.json in the run folder.
    Audit(Box<audit::AuditArgs>),
    /// Report the test accuracy of a run's checkpoint.
    Eval(eval::EvalArgs),
    /// Write a finished run's fine-tuned model as a Hugging Face folder (LoRA adapters merged,
    /// tokenizer files included) or, with --adapter, its LoRA adapter as a PEFT folder.
    ///
    /// The model is rebuilt from the run's config.toml (the BERT folder it names and its
    /// fine-tuning) with the weights of its checkpoint. Only runs of a Hugging Face model (task
    /// snli) can be exported.
    Export(export::ExportArgs),
    /// Datasets: download the official archives.
    Data {
        #[command(subcommand)]
        command: data::DataCommand,
    },
    /// Run every cell of an experiment file (skipping finished cells, resuming interrupted
    /// ones), pack the logs of the finished ones (see `dpcomp pack`) and write its results table.
    Grid(grid::GridArgs),
    /// Pack the logs of every finished run below the folders: metrics.jsonl and grad_error.jsonl
    /// become metrics.jsonl.gz and grad_error.jsonl.gz, which every command reads as before.
    ///
    /// A finished run holds summary.json; runs still training (their folder locked) or
    /// interrupted are left as they are, and a resumed run unpacks its logs before it appends.
    /// `dpcomp grid` packs each cell it finishes on its own.
    Pack(pack::PackArgs),
    /// The paper's figures (PNG and SVG) from the runs of one grid: runs/<experiment>/<profile>.
    Plot(plot::PlotArgs),
    /// Privacy budget of DP-SGD: epsilon for (q, sigma, steps, delta), or the sigma for a target
    /// epsilon.
    Epsilon(epsilon::EpsilonArgs),
    /// DP-SGD for convex losses (hinge, q-norm hinge, logistic) on tabular data: output
    /// perturbation (Theorem 7), gradient perturbation (Theorem 11 or the RDP accountant), or
    /// non-private SGD.
    Convex(convex::ConvexArgs),
    /// Federated learning (FL-STD, FL-RND, FL-FREQ, FL-CS), with or without client-level DP;
    /// writes config.toml, metrics.jsonl (one row a round) and summary.json.
    Fl(Box<fl::FlArgs>),
    /// The paper's analyses: gradient error of finished runs, clipping-radius sweeps.
    Analyze {
        #[command(subcommand)]
        command: analyze::AnalyzeCommand,
    },
    /// Benchmarks: speed and memory against their PyTorch and Opacus peers (results in docs/results/benchmarks.md).
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Correctness on one device (the GPU kit's first step): per-sample gradients of the four
    /// models against per-example autograd, and every compressor against its CPU result. Exits
    /// non-zero when a check fails.
    CheckDevice(dpcomp_lab::bench::device_check::CheckDeviceArgs),
    /// The workers' collectives (all-reduce, all-gather of different lengths, broadcast,
    /// barrier), each result checked on every rank, timed, with the bytes it moved:
    /// `mpiexec -n W dpcomp check-comm` (or `--threads W`). Exits non-zero when a check fails.
    CheckComm(check_comm::CheckCommArgs),
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train::run(*args),
        Command::Audit(args) => audit::run(*args),
        Command::Eval(args) => eval::run(args),
        Command::Export(args) => export::run(args),
        Command::Data { command } => data::run(command),
        Command::Grid(args) => grid::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Epsilon(args) => epsilon::run(args),
        Command::Convex(args) => convex::run(args),
        Command::Fl(args) => fl::run(*args),
        Command::Analyze { command } => analyze::run(command),
        Command::Bench { command } => bench::run(command),
        Command::CheckDevice(args) => check_device::run(args),
        Command::CheckComm(args) => check_comm::run(args),
    }
}
