// Gradient hooks on a tensor, which tch does not expose (torch.Tensor.register_hook): autograd
// calls back into Rust with a tensor's gradient as soon as it is computed, so a layer's output
// gradient can be used (its per-sample norms taken) and dropped within the backward pass
// instead of outliving it (src/nn/grad_hook.rs).
#include <ATen/ATen.h>
#include <cstdint>
#include <memory>

typedef void (*dpcomp_grad_callback)(void *context, at::Tensor *grad);
typedef void (*dpcomp_drop_context)(void *context);

extern "C" {

// Registers callback(context, grad) on `tensor`; `grad` is a new tensor handle the callback
// owns. The hook lives as long as the tensor's autograd node; when that goes, the context is
// handed to drop_context (also when registering fails). 0 on success, -1 when the tensor does
// not require grad or on any other error.
int32_t dpcomp_register_grad_hook(at::Tensor *tensor, dpcomp_grad_callback callback,
                                  void *context, dpcomp_drop_context drop_context) {
  std::shared_ptr<void> owned(context, drop_context);
  try {
    tensor->register_hook(
        [callback, owned](at::Tensor grad) { callback(owned.get(), new at::Tensor(grad)); });
    return 0;
  } catch (...) {
    return -1;
  }
}
}
