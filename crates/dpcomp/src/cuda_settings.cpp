// CUDA's float32 math settings and cuDNN's benchmark mode in LibTorch's global context, the
// settings behind PyTorch's torch.backends.cuda.matmul.fp32_precision,
// torch.backends.cudnn.{conv,rnn}.fp32_precision and torch.backends.cudnn.benchmark, which tch
// does not expose (src/cuda_settings.rs). They are plain flags of at::Context, so they are set
// and read the same with a CPU-only LibTorch; they only change computations on a CUDA device.
// The fp32-precision interface is PyTorch's current one (the older setAllowTF32* calls warn).
#include <ATen/Context.h>
#include <cstdint>

namespace {
at::Float32Op op_of(int32_t op) {
  switch (op) {
    case 0:
      return at::Float32Op::MATMUL;
    case 1:
      return at::Float32Op::CONV;
    default:
      return at::Float32Op::RNN;
  }
}
}  // namespace

extern "C" {

// op: 0 matmul, 1 conv, 2 rnn. tf32 != 0: TF32, else IEEE. 0 on success, -1 on error.
int32_t dpcomp_set_cuda_tf32(int32_t op, int32_t tf32) {
  try {
    at::globalContext().setFloat32Precision(
        at::Float32Backend::CUDA, op_of(op),
        tf32 ? at::Float32Precision::TF32 : at::Float32Precision::IEEE);
    return 0;
  } catch (...) {
    return -1;
  }
}

// 1 when CUDA's float32 `op` runs in TF32, 0 when not, -1 on error.
int32_t dpcomp_cuda_tf32(int32_t op) {
  try {
    return at::globalContext().float32Precision(at::Float32Backend::CUDA, op_of(op)) ==
                   at::Float32Precision::TF32
               ? 1
               : 0;
  } catch (...) {
    return -1;
  }
}

void dpcomp_set_cudnn_benchmark(int32_t on) { at::globalContext().setBenchmarkCuDNN(on != 0); }

int32_t dpcomp_cudnn_benchmark() { return at::globalContext().benchmarkCuDNN() ? 1 : 0; }
}
