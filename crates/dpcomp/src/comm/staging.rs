//! Host buffers for what crosses a process.
//!
//! MPI reads and writes host memory (the MPICH this project builds on is not CUDA-aware), so on
//! a GPU every message of a data-parallel step goes to the host and the result comes back. Done
//! naively (`to_device(Cpu)` per tensor) each copy comes from pageable memory and waits for the
//! device before the next one is queued, and a fresh buffer is allocated every step. A
//! [`HostStaging`] instead keeps one reusable pinned buffer per message slot and queues every
//! copy without waiting:
//!
//! - [`HostStaging::message_to_host`]: the copies of all of a message's tensors (every layer's
//!   values and indices) are queued back to back behind the encoding, and the host waits once
//!   for the last, instead of once per tensor; the message's bytes are then made from host
//!   memory (`compress::wire`).
//! - [`HostStaging::all_reduce`]: the flat vector of a linear compressor (PowerSGD's P and Q,
//!   dense updates, the sketches) is copied into the buffer of its length, summed over the ranks
//!   in place (no copy into a `Vec` and back), and sent back to the device by a non-blocking
//!   copy that the next kernels queue behind.
//!
//! A buffer is reused only after a later copy into it, queued on the same stream behind the
//! copy out of it, has arrived (the wait above), so a copy still in flight is never overwritten.
//! On the CPU nothing needs staging: tensors are read where they are, unless the staging is
//! built with [`HostStaging::always`] (the tests, which run the buffers' path without a GPU).

use super::Communicator;
use crate::compress::{Message, Payload};
use crate::error::Result;
use crate::host;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

mod ffi {
    extern "C" {
        /// `crates/dpcomp/src/host_copy.cpp`: `dst.copy_(src, non_blocking)`.
        pub fn dpcomp_copy_into(
            dst: *mut torch_sys::C_tensor,
            src: *const torch_sys::C_tensor,
            non_blocking: i32,
        ) -> i32;
    }
}

/// Queues the copy of `src` into `dst` (same shape) without waiting for the device.
fn copy_into(dst: &mut Tensor, src: &Tensor) {
    // SAFETY: both pointers are live at::Tensor handles owned by tch for the call; the C++ side
    // catches LibTorch's exceptions.
    let status = unsafe { ffi::dpcomp_copy_into(dst.as_mut_ptr(), src.as_ptr(), 1) };
    assert_eq!(
        status,
        0,
        "LibTorch refused to copy a {:?} {:?} tensor into a {:?} {:?} buffer",
        src.size(),
        src.kind(),
        dst.size(),
        dst.kind()
    );
}

/// Reusable host buffers, one per slot of a message and per all-reduce length; pinned when the
/// tensors come from an accelerator.
#[derive(Debug, Default)]
pub struct HostStaging {
    /// The message slots' buffers: (slot, kind) -> a flat buffer at least as long as the slot's
    /// largest tensor so far (a sparse payload's k may vary between steps).
    slots: HashMap<(usize, Kind), Tensor>,
    /// The all-reduce buffers: length -> a flat f32 buffer of that length (PowerSGD reduces two
    /// vectors of different lengths per step, P's and Q's).
    reduce: HashMap<usize, Tensor>,
    /// Stage CPU tensors too (into unpinned buffers): the same path as on a GPU, for the tests.
    always: bool,
    /// Buffers allocated so far (reuse means this stops growing after the first steps).
    allocations: usize,
}

impl HostStaging {
    /// Staging for tensors on any device: accelerator tensors go through pinned buffers, CPU
    /// tensors are read where they are.
    pub fn new() -> Self {
        HostStaging::default()
    }

    /// Staging that copies CPU tensors into its buffers too (unpinned), so that the buffers'
    /// reuse and growth run without a GPU.
    pub fn always() -> Self {
        HostStaging {
            always: true,
            ..HostStaging::default()
        }
    }

    /// Buffers allocated since this staging was made.
    pub fn allocations(&self) -> usize {
        self.allocations
    }

    fn stages(&self, t: &Tensor) -> bool {
        self.always || t.device() != Device::Cpu
    }

