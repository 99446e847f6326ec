//! W workers as W threads of one process, exchanging through shared memory: the reference that
//! the MPI transport is tested against (same code above the trait, another transport below),
//! and a way to run W workers without MPI. Collectives are deterministic: sums are taken in
//! rank order.
//!
//! Workers started by `ThreadGroup::run` compute one at a time and each with its own stream of
//! LibTorch's CPU generator: a worker holds the compute token between collectives and gives it
//! up, with its generator state saved, while it waits in one (`rng_state`). So each thread draws
//! what it would draw as its own process, and the results do not depend on the scheduling.

use super::{collective_timeout, Communicator, Traffic};
use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the ranks put in for one collective, and what the last completed one gave.
struct Round {
    /// Collectives completed so far.
    generation: u64,
    /// (what, bytes) per rank for the collective in progress.
    slots: Vec<Option<(&'static str, Vec<u8>)>>,
    /// Every rank's bytes of the last completed collective.
    done: Arc<Vec<Vec<u8>>>,
    /// Set when a rank timed out, disagreed or left: every later collective fails with it.
    failed: Option<String>,
}

struct Shared {
    size: usize,
    round: Mutex<Round>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Held by a worker of `ThreadGroup::run` while it computes, given up while it waits in a
/// collective: whether a worker holds it, and the condition others wait on.
static COMPUTE: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

fn take_compute_token() {
    let (busy, free) = &COMPUTE;
    let mut busy = busy.lock().unwrap_or_else(|p| p.into_inner());
    while *busy {
        busy = free.wait(busy).unwrap_or_else(|p| p.into_inner());
    }
    *busy = true;
}

fn give_compute_token() {
    let (busy, free) = &COMPUTE;
    *busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
    free.notify_one();
}

/// Builds the W communicators of one group of threads.
pub struct ThreadGroup;

impl ThreadGroup {
    /// Runs `work` on W threads, one rank each, computing one at a time with a CPU generator of
    /// its own (module docs; each starts from the generator's state at this call), and returns
    /// the results in rank order. A panicking worker is an error naming its rank (the others'
    /// collectives fail when its communicator goes).
    pub fn run<T: Send + 'static>(
        size: usize,
        work: impl Fn(ThreadComm) -> T + Send + Sync + 'static,
    ) -> Result<Vec<T>> {
        let start = crate::rng_state::cpu_generator_state()?;
        let work = Arc::new(work);
        let handles: Vec<_> = Self::ranks(size)
            .into_iter()
            .map(|mut comm| {
                let work = work.clone();
                let start = start.copy();
                std::thread::spawn(move || {
                    comm.generator = Some(start);
                    comm.enter()?;
                    Ok::<T, Error>(work(comm))
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().map_err(|_| Error::Comm {
                    rank,
                    size,
                    what: "the worker thread panicked".to_string(),
                })?
            })
            .collect()
    }

    /// `size` communicators, rank 0 first; hand one to each thread.
    pub fn ranks(size: usize) -> Vec<ThreadComm> {
        Self::with_timeout(size, collective_timeout())
    }

    /// The same with a deadline of `timeout` per collective.
    pub fn with_timeout(size: usize, timeout: Duration) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared {
            size,
            round: Mutex::new(Round {
                generation: 0,
                slots: vec![None; size],
                done: Arc::new(Vec::new()),
                failed: None,
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| ThreadComm {
                rank,
                shared: shared.clone(),
                timeout,
                traffic: Traffic::default(),
                generator: None,
                holds_token: false,
            })
            .collect()
    }
}

/// One rank of a `ThreadGroup`. Dropping it (its thread ended, or failed) fails the others'
/// collectives at once instead of letting them wait for the deadline.
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    timeout: Duration,
    traffic: Traffic,
    /// This worker's CPU generator state while another computes (`run` only).
    generator: Option<tch::Tensor>,
    /// Whether this worker holds the compute token (`run` only, while it computes).
    holds_token: bool,
}

impl ThreadComm {
    /// Takes the compute token and puts this worker's generator state in.
    fn enter(&mut self) -> Result<()> {
        if let Some(state) = self.generator.take() {
            take_compute_token();
            self.holds_token = true;
            crate::rng_state::set_cpu_generator_state(&state)?;
        }
        Ok(())
    }

    /// Saves this worker's generator state and gives the compute token up.
    fn leave(&mut self) -> Result<()> {
        if self.holds_token {
            self.generator = Some(crate::rng_state::cpu_generator_state()?);
            self.holds_token = false;
            give_compute_token();
        }
        Ok(())
    }

    /// Puts in `bytes` for the collective `what` and returns every rank's, in rank order; a
    /// worker of `run` computes no more until it has them.
    fn exchange(&mut self, what: &'static str, bytes: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>> {
        self.leave()?;
        let result = self.exchange_waiting(what, bytes);
        self.enter()?;
        result
    }

    fn exchange_waiting(
        &mut self,
        what: &'static str,
        bytes: Vec<u8>,
    ) -> Result<Arc<Vec<Vec<u8>>>> {
        let deadline = Instant::now() + self.timeout;
        let mut round = self.shared.lock();
        if let Some(why) = &round.failed {
            return Err(self.error(format!("{what}: {why}")));
        }
        let generation = round.generation;
        round.slots[self.rank] = Some((what, bytes));
        if round.slots.iter().all(Option::is_some) {
            let slots: Vec<(&'static str, Vec<u8>)> = round
                .slots
                .iter_mut()
                .map(|s| s.take().expect("all in"))
                .collect();
            if let Some((r, (other, _))) = slots.iter().enumerate().find(|(_, (w, _))| *w != what) {
                let why = format!(
                    "rank {} called {what} while rank {r} called {other}",
                    self.rank
                );
                round.failed = Some(why.clone());
                self.shared.changed.notify_all();
                return Err(self.error(why));
            }
            round.done = Arc::new(slots.into_iter().map(|(_, b)| b).collect());
            round.generation += 1;
            self.shared.changed.notify_all();
            return Ok(round.done.clone());
        }
        loop {
            if round.generation != generation {
                return Ok(round.done.clone());
            }
            if let Some(why) = &round.failed {
                return Err(self.error(format!("{what}: {why}")));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..self.shared.size)
                    .filter(|&r| round.slots[r].is_none())
                    .collect();
                let why = format!(
                    "{what} timed out after {:.0} s waiting for rank(s) {missing:?}",
                    self.timeout.as_secs_f64()
                );
                round.failed = Some(why.clone());
                self.shared.changed.notify_all();
                return Err(self.error(why));
            }
            round = self
                .shared
                .changed
                .wait_timeout(round, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for ThreadComm {
    fn drop(&mut self) {
        if self.holds_token {
            self.holds_token = false;
            give_compute_token();
        }
        let mut round = self.shared.lock();
        if round.failed.is_none() {
            round.failed = Some(format!("rank {} left the group", self.rank));
        }
        self.shared.changed.notify_all();
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let length = bytes.len();
        let all = self.exchange("all_reduce_sum", bytes)?;
        if let Some(r) = all.iter().position(|b| b.len() != length) {
            return Err(self.error(format!(
                "all_reduce_sum of {} values, but rank {r} gave {}",
                values.len(),
                all[r].len() / 4
            )));
        }
        for (i, v) in values.iter_mut().enumerate() {
            let at = 4 * i;
            *v = all
                .iter()
                .map(|b| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
                .fold(0.0f32, |sum, x| sum + x);
        }
        self.traffic += Traffic {
            sent: length as u64,
            received: length as u64,
        };
        Ok(())
    }

    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.exchange("all_gather", bytes.to_vec())?;
        let others: usize = (0..all.len())
            .filter(|&r| r != self.rank)
            .map(|r| all[r].len())
            .sum();
        self.traffic += Traffic {
            sent: bytes.len() as u64,
            received: others as u64,
        };
        Ok(all.as_ref().clone())
    }

    fn broadcast(&mut self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        if root >= self.size() {
            return Err(self.error(format!("broadcast from rank {root} of {}", self.size())));
        }
        let mine = if self.rank == root {
            bytes.clone()
        } else {
            Vec::new()
        };
        let all = self.exchange("broadcast", mine)?;
        if self.rank == root {
            self.traffic.sent += bytes.len() as u64;
        } else {
            *bytes = all[root].clone();
            self.traffic.received += bytes.len() as u64;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.exchange("barrier", Vec::new()).map(|_| ())
    }

    fn take_traffic(&mut self) -> Traffic {
        let size = self.size();
        std::mem::take(&mut self.traffic).between(size)
    }

    fn error(&self, what: String) -> Error {
        Error::Comm {
            rank: self.rank,
            size: self.shared.size,
            what,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `work` on every rank of a group of `size` threads and returns the results in rank
    /// order.
    fn on_threads<T: Send + 'static>(
        size: usize,
        timeout: Duration,
        work: impl Fn(&mut ThreadComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let work = Arc::new(work);
        let handles: Vec<_> = ThreadGroup::with_timeout(size, timeout)
            .into_iter()
            .map(|mut comm| {
                let work = work.clone();
                std::thread::spawn(move || work(&mut comm))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn collectives_give_every_rank_the_same_answer_and_count_the_bytes() {
        let results = on_threads(3, Duration::from_secs(30), |comm| {
            let r = comm.rank();
            let mut values = vec![r as f32, 1.0, 0.5 * r as f32];
            comm.all_reduce_sum(&mut values).unwrap();
            let reduced = comm.take_traffic();
            // Rank r sends r + 1 bytes of value r.
            let gathered = comm.all_gather(&vec![r as u8; r + 1]).unwrap();
            let gather = comm.take_traffic();
            let mut bytes = if r == 1 {
                b"from one".to_vec()
            } else {
                Vec::new()
            };
            comm.broadcast(1, &mut bytes).unwrap();
            comm.barrier().unwrap();
            (
                values,
                reduced,
                gathered,
                gather,
                bytes,
                comm.take_traffic(),
            )
        });
        for (r, (values, reduced, gathered, gather, bytes, cast)) in results.into_iter().enumerate()
        {
            assert_eq!(values, vec![3.0, 3.0, 1.5]);
            assert_eq!(
                reduced,
                Traffic {
                    sent: 12,
                    received: 12
                }
            );
            assert_eq!(gathered, vec![vec![0u8], vec![1, 1], vec![2, 2, 2]]);
            assert_eq!(gather.sent, r as u64 + 1);
            assert_eq!(gather.received, 6 - (r as u64 + 1));
            assert_eq!(bytes, b"from one".to_vec());
            let want = if r == 1 {
                Traffic {
                    sent: 8,
                    received: 0,
                }
            } else {
                Traffic {
                    sent: 0,
                    received: 8,
                }
            };
            assert_eq!(cast, want);
        }
    }

    #[test]
    fn workers_of_run_draw_each_their_own_stream() {
        let _serial = crate::test_serial();
        let draws = |rank: usize, comm: Option<&mut ThreadComm>| {
            tch::manual_seed(100 + rank as i64);
            let mut out = Vec::new();
            let mut comm = comm;
            for _ in 0..4 {
                out.push(tch::Tensor::rand(
                    [64],
                    (tch::Kind::Float, tch::Device::Cpu),
                ));
                if let Some(c) = comm.as_mut() {
                    c.barrier().unwrap();
                }
            }
            tch::Tensor::cat(&out, 0)
        };
        let together =
            ThreadGroup::run(3, move |mut comm| draws(comm.rank(), Some(&mut comm))).unwrap();
        for (rank, got) in together.iter().enumerate() {
            assert!(
                crate::host::equal(got, &draws(rank, None)),
                "rank {rank} drew another stream"
            );
        }
    }

    #[test]
    fn a_missing_rank_or_a_mismatch_is_an_error_on_every_rank_not_a_hang() {
        // Rank 2 leaves without taking part: the others fail at once, naming it.
        let started = Instant::now();
        let results = on_threads(3, Duration::from_secs(60), |comm| {
            if comm.rank() == 2 {
                return Ok(());
            }
            comm.barrier()
        });
        assert!(started.elapsed() < Duration::from_secs(30));
        for (r, result) in results.iter().enumerate().take(2) {
            let message = result.as_ref().unwrap_err().to_string();
            assert!(
                message.contains("rank 2 left the group"),
                "rank {r}: {message}"
            );
        }
        // A rank that never comes: the deadline ends the wait.
        let group = ThreadGroup::with_timeout(2, Duration::from_millis(200));
        let mut ranks = group.into_iter();
        let mut first = ranks.next().unwrap();
        let _second = ranks.next().unwrap();
        let message = first.barrier().unwrap_err().to_string();
        assert!(
            message.contains("timed out") && message.contains("[1]"),
            "{message}"
        );
        // Different collectives on different ranks.
        let results = on_threads(2, Duration::from_secs(30), |comm| {
            if comm.rank() == 0 {
                comm.barrier()
            } else {
                comm.all_gather(b"x").map(|_| ())
            }
        });
        for result in results {
            assert!(result.unwrap_err().to_string().contains("called"));
        }
        // Different configurations.
        let results = on_threads(2, Duration::from_secs(30), |comm| {
            let config = if comm.rank() == 0 {
                "seed = 0"
            } else {
                "seed = 1"
            };
            comm.check_same("config.toml", config.as_bytes())
        });
        for result in results {
            let message = result.unwrap_err().to_string();
            assert!(
                message.contains("config.toml differs") && message.contains("[1]"),
                "{message}"
            );
        }
    }
}
