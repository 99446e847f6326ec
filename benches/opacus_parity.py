#!/usr/bin/env python3
"""Opacus parity: the same private CIFAR-10 training in Opacus and in dpcomp.

Our 100-epoch CIFAR-10 runs at σ 0.8 end near chance, with weights whose norms equal the random
walk the DP noise alone makes (experiments/results/cifar10_dgc_weight_norms.json). This script
asks whether that collapse belongs to DP-SGD at these settings or to our engine: it trains the
same model on the same data at the same settings in Opacus (ghost clipping, Poisson sampling)
and in dpcomp, and prints per epoch the test accuracy of each, the norm of each one's fc1 weight
against the noise's random-walk prediction, and the ε each one's RDP accountant reports.

Settings (dpcomp's `dpcomp_lab::tasks::paper_defaults(Task::Cifar10)`, crates/dpcomp/src/config.rs):
  - model: the paper's CNN, crates/dpcomp/src/models/cifar_cnn.rs, 361,290 parameters (asserted): three blocks
    [Conv 3x3 no padding -> InstanceNorm2d (no affine) -> ReLU -> AvgPool 2 -> Dropout2d 0.1]
    of 32, 64, 128 filters, then fc1 512->256, ReLU, Dropout 0.25, fc2 256->512, ReLU,
    Dropout 0.25, fc3 512->10. The PyTorch module uses dpcomp's parameter names
    (block0.conv.weight, ..., fc1.weight), so dpcomp's safetensors load into it as they are.
  - data: the first --train-size training images in file order (data_batch_1.bin, ...), which is
    dpcomp's --limit-train; the test set's first --test-size images (default all 10,000);
    pixels / 255 normalised by CIFAR-10's per-channel mean (0.4914, 0.4822, 0.4465) and std
    (0.2470, 0.2435, 0.2616) (crates/dpcomp/src/data/cifar.rs); no augmentation (dpcomp's default).
  - DP-SGD: σ 0.8, C 5 (flat clipping), Poisson sampling at q = B / N with expected batch
    B 128 (noised sum divided by B in both), plain SGD lr 0.1 (momentum 0), δ 1e-5, RDP
    accountant, one seed for both (initial weights, batches, noise; the generators differ, so
    the runs are not bit-identical and their initialisations are different draws of the same
    PyTorch default initialisation).

The random-walk prediction: DP-SGD adds N(0, (σC/B)²) to each coordinate of the mean gradient,
so after T steps at learning rate η the noise alone has moved a coordinate by η σ C / B · √T
(experiments/weight_norms.py's noise_walk_per_coordinate), and a tensor of n coordinates by
about √n times that. When a weight's norm equals it, the weight is the accumulated noise.

dpcomp's weights per epoch: `dpcomp train` keeps only its last checkpoint, and a run resumed
after epoch k draws exactly what the uninterrupted run draws in epoch k + 1
(crates/dpcomp/src/train/checkpoint.rs; checked: the weights after a resumed epoch 2 equal an uninterrupted
2-epoch run's bit for bit), so the script trains dpcomp one epoch per invocation (`--resume
--epochs k`) and reads fc1 from checkpoint/model.safetensors after each; dpcomp's test accuracy
and ε per epoch come from its metrics.jsonl. dpcomp runs in a subprocess (one thread) while
Opacus trains in this process (one thread), so the two sides take the machine's two cores.
As a check that the two models compute the same function, dpcomp's final weights are loaded
into the PyTorch CNN and evaluated here: the accuracy must equal dpcomp's own last one.

    DPCOMP_DATA=path/to/data OMP_NUM_THREADS=1 .venv/bin/python benches/opacus_parity.py \\
        --dpcomp bin/dpcomp --epochs 20

Writes experiments/results/opacus_parity.md (the table, also printed) and .json beside it;
dpcomp's run folder is runs/opacus_parity/ (not committed). Opacus is installed into the
virtual environment for benchmarks only (`.venv/bin/pip install opacus`).
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")

PARAMETERS = 361_290
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
LR, SIGMA, CLIP, BATCH, DELTA = 0.1, 0.8, 5.0, 128, 1e-5


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)  # stride 1, no padding, bias
        self.norm = nn.InstanceNorm2d(cout)  # affine=False, track_running_stats=False

    def forward(self, x):
        return F.dropout2d(F.avg_pool2d(F.relu(self.norm(self.conv(x))), 2), 0.1, self.training)


class CifarCnn(nn.Module):
    """dpcomp's CifarCnn (crates/dpcomp/src/models/cifar_cnn.rs), with its parameter names."""

    def __init__(self, classes=10):
        super().__init__()
        self.block0, self.block1, self.block2 = Block(3, 32), Block(32, 64), Block(64, 128)
        self.fc1, self.fc2, self.fc3 = nn.Linear(512, 256), nn.Linear(256, 512), nn.Linear(512, classes)

    def forward(self, x):
        x = self.block2(self.block1(self.block0(x))).flatten(1)
        x = F.dropout(F.relu(self.fc1(x)), 0.25, self.training)
        x = F.dropout(F.relu(self.fc2(x)), 0.25, self.training)
        return self.fc3(x)


