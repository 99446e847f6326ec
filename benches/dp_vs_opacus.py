"""DP-SGD step: dpcomp versus Opacus on the same model, batch size and shapes, in one run.

Opacus is installed into the project's virtual environment for this benchmark only
(`.venv/bin/pip install opacus`); the project does not depend on it. Rounds alternate between
`dpcomp bench dp --json` (our DP step on a fixed batch) and Opacus's step in this process on a
batch of the same shape; the printed speed-up is Opacus time / dpcomp time (median of rounds).

    .venv/bin/python benches/dp_vs_opacus.py --task cifar10    # Opacus ghost clipping, batch 128
    .venv/bin/python benches/dp_vs_opacus.py --task surnames   # Opacus DPLSTM (hooks), batch 32, length 12
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from train_vs_pytorch import CifarCnn, ResNet18, SETTINGS, peak_memory_bytes, peak_memory_start  # noqa: E402

warnings.filterwarnings("ignore")


class SurnamesDpLstm(nn.Module):
    def __init__(self, classes):
        super().__init__()
        from opacus.layers import DPLSTM

        self.embedding = nn.Embedding(256, 64)
        self.lstm = DPLSTM(64, 128, batch_first=True)
        self.classifier = nn.Linear(128, classes)

    def forward(self, ids):
        hs, _ = self.lstm(self.embedding(ids))
        return self.classifier(hs[:, -1])


def opacus_step_seconds(task, batch_size, seq_len, sigma, steps, warmup, device=torch.device("cpu")):
    """Mean seconds of one Opacus DP step and the peak device memory of one step (None on CPU)."""
    from opacus import PrivacyEngine

    lr, clip, classes = SETTINGS[task]
    torch.manual_seed(0)
    if task in ("cifar10", "cifar100"):
        model, mode = (CifarCnn if task == "cifar10" else ResNet18)(classes), "ghost"
        xs = torch.randn(batch_size, 3, 32, 32)
    else:
        model, mode = SurnamesDpLstm(classes), "hooks"
        xs = torch.randint(97, 123, (batch_size, seq_len))
    ys = torch.randint(0, classes, (batch_size,))
    model = model.to(device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()
    engine = PrivacyEngine(accountant="rdp")
    made = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader, criterion=criterion,
        noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=False, grad_sample_mode=mode,
    )
    model, optimizer = made[0], made[1]
    criterion = made[2] if len(made) == 4 else criterion
    model.train()
    xs, ys = xs.to(device), ys.to(device)

    def step():
        loss = criterion(model(xs), ys)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    peak_memory_start(device)
    step()
    peak = peak_memory_bytes(device)
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, mode, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=["cifar10", "cifar100", "surnames"], required=True)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=12)
    ap.add_argument("--noise-multiplier", type=float, default=0.8)
    ap.add_argument("--dpcomp", default="target/release/dpcomp")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both sides run there)")
    args = ap.parse_args()
    device = torch.device(args.device)
    batch = args.batch_size or {"cifar10": 128, "cifar100": 64, "surnames": 32}[args.task]
    rows = []
    for r in range(args.rounds):
        cmd = [args.dpcomp, "bench", "dp", "--task", args.task, "--batch-size", str(batch), "--steps", str(args.steps),
               "--rounds", "1", "--warmup", str(args.warmup), "--seq-len", str(args.seq_len),
               "--noise-multiplier", str(args.noise_multiplier), "--device", device.type, "--json"]
        ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        theirs, mode, peak = opacus_step_seconds(args.task, batch, args.seq_len, args.noise_multiplier, args.steps,
                                                 args.warmup, device)
        rows.append((ours["dp_mean_step_seconds"], theirs))
        print(f"round {r + 1}: dpcomp DP {ours['dp_mean_step_seconds'] * 1e3:.2f} ms, Opacus ({mode}) {theirs * 1e3:.2f} ms, "
              f"speed-up {theirs / ours['dp_mean_step_seconds']:.2f}x", file=sys.stderr)
    import opacus
    print(json.dumps({
        "task": args.task, "batch_size": batch, "opacus_version": opacus.__version__, "opacus_mode": mode,
        "device": str(device), "threads": torch.get_num_threads(),
        "dpcomp_dp_peak_device_bytes": ours.get("dp_peak_device_bytes"), "opacus_peak_device_bytes": peak,
        "dpcomp_dp_step_seconds": statistics.median(o for o, _ in rows),
        "opacus_dp_step_seconds": statistics.median(t for _, t in rows),
        "speedup_opacus_over_dpcomp": statistics.median(t / o for o, t in rows),
    }))


if __name__ == "__main__":
    main()
