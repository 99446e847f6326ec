// The state of LibTorch's default CPU generator, which tch cannot read or set (only seed): the
// W-thread reference of data-parallel training gives every worker thread its own stream by
// swapping the state in and out around each collective (src/rng_state.rs).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <cstdint>
#include <mutex>

extern "C" {

// A new tensor handle holding a copy of the generator's state; null on error.
at::Tensor *dpcomp_cpu_generator_state() {
  try {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    return new at::Tensor(generator.get_state());
  } catch (...) {
    return nullptr;
  }
}

// Sets the generator's state from one `dpcomp_cpu_generator_state` returned. 0 on success.
int32_t dpcomp_set_cpu_generator_state(at::Tensor *state) {
  try {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(*state);
    return 0;
  } catch (...) {
    return -1;
  }
}
}
