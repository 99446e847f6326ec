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

#include <torch/csrc/autograd/function.h>
#include <unordered_map>
#include <unordered_set>
#include <vector>

extern "C" {

// For each of `count` tensors on the autograd graph: writes 1 to reaches_other[k] when the
// backward pass from tensor k's node (grad_fn) goes on to the node of another of the tensors,
// 0 when it does not (tensor k is among the earliest on the graph: no other one is upstream of
// it). A backward pass asked for the gradients of the tensors marked 0 then runs through the
// nodes of all the others. 0 on success, -1 on any error.
int32_t dpcomp_reaches_another(at::Tensor **tensors, int64_t count, uint8_t *reaches_other) {
  try {
    using torch::autograd::Node;
    std::unordered_set<Node *> marked;
    std::vector<Node *> nodes(count, nullptr);
    for (int64_t k = 0; k < count; ++k) {
      nodes[k] = tensors[k]->grad_fn().get();
      if (nodes[k] != nullptr) marked.insert(nodes[k]);
    }
    // reaches[n]: n is a marked node or leads to one (memoised over one depth-first walk; the
    // graph is acyclic).
    std::unordered_map<Node *, bool> reaches;
    auto reaches_marked = [&](Node *start) -> bool {
      std::vector<std::pair<Node *, size_t>> stack{{start, 0}};
      while (!stack.empty()) {
        auto &[node, next] = stack.back();
        if (next == 0 && reaches.count(node) == 0 && marked.count(node) != 0) {
          reaches[node] = true;
        }
        if (reaches.count(node) != 0 && next == 0) {
          stack.pop_back();
          continue;
        }
        const auto &edges = node->next_edges();
        bool pushed = false;
        while (next < edges.size()) {
          Node *child = edges[next].function.get();
          ++next;
          if (child != nullptr && reaches.count(child) == 0) {
            stack.push_back({child, 0});
            pushed = true;
            break;
          }
        }
        if (pushed) continue;
        bool any = false;
        for (const auto &edge : edges) {
          Node *child = edge.function.get();
          if (child != nullptr && reaches[child]) {
            any = true;
            break;
          }
        }
        reaches[node] = any;
        stack.pop_back();
      }
      return reaches[start];
    };
    for (int64_t k = 0; k < count; ++k) {
      uint8_t found = 0;
      if (nodes[k] != nullptr) {
        for (const auto &edge : nodes[k]->next_edges()) {
          Node *child = edge.function.get();
          if (child != nullptr && reaches_marked(child)) {
            found = 1;
            break;
          }
        }
      }
      reaches_other[k] = found;
    }
    return 0;
  } catch (...) {
    return -1;
  }
}
}
