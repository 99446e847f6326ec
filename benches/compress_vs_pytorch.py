"""Compressor overhead: dpcomp versus PyTorch's own PowerSGD and a GRACE-style DGC, on the same
gradient shapes, in one run.

Rounds alternate `dpcomp bench compress --json` (our compress + decompress per step on the task
model's gradients) with the same work in eager PyTorch on tensors of the shapes that command
reports (`layer_shapes`), seeded N(0, 1) values:

- PowerSGD: PyTorch's `powerSGD_hook` steps for one worker, per tensor as the hook does without
  batching: M = grad.view(rows, -1) + error; P = M Q; `_orthogonalize(P)` (PyTorch's function);
  Q = Mᵀ P; M̂ = P Qᵀ; error = M - M̂; tensors failing `_should_compress` (and vectors) pass
  through. We run ours with `shape=rows` so that both factorise the same matrices.
- DGC: GRACE's `DgcCompressor` + residual memory (Xu et al. 2021, grace_dl/dist/compressor/dgc.py,
  re-written here): threshold from the top of a 1% sample, adjusted up to 10 times by x1.3/x0.7
  until the selection is within [0.7, 1.3] k, then the values at the selected positions; the
  receiver scatters them; the residual keeps the rest. Same k as ours (32 numel / (256 x 64)).
- Denoise (the compression paper's algorithm as crates/dpcomp/src/compress/denoise.rs reads it, layer-wise,
  β 0.9, decay 0.9, fp32 values and 32-bit indices): per layer v = lerp(v, g, 1 - β); the
  candidates v and a + r (a = v - v_prev, r the residual) each keep their k = 32 numel / (rate x
  64) largest magnitudes (`torch.topk`); the one whose dropped part has the smaller squared norm
  is sent (a Python `if` on the comparison: one host read, free on the CPU); sender's mirror and
  receiver each replace their velocity by a sent velocity or add a sent acceleration (zero +
  `index_add_`); r = decay (v - mirror); the update is the receiver's velocity.
- FL-RND (the federated paper's sketch, crates/dpcomp/src/compress/linear_sketch.rs): the update flattened
  (`torch.cat`), m = round(n / rate) coordinates drawn without replacement from a per-step seeded
  generator (NumPy's `Generator.choice(replace=False)`, Floyd's algorithm as Rust's
  `rand::seq::index::sample` uses for small m / n), sorted; sent values `flat[idx]`; the
  receiver zero-fills them back and splits into the parameters' shapes.
- FL-FREQ (crates/dpcomp/src/compress/chunked_dct.rs without the shuffle): the flat update zero-padded into
  P = ceil(n / 1024) chunks of L = ceil(n / P), the first round(L / rate) coefficients of each
  chunk's orthonormal DCT-II sent; the receiver zero-fills the others and inverts. The DCT is
  torch-dct's (zh217/torch-dct, `dct(x, norm='ortho')` and `idct`, re-written here), the eager
  PyTorch DCT people use: Makhoul's (1980) one-FFT algorithm, the same as our crates/dpcomp/src/compress/dct.rs.

Not compared: FL-CS, whose receiver runs 100 OWL-QN iterations of basis pursuit (with host reads
in every line search) per message; a lean peer of that solver is more than this script's scope.

Both sides run with the allocator settings dpcomp gives itself (crates/dpcomp/src/allocator.rs: glibc serves
every allocation from the heap and never trims it, so freed tensors are reused instead of being
page-faulted in again): the script re-executes itself with MALLOC_MMAP_MAX_=0 and
MALLOC_TRIM_THRESHOLD_ set, glibc's environment form of the same two mallopt calls
(`--system-malloc` keeps glibc's defaults for the peers; dpcomp sets its own either way).

Every peer sees the same layer shapes and the same k / rank / m as ours; `check_peers` tests the
peers' DCT against the direct formula before timing. The printed speed-up is PyTorch time /
dpcomp time (median of rounds); >= 1 means ours is at least as fast. The JSON lines also give our
backward pass (ms) and our compress + decompress as a share of it.

    OMP_NUM_THREADS=1 .venv/bin/python benches/compress_vs_pytorch.py --task cifar100 --batch-size 64
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    _orthogonalize,
    _should_compress,
)


def dpcomp(binary, task, batch_size, steps, compressor, extra):
    cmd = [
        binary, "bench", "compress", "--task", task,
        "--batch-size", str(batch_size), "--steps", str(steps), "--rounds", "1",
        "--warmup", "1", "--compressor", compressor, "--json", *extra,
    ]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


class TorchPowerSgd:
    def __init__(self, shapes, rank, min_rate=2.0):
        gen = torch.Generator().manual_seed(0)
        self.layers = []
        for shape in shapes:
            numel = 1
            for s in shape:
                numel *= s
            if len(shape) < 2:
                self.layers.append(None)
                continue
            n, m = shape[0], numel // shape[0]
            r = min(rank, n, m)
            ok, _, _ = _should_compress(n, m, r, min_rate)
            self.layers.append(
                (torch.zeros(n, m), torch.randn(m, r, generator=gen)) if ok else None
            )

    def step(self, grads):
        out = []
        for g, layer in zip(grads, self.layers):
            if layer is None:
                out.append(g.clone())
                continue
            error, q = layer
            matrix = g.reshape(error.shape) + error
            p = matrix @ q
            p3 = p.unsqueeze(0)
            _orthogonalize(p3, 0)
            q.copy_(matrix.t() @ p)
            approx = p @ q.t()
            error.copy_(matrix - approx)
            out.append(approx.reshape(g.shape))
        return out


class GraceDgc:
    """GRACE's DGC compressor with residual memory, one worker."""

    def __init__(self, shapes, rate):
        self.residuals = [torch.zeros(s) for s in shapes]
        self.rate = rate

    def compress(self, tensor):
        numel = tensor.numel()
        k = max(1, min(numel, int(32 * numel / (self.rate * 64))))
        sample_shape = [max(1, int(numel * 0.01))]
        sample_index = torch.empty(sample_shape).uniform_(0, numel).type(torch.long)
        sample_tensor = tensor[sample_index]
        sample_k = max(1, int(sample_shape[0] * k / numel))
        vals, _ = torch.topk(sample_tensor.abs(), sample_k)
        thr = vals.min()
        mask = tensor.abs() >= thr
        selected = mask.sum()
        for _ in range(10):
            if selected > 1.3 * k:
                thr = 1.3 * thr
            elif selected < 0.7 * k:
                thr = 0.7 * thr
            else:
                break
            mask = tensor.abs() >= thr
            selected = mask.sum()
        (indices,) = torch.where(mask)
        values = tensor[indices]
        return values, indices

    def step(self, grads):
        out = []
        for i, g in enumerate(grads):
            flat = (g + self.residuals[i]).flatten()
            values, indices = self.compress(flat)
            dense = torch.zeros_like(flat)
            dense.index_put_([indices], values, accumulate=True)
            self.residuals[i] = (flat - dense).view(g.shape)
            out.append(dense.view(g.shape))
        return out


