//! W workers over PyTorch's own c10d on Gloo (the `gloo` cargo feature): the process group is
//! LibTorch's `c10d::ProcessGroupGloo` over a `c10d::TCPStore` (`src/gloo.cpp`), created from
//! the variables `torchrun` sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), so
//! `torchrun --nproc-per-node W --no-python dpcomp train ...` trains with W workers, on one
//! machine or several. The group takes tensors where they live (`Communicator::moves_tensors`),
//! on the CPU and on CUDA: a step's sums are Gloo's all-reduce of the gradients' own tensor, and
//! its byte messages, made on the device (`compress::wire_on_device`), one all-gather of device
//! memory padded to the longest (Gloo gathers tensors of one length). The host collectives
//! (configuration checks, metrics, the messages' layouts) move host memory: byte messages of
//! different lengths are an all-gather of the lengths, then of the messages padded to the
//! longest, trimmed back. Every collective waits at most the timeout
//! (`collective_timeout`), then fails with an error naming the rank and the collective.

use super::{collective_timeout, Communicator, Traffic};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CStr, CString};
use std::time::Duration;
use tch::{Kind, Tensor};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn dpcomp_gloo_new(
        store_host: *const c_char,
        port: i32,
        device_host: *const c_char,
        rank: i32,
        size: i32,
        is_server: i32,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    fn dpcomp_gloo_allreduce_f32(
        g: *mut c_void,
        data: *mut f32,
        n: i64,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_gloo_allreduce_tensor(
        g: *mut c_void,
        t: *mut torch_sys::C_tensor,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_gloo_allgather_tensor(
        g: *mut c_void,
        input: *const torch_sys::C_tensor,
        out: *mut torch_sys::C_tensor,
        size: i32,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_gloo_allgather_u8(
        g: *mut c_void,
        input: *mut u8,
        n: i64,
        out: *mut u8,
        size: i32,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_gloo_broadcast_u8(
        g: *mut c_void,
        data: *mut u8,
        n: i64,
        root: i32,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_gloo_barrier(g: *mut c_void, err: *mut *mut c_char) -> i32;
    fn dpcomp_gloo_free(g: *mut c_void);
}

/// Where the process group meets: the rendezvous of `torchrun`'s environment (env://).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// This process's rank, 0..world_size (`RANK`).
    pub rank: usize,
    /// W, the number of processes (`WORLD_SIZE`).
    pub world_size: usize,
    /// The host of the TCP store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Its port (`MASTER_PORT`).
    pub master_port: u16,
    /// Whether the launcher hosts the store (`TORCHELASTIC_USE_AGENT_STORE=True`, as torchrun
    /// does): every rank then connects as a client; otherwise rank 0 hosts it.
    pub launcher_hosts_store: bool,
}

impl Rendezvous {
    /// Whether the torchrun variables are set (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT`); `var` reads one (a parameter so that a test can hand it an environment).
    pub fn launched(var: impl Fn(&str) -> Option<String>) -> bool {
        ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
            .iter()
            .all(|name| var(name).is_some())
    }

    /// The rendezvous the variables describe; an error names a missing or malformed variable.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let read = |name: &str| {
            var(name).ok_or_else(|| {
                Error::bad_value(
                    name,
                    "not set: a c10d rendezvous needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun sets them)",
                )
            })
        };
        let number = |name: &str, what: &str| -> Result<u64> {
            let text = read(name)?;
            text.trim()
                .parse::<u64>()
                .map_err(|_| Error::bad_value(name, format!("{text:?}: expected {what}")))
        };
        let world_size = number("WORLD_SIZE", "a number of processes, at least 1")? as usize;
        let rank = number("RANK", "a rank, 0 to WORLD_SIZE - 1")? as usize;
        if world_size == 0 || rank >= world_size {
            return Err(Error::bad_value(
                "RANK",
                format!("{rank} of WORLD_SIZE {world_size}: expected 0 to WORLD_SIZE - 1"),
            ));
        }
        let port = number("MASTER_PORT", "a TCP port, 1 to 65535")?;
        let master_port = u16::try_from(port).ok().filter(|p| *p > 0).ok_or_else(|| {
            Error::bad_value(
                "MASTER_PORT",
                format!("{port}: expected a TCP port, 1 to 65535"),
            )
        })?;
        let master_addr = read("MASTER_ADDR")?;
        if master_addr.trim().is_empty() {
            return Err(Error::bad_value(
                "MASTER_ADDR",
                "empty: expected a host name or address",
            ));
        }
        Ok(Rendezvous {
            rank,
            world_size,
            master_addr,
            master_port,
            launcher_hosts_store: var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"),
        })
    }
}

/// This process's rank of a c10d process group on Gloo.
pub struct GlooComm {
    group: *mut c_void,
    rank: usize,
    size: usize,
    traffic: Traffic,
}

// The group is used by one thread at a time (`&mut self` for every collective); c10d's process
// group may be moved between threads.
unsafe impl Send for GlooComm {}

/// The message an FFI call left in `err`, freed.
pub(super) fn take_message(err: *mut c_char) -> String {
    if err.is_null() {
        return "no message".to_string();
    }
    // SAFETY: the shim wrote a NUL-terminated string from strdup.
    let text = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: strdup's memory, freed once.
    unsafe { libc::free(err as *mut c_void) };
    // c10d's messages carry a C++ trace after the first line; the first says what failed.
    text.lines().next().unwrap_or("").to_string()
}

impl GlooComm {
    /// Joins the process group of `rendezvous`; the timeout bounds the rendezvous and every
    /// collective after it.
    pub fn connect(rendezvous: &Rendezvous, timeout: Duration) -> Result<GlooComm> {
        let comm_error = |what: String| Error::Comm {
            rank: rendezvous.rank,
            size: rendezvous.world_size,
            what,
        };
        let host = CString::new(rendezvous.master_addr.clone())
            .map_err(|_| Error::bad_value("MASTER_ADDR", "holds a NUL byte"))?;
        // Gloo's own connections bind to the address this machine has towards the store's host;
        // on one machine that is the loopback.
        let device = CString::new(device_host(&rendezvous.master_addr)).expect("no NUL byte");
        let mut err: *mut c_char = std::ptr::null_mut();
        let is_server = rendezvous.rank == 0 && !rendezvous.launcher_hosts_store;
        // SAFETY: valid C strings for the call; `err` receives a malloc'd message on failure.
        let group = unsafe {
            dpcomp_gloo_new(
                host.as_ptr(),
                rendezvous.master_port as i32,
                device.as_ptr(),
                rendezvous.rank as i32,
                rendezvous.world_size as i32,
                is_server as i32,
                timeout.as_millis().min(i64::MAX as u128) as i64,
                &mut err,
            )
        };
        if group.is_null() {
            return Err(comm_error(format!(
                "joining the c10d process group at {}:{}: {}",
                rendezvous.master_addr,
                rendezvous.master_port,
                take_message(err)
            )));
        }
        Ok(GlooComm {
            group,
            rank: rendezvous.rank,
            size: rendezvous.world_size,
            traffic: Traffic::default(),
        })
    }

    /// The process group torchrun's variables describe, with `collective_timeout`.
    pub fn from_env() -> Result<GlooComm> {
        let rendezvous = Rendezvous::from_env(|name| std::env::var(name).ok())?;
        GlooComm::connect(&rendezvous, collective_timeout())
    }

    /// The result of an FFI collective: an error naming the rank and the collective.
    fn check(&self, collective: &str, status: i32, err: *mut c_char) -> Result<()> {
        match status {
            0 => Ok(()),
            _ => Err(self.error(format!("{collective} failed: {}", take_message(err)))),
        }
    }

    fn gather_equal(&mut self, collective: &str, mine: &mut [u8]) -> Result<Vec<u8>> {
        let mut out = vec![0u8; mine.len() * self.size];
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `mine` holds n bytes and `out` size * n, both alive for the call.
        let status = unsafe {
            dpcomp_gloo_allgather_u8(
                self.group,
                mine.as_mut_ptr(),
                mine.len() as i64,
                out.as_mut_ptr(),
                self.size as i32,
                &mut err,
            )
        };
        self.check(collective, status, err)?;
        Ok(out)
    }
}

/// The address Gloo binds to for a store at `master`: the loopback when the store is local.
fn device_host(master: &str) -> String {
    match master {
        "localhost" | "127.0.0.1" | "::1" => "127.0.0.1".to_string(),
        _ => std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| {
                s.connect((master, 1))?;
                s.local_addr()
            })
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "127.0.0.1".to_string()),
    }
}

