"""Data-parallel step with PowerSGD: dpcomp on MPI versus PyTorch DDP with its PowerSGD hook on
gloo, same model, same W, same machine, in one run.

For each W, rounds alternate: `mpiexec -n W dpcomp bench comm --worker --json` (our step: the
CIFAR-10 CNN's forward, backward, global-norm clip, then the exchange, PowerSGD as the hook
runs it: all-reduce P, orthonormalise, all-reduce Q) and W processes of PyTorch DDP on gloo with
`powerSGD_hook` (rank r, error feedback, warm start, PyTorch's default min_compression_rate 2,
`start_powerSGD_iter` 2, the earliest it allows) doing the same step (forward, backward with the
hook, clip_grad_norm_, SGD), each rank on its own copy of a seeded batch. Our PowerSGD runs with
`shape=rows`, PyTorch's matrix view [shape[0], -1]. Both use one intra-op thread per process.
Printed: the median step time of each and their ratio (ours / PyTorch; <= 1 means dpcomp is no
slower), also for the uncompressed all-reduce (identity against DDP's default hook).

    .venv/bin/python benches/comm_vs_ddp.py --workers 2 4 --steps 20 --rounds 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_pytorch import CifarCnn  # noqa: E402  (the same architecture as ours)

LR, CLIP = 0.1, 5.0  # the paper's CIFAR-10 settings (crates/dpcomp/src/config.rs)


def ddp_worker(rank, world, args, hook, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    # One bucket: with several, the PowerSGD hook's collectives on gloo mismatch between ranks
    # (torch 2.11: "Received data size doesn't match expected size").
    model = torch.nn.parallel.DistributedDataParallel(CifarCnn(10), bucket_cap_mb=100)
    if hook == "powersgd":
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=args.rank,
            start_powerSGD_iter=2,
            min_compression_rate=2,
            use_error_feedback=True,
            warm_start=True,
        )
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    torch.manual_seed(1234)
    x = torch.randn(args.batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch_size,))
    times = []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        loss.item()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    gathered = [None] * world
    dist.all_gather_object(gathered, statistics.median(times))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    # Tearing down a process group under a live DDP model aborts (torch 2.11 + gloo): the
    # results are written, so leave without the teardown.
    os._exit(0)


def ddp_step(args, world, hook, port):
    out = f"/tmp/dpcomp-ddp-{os.getpid()}-{world}-{hook}.json"
    mp.spawn(ddp_worker, args=(world, args, hook, port, out), nprocs=world, join=True)
    with open(out) as f:
        medians = json.load(f)
    os.remove(out)
    return medians[0]


def our_step(args, world):
    command = [
        "mpiexec", "-n", str(world), args.dpcomp, "bench", "comm", "--worker", "--json",
        "--task", "cifar10", "--device", "cpu", "--batch-size", str(args.batch_size),
        "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--compressors", f"powersgd:{args.rank}:shape=rows,identity",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    output = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    rows = json.loads([l for l in output.stdout.splitlines() if l.startswith("[")][-1])
    return {r["kind"]: r["step_seconds"] for r in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dpcomp", default="target/release/dpcomp")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    port = 29500 + os.getpid() % 1000
    for world in args.workers:
        ours = {"powersgd": [], "identity": []}
        theirs = {"powersgd": [], "identity": []}
        for _ in range(args.rounds):
            for kind, seconds in our_step(args, world).items():
                ours[kind].append(seconds)
            for hook in ("powersgd", "identity"):
                port += 1
                theirs[hook].append(ddp_step(args, world, hook, port))
        for kind in ("powersgd", "identity"):
            a, b = statistics.median(ours[kind]), statistics.median(theirs[kind])
            results.append({"workers": world, "compressor": kind, "dpcomp_ms": 1e3 * a,
                            "pytorch_ddp_ms": 1e3 * b, "ratio": a / b,
                            "batch_size": args.batch_size, "rank": args.rank, "steps": args.steps})
    if args.json:
        print(json.dumps(results))
        return
    print(f"CIFAR-10 CNN, batch {args.batch_size} per worker, median of {args.steps} steps x {args.rounds} rounds, one thread per process")
    print(f"{'W':>3} {'exchange':<10} {'dpcomp ms':>10} {'DDP ms':>10} {'ours/DDP':>9}")
    for r in results:
        label = f"powersgd r{r['rank']}" if r["compressor"] == "powersgd" else "dense"
        print(f"{r['workers']:>3} {label:<10} {r['dpcomp_ms']:>10.1f} {r['pytorch_ddp_ms']:>10.1f} {r['ratio']:>9.2f}")


if __name__ == "__main__":
    main()
