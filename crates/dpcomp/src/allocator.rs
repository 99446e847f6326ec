//! Tuning of glibc's allocator, which LibTorch uses for every CPU tensor.
//!
//! By default glibc serves allocations above its mmap threshold (at most 32 MiB) with a fresh
//! `mmap` and returns them with `munmap` when freed. A training step allocates and frees
//! activations, im2col patches and per-sample gradients of that size every step, so every step
//! page-faults them in again and the kernel zeroes each page: profiling the CIFAR-10 CNN's DP
//! step at batch 128 showed about a third of its time there.
//! Serving everything from the heap and never trimming it makes the freed memory reusable by the
//! next step; the process's peak resident memory stays that of its largest step.
//!
//! `dpcomp` calls `keep_freed_memory` first thing; `DPCOMP_SYSTEM_MALLOC=1` leaves glibc's
//! defaults alone (to measure the difference, or when memory must be given back).

/// Serves all allocations from the heap (no mmap) and never trims it. Returns whether the
/// settings were applied (only on glibc targets, and not when `DPCOMP_SYSTEM_MALLOC` is set).
pub fn keep_freed_memory() -> bool {
    if std::env::var_os("DPCOMP_SYSTEM_MALLOC").is_some_and(|v| v != "0") {
        return false;
    }
    apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt only changes glibc's allocation policy; both parameters are documented
    // (mallopt(3)) and take effect for later allocations. It is called before any other thread
    // allocates.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        // mallopt returns 1 on success; a rejected parameter would silently keep the slow path.
        assert!(super::apply());
    }
}
