// Average pooling over 2x2 windows with stride 2 (no padding, floor mode) on contiguous float32
// CPU tensors, as an autograd function: the paper's CIFAR-10 CNN pools after each of its three
// blocks, and LibTorch's general CPU kernels for it (cpu_avg_pool2d and its backward, which
// recompute the window's bounds and divisor for every output element) took about a fifth of
// that model's training step on one core (src/nn/pool.rs). The arithmetic is LibTorch's, bit for
// bit: each output is ((((0 + x00) + x01) + x10) + x11) / 4 and each covered input's gradient
// 0 + g / 4; an input the windows do not cover (the last row or column of an odd size) gets 0.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <cstdint>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Planes (image, channel) per parallel task: enough work to amortise a task's start.
constexpr int64_t PLANES_PER_TASK = 16;

at::Tensor pool_forward(const at::Tensor &input) {
  const at::Tensor x = input.contiguous();
  const int64_t planes = x.size(0) * x.size(1);
  const int64_t height = x.size(2), width = x.size(3);
  const int64_t rows = height / 2, cols = width / 2;
  at::Tensor out = at::empty({x.size(0), x.size(1), rows, cols}, x.options());
  const float *src = x.data_ptr<float>();
  float *dst = out.data_ptr<float>();
  at::parallel_for(0, planes, PLANES_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float *plane = src + p * height * width;
      float *o = dst + p * rows * cols;
      for (int64_t i = 0; i < rows; ++i) {
        const float *top = plane + 2 * i * width;
        const float *bottom = top + width;
        float *line = o + i * cols;
        for (int64_t j = 0; j < cols; ++j) {
          float sum = 0.0f;
          sum += top[2 * j];
          sum += top[2 * j + 1];
          sum += bottom[2 * j];
          sum += bottom[2 * j + 1];
          line[j] = sum / 4.0f;
        }
      }
    }
  });
  return out;
}

at::Tensor pool_backward(const at::Tensor &grad_output, int64_t height, int64_t width) {
  const at::Tensor g = grad_output.contiguous();
  const int64_t planes = g.size(0) * g.size(1);
  const int64_t rows = g.size(2), cols = g.size(3);
  at::Tensor grad = at::empty({g.size(0), g.size(1), height, width}, g.options());
  const float *src = g.data_ptr<float>();
  float *dst = grad.data_ptr<float>();
  at::parallel_for(0, planes, PLANES_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float *line_grads = src + p * rows * cols;
      float *plane = dst + p * height * width;
      for (int64_t i = 0; i < rows; ++i) {
        const float *go = line_grads + i * cols;
        float *top = plane + 2 * i * width;
        float *bottom = top + width;
        for (int64_t j = 0; j < cols; ++j) {
          const float share = 0.0f + go[j] / 4.0f;
          top[2 * j] = share;
          top[2 * j + 1] = share;
          bottom[2 * j] = share;
          bottom[2 * j + 1] = share;
        }
        if (width > 2 * cols) {
          top[width - 1] = 0.0f;
          bottom[width - 1] = 0.0f;
        }
      }
      if (height > 2 * rows) {
        float *last = plane + (height - 1) * width;
        for (int64_t j = 0; j < width; ++j) {
          last[j] = 0.0f;
        }
      }
    }
  });
  return grad;
}

struct AvgPool2x2 : public torch::autograd::Function<AvgPool2x2> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &input) {
    ctx->saved_data["height"] = input.size(2);
    ctx->saved_data["width"] = input.size(3);
    return pool_forward(input);
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    const int64_t height = ctx->saved_data["height"].toInt();
    const int64_t width = ctx->saved_data["width"].toInt();
    return {pool_backward(grads[0], height, width)};
  }
};

} // namespace

extern "C" {

// A new tensor handle: the 2x2, stride-2 average pool of `input` ([B, C, H, W], float32, CPU,
// H and W at least 2), recorded on the autograd graph when `input` requires grad; null on error
// or for an input outside that (the caller then uses LibTorch's avg_pool2d).
at::Tensor *dpcomp_avg_pool2x2(const at::Tensor *input) {
  try {
    const at::Tensor &x = *input;
    if (x.dim() != 4 || x.scalar_type() != at::kFloat || !x.device().is_cpu() ||
        x.size(2) < 2 || x.size(3) < 2) {
      return nullptr;
    }
    return new at::Tensor(AvgPool2x2::apply(x));
  } catch (...) {
    return nullptr;
  }
}
}
