#!/usr/bin/env python3
"""Peak resident memory of one ResNet-18 step (CIFAR-100 shapes, GroupNorm, batch 64, one
thread): eager PyTorch without privacy, Opacus's ghost clipping and Opacus's hooks, each in a
process of its own (peak RSS is per process). The scale against which `dpcomp bench dp --task
cifar100`'s DP / non-private memory ratio is read.

    .venv/bin/python benches/memory_vs_opacus.py [--batch-size 64]
"""

import argparse
import json
import os
import resource
import subprocess
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from train_vs_pytorch import ResNet18  # noqa: E402


def one(mode, batch):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResNet18(100)
    xs, ys = torch.randn(batch, 3, 32, 32), torch.randint(0, 100, (batch,))
    optimizer, criterion = torch.optim.SGD(model.parameters(), lr=1.0), nn.CrossEntropyLoss()
    if mode != "plain":
        from opacus import PrivacyEngine

        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=batch)
        made = PrivacyEngine(accountant="rdp").make_private(
            module=model, optimizer=optimizer, data_loader=loader, criterion=criterion,
            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False, grad_sample_mode=mode)
        model, optimizer = made[0], made[1]
        criterion = made[2] if len(made) == 4 else criterion
    for _ in range(2):
        criterion(model(xs), ys).backward()
        optimizer.step()
        optimizer.zero_grad()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(one(args.mode, args.batch_size))
        return
    peaks = {}
    for mode in ["plain", "ghost", "hooks"]:
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--batch-size", str(args.batch_size)],
                             check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        peaks[mode] = int(out.stdout.split()[-1])
    print(json.dumps({
        "model": "resnet18-groupnorm", "batch_size": args.batch_size, "torch": torch.__version__,
        "peak_rss_bytes": peaks,
        "ratio_ghost_over_plain": peaks["ghost"] / peaks["plain"],
        "ratio_hooks_over_plain": peaks["hooks"] / peaks["plain"],
    }))


if __name__ == "__main__":
    main()
