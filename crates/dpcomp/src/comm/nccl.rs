//! CUDA workers over PyTorch's own c10d on NCCL (the `nccl` cargo feature, built where NCCL's
//! and the CUDA runtime's headers are present): the tensor collectives (`all_reduce_tensor`,
//! `all_gather_tensor`) go through LibTorch's `c10d::ProcessGroupNCCL` (`src/nccl.cpp`) on this
//! rank's GPU, and the small host-memory collectives (`all_reduce_sum`, `all_gather`,
//! `broadcast`, `barrier`) through a Gloo group of the same job (`GlooComm`). Both meet in one
//! TCP store, the one the Gloo group hosts on rank 0 (or joins, where torchrun's agent hosts
//! it), each under a prefix of its own.
//!
//! A tensor collective is queued on NCCL's stream and the current stream of the tensor's device
//! waits for it: the host does not block, and a data-parallel step's messages stay on the GPU.
//! Each rank uses the GPU `LOCAL_RANK` names (torchrun sets it; 0 where it is unset). A tensor
//! that is not on that GPU is refused with an error naming the rank and the collective. NCCL
//! reports a collective that another rank never joins from its watchdog thread: after the
//! collective timeout (`collective_timeout`) the process ends with a message naming the rank
//! and the operation (`[Rank r] Watchdog caught collective operation timeout: WorkNCCL(...,
//! OpType=ALLREDUCE, ...)`), since the host, which never waited, cannot be handed an error.

use super::gloo::{take_message, GlooComm, Rendezvous};
use super::{collective_timeout, Communicator, Traffic};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CString};
use std::time::Duration;
use tch::{Device, Kind, Tensor};

