// A copy into an existing tensor that does not wait for the device: at::Tensor's
// copy_(src, non_blocking), which tch exposes only blocking. Between pinned host memory and a
// CUDA device the copy is queued on the current stream and the call returns at once; between
// CPU tensors it is a plain copy. Used by src/comm/staging.rs for its reusable host buffers.
#include <ATen/ATen.h>
#include <cstdint>

extern "C" {

// dst.copy_(src, non_blocking != 0); 0 on success, -1 when LibTorch refused (shapes that do not
// broadcast, a kind it cannot convert).
int32_t dpcomp_copy_into(at::Tensor* dst, const at::Tensor* src, int32_t non_blocking) {
  try {
    dst->copy_(*src, non_blocking != 0);
    return 0;
  } catch (...) {
    return -1;
  }
}
}