def round_half_away(x):
    """Rust's `f64::round` (halves away from zero) for x >= 0; Python's `round` rounds to even."""
    return math.floor(x + 0.5)


def sparse_k(numel, rate):
    """k of ours at `budget=bits` with 32-bit values and indices: floor(32 numel / (64 rate))."""
    return max(1, min(numel, int(32 * numel / (rate * 64))))


class LeanDenoise:
    """Denoise, layer-wise, sender and receiver in one process (see the module docstring)."""

    def __init__(self, shapes, rate, beta=0.9, decay=0.9):
        self.shapes = shapes
        self.numels = [math.prod(s) for s in shapes]
        self.rate, self.beta, self.decay = rate, beta, decay
        self.velocity = [torch.zeros(n) for n in self.numels]
        self.residual = [torch.zeros(n) for n in self.numels]
        self.mirror = [torch.zeros(n) for n in self.numels]
        self.received = [torch.zeros(n) for n in self.numels]

    def sparsify(self, x):
        """(indices, values, squared norm of what is dropped), or all of x when sparse is not
        cheaper (64 bits per kept element against 32 per dense value)."""
        n = x.numel()
        k = sparse_k(n, self.rate)
        if self.rate <= 1.0 or k * 64 >= n * 32:
            return None, x.clone(), torch.zeros((), dtype=torch.float64)
        indices = torch.topk(x.abs(), k, sorted=False).indices
        values = x[indices]
        error = (torch.linalg.vector_norm(x).double().square()
                 - values.square().sum(dtype=torch.float64))
        return indices, values, error

    @staticmethod
    def receive(velocity, is_velocity, indices, values):
        if indices is None:
            if is_velocity:
                velocity.copy_(values)
            else:
                velocity.add_(values)
            return
        if is_velocity:
            velocity.zero_()
        velocity.index_add_(0, indices, values)

    def step(self, grads):
        out = []
        for i, g in enumerate(grads):
            old = self.velocity[i]
            velocity = old.lerp(g.reshape(-1), 1.0 - self.beta)
            acceleration = velocity - old + self.residual[i]
            vi, vv, ve = self.sparsify(velocity)
            ai, av, ae = self.sparsify(acceleration)
            is_velocity = bool(ve <= ae)
            indices, values = (vi, vv) if is_velocity else (ai, av)
            self.receive(self.mirror[i], is_velocity, indices, values)
            self.residual[i] = (velocity - self.mirror[i]).mul_(self.decay)
            self.velocity[i] = velocity
            self.receive(self.received[i], is_velocity, indices, values)
            out.append(self.received[i].view(self.shapes[i]))
        return out