extern "C" {
    fn dpcomp_nccl_new(
        store_host: *const c_char,
        port: i32,
        rank: i32,
        size: i32,
        device: i32,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    fn dpcomp_nccl_allreduce_tensor(
        g: *mut c_void,
        t: *mut torch_sys::C_tensor,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_nccl_allgather_tensor(
        g: *mut c_void,
        input: *const torch_sys::C_tensor,
        out: *mut torch_sys::C_tensor,
        err: *mut *mut c_char,
    ) -> i32;
    fn dpcomp_nccl_free(g: *mut c_void);
}

/// The GPU of this rank: `LOCAL_RANK` as `var` reads it, 0 where it is unset; an error names a
/// malformed value.
pub fn local_device(var: impl Fn(&str) -> Option<String>) -> Result<usize> {
    match var("LOCAL_RANK") {
        None => Ok(0),
        Some(text) => text.trim().parse::<usize>().map_err(|_| {
            Error::bad_value(
                "LOCAL_RANK",
                format!("{text:?}: expected this process's rank on its machine, 0 or more"),
            )
        }),
    }
}

/// The NCCL group of `rendezvous` on CUDA device `device`, through the job's store (which the
/// Gloo group of the same job hosts or has joined); an error names the rank and what c10d said.
fn join_nccl_group(
    rendezvous: &Rendezvous,
    device: usize,
    timeout: Duration,
) -> Result<*mut c_void> {
    let store_host = CString::new(rendezvous.master_addr.clone())
        .map_err(|_| Error::bad_value("MASTER_ADDR", "holds a NUL byte"))?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: a valid C string for the call; `err` receives a malloc'd message on failure.
    let group = unsafe {
        dpcomp_nccl_new(
            store_host.as_ptr(),
            rendezvous.master_port as i32,
            rendezvous.rank as i32,
            rendezvous.world_size as i32,
            device as i32,
            timeout.as_millis().min(i64::MAX as u128) as i64,
            &mut err,
        )
    };
    if group.is_null() {
        return Err(Error::Comm {
            rank: rendezvous.rank,
            size: rendezvous.world_size,
            what: format!(
                "joining the c10d process group on NCCL (cuda:{device}) at {}:{}: {}",
                rendezvous.master_addr,
                rendezvous.master_port,
                take_message(err)
            ),
        });
    }
    Ok(group)
}

/// This process's rank of a c10d job on NCCL, with the job's Gloo group for host memory.
pub struct NcclComm {
    group: *mut c_void,
    host: GlooComm,
    device: usize,
    traffic: Traffic,
}

// The group is used by one thread at a time (`&mut self` for every collective); c10d's process
// group may be moved between threads.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Joins the job of `rendezvous` on CUDA device `device`: first its Gloo group (which hosts
    /// or joins the store), then the NCCL group through the same store. The timeout bounds the
    /// rendezvous and every collective after it. An error when this process sees no such GPU.
    pub fn connect(rendezvous: &Rendezvous, device: usize, timeout: Duration) -> Result<NcclComm> {
        let comm_error = |what: String| Error::Comm {
            rank: rendezvous.rank,
            size: rendezvous.world_size,
            what,
        };
        let gpus = tch::Cuda::device_count().max(0) as usize;
        if gpus == 0 {
            return Err(comm_error(
                "NCCL needs CUDA tensors; this process sees no GPU (LibTorch finds no CUDA device): use Gloo (--comm gloo) on the CPU".to_string(),
            ));
        }
        if device >= gpus {
            return Err(comm_error(format!(
                "NCCL on cuda:{device} (LOCAL_RANK {device}), but this process sees {gpus} GPU(s): start at most {gpus} rank(s) a machine (torchrun --nproc-per-node), or use Gloo (--comm gloo)"
            )));
        }
        let host = GlooComm::connect(rendezvous, timeout)?;
        let group = join_nccl_group(rendezvous, device, timeout)?;
        Ok(NcclComm {
            group,
            host,
            device,
            traffic: Traffic::default(),
        })
    }

    /// The job torchrun's variables describe, on the GPU `LOCAL_RANK` names, with
    /// `collective_timeout`.
    pub fn from_env() -> Result<NcclComm> {
        let var = |name: &str| std::env::var(name).ok();
        let rendezvous = Rendezvous::from_env(var)?;
        let device = local_device(var)?;
        NcclComm::connect(&rendezvous, device, collective_timeout())
    }

    /// The CUDA device of this rank's NCCL group.
    pub fn device(&self) -> Device {
        Device::Cuda(self.device)
    }

    /// An error unless `t` lives on this rank's GPU.
    fn on_my_gpu(&self, collective: &str, t: &Tensor) -> Result<()> {
        if t.device() == self.device() {
            return Ok(());
        }
        let what = match t.device() {
            Device::Cpu => "a CPU tensor: NCCL takes CUDA tensors".to_string(),
            other => format!("a tensor on {other:?}"),
        };
        Err(self.error(format!(
            "{collective} of {what}, and this rank's NCCL group is on cuda:{} (LOCAL_RANK); the exchange must run on that device",
            self.device
        )))
    }

    /// The result of an FFI collective: an error naming the rank and the collective.
    fn check(&self, collective: &str, status: i32, err: *mut c_char) -> Result<()> {
        match status {
            0 => Ok(()),
            _ => Err(self.error(format!(
                "{collective} on NCCL failed: {}",
                take_message(err)
            ))),
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the group from `dpcomp_nccl_new`, freed once, before the Gloo group (and the
        // store it may host) drops with the fields.
        unsafe { dpcomp_nccl_free(self.group) }
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.host.rank()
    }

    fn size(&self) -> usize {
        self.host.size()
    }

    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<()> {
        self.host.all_reduce_sum(values)
    }

    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.host.all_gather(bytes)
    }

    fn broadcast(&mut self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.host.broadcast(root, bytes)
    }

    fn barrier(&mut self) -> Result<()> {
        self.host.barrier()
    }

    fn abort(&mut self, code: i32) {
        self.host.abort(code)
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
        self.on_my_gpu("all_reduce_tensor", flat)?;
        if flat.numel() == 0 {
            return Ok(());
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: a live tensor handle, exclusively borrowed for the call.
        let status =
            unsafe { dpcomp_nccl_allreduce_tensor(self.group, flat.as_mut_ptr(), &mut err) };
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
        self.on_my_gpu("all_gather_tensor", bytes)?;
        let size = self.size() as i64;
        let n = bytes.numel() as i64;
        let input = bytes.contiguous();
        let mut out = Tensor::empty([n * size], (Kind::Uint8, bytes.device()));
        if n > 0 {
            let mut err: *mut c_char = std::ptr::null_mut();
            // SAFETY: live tensor handles; `out` holds size * n bytes on `bytes`' device.
            let status = unsafe {
                dpcomp_nccl_allgather_tensor(self.group, input.as_ptr(), out.as_mut_ptr(), &mut err)
            };
            self.check("all_gather_tensor", status, err)?;
        }
        self.traffic += Traffic {
            sent: n as u64,
            received: n as u64 * (size as u64 - 1),
        };
        Ok((0..size).map(|r| out.narrow(0, r * n, n)).collect())
    }

    fn take_traffic(&mut self) -> Traffic {
        let size = self.size();
        let mut total = self.host.take_traffic();
        total += std::mem::take(&mut self.traffic).between(size);
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim links and meets the store the Gloo group hosts: on a machine without a GPU,
    /// CUDA's refusal (after the store is joined) comes back as an error naming the rank and
    /// the store; with one, a group of one rank sums a CUDA vector.
    #[test]
    fn the_nccl_group_joins_the_gloo_groups_store() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let rendezvous = Rendezvous {
            rank: 0,
            world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            launcher_hosts_store: false,
        };
        let timeout = Duration::from_secs(30);
        if tch::Cuda::device_count() == 0 {
            // With no store at the port, the client gives up first (CUDA is not reached).
            let nobody = join_nccl_group(&rendezvous, 0, Duration::from_secs(2))
                .unwrap_err()
                .to_string();
            assert!(!nobody.contains("CUDA"), "{nobody}");
            let _gloo = GlooComm::connect(&rendezvous, timeout).unwrap();
            let e = join_nccl_group(&rendezvous, 0, timeout)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "rank 0 of 1: joining the c10d process group on NCCL (cuda:0) at 127.0.0.1:{port}: "
                )) && (e.contains("CUDA") || e.contains("GPU")),
                "{e}"
            );
            let e = NcclComm::connect(&rendezvous, 0, timeout)
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.contains("NCCL needs CUDA tensors; this process sees no GPU"),
                "{e}"
            );
            return;
        }
        let mut comm = NcclComm::connect(&rendezvous, 0, timeout).unwrap();
        let mut flat = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).to_device(Device::Cuda(0));
        comm.all_reduce_tensor(&mut flat).unwrap();
        assert_eq!(
            crate::host::to_vec_f32(&flat.to_device(Device::Cpu)).unwrap(),
            [1.0, 2.0, 3.0]
        );
        let e = comm
            .all_reduce_tensor(&mut Tensor::from_slice(&[1.0f32]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("all_reduce_tensor of a CPU tensor: NCCL takes CUDA tensors"),
            "{e}"
        );
    }

    #[test]
    fn local_rank_names_the_gpu_and_a_bad_one_is_named() {
        assert_eq!(local_device(|_| None).unwrap(), 0);
        assert_eq!(local_device(|_| Some("3".into())).unwrap(), 3);
        let e = local_device(|_| Some("x".into())).unwrap_err().to_string();
        assert!(e.starts_with("LOCAL_RANK: \"x\""), "{e}");
    }
}
