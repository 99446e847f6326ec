// A process group of PyTorch's c10d on NCCL (the `nccl` cargo feature, `comm::nccl`): the wheel's
// own `c10d::ProcessGroupNCCL` over a client of the job's `c10d::TCPStore` (the one the Gloo
// group of the same job hosts or joins), under a prefix of its own. It compiles against the
// wheel's headers, NCCL's `nccl.h` (nvidia-nccl-cu13) and the CUDA runtime's headers
// (nvidia-cuda-runtime, -crt and -cccl), and links the wheel's libtorch_cuda; no GPU is needed
// to build it. Only CUDA tensors go through it: a collective is queued on NCCL's stream and the
// current stream of the tensor's device waits for it (`Work::wait`), so the host never blocks.
// Each function returns 0 (or a group) on success; on failure it writes a malloc'd message to
// `*err`, which the caller frees.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cstdint>
#include <cstring>
#include <string>

namespace {
struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
};

int fail(const std::exception& e, char** err) {
  *err = strdup(e.what());
  return 1;
}
}  // namespace

extern "C" {
// Joins the store at `store_host:port` as a client and makes rank `rank` of `size` on CUDA
// device `device`. NCCL's communicator itself is made at the first collective.
void* dpcomp_nccl_new(const char* store_host, int port, int rank, int size, int device,
                      int64_t timeout_ms, char** err) {
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = false;
    o.numWorkers = size;
    o.waitWorkers = false;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(store_host), o);
    // A prefix of its own: the Gloo group of the same job uses "dpcomp" in the same store.
    auto store = c10::make_intrusive<c10d::PrefixStore>("dpcomp-nccl", tcp);
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    pg->setBoundDeviceId(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
    return new Group{store, pg};
  } catch (const std::exception& e) {
    fail(e, err);
    return nullptr;
  }
}

// `t` (a contiguous CUDA tensor) summed over the ranks, in place; the current stream waits.
int dpcomp_nccl_allreduce_tensor(void* g, at::Tensor* t, char** err) {
  try {
    std::vector<at::Tensor> ts{*t};
    static_cast<Group*>(g)->pg->allreduce(ts)->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

// Every rank's `in` (one dimension, the same length everywhere) into `out` (size times as long,
// contiguous, on the same device), in rank order; the current stream waits.
int dpcomp_nccl_allgather_tensor(void* g, const at::Tensor* in, at::Tensor* out, char** err) {
  try {
    at::Tensor input = *in;
    at::Tensor output = *out;
    static_cast<Group*>(g)->pg->_allgather_base(output, input)->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

// Ends NCCL's communicators and the group's watchdog before the group is freed.
void dpcomp_nccl_free(void* g) {
  auto* group = static_cast<Group*>(g);
  try {
    group->pg->shutdown();
  } catch (const std::exception&) {
    // A communicator that never started has nothing to end.
  }
  delete group;
}
}
