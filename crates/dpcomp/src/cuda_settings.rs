//! CUDA's math settings (`[cuda]`, `config::CudaSettings`): TF32 for float32 matrix
//! products and for cuDNN's convolutions and RNNs, and cuDNN's benchmark mode, with PyTorch's
//! defaults (matrix products in full float32, cuDNN in TF32, no benchmark). The `Trainer`
//! applies a run's settings when it runs on a CUDA device; on the CPU they change nothing and
//! are not applied, so a process that trains on the CPU keeps LibTorch's globals as they were.
//!
//! ```
//! use dpcomp::config::CudaSettings;
//! let pytorch = CudaSettings::default();
//! assert!(!pytorch.tf32_matmul && pytorch.tf32_cudnn && !pytorch.cudnn_benchmark);
//! ```

use crate::config::CudaSettings;
use crate::error::{Error, Result};

mod ffi {
    extern "C" {
        pub fn dpcomp_set_cuda_tf32(op: i32, tf32: i32) -> i32;
        pub fn dpcomp_cuda_tf32(op: i32) -> i32;
        pub fn dpcomp_set_cudnn_benchmark(on: i32);
        pub fn dpcomp_cudnn_benchmark() -> i32;
    }
}

/// at::Float32Op as `cuda_settings.cpp` numbers it.
const MATMUL: i32 = 0;
const CONV: i32 = 1;
const RNN: i32 = 2;

/// Sets LibTorch's process-wide CUDA math flags to `settings` (what PyTorch's
/// `torch.backends` setters do). They stay set for the process.
pub fn apply(settings: &CudaSettings) -> Result<()> {
    let set = |op: i32, tf32: bool, name: &str| {
        // SAFETY: plain setters of LibTorch's global context; they catch C++ exceptions.
        if unsafe { ffi::dpcomp_set_cuda_tf32(op, i32::from(tf32)) } == 0 {
            Ok(())
        } else {
            Err(Error::bad_value(
                name,
                "LibTorch refused to set CUDA's float32 precision",
            ))
        }
    };
    set(MATMUL, settings.tf32_matmul, "cuda.tf32_matmul")?;
    set(CONV, settings.tf32_cudnn, "cuda.tf32_cudnn")?;
    set(RNN, settings.tf32_cudnn, "cuda.tf32_cudnn")?;
    // SAFETY: a plain setter of LibTorch's global context.
    unsafe { ffi::dpcomp_set_cudnn_benchmark(i32::from(settings.cudnn_benchmark)) };
    Ok(())
}

/// The process's CUDA math flags as LibTorch holds them now (`tf32_cudnn` is the convolutions').
pub fn current() -> CudaSettings {
    // SAFETY: plain getters of LibTorch's global context; they catch C++ exceptions (-1).
    let tf32 = |op: i32| unsafe { ffi::dpcomp_cuda_tf32(op) } == 1;
    CudaSettings {
        tf32_matmul: tf32(MATMUL),
        tf32_cudnn: tf32(CONV),
        cudnn_benchmark: unsafe { ffi::dpcomp_cudnn_benchmark() } == 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LibTorch starts with PyTorch's defaults, which are the settings' defaults; every flag set
    /// reads back; the defaults are restored at the end (the flags are process-wide).
    #[test]
    fn the_flags_start_at_pytorchs_defaults_and_read_back_what_was_set() {
        let _serial = crate::test_serial();
        assert_eq!(current(), CudaSettings::default());
        let flipped = CudaSettings {
            tf32_matmul: true,
            tf32_cudnn: false,
            cudnn_benchmark: true,
        };
        apply(&flipped).unwrap();
        assert_eq!(current(), flipped);
        // SAFETY: a getter; RNNs follow tf32_cudnn.
        assert_eq!(unsafe { ffi::dpcomp_cuda_tf32(RNN) }, 0);
        apply(&CudaSettings::default()).unwrap();
        assert_eq!(current(), CudaSettings::default());
    }
}
