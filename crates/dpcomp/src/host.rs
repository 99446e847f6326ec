//! Every read of a tensor's value to the host, counted.
//!
//! On CUDA a training step must neither read a tensor's value on the host nor wait for the
//! device, except where the caller asks for values (an observer's logging interval, the end of
//! an epoch). Both happen in the same places: reading a value (`item()`, a copy into a `Vec`)
//! waits for the queue to drain, and so does an op whose result's *size* depends on the data
//! (`nonzero`, `masked_select`), because the host has to learn the size before it can allocate.
//! Without a GPU that is proven by counting: the library reads tensor values only through this
//! module, each call adds one to a counter of the calling thread, and `tests/training/host_reads.rs`
//! trains with every compressor and mode and asserts that the steps add nothing.
//! The same file's `every_read_in_the_library_goes_through_the_host_module` keeps it that way:
//! it fails on a direct read anywhere else in `src/` (the application in `src/bin/` is exempt).
//!
//! The counter is per thread because the training loop runs on its caller's thread (one worker)
//! and tests run side by side in threads of one process.
//!
//! ```
//! use dpcomp::host;
//! let t = tch::Tensor::from_slice(&[1.0f64, 2.0]);
//! let reads = host::HostReads::start();
//! let total = host::f64_scalar(&t.sum(tch::Kind::Double));
//! assert_eq!((total, reads.since()), (3.0, 1));
//! ```
//!
//! One kind of read is not counted: [`cpu_i64_scalar`], for tensors that live in host memory
//! on every device (the Poisson batches' indices and the sequences' widths, which stay on the
//! CPU when the examples are held on an accelerator). Reading them neither copies from the
//! device nor waits for it; the function panics if handed a tensor that is not on the CPU.
//! `bool_if_on_cpu` reads a flag only where it is in host memory, for the same reason.
//!
//! The other direction is no read either, but a plain copy from host memory to CUDA waits for
//! the device's queue to drain: what a step makes on the host and sends to the device (the batch
//! index, FL-RND's coordinates, PowerSGD's fresh Q, secure noise) goes through [`upload`].

use std::cell::Cell;
use tch::{Device, TchError, Tensor};

thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
    /// Inside `one_transfer`: the reads are of host memory the transfer brought over, counted
    /// once by it.
    static IN_TRANSFER: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if !IN_TRANSFER.with(Cell::get) {
        READS.with(|r| r.set(r.get() + 1));
    }
}

/// Runs `f`, one transfer of a data-parallel exchange to the transport (`comm::staging`): the
/// message's tensors (or an all-reduced vector) brought to host memory with one wait for the
/// device, then read there as the transport needs them (MPI, and the thread transport that is
/// its in-process reference, move bytes in host memory). Counted as one read, the wait: the
/// reads inside `f` are of host memory (on a GPU, the staging's pinned buffers after the
/// wait), which neither copy from the device nor wait for it, as `cpu_i64_scalar`'s.
pub fn one_transfer<R>(f: impl FnOnce() -> R) -> R {
    struct Leave(bool);
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_TRANSFER.with(|t| t.set(self.0));
        }
    }
    count();
    let _leave = Leave(IN_TRANSFER.with(|t| t.replace(true)));
    f()
}

/// Host reads (and data-dependent ops) made on this thread so far.
pub fn reads() -> u64 {
    READS.with(Cell::get)
}

/// The reads of this thread from a starting point on: `HostReads::start()`, then `since()`.
#[derive(Debug, Clone, Copy)]
pub struct HostReads {
    start: u64,
}

impl HostReads {
    /// Starts counting from this thread's reads now.
    pub fn start() -> Self {
        HostReads { start: reads() }
    }

    /// Reads made on this thread since `start`.
    pub fn since(&self) -> u64 {
        reads() - self.start
    }
}

/// The value of a one-element tensor as f64 (any kind; `double_value(&[])`).
pub fn f64_scalar(t: &Tensor) -> f64 {
    f64_at(t, &[])
}