class LeanFlRnd:
    """FL-RND: m = round(n / rate) shared-seed coordinates of the flat update, new every step."""

    def __init__(self, shapes, rate, seed=0):
        self.shapes = shapes
        self.sizes = [math.prod(s) for s in shapes]
        self.n = sum(self.sizes)
        self.m = max(1, min(self.n, round_half_away(self.n / rate)))
        self.seed, self.round = seed, 0

    def step(self, grads):
        flat = torch.cat([g.reshape(-1) for g in grads])
        rng = np.random.default_rng([self.seed, self.round])
        index = torch.from_numpy(np.sort(rng.choice(self.n, self.m, replace=False, shuffle=False)))
        values = flat[index]
        self.round += 1
        dense = torch.zeros(self.n)
        dense[index] = values
        return [t.view(s) for t, s in zip(torch.split(dense, self.sizes), self.shapes)]


def dct_ortho(x):
    """torch-dct's `dct(x, norm='ortho')` (zh217/torch-dct): Makhoul's FFT algorithm, last dim."""
    n = x.shape[-1]
    v = torch.cat([x[:, ::2], x[:, 1::2].flip([1])], dim=1)
    vc = torch.view_as_real(torch.fft.fft(v, dim=1))
    k = -torch.arange(n, dtype=x.dtype)[None, :] * math.pi / (2 * n)
    w_r, w_i = torch.cos(k), torch.sin(k)
    out = vc[:, :, 0] * w_r - vc[:, :, 1] * w_i
    out[:, 0] /= math.sqrt(n) * 2
    out[:, 1:] /= math.sqrt(n / 2) * 2
    return 2 * out


