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

The printed speed-up is PyTorch time / dpcomp time (median of rounds); >= 1 means ours is at
least as fast.

    .venv/bin/python benches/compress_vs_pytorch.py --task cifar100 --batch-size 64
"""
import argparse
import json
import statistics
import subprocess
import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    _orthogonalize,
    _should_compress,
)


def dpcomp(task, batch_size, steps, compressor, extra):
    cmd = [
        "target/release/dpcomp", "bench", "compress", "--task", task,
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="cifar100")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--rate", type=float, default=256.0)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    cases = [
        ("powersgd", ["--rank", str(args.rank), "--compressor-option", "shape=rows",
                      "--compressor-option", "epsilon=0"],
         lambda shapes: TorchPowerSgd(shapes, args.rank), "PyTorch powerSGD_hook"),
        ("dgc", ["--rate", str(args.rate)],
         lambda shapes: GraceDgc(shapes, args.rate), "GRACE-style DGC"),
    ]
    results = []
    for name, extra, make, peer in cases:
        ours, theirs = [], []
        for r in range(args.rounds):
            report = dpcomp(args.task, args.batch_size, args.steps, name, extra)
            shapes = [tuple(s) for s in report["layer_shapes"]]
            ours.append(report["mean_compress_decompress_seconds"])
            theirs.append(time_torch(make, shapes, args.steps))
            print(f"{name} round {r + 1}: dpcomp {ours[-1] * 1e3:.2f} ms, {peer} "
                  f"{theirs[-1] * 1e3:.2f} ms, speed-up {theirs[-1] / ours[-1]:.2f}x", flush=True)
        o, t = statistics.median(ours), statistics.median(theirs)
        results.append({
            "compressor": report["compressor"], "peer": peer, "task": args.task,
            "dpcomp_seconds": o, "pytorch_seconds": t, "speedup_pytorch_over_dpcomp": t / o,
            "dpcomp_ratio_to_backward": report["ratio_compress_over_backward"],
            "threads": torch.get_num_threads(),
        })
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