/// The element of `t` at `index` as f64 (`double_value(index)`).
pub fn f64_at(t: &Tensor, index: &[i64]) -> f64 {
    count();
    t.double_value(index)
}

/// The value of a one-element tensor as i64 (any kind; `int64_value(&[])`).
pub fn i64_scalar(t: &Tensor) -> i64 {
    count();
    t.int64_value(&[])
}

/// The value of a one-element tensor as bool.
pub fn bool_scalar(t: &Tensor) -> Result<bool, TchError> {
    count();
    bool::try_from(t)
}

/// Every value of `t` (flattened, row-major) as f32; an error when its kind is not Float.
pub fn to_vec_f32(t: &Tensor) -> Result<Vec<f32>, TchError> {
    count();
    Vec::<f32>::try_from(t)
}

/// Every value of `t` (flattened, row-major) as f64; an error when its kind is not Double.
pub fn to_vec_f64(t: &Tensor) -> Result<Vec<f64>, TchError> {
    count();
    Vec::<f64>::try_from(t)
}

/// Every value of `t` (flattened, row-major) as i64; an error when its kind is not Int64.
pub fn to_vec_i64(t: &Tensor) -> Result<Vec<i64>, TchError> {
    count();
    Vec::<i64>::try_from(t)
}

/// Every value of `t` (flattened, row-major) as bool; an error when its kind is not Bool.
pub fn to_vec_bool(t: &Tensor) -> Result<Vec<bool>, TchError> {
    count();
    Vec::<bool>::try_from(t)
}

/// The bytes of a contiguous CPU tensor as they lie in memory (its kind, little-endian).
pub fn to_bytes(t: &Tensor) -> Vec<u8> {
    count();
    let mut bytes = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
    t.copy_data_u8(&mut bytes, t.numel());
    bytes
}

/// Whether `a` and `b` have the same size and elements (`Tensor::equal`).
pub fn equal(a: &Tensor, b: &Tensor) -> bool {
    count();
    a.equal(b)
}

/// The positions of the nonzero elements of `t`, [count, dim] int64: a size that depends on
/// the data, so on an accelerator the host waits for the device.
pub fn nonzero(t: &Tensor) -> Tensor {
    count();
    t.nonzero()
}

/// Positions (int64, ascending) of the elements of the flat tensor `x` whose magnitude is at
/// least the 0-d `threshold` (of `x`'s kind): `nonzero(|x| >= threshold)`. On a contiguous f32
/// CPU tensor it is one pass over `x`, without the magnitude and mask temporaries and the
/// count pass of LibTorch's `nonzero` (the sampled top-k, `compress::topk`); the same positions,
/// since |x| and the comparison are exact. Elsewhere LibTorch's ops. A data-dependent size: one
/// counted read (`nonzero`).
pub fn magnitude_at_least(x: &Tensor, threshold: &Tensor) -> Tensor {
    count();
    if is_host_f32_vector(x) && is_host_f32_vector(&threshold.view([-1])) {
        let (positions, _) = host_f32_at_least(x, threshold);
        return Tensor::from_slice(&positions);
    }
    x.abs().ge_tensor(threshold).nonzero().view([-1])
}

/// Whether `x` is a contiguous f32 tensor of at most one dimension in host memory: what the
/// one-pass functions here read directly.
pub(crate) fn is_host_f32_vector(x: &Tensor) -> bool {
    x.device() == Device::Cpu && x.kind() == tch::Kind::Float && x.is_contiguous() && x.dim() <= 1
}

