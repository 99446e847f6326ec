// A process group of PyTorch's c10d on Gloo (the `gloo` cargo feature, `comm::gloo`): the store
// and the group are the wheel's own (`c10d::TCPStore`, `c10d::ProcessGroupGloo`); Gloo's headers
// come from Debian's libgloo-dev. Only the exported constructors, `Options` and
// `createDeviceForHostname` are called, so the headers' older snapshot matches the library's.
// Each function returns 0 (or a group) on success; on failure it writes a malloc'd message to
// `*err`, which the caller frees.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <ATen/ATen.h>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

namespace {
struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

int fail(const std::exception& e, char** err) {
  *err = strdup(e.what());
  return 1;
}

// c10d records every collective in a flight recorder that is one per process and not safe to
// enter from two groups at once (a crash in its map when the ranks of a test run as threads of
// one process); the collectives are queued under one lock and waited for outside it.
std::mutex enqueue_lock;

template <class F>
c10::intrusive_ptr<c10d::Work> enqueue(F f) {
  std::lock_guard<std::mutex> guard(enqueue_lock);
  return f();
}

at::Tensor bytes(uint8_t* data, int64_t n) {
  return at::from_blob(data, {n}, at::TensorOptions().dtype(at::kByte));
}
}  // namespace

extern "C" {
void* dpcomp_gloo_new(const char* store_host, int port, const char* device_host, int rank,
                      int size, int is_server, int64_t timeout_ms, char** err) {
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = is_server != 0;
    o.numWorkers = size;
    o.waitWorkers = false;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(store_host), o);
    // A prefix of its own, so that its keys never meet a launcher's in a shared store.
    auto store = c10::make_intrusive<c10d::PrefixStore>("dpcomp", tcp);
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
    opts->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(std::string(device_host)));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    return new Group{store, pg};
  } catch (const std::exception& e) {
    fail(e, err);
    return nullptr;
  }
}

int dpcomp_gloo_allreduce_f32(void* g, float* data, int64_t n, char** err) {
  try {
    std::vector<at::Tensor> ts{at::from_blob(data, {n}, at::TensorOptions().dtype(at::kFloat))};
    enqueue([&] { return static_cast<Group*>(g)->pg->allreduce(ts); })->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

// `t` (a contiguous tensor on the CPU or CUDA) summed over the ranks, in place.
int dpcomp_gloo_allreduce_tensor(void* g, at::Tensor* t, char** err) {
  try {
    std::vector<at::Tensor> ts{*t};
    enqueue([&] { return static_cast<Group*>(g)->pg->allreduce(ts); })->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

// Every rank's `in` (one dimension, the same length everywhere) into `out` (size times as long,
// on the same device), in rank order.
int dpcomp_gloo_allgather_tensor(void* g, const at::Tensor* in, at::Tensor* out, int size,
                                 char** err) {
  try {
    const int64_t n = in->numel();
    std::vector<at::Tensor> inputs{*in};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size; ++r) outputs[0].push_back(out->narrow(0, r * n, n));
    enqueue([&] { return static_cast<Group*>(g)->pg->allgather(outputs, inputs); })->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

// Every rank's `n` bytes into `out` (size * n bytes, in rank order).
int dpcomp_gloo_allgather_u8(void* g, uint8_t* in, int64_t n, uint8_t* out, int size,
                             char** err) {
  try {
    std::vector<at::Tensor> inputs{bytes(in, n)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size; ++r) outputs[0].push_back(bytes(out + r * n, n));
    enqueue([&] { return static_cast<Group*>(g)->pg->allgather(outputs, inputs); })->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

int dpcomp_gloo_broadcast_u8(void* g, uint8_t* data, int64_t n, int root, char** err) {
  try {
    std::vector<at::Tensor> ts{bytes(data, n)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    enqueue([&] { return static_cast<Group*>(g)->pg->broadcast(ts, o); })->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

int dpcomp_gloo_barrier(void* g, char** err) {
  try {
    enqueue([&] { return static_cast<Group*>(g)->pg->barrier(); })->wait();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err);
  }
}

void dpcomp_gloo_free(void* g) { delete static_cast<Group*>(g); }
}
