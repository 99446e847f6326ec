"""Non-private training step: dpcomp versus eager PyTorch on the same batch, in one run.

Each round runs `dpcomp bench train --json --batch-out BATCH` (which times our step and writes
the batch it timed), then times the same architecture in eager PyTorch on that batch, in this
process. Rounds alternate so that both see the same machine load; the ratio printed is the median
of the per-round ratios (ours / PyTorch; < 1 means dpcomp is faster).

    .venv/bin/python benches/train_vs_pytorch.py --task cifar10 --batch-size 128
    .venv/bin/python benches/train_vs_pytorch.py --task surnames --batch-size 32

PyTorch's Surnames model uses the fused `nn.LSTM`; ours is unrolled from cells (per-sample
gradients need the per-step activations).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAST_PEAK = None
DTYPES = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
# The paper's learning rates and clipping radii (crates/dpcomp/src/config.rs).
SETTINGS = {"surnames": (2.0, 3.0, 18), "cifar10": (0.1, 5.0, 10), "cifar100": (1.0, 1000.0, 100)}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        t = torch.frombuffer(bytearray(data[start:end]), dtype=DTYPES[meta["dtype"]])
        out[name] = t.reshape(meta["shape"])
    return out


class SurnamesLstm(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.embedding = nn.Embedding(256, 64)
        self.lstm = nn.LSTM(64, 128, batch_first=True)
        self.classifier = nn.Linear(128, classes)

    def forward(self, ids, lengths):
        hs, _ = self.lstm(self.embedding(ids))
        last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, hs.size(2))
        return self.classifier(hs.gather(1, last).squeeze(1))


class CifarCnn(nn.Module):
    def __init__(self, classes):
        super().__init__()
        blocks, c = [], 3
        for out in (32, 64, 128):
            blocks += [nn.Conv2d(c, out, 3), nn.InstanceNorm2d(out), nn.ReLU(),
                       nn.AvgPool2d(2), nn.Dropout2d(0.1)]
            c = out
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(512, 256), nn.ReLU(), nn.Dropout(0.25),
                                  nn.Linear(256, 512), nn.ReLU(), nn.Dropout(0.25), nn.Linear(512, classes))

    def forward(self, x):
        return self.head(self.features(x))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(min(32, cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(min(32, cout), cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(min(32, cout), cout))

    def forward(self, x):
        y = F.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.GroupNorm(32, 64), nn.ReLU())
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Linear(2048, classes)

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 2).flatten(1))


def peak_memory_start(device):
    """Restarts the CUDA peak-memory counter (torch.cuda.reset_peak_memory_stats); no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device):
    """torch.cuda.max_memory_allocated since peak_memory_start; None on the CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def pytorch_step_seconds(task, batch, steps, warmup, device=torch.device("cpu")):
    """Mean seconds of one eager step (each ends in loss.item(), a device sync, as ours ends in
    one), and the parameter count; the peak device memory of one step is stored in LAST_PEAK."""
    global LAST_PEAK
    lr, clip, classes = SETTINGS[task]
    torch.manual_seed(0)
    model = {"surnames": SurnamesLstm, "cifar10": CifarCnn, "cifar100": ResNet18}[task](classes).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    inputs = (batch["ids"], batch["lengths"]) if task == "surnames" else (batch["images"],)
    inputs = tuple(x.to(device) for x in inputs)
    labels = batch["labels"].to(device)

    def step():
        loss = F.cross_entropy(model(*inputs), labels)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss.item()

    peak_memory_start(device)
    step()
    LAST_PEAK = peak_memory_bytes(device)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.mean(times), sum(p.numel() for p in model.parameters())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=sorted(SETTINGS), required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=12)
    ap.add_argument("--dpcomp", default="target/release/dpcomp")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both sides run there)")
    args = ap.parse_args()
    device = torch.device(args.device)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        batch_path = os.path.join(tmp, "batch.safetensors")
        for r in range(args.rounds):
            cmd = [args.dpcomp, "bench", "train", "--task", args.task, "--batch-size", str(args.batch_size),
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--seq-len", str(args.seq_len),
                   "--device", device.type, "--json", "--batch-out", batch_path]
            ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            batch = read_safetensors(batch_path)
            theirs, params = pytorch_step_seconds(args.task, batch, args.steps, args.warmup, device)
            assert params == ours["trainable_parameters"], (params, ours["trainable_parameters"])
            rows.append((ours["mean_step_seconds"], theirs))
            print(f"round {r + 1}: dpcomp {ours['mean_step_seconds'] * 1e3:.2f} ms, "
                  f"PyTorch {theirs * 1e3:.2f} ms, ratio {ours['mean_step_seconds'] / theirs:.3f}", file=sys.stderr)
    ratio = statistics.median(o / t for o, t in rows)
    print(json.dumps({
        "task": args.task, "batch_size": args.batch_size, "steps": args.steps, "rounds": args.rounds,
        "device": str(device), "threads": torch.get_num_threads(), "parameters": params,
        "dpcomp_peak_device_bytes": ours.get("peak_device_bytes"), "pytorch_peak_device_bytes": LAST_PEAK,
        "dpcomp_mean_step_seconds": statistics.median(o for o, _ in rows),
        "pytorch_mean_step_seconds": statistics.median(t for _, t in rows),
        "ratio_dpcomp_over_pytorch": ratio,
    }))


if __name__ == "__main__":
    main()