    /// A buffer of at least `numel` values of `kind`, pinned for `device` when it is an
    /// accelerator.
    fn allocate(numel: usize, kind: Kind, device: Device) -> Tensor {
        let buffer = Tensor::empty([numel as i64], (kind, Device::Cpu));
        match device {
            Device::Cpu => buffer,
            accelerator => buffer.pin_memory(accelerator),
        }
    }

    /// Queues the copy of `t` into the buffer of `slot` and returns the host view it lands in,
    /// in `t`'s shape; its values are there once the device has run the copy
    /// (`host::wait_for`).
    fn queue_to_host(&mut self, slot: usize, t: &Tensor) -> Tensor {
        let numel = t.numel();
        let key = (slot, t.kind());
        let fits = self
            .slots
            .get(&key)
            .is_some_and(|buffer| buffer.numel() >= numel);
        if !fits {
            self.slots
                .insert(key, Self::allocate(numel, t.kind(), t.device()));
            self.allocations += 1;
        }
        let mut view = self.slots[&key]
            .narrow(0, 0, numel as i64)
            .view(t.size().as_slice());
        copy_into(&mut view, t);
        view
    }

    /// The bytes of `message` (`Message::to_bytes`) made from host memory: one transfer
    /// (`host::one_transfer`, one counted read), however many tensors the message has.
    pub fn message_bytes(&mut self, message: &Message) -> Result<Vec<u8>> {
        host::one_transfer(|| self.message_to_host(message).to_bytes())
    }

    /// `message` with every tensor in host memory: all copies queued first, then one wait. The
    /// result's tensors are views of this staging's buffers, valid until its next call: make
    /// the bytes (`Message::to_bytes`) and drop it.
    pub fn message_to_host(&mut self, message: &Message) -> Message {
        let Some(device) = message_device(message) else {
            return Message::new(Vec::new()); // no tensor at all
        };
        let mut slot = 0;
        let mut stage = |t: &Tensor| -> Tensor {
            if !self.stages(t) {
                return t.shallow_clone();
            }
            slot += 1;
            self.queue_to_host(slot - 1, t)
        };
        let payloads = message
            .payloads
            .iter()
            .map(|p| p.map_tensors(&mut stage))
            .collect();
        let flags = message.flags.iter().map(&mut stage).collect();
        if device != Device::Cpu {
            host::wait_for(device);
        }
        Message { payloads, flags }
    }

    /// `flat` (f32, one dimension, on any device) summed over the ranks of `comm`, back on
    /// `flat`'s device: through the buffer of its length, summed in place, returned by a
    /// non-blocking copy (on the CPU a tensor of its own, never the buffer).
    /// One transfer (`host::one_transfer`): one counted read on every device.
    pub fn all_reduce(&mut self, comm: &mut dyn Communicator, flat: &Tensor) -> Result<Tensor> {
        host::one_transfer(|| self.all_reduce_in_host_memory(comm, flat))
    }

    fn all_reduce_in_host_memory(
        &mut self,
        comm: &mut dyn Communicator,
        flat: &Tensor,
    ) -> Result<Tensor> {
        let device = flat.device();
        let flat = flat.to_kind(Kind::Float).reshape([-1]);
        let numel = flat.numel();
        if !self.stages(&flat) {
            // Already in host memory: sum a copy of our own in place.
            let mut values = flat.copy();
            host::with_f32_mut(&mut values, |v| comm.all_reduce_sum(v))?;
            return Ok(values);
        }
        let mut buffer = match self.reduce.get(&numel) {
            Some(buffer) => buffer.shallow_clone(),
            None => {
                let buffer = Self::allocate(numel, Kind::Float, device);
                self.reduce.insert(numel, buffer.shallow_clone());
                self.allocations += 1;
                buffer
            }
        };
        copy_into(&mut buffer, &flat);
        host::wait_for(device);
        host::with_f32_mut(&mut buffer, |v| comm.all_reduce_sum(v))?;
        Ok(match device {
            Device::Cpu => buffer.copy(),
            accelerator => buffer.to_device_(accelerator, Kind::Float, true, false),
        })
    }
}

/// The device of a message's tensors (of its first one); `None` for a message without any.
fn message_device(message: &Message) -> Option<Device> {
    message
        .payloads
        .iter()
        .map(Payload::device)
        .chain(message.flags.iter().map(Tensor::device))
        .next()
}
