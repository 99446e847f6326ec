// Peak CUDA memory of LibTorch's caching allocator, the numbers behind PyTorch's
// torch.cuda.max_memory_allocated / reset_peak_memory_stats, which tch does not expose.
// Goes through c10's device-generic allocator interface, so it needs no CUDA headers; with a
// CPU-only LibTorch no CUDA allocator is registered and every call returns -1 (src/cuda_memory.rs).
#include <c10/core/CachingDeviceAllocator.h>
#include <cstdint>

extern "C" {

// Bytes: peak allocated since the last reset (stat type 0 = aggregate over pools); -1 on error.
int64_t dpcomp_cuda_peak_allocated(int32_t device) {
  try {
    auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                     ->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return stats.allocated_bytes[0].peak;
  } catch (...) {
    return -1;
  }
}

// Bytes currently allocated; -1 on error.
int64_t dpcomp_cuda_allocated(int32_t device) {
  try {
    auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                     ->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return stats.allocated_bytes[0].current;
  } catch (...) {
    return -1;
  }
}

// 0 on success, -1 on error.
int32_t dpcomp_cuda_reset_peak(int32_t device) {
  try {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)
        ->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return 0;
  } catch (...) {
    return -1;
  }
}
}