impl Drop for GlooComm {
    fn drop(&mut self) {
        // SAFETY: the group from `dpcomp_gloo_new`, freed once.
        unsafe { dpcomp_gloo_free(self.group) }
    }
}

impl Communicator for GlooComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `values` is alive and exclusively borrowed for the call.
        let status = unsafe {
            dpcomp_gloo_allreduce_f32(
                self.group,
                values.as_mut_ptr(),
                values.len() as i64,
                &mut err,
            )
        };
        self.check("all_reduce_sum", status, err)?;
        let bytes = 4 * values.len() as u64;
        self.traffic += Traffic {
            sent: bytes,
            received: bytes,
        };
        Ok(())
    }

    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut length = (bytes.len() as u64).to_le_bytes();
        let lengths: Vec<usize> = self
            .gather_equal("all_gather (lengths)", &mut length)?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
            .collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let gathered = match longest {
            0 => Vec::new(),
            _ => {
                let mut padded = bytes.to_vec();
                padded.resize(longest, 0);
                self.gather_equal("all_gather", &mut padded)?
            }
        };
        let total: usize = lengths.iter().sum();
        self.traffic += Traffic {
            sent: bytes.len() as u64,
            received: (total - bytes.len()) as u64,
        };
        Ok(lengths
            .iter()
            .enumerate()
            .map(|(r, &n)| gathered[r * longest..r * longest + n].to_vec())
            .collect())
    }

    fn broadcast(&mut self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        if root >= self.size {
            return Err(self.error(format!("broadcast from rank {root} of {}", self.size)));
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        let mut length = (bytes.len() as u64).to_le_bytes();
        // SAFETY: 8 bytes alive for the call.
        let status = unsafe {
            dpcomp_gloo_broadcast_u8(self.group, length.as_mut_ptr(), 8, root as i32, &mut err)
        };
        self.check("broadcast (length)", status, err)?;
        let length = u64::from_le_bytes(length) as usize;
        if self.rank != root {
            *bytes = vec![0u8; length];
        }
        if length > 0 {
            let mut err: *mut c_char = std::ptr::null_mut();
            // SAFETY: `bytes` holds `length` bytes, alive for the call.
            let status = unsafe {
                dpcomp_gloo_broadcast_u8(
                    self.group,
                    bytes.as_mut_ptr(),
                    length as i64,
                    root as i32,
                    &mut err,
                )
            };
            self.check("broadcast", status, err)?;
        }
        if self.rank == root {
            self.traffic.sent += length as u64;
        } else {
            self.traffic.received += length as u64;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: the group is alive.
        let status = unsafe { dpcomp_gloo_barrier(self.group, &mut err) };
        self.check("barrier", status, err)
    }

    fn moves_tensors(&self) -> bool {
        true
    }

    fn all_reduce_tensor(&mut self, flat: &mut Tensor) -> Result<()> {
        if flat.kind() != Kind::Float || flat.dim() != 1 || !flat.is_contiguous() {
            return Err(self.error(format!(
                "all_reduce_tensor of a {:?} tensor of shape {:?}: expected a contiguous f32 vector",
                flat.kind(),
                flat.size()
            )));
        }
        if flat.numel() == 0 {
            return Ok(());
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: a live tensor handle, exclusively borrowed for the call.
        let status =
            unsafe { dpcomp_gloo_allreduce_tensor(self.group, flat.as_mut_ptr(), &mut err) };
        self.check("all_reduce_tensor", status, err)?;
        let bytes = 4 * flat.numel() as u64;
        self.traffic += Traffic {
            sent: bytes,
            received: bytes,
        };
        Ok(())
    }

    fn all_gather_tensor(&mut self, bytes: &Tensor) -> Result<Vec<Tensor>> {
        if bytes.kind() != Kind::Uint8 || bytes.dim() != 1 {
            return Err(self.error(format!(
                "all_gather_tensor of a {:?} tensor of shape {:?}: expected a uint8 vector",
                bytes.kind(),
                bytes.size()
            )));
        }
        let n = bytes.numel() as i64;
        let input = bytes.contiguous();
        let mut out = Tensor::empty([n * self.size as i64], (Kind::Uint8, bytes.device()));
        if n > 0 {
            let mut err: *mut c_char = std::ptr::null_mut();
            // SAFETY: live tensor handles; `out` holds size * n bytes on `bytes`' device.
            let status = unsafe {
                dpcomp_gloo_allgather_tensor(
                    self.group,
                    input.as_ptr(),
                    out.as_mut_ptr(),
                    self.size as i32,
                    &mut err,
                )
            };
            self.check("all_gather_tensor", status, err)?;
        }
        self.traffic += Traffic {
            sent: n as u64,
            received: n as u64 * (self.size as u64 - 1),
        };
        Ok((0..self.size as i64)
            .map(|r| out.narrow(0, r * n, n))
            .collect())
    }

    fn take_traffic(&mut self) -> Traffic {
        let size = self.size;
        std::mem::take(&mut self.traffic).between(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn torchruns_variables_make_the_rendezvous_and_bad_ones_are_named() {
        let good = [
            ("RANK", "1"),
            ("WORLD_SIZE", "3"),
            ("MASTER_ADDR", "10.0.0.2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        assert!(Rendezvous::launched(env(&good)));
        assert_eq!(
            Rendezvous::from_env(env(&good)).unwrap(),
            Rendezvous {
                rank: 1,
                world_size: 3,
                master_addr: "10.0.0.2".into(),
                master_port: 29500,
                launcher_hosts_store: true,
            }
        );
        assert!(!Rendezvous::launched(env(&good[..3])));
        for (name, value, want) in [
            ("RANK", "3", "RANK: 3 of WORLD_SIZE 3"),
            ("RANK", "x", "RANK: \"x\": expected a rank"),
            ("WORLD_SIZE", "0", "RANK: 1 of WORLD_SIZE 0"),
            (
                "MASTER_PORT",
                "70000",
                "MASTER_PORT: 70000: expected a TCP port",
            ),
            ("MASTER_ADDR", " ", "MASTER_ADDR: empty"),
        ] {
            let mut pairs = good.to_vec();
            pairs.retain(|(k, _)| *k != name);
            pairs.push((name, value));
            let err = Rendezvous::from_env(env(&pairs)).unwrap_err().to_string();
            assert!(err.contains(want), "{name}={value}: {err}");
        }
        let err = Rendezvous::from_env(env(&good[1..]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("RANK: not set"), "{err}");
    }
}
