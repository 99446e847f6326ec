//! Communication between the W workers of a data-parallel run: the collectives that
//! gradient compression needs, behind one small trait, so that training code is the same on one
//! process, on W threads of one process (the tests' reference), and on W processes under MPI or
//! c10d (torchrun).
//!
//! - `all_reduce_sum`: dense vectors (the identity compressor, PowerSGD's factors, the
//!   federated DCT sketches, which are linear);
//! - `all_gather`: byte buffers of different lengths, in rank order, with no padding (MPI's
//!   `MPI_Allgatherv`): the sparse messages of DGC, Denoise and top-k, each as its exact bytes;
//! - `broadcast`, `barrier`;
//! - `all_reduce_tensor`, `all_gather_tensor`: the same on tensors where they live, for a
//!   transport that moves device memory (c10d's process groups, `moves_tensors`), so that a
//!   step's messages never pass through the host; the others go through host memory.
//!
//! Every implementation counts the bytes it handed to and received from its transport
//! (`Traffic`), so the bandwidth a run reports is what crossed, measured from the buffers.
//! Every collective has a deadline: a rank that died or diverged ends the job with an error
//! naming the collective on every rank, never a hang.

pub mod check;
#[cfg(feature = "gloo")]
pub mod gloo;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(dpcomp_nccl)]
pub mod nccl;
pub mod select;
pub mod staging;
pub mod threads;
pub mod weights;

use crate::error::{Error, Result};
use crate::host;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

pub use select::{world_on, CommChoice};
pub use threads::ThreadGroup;

/// Bytes a rank handed to its transport and got back from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes this rank handed to its transport.
    pub sent: u64,
    /// Bytes this rank received from its transport.
    pub received: u64,
}

impl Traffic {
    /// What crossed between `size` ranks: this count, or none with one rank.
    pub fn between(self, size: usize) -> Traffic {
        if size > 1 {
            self
        } else {
            Traffic::default()
        }
    }
}

impl std::ops::AddAssign for Traffic {
    fn add_assign(&mut self, other: Traffic) {
        self.sent += other.sent;
        self.received += other.received;
    }
}

