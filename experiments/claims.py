#!/usr/bin/env python3
"""The numbers behind the README's verdict table for the compression paper.

Reads the committed logs of the full-profile grids under experiments/runs/ (summary.json,
metrics.jsonl, grad_error.jsonl, config.toml of every finished cell; a log is read from its
packed form metrics.jsonl.gz when the plain file is not there) and prints, per claim of
Lin, "On the Interaction Between Differential Privacy and Gradient Compression in Deep
Learning" (2022), our measurement: mean and sample standard
deviation over seeds, and for a difference its standard error sqrt(sd1^2/n1 + sd2^2/n2). A
difference counts as outside seed noise when it is more than twice its standard error.

    python3 experiments/claims.py [--runs experiments/runs]

Standard library only (tomllib: Python 3.11 or later).
"""

import argparse
import gzip
import json
import math
import statistics
import tomllib
from pathlib import Path


def flat_config(path):
    """A run's config.toml as one flat dict of strings: the sections' settings (`[privacy]
    noise_multiplier`) beside the top-level keys, as the runs written before the sections hold
    them. The names this script reads are unique across sections."""
    with open(path, "rb") as f:
        table = tomllib.load(f)
    flat = {}
    for key, value in table.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            flat[k] = str(v)
    return flat


def read_log(path):
    """The rows of a run's log: `path` (X.jsonl), or else its packed form X.jsonl.gz, as dpcomp
    reads it; none when neither exists."""
    packed = path.with_name(path.name + ".gz")
    if path.is_file():
        text = path.read_text()
    elif packed.is_file():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return []
    return [json.loads(l) for l in text.splitlines() if l.strip()]


def read_cells(root):
    """Every finished cell below root (a grid's profile folder) as a dict."""
    cells = []
    if not root.is_dir():
        return cells
    for d in sorted(root.iterdir()):
        summary = d / "summary.json"
        if not summary.is_file():
            continue
        config = flat_config(d / "config.toml")
        metrics = read_log(d / "metrics.jsonl")
        errors = read_log(d / "grad_error.jsonl")
        s = json.loads(summary.read_text())
        cells.append(
            {
                "name": d.name,
                "sigma": float(config.get("noise_multiplier", "0")),
                "rate": float(config.get("rate", "1")),
                "rank": int(config.get("rank", "1")),
                "C": float(config["max_grad_norm"]),
                "compressor": s["compressor"],
                "seed": int(config["seed"]),
                "final": 100.0 * s["final_accuracy"],
                "epsilon": s.get("epsilon"),
                "paper_gib": s.get("upstream_paper_gib"),
                "curve": [100.0 * m["test_accuracy"] for m in metrics],
                # A run whose training loss became NaN (written as null) has diverged.
                "diverged": next((m["epoch"] for m in metrics if m["train_loss"] is None), None),
                "errors": errors,
            }
        )
    return cells


def stats(values):
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else float("nan")
    return mean, sd, n


def fmt(values):
    mean, sd, n = stats(values)
    if n > 1:
        return f"{mean:.1f} ± {sd:.1f} (n {n})"
    return f"{mean:.1f} (n 1)"


def diff(a, b):
    """a - b with its standard error and whether it is outside seed noise (> 2 SE)."""
    ma, sa, na = stats(a)
    mb, sb, nb = stats(b)
    if na < 2 or nb < 2:
        return f"{ma - mb:+.1f} (one seed: no spread)"
    se = math.sqrt(sa * sa / na + sb * sb / nb)
    verdict = "outside seed noise" if abs(ma - mb) > 2 * se else "within seed noise"
    return f"{ma - mb:+.1f} ± {se:.1f} SE, {verdict}"


def select(cells, **want):
    return [c for c in cells if all(c[k] == v for k, v in want.items())]


def finals(cells, **want):
    """Final accuracies of the cells that did not diverge (those are listed separately)."""
    return [c["final"] for c in select(cells, **want) if not c["diverged"]]


