"""σ calibration for a target ε: dpcomp's accountants against Opacus 1.6's `get_noise_multiplier`
(PRV, its default, and RDP), timed side by side in one run on the same machine.

    .venv/bin/python benches/calibration_vs_opacus.py --dpcomp target/release/dpcomp

Each case is (q, steps, δ, ε): CIFAR-10 at ε 8 as `examples/cifar_cnn.rs` trains it (6,400
images in batches of 128 for 5 epochs: q 1/50, 250 steps) and at the paper's 100 epochs of the
full set (q 1/391, 39,100 steps), and Surnames at the paper's 100 epochs (q 1/502, 50,200 steps).
dpcomp is timed as the whole `dpcomp epsilon` process (its start with LibTorch included, and its
report of ε at the σ found); Opacus in-process. Each cell gives wall seconds and, after the
slash, CPU seconds (user + system: the child process's for dpcomp, this process's for Opacus),
which a loaded machine inflates less than wall time.
"""
import argparse
import json
import resource
import subprocess
import time

from opacus.accountants.utils import get_noise_multiplier

CASES = [
    ("cifar_cnn example, eps 8", 1 / 50, 250, 1e-5, 8.0),
    ("CIFAR-10 100 epochs, eps 4.86", 1 / 391, 39100, 1e-5, 4.86),
    ("Surnames 100 epochs, eps 8", 1 / 502, 50200, 8e-5, 8.0),
]


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dpcomp_sigma(binary, accountant, q, steps, delta, epsilon):
    start, cpu = time.perf_counter(), children_cpu()
    out = subprocess.run(
        [binary, "epsilon", "--accountant", accountant, "--sample-rate", repr(q),
         "--target-epsilon", repr(epsilon), "--steps", str(steps), "--delta", repr(delta),
         "--json"],
        check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - start
    return json.loads(out)["noise_multiplier"], seconds, children_cpu() - cpu


def opacus_sigma(accountant, q, steps, delta, epsilon):
    start, cpu = time.perf_counter(), time.process_time()
    sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=q,
                                 steps=steps, accountant=accountant)
    return sigma, time.perf_counter() - start, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dpcomp", default="target/release/dpcomp")
    args = parser.parse_args()
    print("| case | dpcomp pld σ (wall/CPU s) | Opacus prv σ (wall/CPU s) | dpcomp rdp σ (wall/CPU s) "
          "| Opacus rdp σ (wall/CPU s) |")
    print("|---|---|---|---|---|")
    for name, q, steps, delta, epsilon in CASES:
        pld = dpcomp_sigma(args.dpcomp, "pld", q, steps, delta, epsilon)
        prv = opacus_sigma("prv", q, steps, delta, epsilon)
        rdp = dpcomp_sigma(args.dpcomp, "rdp", q, steps, delta, epsilon)
        ordp = opacus_sigma("rdp", q, steps, delta, epsilon)
        cells = [f"{s:.4f} ({t:.2f}/{c:.2f})" for s, t, c in (pld, prv, rdp, ordp)]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
