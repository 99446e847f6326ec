//! Device memory of LibTorch's CUDA caching allocator: what PyTorch reports as
//! `torch.cuda.max_memory_allocated` and `torch.cuda.memory_allocated`, and its
//! `reset_peak_memory_stats`. tch exposes none of these; build.rs compiles a few lines of C++
//! (`crates/dpcomp/src/cuda_memory.cpp`) against the wheel's headers when LibTorch has CUDA. Everywhere else
//! (the CPU, or a CPU-only LibTorch) the readings are `None`.

use tch::Device;

#[cfg(dpcomp_cuda_memory)]
mod ffi {
    extern "C" {
        pub fn dpcomp_cuda_peak_allocated(device: i32) -> i64;
        pub fn dpcomp_cuda_allocated(device: i32) -> i64;
        pub fn dpcomp_cuda_reset_peak(device: i32) -> i32;
    }
}

fn cuda_index(device: Device) -> Option<i32> {
    match device {
        Device::Cuda(i) if tch::Cuda::is_available() => Some(i as i32),
        _ => None,
    }
}

/// Peak bytes allocated on `device` since the last `reset_peak` (or the process start).
pub fn peak_allocated(device: Device) -> Option<u64> {
    let _index = cuda_index(device)?;
    #[cfg(dpcomp_cuda_memory)]
    {
        // SAFETY: reads the allocator's statistics for a device that exists; errors come back as -1.
        let bytes = unsafe { ffi::dpcomp_cuda_peak_allocated(_index) };
        u64::try_from(bytes).ok()
    }
    #[cfg(not(dpcomp_cuda_memory))]
    None
}

/// Bytes allocated on `device` now.
pub fn allocated(device: Device) -> Option<u64> {
    let _index = cuda_index(device)?;
    #[cfg(dpcomp_cuda_memory)]
    {
        // SAFETY: as in `peak_allocated`.
        let bytes = unsafe { ffi::dpcomp_cuda_allocated(_index) };
        u64::try_from(bytes).ok()
    }
    #[cfg(not(dpcomp_cuda_memory))]
    None
}

/// Restarts the peak from the current allocation; false where there is nothing to reset.
pub fn reset_peak(device: Device) -> bool {
    let Some(_index) = cuda_index(device) else {
        return false;
    };
    #[cfg(dpcomp_cuda_memory)]
    {
        // SAFETY: as in `peak_allocated`.
        unsafe { ffi::dpcomp_cuda_reset_peak(_index) == 0 }
    }
    #[cfg(not(dpcomp_cuda_memory))]
    false
}

/// Whether this build can read device memory at all (a CUDA LibTorch with its headers).
pub const AVAILABLE: bool = cfg!(dpcomp_cuda_memory);
