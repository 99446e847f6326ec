//! The MPI transport (rsmpi on MPICH; the `mpi` cargo feature): every collective is MPI's own —
//! `MPI_Iallreduce` for dense sums, `MPI_Iallgather` of the lengths then `MPI_Iallgatherv` of
//! the exact bytes, `MPI_Ibcast`, `MPI_Ibarrier` — started non-blocking and polled against the
//! deadline (`collective_timeout`): a collective that does not complete in time prints which
//! one and aborts the whole job (`MPI_Abort`), so a dead or diverged rank never leaves the others
//! hanging.

use super::{collective_timeout, Communicator as Collectives, Traffic};
use crate::error::Result;
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::request::{scope, Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;
use std::time::{Duration, Instant};

/// Whether this process was started by an MPI launcher (`mpiexec`/`mpirun` of MPICH or Open
/// MPI, or Slurm's PMI), from the variables the launchers set.
pub fn launched_by_mpi() -> bool {
    ["PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// This process's rank of `MPI_COMM_WORLD`. Holds MPI for the life of the process: MPI is
/// finalised when it is dropped, and cannot be initialised twice.
pub struct MpiComm {
    // Declared before `universe`, so the communicator goes first.
    world: SimpleCommunicator,
    _universe: mpi::environment::Universe,
    timeout: Duration,
    traffic: Traffic,
}

impl MpiComm {
    /// Initialises MPI; `None` if it was already initialised in this process.
    pub fn init() -> Option<MpiComm> {
        let universe = mpi::initialize()?;
        let world = universe.world();
        Some(MpiComm {
            world,
            _universe: universe,
            timeout: collective_timeout(),
            traffic: Traffic::default(),
        })
    }

    /// Polls `request` until it completes; past the deadline, prints what timed out and aborts
    /// the job (an incomplete MPI request cannot be abandoned).
    fn finish<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        what: &str,
        mut request: Request<'a, D, S>,
        started: Instant,
    ) {
        let mut spins = 0u32;
        loop {
            match request.test() {
                Ok(_) => return,
                Err(pending) => request = pending,
            }
            if started.elapsed() > self.timeout {
                eprintln!(
                    "error: rank {} of {}: {what} did not complete within {:.0} s (a rank died, hangs, or runs other collectives): aborting the job",
                    self.world.rank(),
                    self.world.size(),
                    self.timeout.as_secs_f64()
                );
                self.world.abort(70);
            }
            spins += 1;
            if spins > 1000 {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Collectives for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<()> {
        let send = values.to_vec();
        let started = Instant::now();
        scope(|s| {
            let request = self.world.immediate_all_reduce_into(
                s,
                &send[..],
                &mut values[..],
                SystemOperation::sum(),
            );
            self.finish("all_reduce_sum", request, started);
        });
        let bytes = 4 * values.len() as u64;
        self.traffic += Traffic {
            sent: bytes,
            received: bytes,
        };
        Ok(())
    }

    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let size = self.size();
        let started = Instant::now();
        let mine = Count::try_from(bytes.len()).map_err(|_| {
            self.error(format!(
                "all_gather of {} bytes: more than MPI counts",
                bytes.len()
            ))
        })?;
        let mut counts = vec![0 as Count; size];
        scope(|s| {
            let request = self
                .world
                .immediate_all_gather_into(s, &mine, &mut counts[..]);
            self.finish("all_gather (lengths)", request, started);
        });
        let displacements: Vec<Count> = counts
            .iter()
            .scan(0 as Count, |at, &c| {
                let here = *at;
                *at += c;
                Some(here)
            })
            .collect();
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let mut gathered = vec![0u8; total];
        {
            let mut partition =
                PartitionMut::new(&mut gathered[..], &counts[..], &displacements[..]);
            scope(|s| {
                let request =
                    self.world
                        .immediate_all_gather_varcount_into(s, bytes, &mut partition);
                self.finish("all_gather", request, started);
            });
        }
        self.traffic += Traffic {
            sent: bytes.len() as u64,
            received: (total - bytes.len()) as u64,
        };
        Ok(counts
            .iter()
            .zip(&displacements)
            .map(|(&c, &d)| gathered[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn broadcast(&mut self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        if root >= self.size() {
            return Err(self.error(format!("broadcast from rank {root} of {}", self.size())));
        }
        let started = Instant::now();
        let process = self.world.process_at_rank(root as i32);
        let mut length = bytes.len() as u64;
        scope(|s| {
            let request = process.immediate_broadcast_into(s, &mut length);
            self.finish("broadcast (length)", request, started);
        });
        if self.rank() != root {
            *bytes = vec![0u8; length as usize];
        }
        scope(|s| {
            let request = process.immediate_broadcast_into(s, &mut bytes[..]);
            self.finish("broadcast", request, started);
        });
        if self.rank() == root {
            self.traffic.sent += length;
        } else {
            self.traffic.received += length;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let started = Instant::now();
        let request = self.world.immediate_barrier();
        self.finish("barrier", request, started);
        Ok(())
    }

    fn take_traffic(&mut self) -> Traffic {
        let size = self.size();
        std::mem::take(&mut self.traffic).between(size)
    }

    fn abort(&mut self, code: i32) {
        self.world.abort(code)
    }
}
