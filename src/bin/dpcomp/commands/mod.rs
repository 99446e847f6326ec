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
pub mod fl;
pub mod grid;
pub mod plot;
pub mod train;

use dpcomp::comm::Communicator;

/// The MPI job this process belongs to, or one process (`dpcomp::comm::world`).
pub fn world() -> anyhow::Result<(Box<dyn Communicator>, &'static str)> {
    Ok(dpcomp::comm::world()?)
}
