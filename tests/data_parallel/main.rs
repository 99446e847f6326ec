//! W data-parallel workers over threads, MPI and c10d on Gloo and NCCL.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod distributed;
#[cfg(feature = "gloo")]
mod gloo;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