def read_cifar(paths, n):
    """The first n records of the binary batch files, in file order: uint8 [n,3,32,32], labels."""
    raw = b"".join(open(p, "rb").read() for p in paths)
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 1 + 3072)[:n]
    assert len(rec) == n, f"asked for {n} images, the files hold {len(rec)}"
    images = torch.from_numpy(rec[:, 1:].copy()).view(n, 3, 32, 32)
    return images, torch.from_numpy(rec[:, 0].astype(np.int64))


def normalise(images):
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        start, end = v["data_offsets"]
        assert v["dtype"] == "F32", (name, v["dtype"])
        out[name] = torch.from_numpy(
            np.frombuffer(raw[8 + n + start : 8 + n + end], dtype=np.float32).reshape(v["shape"]).copy())
    return out


@torch.no_grad()
def accuracy(model, xs, ys, chunk=1000):
    model.eval()
    correct = sum(int((model(xs[i : i + chunk]).argmax(1) == ys[i : i + chunk]).sum()) for i in range(0, len(ys), chunk))
    return correct / len(ys)


def norms(named):
    return {k: float(v.detach().norm()) for k, v in named.items()}


def run_dpcomp(args, out, result):
    """Trains dpcomp one epoch per invocation (resuming), recording fc1 after each epoch."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DPCOMP_DATA=args.data_dir)
    if os.path.exists(out):
        shutil.rmtree(out)
    base = [args.dpcomp, "train", "--task", "cifar10", "--device", "cpu", "--quiet", "--out", out,
            "--seed", str(args.seed), "--limit-train", str(args.train_size), "--limit-test", str(args.test_size),
            "--noise-multiplier", str(SIGMA), "--max-grad-norm", str(CLIP), "--lr", str(LR), "--momentum", "0",
            "--batch-size", str(BATCH), "--sampling", "poisson", "--delta", str(DELTA), "--accountant", "rdp",
            "--augment", "false"]
    try:
        for epoch in range(1, args.epochs + 1):
            cmd = [args.dpcomp, "train", "--out", out, "--resume", "--quiet", "--epochs", str(epoch)] if epoch > 1 \
                else base + ["--epochs", "1"]
            start = time.perf_counter()
            subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
            row = rows[-1]
            assert row["epoch"] == epoch, (row["epoch"], epoch)
            state = json.load(open(f"{out}/checkpoint/state.json"))
            weights = load_safetensors(f"{out}/checkpoint/model.safetensors")
            result["epochs"].append({"epoch": epoch, "steps": state["steps_done"], "test_accuracy": row["test_accuracy"],
                                     "train_loss": row["train_loss"], "epsilon": row["epsilon"],
                                     "norms": norms(weights), "seconds": seconds})
            print(f"dpcomp epoch {epoch}: acc {row['test_accuracy']:.4f} eps {row['epsilon']:.4f} "
                  f"|fc1.weight| {result['epochs'][-1]['norms']['fc1.weight']:.3f} ({seconds:.1f}s)", file=sys.stderr)
        result["final_weights"] = f"{out}/checkpoint/model.safetensors"
        # The run's settings, less the data folder it resolved (this machine's path).
        result["config"] = "".join(line for line in open(f"{out}/config.toml")
                                   if not line.startswith("data_dir = "))
    except BaseException as e:  # reported by the main thread
        result["error"] = repr(e) + (f"\n{e.stderr}" if isinstance(e, subprocess.CalledProcessError) else "")


def run_opacus(args, train, test, result):
    from opacus import PrivacyEngine

    torch.manual_seed(args.seed)
    model = CifarCnn()
    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count == PARAMETERS, f"{count} parameters, dpcomp's CNN has {PARAMETERS}"
    result["init_norms"] = norms(dict(model.named_parameters()))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=BATCH)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, criterion, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader, criterion=nn.CrossEntropyLoss(),
        noise_multiplier=SIGMA, max_grad_norm=CLIP, poisson_sampling=True, grad_sample_mode="ghost")
    result["sample_rate"] = 1 / len(loader)
    result["expected_batch_size"] = optimizer.expected_batch_size
    inner = model._module
    steps = 0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        losses = []
        for xs, ys in loader:
            loss = criterion(model(xs), ys)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            steps += 1
        acc = accuracy(inner, *test)
        eps = engine.get_epsilon(DELTA)
        seconds = time.perf_counter() - start
        result["epochs"].append({"epoch": epoch, "steps": steps, "test_accuracy": acc, "train_loss": float(np.mean(losses)),
                                 "epsilon": eps, "norms": norms(dict(inner.named_parameters())), "seconds": seconds})
        print(f"opacus epoch {epoch}: acc {acc:.4f} eps {eps:.4f} |fc1.weight| "
              f"{result['epochs'][-1]['norms']['fc1.weight']:.3f} ({seconds:.1f}s)", file=sys.stderr)


def walk(steps, n):
    """The DP noise's random walk: per coordinate η σ C / B · √T, a tensor of n about √n times that."""
    return LR * SIGMA * CLIP / BATCH * math.sqrt(steps) * math.sqrt(n)


