// Gradient hooks on a recorded layer's output, which tch does not expose (what
// torch.Tensor.register_hook installs, registered on the output's autograd node so that the
// output itself need not be held): autograd calls back into Rust with the output's gradient as
// soon as it is computed, so a layer's output gradient can be used (its per-sample norms taken)
// and dropped within the backward pass instead of outliving it (src/nn/grad_hook.rs). Also the
// graph walk that finds the earliest recorded outputs and the backward pass to them.
#include <ATen/ATen.h>
#include <cstdint>
#include <memory>

typedef void (*dpcomp_grad_callback)(void *context, at::Tensor *grad);
typedef void (*dpcomp_drop_context)(void *context);

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <unordered_map>
#include <unordered_set>
#include <vector>

// Where a recorded output's gradient enters the autograd graph, held instead of the output so
// that the output's memory can go as soon as autograd no longer needs it (a norm layer's
// output, for one, which the following ReLU does not save). `node` is the output's grad_fn
// (null for a leaf or a tensor without grad: off the graph); `edge` is (grad_fn, output_nr) or,
// for a leaf that requires grad, its gradient accumulator (what a backward pass asked for the
// tensor's gradient targets).
struct DpcompEdge {
  std::shared_ptr<torch::autograd::Node> node;
  torch::autograd::Edge edge;
};

// A tensor pre-hook on one of a node's outputs: autograd calls it with the gradients of the
// node's outputs as they arrive, before the node runs (what Tensor::register_hook installs for
// a non-leaf tensor, without holding the tensor). Undefined gradients are not handed on.
struct DpcompPreHook : torch::autograd::FunctionPreHook {
  DpcompPreHook(uint32_t index, dpcomp_grad_callback callback, std::shared_ptr<void> owned)
      : index_(index), callback_(callback), owned_(std::move(owned)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list &grads) override {
    if (index_ < grads.size() && grads[index_].defined()) {
      callback_(owned_.get(), new at::Tensor(grads[index_]));
    }
    return grads;
  }
  uint32_t index_;
  dpcomp_grad_callback callback_;
  std::shared_ptr<void> owned_;
};

extern "C" {

// The edge of `tensor` (see DpcompEdge); null on error.
DpcompEdge *dpcomp_gradient_edge(at::Tensor *tensor) {
  try {
    auto held = new DpcompEdge();
    held->node = tensor->grad_fn();
    if (tensor->requires_grad()) held->edge = torch::autograd::impl::gradient_edge(*tensor);
    return held;
  } catch (...) {
    return nullptr;
  }
}

void dpcomp_edge_free(DpcompEdge *edge) { delete edge; }

// Registers callback(context, grad) on the output of `edge`'s node that the edge names, as a
// tensor hook on that output would; the hook lives as long as the node, and the context is then
// handed to drop_context (also when registering fails). 0 on success, -1 when the edge is off
// the graph or on any other error.
int32_t dpcomp_register_edge_hook(DpcompEdge *edge, dpcomp_grad_callback callback, void *context,
                                  dpcomp_drop_context drop_context) {
  std::shared_ptr<void> owned(context, drop_context);
  try {
    if (!edge->node) return -1;
    edge->node->add_tensor_pre_hook(
        std::make_unique<DpcompPreHook>(edge->edge.input_nr, callback, owned));
    return 0;
  } catch (...) {
    return -1;
  }
}

// The gradients of `root` (a scalar) at the `count` edges, as at::autograd's grad() computes
// them for tensors (tch's run_backward: no accumulation into .grad); `outputs[k]` receives a new
// tensor handle, undefined where no gradient reaches. 0 on success, -1 on any error.
int32_t dpcomp_backward_to_edges(at::Tensor *root, DpcompEdge **edges, int64_t count,
                                 int32_t keep_graph, at::Tensor **outputs) {
  try {
    std::vector<torch::autograd::Edge> roots{torch::autograd::impl::gradient_edge(*root)};
    std::vector<torch::autograd::Variable> grads{at::ones_like(*root)};
    std::vector<torch::autograd::Edge> targets;
    for (int64_t k = 0; k < count; ++k) {
      if (!edges[k]->edge.is_valid()) return -1;
      targets.push_back(edges[k]->edge);
    }
    auto found = torch::autograd::Engine::get_default_engine().execute(
        roots, grads, keep_graph != 0, false, false, targets);
    for (int64_t k = 0; k < count; ++k) outputs[k] = new at::Tensor(found[k]);
    return 0;
  } catch (...) {
    return -1;
  }
}

// For each of `count` edges: writes 1 to reaches_other[k] when the backward pass from edge k's
// node goes on to the node of another of the edges, 0 when it does not (edge k is among the
// earliest on the graph: no other one is upstream of it). A backward pass asked for the
// gradients at the edges marked 0 then runs through the nodes of all the others. An edge off
// the graph reaches nothing. 0 on success, -1 on any error.
int32_t dpcomp_edges_reach_another(DpcompEdge **edges, int64_t count, uint8_t *reaches_other) {
  try {
    using torch::autograd::Node;
    std::unordered_set<Node *> marked;
    std::vector<Node *> nodes(count, nullptr);
    for (int64_t k = 0; k < count; ++k) {
      nodes[k] = edges[k]->node.get();
      if (nodes[k] != nullptr) marked.insert(nodes[k]);    }
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

// Drops a tensor's accumulated gradient, so that its memory goes (what PyTorch's
// zero_grad(set_to_none=True) does for a parameter). 0 on success, -1 on any error.
int32_t dpcomp_clear_grad(at::Tensor *tensor) {
  try {
    tensor->mutable_grad().reset();
    return 0;
  } catch (...) {
    return -1;
  }
}
}