/// How long a collective waits for the other ranks before it gives up (and, under MPI, aborts
/// the job): `DPCOMP_COLLECTIVE_TIMEOUT` seconds, 600 by default (a first step on a large model
/// may take minutes on a slow rank).
pub fn collective_timeout() -> Duration {
    let seconds = std::env::var("DPCOMP_COLLECTIVE_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(600.0);
    Duration::from_secs_f64(seconds)
}

/// The collectives of one rank. Every rank must call the same collectives in the same order
/// with matching arguments (the lengths of `all_reduce_sum`'s vectors, the root of
/// `broadcast`).
///
/// Three workers as three threads (`ThreadGroup`; under MPI the same calls cross processes):
/// each adds its rank + 1 into a sum, gathers a message as long as its rank, and receives rank
/// 2's bytes.
///
/// ```
/// use dpcomp::comm::{Communicator, ThreadGroup};
/// let results = ThreadGroup::run(3, |mut comm| -> dpcomp::Result<_> {
///     let rank = comm.rank();
///     let mut values = vec![rank as f32 + 1.0; 2];
///     comm.all_reduce_sum(&mut values)?;
///     let gathered = comm.all_gather(&vec![rank as u8; rank])?;
///     let mut bytes = if rank == 2 { b"from 2".to_vec() } else { Vec::new() };
///     comm.broadcast(2, &mut bytes)?;
///     Ok((values, gathered, bytes, comm.take_traffic()))
/// })?;
/// for result in results {
///     let (values, gathered, bytes, traffic) = result?;
///     assert_eq!(values, [6.0f32, 6.0]); // 1 + 2 + 3
///     assert_eq!(gathered, vec![vec![], vec![1u8], vec![2, 2]]);
///     assert_eq!(bytes, b"from 2");
///     assert!(traffic.sent > 0 && traffic.received > 0);
/// }
/// # Ok::<(), dpcomp::Error>(())
/// ```
pub trait Communicator: Send {
    /// This worker's rank, 0..size.
    fn rank(&self) -> usize;
    /// W, the number of workers.
    fn size(&self) -> usize;
    /// Element-wise sum over the ranks, in place (every rank gets the sum).
    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<()>;
    /// Every rank's bytes, in rank order; lengths may differ between ranks.
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// `bytes` of rank `root`, on every rank (the others' `bytes` are replaced).
    fn broadcast(&mut self, root: usize, bytes: &mut Vec<u8>) -> Result<()>;
    /// Waits until every rank is here.
    fn barrier(&mut self) -> Result<()>;
    /// Bytes handed to and received from the transport since the last call (none with one
    /// rank: nothing crosses); resets the count.
    fn take_traffic(&mut self) -> Traffic;
    /// Ends the whole job after an error on this rank, so that the others do not wait for it
    /// (under MPI, `MPI_Abort`); a no-op where the other ranks learn of it otherwise.
    fn abort(&mut self, _code: i32) {}

    /// Whether this transport takes tensors where they live (`all_reduce_tensor`,
    /// `all_gather_tensor`): c10d's process groups do, on the CPU and on CUDA, so a
    /// data-parallel step's messages never pass through host memory (`train::exchange`). MPI and
    /// the thread transport move host memory; for them the exchange stages messages on the host
    /// (`staging`) and the two methods below fall back to a copy through it.
    fn moves_tensors(&self) -> bool {
        false
    }

    /// Sums `flat` (a contiguous one-dimensional f32 tensor) over the ranks, in place, where it
    /// lives. The default copies it to host memory, sums it there (`all_reduce_sum`) and back:
    /// one counted transfer (`host::one_transfer`).
    fn all_reduce_tensor(&mut self, flat: &mut Tensor) -> Result<()> {
        let mut values = flat
            .to_device(Device::Cpu)
            .to_kind(Kind::Float)
            .contiguous();
        host::one_transfer(|| host::with_f32_mut(&mut values, |v| self.all_reduce_sum(v)))?;
        flat.copy_(&values);
        Ok(())
    }

    /// Every rank's `bytes` (a one-dimensional uint8 tensor of the same length on every rank),
    /// in rank order, on `bytes`' device. The default goes through host memory (`all_gather`):
    /// one counted transfer.
    fn all_gather_tensor(&mut self, bytes: &Tensor) -> Result<Vec<Tensor>> {
        let device = bytes.device();
        let mine = host::one_transfer(|| host::to_bytes(&bytes.to_device(Device::Cpu)));
        let all = self.all_gather(&mine)?;
        Ok(all
            .iter()
            .map(|b| host::upload(&Tensor::from_slice(b), device))
            .collect())
    }

    /// An error naming this rank.
    fn error(&self, what: String) -> Error {
        Error::Comm {
            rank: self.rank(),
            size: self.size(),
            what,
        }
    }

    /// Rank `root`'s `f32` values on every rank.
    fn broadcast_f32(&mut self, root: usize, values: &mut [f32]) -> Result<()> {
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.broadcast(root, &mut bytes)?;
        if bytes.len() != 4 * values.len() {
            return Err(self.error(format!(
                "broadcast of {} values from rank {root} brought {} bytes",
                values.len(),
                bytes.len()
            )));
        }
        for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    /// Checks that every rank holds the same `bytes` (a configuration, a dataset's fingerprint,
    /// initial weights): an error on every rank naming `what` and the ranks that differ from
    /// rank 0 otherwise.
    fn check_same(&mut self, what: &str, bytes: &[u8]) -> Result<()> {
        let all = self.all_gather(bytes)?;
        let differ: Vec<usize> = (1..all.len()).filter(|&r| all[r] != all[0]).collect();
        if differ.is_empty() {
            Ok(())
        } else {
            Err(self.error(format!(
                "{what} differs between ranks: rank 0 and rank(s) {differ:?} (every rank must run the same configuration on the same data)"
            )))
        }
    }
}

/// What a program does when its rank fails: writes `error: rank r of W: message` to stderr in
/// one write, waits half a second for the launcher to forward it (an abort, this rank's or
/// another failing rank's, ends the job and loses output still in flight), then ends the whole
/// job (`Communicator::abort`), so that no other rank waits for this one.
pub fn end_job(comm: &mut dyn Communicator, message: &str) {
    let rank = format!("rank {} of {}: ", comm.rank(), comm.size());
    // A communicator's own error already names the rank (`Error::Comm`).
    let message = message.strip_prefix(&rank).unwrap_or(message);
    let line = format!("error: {rank}{message}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    std::thread::sleep(Duration::from_millis(500));
    comm.abort(1);
}

/// Makes a panic on this rank end the whole job at once, as an error does (`end_job`): without
/// it a panicking rank unwinds into `MPI_Finalize` while the other ranks wait in their next
/// collective, and the job hangs. The hook prints the panic as the previous hook did, then says
/// which rank panicked and aborts the job (`Communicator::abort`); when the panic happened while
/// this rank held `comm` (inside a collective) it aborts the process, which the MPI launcher
/// turns into the end of the job. A program of one's own under MPI calls it once, after
/// `world()`; the `dpcomp` binary does.
///
/// The hook holds the communicator weakly: when the program drops its last handle the
/// communicator ends (`MPI_Finalize`) as it would without the hook; a strong handle kept by the
/// hook would skip that, and the launcher kills a job whose ranks exit unfinalised.
pub fn end_job_on_panic(comm: &Shared) {
    let weak = std::sync::Arc::downgrade(&comm.0);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if let Some(strong) = weak.upgrade() {
            Shared(strong).abort_after_panic(&info.to_string());
        }
    }));
}