def mean_curve(cells):
    cells = [c for c in cells if not c["diverged"]]
    length = min(len(c["curve"]) for c in cells)
    return [statistics.fmean(c["curve"][e] for c in cells) for e in range(length)]


def epsilon_of(cells, sigma):
    found = [c["epsilon"] for c in cells if c["sigma"] == sigma and c["epsilon"]]
    return f"{found[0]:.2f}" if found else "n/a"


def stage(record, name):
    return next(s for s in record["stages"] if s["stage"] == name)


def spearman(x, y):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="experiments/runs", type=Path)
    args = parser.parse_args()
    dgc = read_cells(args.runs / "surnames_dgc" / "full")
    psgd = read_cells(args.runs / "surnames_powersgd" / "full")
    denoise = read_cells(args.runs / "surnames_denoise" / "full")
    clipping = read_cells(args.runs / "surnames_clipping" / "full")
    cifar = read_cells(args.runs / "cifar10_dgc" / "cpu")
    cifar_full = read_cells(args.runs / "cifar10_dgc" / "full")

    for c in dgc + psgd + denoise + clipping:
        if c["diverged"]:
            print(f"DIVERGED: {c['name']} (NaN training loss from epoch {c['diverged']}; final {c['final']:.1f})")
    print("(Means below leave the diverged runs out.)")
    print("## Surnames DGC (full profile): final accuracy per cell, mean ± sd over seeds")
    for sigma in (0.0, 0.4, 0.8):
        row = [f"x{int(r)} {fmt(finals(dgc, sigma=sigma, rate=r))}" for r in (1.0, 16.0, 256.0) if finals(dgc, sigma=sigma, rate=r)]
        print(f"σ {sigma} (ε {epsilon_of(dgc, sigma)}): " + "; ".join(row))
    print("paper-unit upload:", sorted({round(c['paper_gib'], 2) for c in dgc}, reverse=True))

    if finals(dgc, sigma=0.4, rate=1.0):
        base = finals(dgc, sigma=0.4, rate=1.0)
        for r in (16.0, 256.0):
            if finals(dgc, sigma=0.4, rate=r):
                print(f"claim 1 (DGC raises private accuracy at σ 0.4): x{int(r)} - x1 = {diff(finals(dgc, sigma=0.4, rate=r), base)}")
        for r in (16.0, 256.0):
            if finals(dgc, sigma=0.8, rate=r) and finals(dgc, sigma=0.8, rate=1.0):
                print(f"  same at σ 0.8: x{int(r)} - x1 = {diff(finals(dgc, sigma=0.8, rate=r), finals(dgc, sigma=0.8, rate=1.0))}")

    print("\n## Surnames PowerSGD (full profile)")
    for sigma in (0.0, 0.4, 0.8):
        row = [f"r{k} {fmt(finals(psgd, sigma=sigma, rank=k))}" for k in (1, 16) if finals(psgd, sigma=sigma, rank=k)]
        print(f"σ {sigma}: " + "; ".join(row))
    if finals(dgc, sigma=0.4, rate=1.0):
        for k in (1, 16):
            if finals(psgd, sigma=0.4, rank=k):
                print(f"claim 2 (PowerSGD raises private accuracy at σ 0.4): r{k} - uncompressed = {diff(finals(psgd, sigma=0.4, rank=k), finals(dgc, sigma=0.4, rate=1.0))}")

    print("\n## Claim 4: accuracy lost to noise (σ 0 - σ 0.8), uncompressed vs compressed")
    for r in (1.0, 16.0, 256.0):
        a, b = finals(dgc, sigma=0.0, rate=r), finals(dgc, sigma=0.8, rate=r)
        if a and b:
            print(f"DGC x{int(r)}: {diff(a, b)}")
    for k in (1, 16):
        a, b = finals(psgd, sigma=0.0, rank=k), finals(psgd, sigma=0.8, rank=k)
        if a and b:
            print(f"PowerSGD r{k}: {diff(a, b)}")

    print("\n## Claim 5: peak early, then decline (mean curve over seeds: peak, its epoch, final mean of the last 10)")
    for sigma in (0.0, 0.4, 0.8):
        for r in (1.0, 16.0, 256.0):
            chosen = select(dgc, sigma=sigma, rate=r)
            if chosen:
                curve = mean_curve(chosen)
                peak = max(curve)
                at = curve.index(peak) + 1
                final = statistics.fmean(curve[-10:])
                print(f"σ {sigma} DGC x{int(r)}: peak {peak:.1f} at epoch {at}, final {final:.1f}, decline {peak - final:.1f}")
        for k in (1, 16):
            chosen = select(psgd, sigma=sigma, rank=k)
            if chosen:
                curve = mean_curve(chosen)
                peak = max(curve)
                final = statistics.fmean(curve[-10:])
                print(f"σ {sigma} PowerSGD r{k}: peak {peak:.1f} at epoch {curve.index(peak) + 1}, final {final:.1f}, decline {peak - final:.1f}")

    print("\n## Claim 3: CIFAR-10 at σ 0.8 (ε 4.86), DGC x256 - x1 (full profile, seeds that have both rates)")
    x1, x256 = select(cifar_full, sigma=0.8, rate=1.0), select(cifar_full, sigma=0.8, rate=256.0)
    paired = sorted({c["seed"] for c in x1} & {c["seed"] for c in x256})
    if paired:
        a = [c["final"] for c in x256 if c["seed"] in paired and not c["diverged"]]
        b = [c["final"] for c in x1 if c["seed"] in paired and not c["diverged"]]
        print(f"seeds {paired}: x256 - x1 = {diff(a, b)} (x1 {fmt(b)}, x256 {fmt(a)}; ε {x1[0]['epsilon']:.2f})")
    else:
        print("no seed has both rates yet")
    for name, cells in (("x1", x1), ("x256", x256)):
        for c in sorted(cells, key=lambda c: c["seed"]):
            curve = c["curve"]
            peak = max(curve)
            print(f"{name} seed {c['seed']}: final {c['final']:.1f}, first 10 epochs mean {statistics.fmean(curve[:10]):.1f},"
                  f" last 10 {statistics.fmean(curve[-10:]):.1f}, peak {peak:.1f} at epoch {curve.index(peak) + 1}")

    print("\n## Claim 6: compression cost without noise (σ 0: x1 - x256), Surnames full vs CIFAR-10 full and cpu profiles")
    if finals(dgc, sigma=0.0, rate=256.0):
        print(f"Surnames: {diff(finals(dgc, sigma=0.0, rate=1.0), finals(dgc, sigma=0.0, rate=256.0))}")
    x1, x256 = select(cifar_full, sigma=0.0, rate=1.0), select(cifar_full, sigma=0.0, rate=256.0)
    paired = sorted({c["seed"] for c in x1} & {c["seed"] for c in x256})
    if paired:
        a = [c["final"] for c in x1 if c["seed"] in paired and not c["diverged"]]
        b = [c["final"] for c in x256 if c["seed"] in paired and not c["diverged"]]
        print(f"CIFAR-10 full profile, seeds {paired}: {diff(a, b)} (x1 {fmt(a)}, x256 {fmt(b)})")
        for name, cells in (("x1", x1), ("x256", x256)):
            for c in sorted(cells, key=lambda c: c["seed"]):
                curve = c["curve"]
                print(f"  {name} seed {c['seed']}: final {c['final']:.1f}, peak {max(curve):.1f} at epoch {curve.index(max(curve)) + 1}, first 10 epochs mean {statistics.fmean(curve[:10]):.1f}")
    if cifar:
        print(f"CIFAR-10 (cpu profile, one seed): {diff(finals(cifar, sigma=0.0, rate=1.0), finals(cifar, sigma=0.0, rate=256.0))}")

    print("\n## Claims 7-9: gradient error (4 fixed batches x 8 noise draws)")
    measured = [c for c in dgc + psgd if c["errors"] and not c["diverged"]]
    if measured:
        last = [max(c["errors"], key=lambda r: r["epoch"]) for c in measured]
        x = [stage(r, "compress")["error"] for r in last]
        y = [c["final"] for c in measured]
        print(f"claim 7: Spearman(final accuracy, final compressed-gradient error) over {len(x)} runs = {spearman(x, y):+.2f}")
        for sigma in (0.4, 0.8):
            for c in sorted(select(measured, sigma=sigma, seed=0), key=lambda c: (c["compressor"])):
                first = min(c["errors"], key=lambda r: r["epoch"])
                end = max(c["errors"], key=lambda r: r["epoch"])
                print(
                    f"σ {sigma} {c['compressor']}: epoch {first['epoch']}: clip {stage(first, 'clip')['error']:.3g}, "
                    f"noise {stage(first, 'noise')['error']:.3g} (var {stage(first, 'noise')['variance']:.3g}), "
                    f"compress {stage(first, 'compress')['error']:.3g} (bias² {stage(first, 'compress')['bias2']:.3g}, var {stage(first, 'compress')['variance']:.3g}); "
                    f"epoch {end['epoch']}: clip {stage(end, 'clip')['error']:.3g}, noise {stage(end, 'noise')['error']:.3g}, "
                    f"compress {stage(end, 'compress')['error']:.3g} (bias² {stage(end, 'compress')['bias2']:.3g}, var {stage(end, 'compress')['variance']:.3g})"
                )

    if denoise:
        # The full Denoise grid runs only the Denoise arms; its DGC arm is the surnames_dgc full
        # grid (identical configurations), joined here on σ, rate and seed.
        print("\n## Claim 10: Denoise vs DGC (same σ, rate, seeds; DGC from surnames_dgc)")
        wins = clear_wins = total = 0
        for sigma in (0.0, 0.4, 0.8):
            for r in (1.0, 16.0, 256.0):
                for variant in ("denoise-model", "denoise-model-clip"):
                    arm = [c for c in denoise if c["sigma"] == sigma and c["rate"] == r and c["name"].endswith("variant-" + variant) and not c["diverged"]]
                    seeds = {c["seed"] for c in arm}
                    base = [c["final"] for c in dgc if c["sigma"] == sigma and c["rate"] == r and c["seed"] in seeds and not c["diverged"]]
                    other = [c["final"] for c in arm if any(d["seed"] == c["seed"] and d["sigma"] == sigma and d["rate"] == r and not d["diverged"] for d in dgc)]
                    if base and other:
                        total += 1
                        wins += statistics.fmean(other) > statistics.fmean(base)
                        clear_wins += statistics.fmean(other) > statistics.fmean(base) and "outside seed noise" in diff(other, base)
                        print(f"σ {sigma} x{int(r)} {variant} - dgc: {diff(other, base)}  ({fmt(other)} vs {fmt(base)})")
        if total:
            print(f"Denoise's mean above DGC's in {wins} of {total} (σ, rate, variant) cells; above it outside seed noise in {clear_wins}")

    if clipping:
        print("\n## Claim 11: training at the clipping model's C* vs C = 3")
        for sigma in (0.4, 0.8):
            at3 = [c["final"] for c in clipping if c["sigma"] == sigma and c["C"] == 3.0]
            star = [c["final"] for c in clipping if c["sigma"] == sigma and c["C"] != 3.0]
            if at3 and star:
                print(f"σ {sigma}: C* - C 3 = {diff(star, at3)}  ({fmt(star)} vs {fmt(at3)})")


if __name__ == "__main__":
    main()