/// Positions (ascending) of the k largest |x| among the elements of `x` with |x| at least the
/// 0-d `threshold`, or `None` when fewer than k reach it; among magnitudes equal to the k-th
/// largest, the lowest positions. For a contiguous f32 vector in host memory (`debug_assert`ed;
/// `compress::topk` checks with [`is_host_f32_vector`]): one pass collects the candidates and
/// their magnitudes, a selection (`select_nth_unstable`, linear) finds the k-th largest of
/// them and a pass over the candidates keeps the k, already in ascending order. The same
/// positions as LibTorch's `topk` over the candidates then sorted, unless magnitudes tie at the
/// k-th (where `topk` chooses among them in no documented order). One counted read, as
/// [`magnitude_at_least`].
pub(crate) fn largest_magnitudes_at_least(
    x: &Tensor,
    threshold: &Tensor,
    k: usize,
) -> Option<Tensor> {
    debug_assert!(is_host_f32_vector(x) && is_host_f32_vector(&threshold.view([-1])));
    count();
    let (positions, magnitudes) = host_f32_at_least(x, threshold);
    let found = positions.len();
    if found < k || k == 0 {
        return None;
    }
    if found == k {
        return Some(Tensor::from_slice(&positions));
    }
    // The k-th largest candidate magnitude: position found - k of the ascending order. No
    // candidate is NaN (a NaN fails `>=`), so `total_cmp` is the numeric order.
    let mut order = magnitudes.clone();
    let (_, &mut kth, _) = order.select_nth_unstable_by(found - k, f32::total_cmp);
    let above = magnitudes.iter().filter(|&&m| m > kth).count();
    let mut ties_left = k - above;
    let mut chosen = Vec::with_capacity(k);
    for (&position, &m) in positions.iter().zip(&magnitudes) {
        if m > kth {
            chosen.push(position);
        } else if m == kth && ties_left > 0 {
            chosen.push(position);
            ties_left -= 1;
        }
    }
    Some(Tensor::from_slice(&chosen))
}

/// The positions and magnitudes of the elements of the host f32 vector `x` with |x| at least
/// the 0-d f32 `threshold`, in one pass (no magnitude or mask temporaries of x's size). Reads
/// the threshold: the caller counts it.
fn host_f32_at_least(x: &Tensor, threshold: &Tensor) -> (Vec<i64>, Vec<f32>) {
    // An f32 read as f64 and back is the same f32.
    let t = threshold.double_value(&[]) as f32;
    let len = x.numel();
    let mut positions = Vec::with_capacity(len / 16);
    let mut magnitudes = Vec::with_capacity(len / 16);
    if len == 0 {
        return (positions, magnitudes);
    }
    // SAFETY: `x` is a contiguous CPU tensor of `len` f32 values (the callers check), only
    // read here.
    let values = unsafe { std::slice::from_raw_parts(x.data_ptr() as *const f32, len) };
    let done = at_least_in_blocks(values, t, &mut positions, &mut magnitudes);
    for (i, v) in values.iter().enumerate().skip(done) {
        let m = v.abs();
        if m >= t {
            positions.push(i as i64);
            magnitudes.push(m);
        }
    }
    (positions, magnitudes)
}

/// `host_f32_at_least` over the whole blocks of 16 values at the start of `values`, four SSE2
/// comparisons and one mask per block (SSE2 is part of every x86-64 processor): a pass that
/// skips the blocks without a candidate in a few instructions instead of a branch per value
/// (ResNet-18's 11.2M values, 0.3 % above the threshold: 16 -> 6 ms; 4.7 %: 14 -> 10 ms). The
/// comparison is the scalar loop's (an ordered >=, false for NaN; the magnitude is the value
/// with its sign bit cleared, `f32::abs`), so the positions are the same. Returns how many
/// values it covered.
#[cfg(target_arch = "x86_64")]
fn at_least_in_blocks(
    values: &[f32],
    t: f32,
    positions: &mut Vec<i64>,
    magnitudes: &mut Vec<f32>,
) -> usize {
    use std::arch::x86_64::{
        _mm_and_ps, _mm_castsi128_ps, _mm_cmpge_ps, _mm_loadu_ps, _mm_movemask_ps, _mm_set1_epi32,
        _mm_set1_ps,
    };
    let blocks = values.len() / 16;
    // SAFETY: SSE2 is available on every x86-64 target; each block reads the 16 values at
    // 16 b .. 16 b + 16 <= values.len() (unaligned loads), and nothing is written through `base`.
    unsafe {
        let threshold = _mm_set1_ps(t);
        let no_sign = _mm_castsi128_ps(_mm_set1_epi32(0x7fff_ffff));
        let base = values.as_ptr();
        for b in 0..blocks {
            let block = base.add(16 * b);
            let mut mask = 0u32;
            for quarter in 0..4 {
                let four = _mm_and_ps(_mm_loadu_ps(block.add(4 * quarter)), no_sign);
                mask |= (_mm_movemask_ps(_mm_cmpge_ps(four, threshold)) as u32) << (4 * quarter);
            }
            while mask != 0 {
                let j = mask.trailing_zeros() as usize;
                positions.push((16 * b + j) as i64);
                magnitudes.push(values[16 * b + j].abs());
                mask &= mask - 1;
            }
        }
    }
    16 * blocks
}