/// The job this process belongs to: a c10d process group on Gloo when torchrun's variables are
/// set (and the `gloo` feature is built), the MPI job when an MPI launcher started it (and the
/// `mpi` feature is built), or one process; with the transport's name ("c10d on Gloo", "MPI",
/// "one process").
///
/// A build without the `mpi` feature started by a launcher with several processes is an error
/// naming the feature: each rank would otherwise train alone, W copies of a one-worker run.
pub fn world() -> Result<(Box<dyn Communicator>, &'static str)> {
    #[cfg(feature = "gloo")]
    if gloo::Rendezvous::launched(|name| std::env::var(name).ok()) {
        return Ok((Box::new(gloo::GlooComm::from_env()?), "c10d on Gloo"));
    }
    #[cfg(feature = "mpi")]
    if mpi::launched_by_mpi() {
        let comm = mpi::MpiComm::init().ok_or_else(|| Error::Comm {
            rank: 0,
            size: 0,
            what: "MPI was already initialised in this process".to_string(),
        })?;
        return Ok((Box::new(comm), "MPI"));
    }
    #[cfg(not(feature = "mpi"))]
    refuse_a_launch_of_several(|name| std::env::var(name).ok())?;
    Ok((Box::new(SingleProcess), "one process"))
}

/// Without the `mpi` feature: an error when the launcher variables (`PMI_SIZE`, MPICH and
/// Slurm; `OMPI_COMM_WORLD_SIZE`, Open MPI) say this process is one of several. `var` reads one
/// environment variable (a parameter so that a test can hand it a launcher's environment).
#[cfg_attr(feature = "mpi", allow(dead_code))]
pub(crate) fn refuse_a_launch_of_several(var: impl Fn(&str) -> Option<String>) -> Result<()> {
    let (size, rank) = launcher_size_and_rank(var);
    match size {
        Some(size) if size > 1 => Err(Error::Comm {
            rank: rank.unwrap_or(0),
            size,
            what: format!(
                "an MPI launcher started {size} processes, but dpcomp was built without its \
                 `mpi` feature, so each would train alone; build with `features = [\"mpi\"]` \
                 (the default features include it)"
            ),
        }),
        _ => Ok(()),
    }
}

/// (size, rank) of the job an MPI launcher started this process in, from its variables
/// (`PMI_SIZE` / `PMI_RANK`, MPICH and Slurm; `OMPI_COMM_WORLD_SIZE` / `OMPI_COMM_WORLD_RANK`,
/// Open MPI), read by `var`; `None` where they are absent.
fn launcher_size_and_rank(var: impl Fn(&str) -> Option<String>) -> (Option<usize>, Option<usize>) {
    let read = |name: &str| var(name).and_then(|v| v.trim().parse::<usize>().ok());
    let size = read("PMI_SIZE").or_else(|| read("OMPI_COMM_WORLD_SIZE"));
    let rank = read("PMI_RANK").or_else(|| read("OMPI_COMM_WORLD_RANK"));
    (size, rank)
}

