//! One file per `dpcomp` subcommand: its clap arguments and the code that runs it.

pub mod analyze;
pub mod audit;
pub mod bench;
pub mod check_comm;
pub mod check_device;
pub mod convex;
pub mod data;
pub mod epsilon;
pub mod eval;
pub mod export;
pub mod fl;
pub mod grid;
pub mod pack;
pub mod plot;
pub mod train;

use dpcomp::comm::Communicator;

/// `--task` of the commands over `TrainOverrides`: one of the lab's four tasks, each listed with
/// its description in `--help` (`#[command(mut_arg("task", task_arg))]`).
pub fn task_arg(arg: clap::Arg) -> clap::Arg {
    use clap::ValueEnum;
    let values: Vec<clap::builder::PossibleValue> = dpcomp_lab::Task::ALL
        .iter()
        .filter_map(|t| t.to_possible_value())
        .collect();
    arg.value_parser(clap::builder::PossibleValuesParser::new(values))
}

/// The job this process belongs to for a run on `device`: under torchrun the c10d backend
/// `--comm` names (auto: NCCL for CUDA where built, Gloo for the CPU), else the MPI job or one
/// process (`dpcomp::comm::world_on`).
pub fn world_on(
    device: tch::Device,
    comm: dpcomp::comm::CommChoice,
) -> anyhow::Result<(Box<dyn Communicator>, &'static str)> {
    Ok(dpcomp::comm::world_on(device, comm)?)
}

/// `flag`'s W workers as threads of this process: 1 to `comm::MAX_THREAD_WORKERS`.
pub fn check_thread_workers(flag: &str, workers: usize) -> anyhow::Result<()> {
    let max = dpcomp::comm::MAX_THREAD_WORKERS;
    if !(1..=max).contains(&workers) {
        anyhow::bail!(
            "{flag} {workers}: expected 1 to {max} workers as threads of one process (each \
             holds its own replica and thread pool); run more as MPI ranks under mpiexec"
        );
    }
    // A launcher's processes would each run threads of their own: N x W workers in N runs.
    let torchrun = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.trim().parse::<usize>().ok());
    let launched = [
        (
            dpcomp::comm::launched_processes(),
            "an MPI launcher",
            "mpiexec -n W",
        ),
        (
            torchrun,
            "torchrun (WORLD_SIZE)",
            "torchrun --nproc-per-node W",
        ),
    ];
    for (processes, launcher, launch) in launched {
        if let Some(n) = processes.filter(|&n| n > 1) {
            anyhow::bail!(
                "{flag} {workers}: {launcher} started {n} processes, which would each run \
                 {workers} workers of their own; run {flag} W as one process, or `{launch} \
                 dpcomp ...` without {flag}"
            );
        }
    }
    Ok(())
}

/// δ as a command prints it: the shortest decimal that reads back as the same number, in
/// scientific notation below 1e-6 (1e-300 rather than three hundred digits).
pub fn delta_text(delta: f64) -> String {
    if delta != 0.0 && delta.abs() < 1e-6 {
        format!("{delta:e}")
    } else {
        format!("{delta}")
    }
}