/// Elsewhere the scalar loop of `host_f32_at_least` covers every value.
#[cfg(not(target_arch = "x86_64"))]
fn at_least_in_blocks(_: &[f32], _: f32, _: &mut Vec<i64>, _: &mut Vec<f32>) -> usize {
    0
}

/// The elements of `t` where `mask` is true, flattened: a data-dependent size (`nonzero`).
pub fn masked_select(t: &Tensor, mask: &Tensor) -> Tensor {
    count();
    t.masked_select(mask)
}

/// `t`, made on the host, on `device` without waiting for the device: on an accelerator through
/// pinned memory and an asynchronous copy (a copy from pageable memory synchronises the
/// stream first; the pinned block is not reused before the copy is done), on the CPU `t`
/// itself. Not counted: it reads nothing back.
pub fn upload(t: &Tensor, device: Device) -> Tensor {
    match device {
        Device::Cpu => t.to_device(device),
        there => {
            t.to_device(Device::Cpu)
                .pin_memory(there)
                .to_device_(there, t.kind(), true, false)
        }
    }
}

/// Waits until `device` has run everything queued on it (on CUDA `cudaDeviceSynchronize`; on
/// the CPU nothing to wait for). Counted on every device: it is the one wait before the host
/// reads values that non-blocking copies are bringing back (`comm::staging`).
pub fn wait_for(device: Device) {
    count();
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// Runs `f` on the values of `t` in place: `t` must be a contiguous Float tensor in host
/// memory (a staging buffer whose copies have arrived, `wait_for`); what `f` writes is `t`'s
/// new values. Counted: the host reads (and writes) the values.
///
/// Panics if `t` is not a contiguous f32 CPU tensor: reading other memory as f32 would be
/// undefined behaviour.
pub fn with_f32_mut<R>(t: &mut Tensor, f: impl FnOnce(&mut [f32]) -> R) -> R {
    assert!(
        t.device() == Device::Cpu && t.kind() == tch::Kind::Float && t.is_contiguous(),
        "host::with_f32_mut takes a contiguous f32 tensor in host memory, got {:?} {:?}",
        t.kind(),
        t.device()
    );
    count();
    let len = t.numel();
    if len == 0 {
        return f(&mut []);
    }
    // SAFETY: `t` is a contiguous CPU tensor of `len` f32 values (checked above), borrowed
    // mutably for the duration of `f`, so nothing else reads or writes it meanwhile.
    let values = unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, len) };
    f(values)
}

/// The value of a one-element bool tensor when it is in host memory, `None` on an accelerator:
/// not counted, since reading host memory neither copies from a device nor waits for one. For
/// a CPU-only shortcut that skips work the value makes unnecessary (Denoise's receiver does not
/// multiply a velocity by one); on an accelerator the caller does the work without looking.
pub(crate) fn bool_if_on_cpu(t: &Tensor) -> Option<bool> {
    (t.device() == Device::Cpu && t.numel() == 1).then(|| t.int64_value(&[]) != 0)
}

/// The value of a one-element tensor that lives in host memory on every device, as i64: not
/// counted (the module docs). Panics if `t` is not on the CPU, where reading it would wait for
/// the device.
pub fn cpu_i64_scalar(t: &Tensor) -> i64 {
    assert_eq!(
        t.device(),
        Device::Cpu,
        "host::cpu_i64_scalar reads tensors held in host memory only"
    );
    t.int64_value(&[])
}