def idct_ortho(y):
    """torch-dct's `idct(y, norm='ortho')`, the inverse of `dct_ortho`, last dim."""
    n = y.shape[-1]
    x_v = y.contiguous() / 2
    x_v[:, 0] *= math.sqrt(n) * 2
    x_v[:, 1:] *= math.sqrt(n / 2) * 2
    k = torch.arange(n, dtype=y.dtype)[None, :] * math.pi / (2 * n)
    w_r, w_i = torch.cos(k), torch.sin(k)
    v_t_r = x_v
    v_t_i = torch.cat([x_v[:, :1] * 0, -x_v.flip([1])[:, :-1]], dim=1)
    v_r = v_t_r * w_r - v_t_i * w_i
    v_i = v_t_r * w_i + v_t_i * w_r
    v = torch.fft.irfft(torch.complex(v_r, v_i), n=n, dim=1)
    x = v.new_zeros(v.shape)
    x[:, ::2] += v[:, :n - (n // 2)]
    x[:, 1::2] += v.flip([1])[:, :n // 2]
    return x


class LeanFlFreq:
    """FL-FREQ: the first round(L / rate) DCT-II coefficients of P contiguous chunks of length L."""

    def __init__(self, shapes, rate, chunk=1024):
        self.shapes = shapes
        self.sizes = [math.prod(s) for s in shapes]
        self.n = sum(self.sizes)
        self.chunks = (self.n + chunk - 1) // chunk
        self.length = (self.n + self.chunks - 1) // self.chunks
        self.kept = max(1, min(self.length, round_half_away(self.length / rate)))

    def step(self, grads):
        flat = torch.cat([g.reshape(-1) for g in grads])
        padded = torch.nn.functional.pad(flat, (0, self.chunks * self.length - self.n))
        message = dct_ortho(padded.view(self.chunks, self.length))[:, :self.kept].contiguous()
        full = torch.nn.functional.pad(message, (0, self.length - self.kept))
        dense = idct_ortho(full).reshape(-1)[:self.n]
        return [t.view(s) for t, s in zip(torch.split(dense, self.sizes), self.shapes)]


def check_peers():
    """The peers' DCT against the direct O(n²) formula, and its inverse, on small chunks."""
    n = 37
    x = torch.randn(3, n, dtype=torch.float64)
    j = torch.arange(n, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * j[None, :] + 1) * j[:, None] / (2 * n)) * math.sqrt(2 / n)
    d[0] /= math.sqrt(2)
    assert torch.allclose(dct_ortho(x), x @ d.T, atol=1e-10), "dct_ortho is not the DCT-II"
    assert torch.allclose(idct_ortho(dct_ortho(x)), x, atol=1e-10), "idct_ortho does not invert"


def time_torch(make, shapes, steps):
    compressor = make(shapes)
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(s, generator=gen) for s in shapes]
    compressor.step(grads)
    total = 0.0
    for _ in range(steps):
        update = [g + 0.01 * torch.randn_like(g) for g in grads]
        start = time.perf_counter()
        compressor.step(update)
        total += time.perf_counter() - start
    return total / steps


def print_results(results):
    """Each result as a JSON line, then all of them as a Markdown table."""
    for r in results:
        print(json.dumps(r))
    print("| compressor | peer | dpcomp ms | peer ms | peer / dpcomp | backward ms | dpcomp / backward |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['compressor']} | {r['peer']} | {r['dpcomp_seconds'] * 1e3:.1f} | "
              f"{r['pytorch_seconds'] * 1e3:.1f} | {r['speedup_pytorch_over_dpcomp']:.2f} | "
              f"{r['dpcomp_backward_seconds'] * 1e3:.0f} | {r['dpcomp_ratio_to_backward']:.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="cifar100")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--rate", type=float, default=256.0)
    ap.add_argument("--compressors", default="",
                    help="comma-separated subset of powersgd,dgc,denoise,fl-rnd,fl-freq")
    ap.add_argument("--dpcomp", default="target/release/dpcomp",
                    help="the dpcomp binary to time (e.g. a build of an earlier commit)")
    ap.add_argument("--system-malloc", action="store_true",
                    help="keep glibc's default allocator settings for the PyTorch peers")
    args = ap.parse_args()
    if not args.system_malloc and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        # glibc reads these when the process starts: run again with dpcomp's allocator policy.
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="2147483647")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    torch.set_num_threads(torch.get_num_threads())
    cases = [
        ("powersgd", ["--rank", str(args.rank), "--compressor-option", "shape=rows",
                      "--compressor-option", "epsilon=0"],
         lambda shapes: TorchPowerSgd(shapes, args.rank), "PyTorch powerSGD_hook"),
        ("dgc", ["--rate", str(args.rate)],
         lambda shapes: GraceDgc(shapes, args.rate), "GRACE-style DGC"),
        ("denoise", ["--rate", str(args.rate)],
         lambda shapes: LeanDenoise(shapes, args.rate), "lean PyTorch Denoise"),
        ("fl-rnd", ["--rate", str(args.rate)],
         lambda shapes: LeanFlRnd(shapes, args.rate), "lean PyTorch FL-RND"),
        ("fl-freq", ["--rate", str(args.rate)],
         lambda shapes: LeanFlFreq(shapes, args.rate), "torch-dct FL-FREQ"),
    ]
    chosen = args.compressors.split(",") if args.compressors else [c[0] for c in cases]
    unknown = set(chosen) - {c[0] for c in cases}
    if unknown:
        raise SystemExit(f"--compressors: unknown {sorted(unknown)}; "
                         f"expected some of {[c[0] for c in cases]}")
    check_peers()
    results = []
    for name, extra, make, peer in (c for c in cases if c[0] in chosen):
        ours, theirs, backward = [], [], []
        for r in range(args.rounds):
            report = dpcomp(args.dpcomp, args.task, args.batch_size, args.steps, name, extra)
            shapes = [tuple(s) for s in report["layer_shapes"]]
            ours.append(report["mean_compress_decompress_seconds"])
            backward.append(report["mean_backward_seconds"])
            theirs.append(time_torch(make, shapes, args.steps))
            print(f"{name} round {r + 1}: dpcomp {ours[-1] * 1e3:.2f} ms, {peer} "
                  f"{theirs[-1] * 1e3:.2f} ms, speed-up {theirs[-1] / ours[-1]:.2f}x", flush=True)
        o, t, b = statistics.median(ours), statistics.median(theirs), statistics.median(backward)
        results.append({
            "compressor": report["compressor"], "peer": peer, "task": args.task,
            "dpcomp_seconds": o, "pytorch_seconds": t, "speedup_pytorch_over_dpcomp": t / o,
            "dpcomp_ratio_to_backward": o / b, "dpcomp_backward_seconds": b,
            "dpcomp_threads": report["threads"],
            "threads": torch.get_num_threads(),
            "peer_malloc": "glibc defaults" if args.system_malloc else "heap, never trimmed",
        })
    print_results(results)


if __name__ == "__main__":
    main()
