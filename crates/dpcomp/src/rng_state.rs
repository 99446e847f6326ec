//! The state of LibTorch's default CPU generator (`crates/dpcomp/src/rng_state.cpp`; tch can only seed it).
//! Everything random in a CPU run draws from it — Poisson sampling, augmentation, dropout, the
//! seeded noise — so saving it and putting it back gives a computation its own stream: the
//! W-thread reference of data-parallel training (`comm::threads`) swaps each worker's state in
//! and out around every collective, so each thread draws what its process would.

use crate::error::{Error, Result};
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    fn dpcomp_cpu_generator_state() -> *mut C_tensor;
    fn dpcomp_set_cpu_generator_state(state: *mut C_tensor) -> i32;
}

/// A copy of the default CPU generator's state.
pub fn cpu_generator_state() -> Result<Tensor> {
    // SAFETY: returns a new tensor handle this side owns, or null.
    let state = unsafe { dpcomp_cpu_generator_state() };
    if state.is_null() {
        return Err(Error::bad_value(
            "generator",
            "LibTorch could not read the CPU generator's state",
        ));
    }
    // SAFETY: a valid, owned handle.
    Ok(unsafe { Tensor::from_ptr(state) })
}

/// Puts back a state `cpu_generator_state` returned.
pub fn set_cpu_generator_state(state: &Tensor) -> Result<()> {
    let mut state = state.shallow_clone();
    // SAFETY: a valid tensor handle for the duration of the call.
    let done = unsafe { dpcomp_set_cpu_generator_state(state.as_mut_ptr()) };
    if done != 0 {
        return Err(Error::bad_value(
            "generator",
            "LibTorch refused the CPU generator state (not one it wrote?)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_state_replays_the_same_draws() {
        let _serial = crate::test_serial();
        tch::manual_seed(11);
        let state = cpu_generator_state().unwrap();
        let first = Tensor::rand([5], (tch::Kind::Float, tch::Device::Cpu));
        let normal = Tensor::randn([3], (tch::Kind::Double, tch::Device::Cpu));
        set_cpu_generator_state(&state).unwrap();
        assert!(crate::host::equal(
            &Tensor::rand([5], (tch::Kind::Float, tch::Device::Cpu)),
            &first
        ));
        assert!(crate::host::equal(
            &Tensor::randn([3], (tch::Kind::Double, tch::Device::Cpu)),
            &normal
        ));
        assert!(set_cpu_generator_state(&Tensor::from_slice(&[1.0f32])).is_err());
    }
}