/// How many processes an MPI launcher (`mpiexec`, `srun`) started this one among, from its
/// environment as `world` reads it without the `mpi` feature; `None` outside a launcher. For a
/// command that runs its workers as threads of one process and must not run once per rank.
pub fn launched_processes() -> Option<usize> {
    launcher_size_and_rank(|name| std::env::var(name).ok()).0
}

/// The most workers run as threads of one process (`ThreadGroup`: `dpcomp train
/// --thread-workers`, `dpcomp check-comm --threads`). Each is an OS thread with a replica of
/// the model and LibTorch's pool of its own, one computing at a time: W threads take about W
/// times one worker's memory and time, and near a thousand the process runs out of threads
/// (libgomp cannot create them). A job of more workers runs as MPI ranks under `mpiexec`.
pub const MAX_THREAD_WORKERS: usize = 256;

/// One worker, no transport: every collective returns its input; nothing crosses.
#[derive(Debug, Default)]
pub struct SingleProcess;

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&mut self, _values: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![bytes.to_vec()])
    }
    fn broadcast(&mut self, root: usize, _bytes: &mut Vec<u8>) -> Result<()> {
        if root != 0 {
            return Err(self.error(format!("broadcast from rank {root}, but there is one rank")));
        }
        Ok(())
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
    fn take_traffic(&mut self) -> Traffic {
        Traffic::default()
    }
}

/// One communicator with several owners: a trainer holds one handle while the program keeps
/// another, so that after an error anywhere the program can still end the whole job
/// (`abort`), which a communicator dropped with a failed trainer could not.
#[derive(Clone)]
pub struct Shared(std::sync::Arc<std::sync::Mutex<Box<dyn Communicator>>>);

impl Shared {
    /// Shares `comm`: clones of the result are handles to the same communicator.
    pub fn new(comm: Box<dyn Communicator>) -> Self {
        Shared(std::sync::Arc::new(std::sync::Mutex::new(comm)))
    }

    fn with<T>(&self, f: impl FnOnce(&mut dyn Communicator) -> T) -> T {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(guard.as_mut())
    }

    /// `end_job` from a panic hook: never waits for the lock (the panicking thread may hold it),
    /// and aborts the process when it cannot take it.
    fn abort_after_panic(&self, panic: &str) {
        let mut guard = match self.0.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => std::process::abort(),
        };
        if guard.size() > 1 {
            end_job(guard.as_mut(), &format!("panicked: {panic}"));
        }
    }
}

impl Communicator for Shared {
    fn rank(&self) -> usize {
        self.with(|c| c.rank())
    }
    fn size(&self) -> usize {
        self.with(|c| c.size())
    }
    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<()> {
        self.with(|c| c.all_reduce_sum(values))
    }
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.with(|c| c.all_gather(bytes))
    }
    fn broadcast(&mut self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.with(|c| c.broadcast(root, bytes))
    }
    fn barrier(&mut self) -> Result<()> {
        self.with(|c| c.barrier())
    }
    fn take_traffic(&mut self) -> Traffic {
        self.with(|c| c.take_traffic())
    }
    fn abort(&mut self, code: i32) {
        self.with(|c| c.abort(code))
    }
    fn moves_tensors(&self) -> bool {
        self.with(|c| c.moves_tensors())
    }
    fn all_reduce_tensor(&mut self, flat: &mut Tensor) -> Result<()> {
        self.with(|c| c.all_reduce_tensor(flat))
    }
    fn all_gather_tensor(&mut self, bytes: &Tensor) -> Result<Vec<Tensor>> {
        self.with(|c| c.all_gather_tensor(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::refuse_a_launch_of_several;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_launch_of_several_processes_without_mpi_is_refused_by_the_features_name() {
        for launcher in [
            [("PMI_SIZE", "4"), ("PMI_RANK", "2")],
            [("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "2")],
        ] {
            let e = refuse_a_launch_of_several(env(&launcher))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("4 processes") && e.contains("`mpi` feature"),
                "{e}"
            );
            assert!(e.contains("rank 2"), "{e}");
        }
        // One process, or no launcher: a single-process run, as without MPI.
        assert!(refuse_a_launch_of_several(env(&[("PMI_SIZE", "1")])).is_ok());
        assert!(refuse_a_launch_of_several(env(&[])).is_ok());
    }
}
