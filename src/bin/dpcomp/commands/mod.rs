//! One file per `dpcomp` subcommand: its clap arguments and the code that runs it.

pub mod analyze;
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

use dpcomp::comm::{Communicator, SingleProcess};

/// The MPI job this process belongs to (when an MPI launcher started it and the `mpi` feature is
/// built), or one process; with the transport's name.
pub fn world() -> anyhow::Result<(Box<dyn Communicator>, &'static str)> {
    #[cfg(feature = "mpi")]
    if dpcomp::comm::mpi::launched_by_mpi() {
        let comm = dpcomp::comm::mpi::MpiComm::init()
            .ok_or_else(|| anyhow::anyhow!("MPI was already initialised in this process"))?;
        return Ok((Box::new(comm), "MPI"));
    }
    Ok((Box::new(SingleProcess), "one process"))
}
