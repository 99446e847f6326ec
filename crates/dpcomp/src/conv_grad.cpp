// The weight gradient of a 2-D convolution alone: at::convolution_backward with only the weight's
// output asked for, which tch does not expose. The clipped sum of a convolution's per-sample
// gradients, Σ_i c_i g_i, is this gradient for the output gradient scaled per example by c_i
// (src/nn/per_sample.rs): the same kernel a non-private step runs for its weight gradient,
// without cutting the input's patches.
#include <ATen/ATen.h>
#include <cstdint>
#include <vector>

extern "C" {

// A new tensor handle holding d/dW of Σ grad_output ⊙ conv2d(input, W) for W of `weight_size`
// (4 values), square stride and padding, no dilation, `groups` groups; null on error.
at::Tensor *dpcomp_conv2d_weight_grad(const at::Tensor *grad_output, const at::Tensor *input,
                                      const int64_t *weight_size, int64_t stride,
                                      int64_t padding, int64_t groups) {
  try {
    std::vector<int64_t> size(weight_size, weight_size + 4);
    // Only the weight's sizes and options are read for its gradient.
    auto weight = at::empty(size, input->options());
    auto grads = at::convolution_backward(*grad_output, *input, weight, std::nullopt,
                                          {stride, stride}, {padding, padding}, {1, 1}, false,
                                          {0, 0}, groups, {false, true, false});
    return new at::Tensor(std::get<1>(grads));
  } catch (...) {
    return nullptr;
  }
}
}