def table(result):
    s, ours, theirs = result["settings"], result["dpcomp"], result["opacus"]
    n = s["elements"]["fc1.weight"]
    init = math.sqrt(n / (3 * 512))  # E|W|² of PyTorch's default Linear init U(±1/√fan_in): n / (3 fan_in)
    lines = [
        f"Opacus parity, CIFAR-10: the paper's CNN ({PARAMETERS:,} parameters), first {s['train_size']:,} "
        f"training images, {s['test_size']:,} test images, σ {SIGMA}, C {CLIP}, lr {LR} plain SGD, Poisson sampling "
        f"at expected batch {BATCH} (q {s['sample_rate']:g}), δ {DELTA:g}, RDP accountants, seed {s['seed']}, "
        f"{len(ours['epochs'])} epochs. Opacus {theirs['opacus_version']}, ghost clipping. ‖fc1‖ is the L2 norm of fc1.weight "
        f"(n = {n:,} elements). The walk is √n · η σ C / B · √T, what the DP noise alone moves it after T steps "
        f"(experiments/weight_norms.py's prediction); walk ⊕ init adds the initial weights' expected norm "
        f"√(n / (3 · 512)) = {init:.2f} in quadrature (independent), and the ratios are against it. Chance is 10%.",
        "",
        "| epoch | steps T | test acc dpcomp | test acc Opacus | ‖fc1‖ dpcomp | ‖fc1‖ Opacus | walk | walk ⊕ init | "
        "dpcomp / (walk ⊕ init) | Opacus / (walk ⊕ init) | ε dpcomp | ε Opacus |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| 0 | 0 | | {theirs['init_accuracy']:.2%} | | {theirs['init_norms']['fc1.weight']:.2f} | 0 | {init:.2f} | "
        f"| {theirs['init_norms']['fc1.weight'] / init:.3f} | | |",
    ]
    for a, b in zip(ours["epochs"], theirs["epochs"]):
        assert a["steps"] == b["steps"], (a["steps"], b["steps"])
        w = walk(a["steps"], n)
        wi = math.hypot(w, init)
        lines.append(
            f"| {a['epoch']} | {a['steps']} | {a['test_accuracy']:.2%} | {b['test_accuracy']:.2%} | "
            f"{a['norms']['fc1.weight']:.2f} | {b['norms']['fc1.weight']:.2f} | {w:.2f} | {wi:.2f} | "
            f"{a['norms']['fc1.weight'] / wi:.3f} | {b['norms']['fc1.weight'] / wi:.3f} | "
            f"{a['epsilon']:.6f} | {b['epsilon']:.6f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--train-size", type=int, default=6400, help="first N training images, in file order")
    ap.add_argument("--test-size", type=int, default=10_000, help="first N test images")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dpcomp", default="target/release/dpcomp")
    ap.add_argument("--data-dir", default=os.environ.get("DPCOMP_DATA", "data"))
    ap.add_argument("--run-dir", default="runs/opacus_parity", help="dpcomp's run folders go here")
    ap.add_argument("--results", default="experiments/results/opacus_parity",
                    help="writes RESULTS.md and RESULTS.json ('' to write nothing)")
    ap.add_argument("--table-from", metavar="JSON", help="only rewrite the table from a finished run's JSON")
    args = ap.parse_args()
    if args.table_from:
        return report(json.load(open(args.table_from)), args.results)
    torch.set_num_threads(1)
    assert args.train_size % BATCH == 0, "q = B / N: the expected batch must divide the training set for equal steps"

    folder = f"{args.data_dir}/cifar-10-batches-bin"
    train = read_cifar([f"{folder}/data_batch_{i}.bin" for i in range(1, 6)], args.train_size)
    test = read_cifar([f"{folder}/test_batch.bin"], args.test_size)
    train, test = (normalise(train[0]), train[1]), (normalise(test[0]), test[1])

    ours = {"epochs": []}
    out = f"{args.run_dir}/dpcomp-seed{args.seed}-n{args.train_size}"
    worker = threading.Thread(target=run_dpcomp, args=(args, out, ours))
    worker.start()
    import opacus

    theirs = {"epochs": [], "opacus_version": opacus.__version__}
    torch.manual_seed(args.seed)
    probe = CifarCnn()
    theirs["init_accuracy"] = accuracy(probe, *test)  # the seed's initial model, before make_private
    run_opacus(args, train, test, theirs)
    worker.join()
    if "error" in ours:
        sys.exit(f"dpcomp failed: {ours['error']}")

    # The same function: dpcomp's final weights in the PyTorch CNN give dpcomp's own accuracy.
    weights = load_safetensors(ours.pop("final_weights"))
    check = CifarCnn()
    names = dict(check.named_parameters())
    assert sorted(weights) == sorted(names), (sorted(weights), sorted(names))
    assert all(tuple(weights[k].shape) == tuple(names[k].shape) for k in names)
    check.load_state_dict(weights)
    ours["final_accuracy_in_pytorch"] = accuracy(check, *test)

    settings = {"train_size": args.train_size, "test_size": args.test_size, "epochs": args.epochs, "seed": args.seed,
                "lr": LR, "momentum": 0.0, "noise_multiplier": SIGMA, "max_grad_norm": CLIP, "batch_size": BATCH,
                "sample_rate": BATCH / args.train_size, "delta": DELTA, "parameters": PARAMETERS,
                "noise_walk_per_coordinate": {str(e["steps"]): LR * SIGMA * CLIP / BATCH * math.sqrt(e["steps"])
                                              for e in ours["epochs"]},
                "elements": {k: v.numel() for k, v in names.items()}, "threads": torch.get_num_threads(),
                # The data folder is this machine's (DPCOMP_DATA or --data-dir), not part of the record.
                "command": " ".join(["OMP_NUM_THREADS=1", os.path.relpath(sys.executable), *sys.argv])}
    result = {"settings": settings, "dpcomp": ours, "opacus": theirs}
    if args.results:  # the measurements first, so that a failure below loses no training
        os.makedirs(os.path.dirname(args.results) or ".", exist_ok=True)
        json.dump(result, open(f"{args.results}.json", "w"), indent=1)
    report(result, args.results)


def report(result, results):
    md = table(result)
    ours, s = result["dpcomp"], result["settings"]
    md += (f"\ndpcomp's final weights loaded into the PyTorch CNN: {ours['final_accuracy_in_pytorch']:.2%} test accuracy "
           f"(dpcomp's own evaluation: {ours['epochs'][-1]['test_accuracy']:.2%}). Initialisations differ (the same "
           f"PyTorch default scheme, different generators); Opacus's epoch 0 is its initial model. Seconds per epoch "
           f"(the two sides ran at once, one thread each, on a shared 2-core machine): dpcomp "
           f"{np.median([e['seconds'] for e in ours['epochs']]):.1f}, Opacus "
           f"{np.median([e['seconds'] for e in result['opacus']['epochs']]):.1f} (medians; dpcomp's include starting the "
           f"process and loading the data each epoch).\n\nCommand, with `DPCOMP_DATA` set to the data folder: "
           f"`{s['command']}`\n")
    print(md)
    if results:
        open(f"{results}.md", "w").write(md)


if __name__ == "__main__":
    main()
