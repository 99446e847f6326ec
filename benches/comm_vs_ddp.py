"""Data-parallel step: dpcomp on Gloo and on MPI against PyTorch DDP on Gloo, with the same
exchange, the same model, the same W, on the same machine, in one run.

Models: the paper's CIFAR-10 CNN (`--task cifar10`, 361,290 parameters) and ResNet-18
(`--task cifar100`, GroupNorm, 11,373,732 parameters); the script checks that the Python
architectures (`train_vs_pytorch.CifarCnn`, `ResNet18`) have exactly dpcomp's parameter counts.

Exchanges, dpcomp's compressor against DDP's communication hook:

- dense: `identity` (one fp32 all-reduce of the flattened gradients after backward) against
  DDP's default all-reduce (fp32 buckets, all-reduced during backward as each fills);
- PowerSGD rank r: `powersgd:r:shape=rows` (all-reduce P, orthonormalise, all-reduce Q, error
  feedback, warm start) against `powerSGD_hook` (the same algorithm, PyTorch's matrix view
  [shape[0], -1], `min_compression_rate` 2, `start_powerSGD_iter` 2, the earliest it allows);
- fp16: `fp16` against `fp16_compress_hook`. They move the same 16-bit values but combine them
  differently: the hook divides each bucket by W in fp16 and all-reduces fp16 (the sum is
  rounded to fp16 at every addition; Gloo's ring), then casts back to fp32; dpcomp all-gathers
  every worker's fp16 message (its exact wire bytes) and each worker decodes the W messages to
  fp32 and averages them in fp32. At W = 2 both receive one worker's 2 bytes per element.

dpcomp runs as `torchrun --nproc-per-node W --no-python dpcomp bench comm --worker --json`
(c10d on Gloo, `comm::world()`) and as `mpiexec -n W dpcomp bench comm --worker --json`: every
rank trains on its own copy of the seeded synthetic batch, the non-private step (forward,
backward, global-norm clip, exchange, SGD); the exchange is the same under DP. DDP runs W
processes on Gloo, under torchrun too (this script with `--ddp-worker`), doing the same step
(forward, backward with the hook, `clip_grad_norm_`, SGD), each on its own seeded batch of the
same shape, plus the same step under `no_sync()` (no communication at all: the compute alone,
for the profile). One intra-op thread per process on both sides. Rounds alternate between the
systems (the order rotating); each system's time in a round is rank 0's median over the timed
steps; printed: the median over rounds, the range of the rounds, and ours / DDP (<= 1 means
dpcomp is no slower), with dpcomp's parts beside DDP's step without communication.

    .venv/bin/python benches/comm_vs_ddp.py --models cnn resnet18 --rounds 4
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
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_pytorch import SETTINGS, CifarCnn, ResNet18  # noqa: E402  (dpcomp's architectures)

# name: (dpcomp task, Python model, default batch per worker, default timed steps)
MODELS = {"cnn": ("cifar10", CifarCnn, 64, 20), "resnet18": ("cifar100", ResNet18, 32, 5)}
EXCHANGES = ("dense", "powersgd", "fp16")
LABELS = {"dense": "dense all-reduce", "fp16": "fp16", "powersgd": "PowerSGD r{rank}"}


def dpcomp_compressor(exchange, rank):
    return {"dense": "identity", "powersgd": f"powersgd:{rank}:shape=rows", "fp16": "fp16"}[exchange]


def ddp_model(model_class, classes, exchange, rank):
    torch.manual_seed(0)
    if exchange == "powersgd":
        # One bucket: with several, the PowerSGD hook's collectives on Gloo mismatch between
        # ranks (torch 2.11: "Received data size doesn't match expected size").
        model = torch.nn.parallel.DistributedDataParallel(model_class(classes), bucket_cap_mb=1000)
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=2,
            min_compression_rate=2,
            use_error_feedback=True,
            warm_start=True,
        )
        model.register_comm_hook(state, powersgd.powerSGD_hook)
        return model
    # Dense and fp16: DDP as it is used, its default buckets overlapping backward.
    model = torch.nn.parallel.DistributedDataParallel(model_class(classes))
    if exchange == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return model


def ddp_worker(args, model_name, out):
    """One rank of the DDP job, under torchrun (`--ddp-worker`)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    task, model_class, _, _ = MODELS[model_name]
    lr, clip, classes = SETTINGS[task]
    batch, steps = args.batch[model_name], args.steps[model_name]
    torch.manual_seed(1234 + rank)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, classes, (batch,))
    medians = {}
    for exchange in EXCHANGES + ("no-sync",):
        model = ddp_model(model_class, classes, exchange, args.rank)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        times = []
        for step in range(args.warmup + steps):
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            if exchange == "no-sync":
                with model.no_sync():
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
            else:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            loss.item()
            if step >= args.warmup:
                times.append(time.perf_counter() - started)
        medians[exchange] = statistics.median(times)
        medians["parameters"] = sum(p.numel() for p in model.parameters())
        dist.barrier()
    gathered = [None] * world
    dist.all_gather_object(gathered, medians)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered[0], f)
    dist.barrier()
    # Tearing down a process group under a live DDP model aborts (torch 2.11 + Gloo): the
    # results are written, so leave without the teardown.
    os._exit(0)


def launch(command):
    """Runs a job's launcher with one intra-op thread per process; its stdout."""
    output = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if output.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{output.stderr[-4000:]}")
    return output.stdout


def torchrun(args, port):
    return [args.torchrun, "--nproc-per-node", str(args.workers), "--master-addr", "127.0.0.1",
            "--master-port", str(port)]


def ddp_steps(args, model_name, port):
    """DDP's medians: W ranks under torchrun, as dpcomp's Gloo ranks (torchrun starts each rank
    in a session of its own, and so does mpiexec; with the kernel's autogroup scheduling, ranks
    sharing one session would get a smaller share of a loaded machine than the other side's)."""
    out = f"/tmp/dpcomp-ddp-{os.getpid()}-{args.workers}-{model_name}.json"
    launch(torchrun(args, port) + [
        os.path.abspath(__file__), "--ddp-worker", model_name, "--ddp-out", out, "--rank", str(args.rank),
        "--warmup", str(args.warmup), "--batch-size", f"{model_name}={args.batch[model_name]}",
        "--steps", f"{model_name}={args.steps[model_name]}",
    ])
    with open(out) as f:
        medians = json.load(f)
    os.remove(out)
    return medians


def dpcomp_steps(args, model_name, transport, port):
    task = MODELS[model_name][0]
    worker = [
        args.dpcomp, "bench", "comm", "--worker", "--json", "--task", task, "--device", "cpu",
        "--batch-size", str(args.batch[model_name]), "--steps", str(args.steps[model_name]),
        "--warmup", str(args.warmup),
        "--compressors", ",".join(dpcomp_compressor(e, args.rank) for e in EXCHANGES),
    ]
    if transport == "gloo":
        launcher = torchrun(args, port) + ["--no-python"]
    else:
        launcher = ["mpiexec", "-n", str(args.workers)]
    stdout = launch(launcher + worker)
    rows = json.loads([l for l in stdout.splitlines() if l.startswith("[")][-1])
    kinds = {"identity": "dense", "powersgd": "powersgd", "fp16": "fp16"}
    return {kinds[r["kind"]]: r for r in rows}


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["cnn", "resnet18"])
    parser.add_argument("--transports", nargs="+", choices=["gloo", "mpi"], default=["gloo", "mpi"],
                        help="dpcomp's transports (DDP always runs on Gloo)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=1, help="PowerSGD's rank")
    parser.add_argument("--batch-size", nargs="+", metavar="MODEL=N", default=[],
                        help="per worker, e.g. cnn=64 resnet18=32 (the defaults)")
    parser.add_argument("--steps", nargs="+", metavar="MODEL=N", default=[],
                        help="timed steps per round, e.g. cnn=20 resnet18=5 (the defaults)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dpcomp", default="target/release/dpcomp")
    parser.add_argument("--torchrun", default=os.path.join(os.path.dirname(sys.executable), "torchrun"))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    parser.add_argument("--save", metavar="PATH", help="also write the rows as JSON to PATH")
    parser.add_argument("--ddp-worker", choices=sorted(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--ddp-out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    def per_model(pairs, index):
        values = {name: spec[index] for name, spec in MODELS.items()}
        for pair in pairs:
            name, _, n = str(pair).partition("=")
            if name not in MODELS or not n.isdigit() or int(n) < 1:
                parser.error(f"{pair!r}: expected MODEL=N with MODEL one of {sorted(MODELS)} and N >= 1")
            values[name] = int(n)
        return values

    args.batch = per_model(args.batch_size, 2)
    args.steps = per_model(args.steps, 3)
    if args.ddp_worker:
        ddp_worker(args, args.ddp_worker, args.ddp_out)
    systems = ["ddp"] + args.transports
    port = 29500 + os.getpid() % 1000
    results = []
    for model_name in args.models:
        # rounds[system][exchange]: one median per round; profile[transport][exchange]: dpcomp's parts
        rounds = {s: {e: [] for e in EXCHANGES} for s in systems}
        rounds["ddp"]["no-sync"] = []
        parts = {t: {e: [] for e in EXCHANGES} for t in args.transports}
        parameters = {}
        for r in range(args.rounds):
            for system in systems[r % len(systems):] + systems[:r % len(systems)]:
                port += 1
                started = time.perf_counter()
                if system == "ddp":
                    medians = ddp_steps(args, model_name, port)
                    parameters["pytorch"] = medians.pop("parameters")
                    for exchange, seconds in medians.items():
                        rounds["ddp"][exchange].append(seconds)
                else:
                    rows = dpcomp_steps(args, model_name, system, port)
                    for exchange, row in rows.items():
                        rounds[system][exchange].append(row["step_seconds"])
                        parts[system][exchange].append(row)
                        parameters["dpcomp"] = row["parameters"]
                print(f"{model_name} round {r + 1} {system}: {time.perf_counter() - started:.0f} s",
                      file=sys.stderr)
        if parameters["pytorch"] != parameters["dpcomp"]:
            sys.exit(f"{model_name}: PyTorch's model has {parameters['pytorch']} parameters, dpcomp's "
                     f"{parameters['dpcomp']}: not the same architecture")
        for exchange in EXCHANGES:
            ddp = summary(rounds["ddp"][exchange])
            for transport in args.transports:
                ours = summary(rounds[transport][exchange])
                ratios = [a / b for a, b in zip(rounds[transport][exchange], rounds["ddp"][exchange])]
                median_part = lambda key: statistics.median(row[key] for row in parts[transport][exchange])
                results.append({
                    "model": model_name, "task": MODELS[model_name][0], "parameters": parameters["dpcomp"],
                    "workers": args.workers, "batch_size": args.batch[model_name],
                    "steps": args.steps[model_name], "rounds": args.rounds,
                    "exchange": exchange, "rank": args.rank, "transport": transport,
                    "dpcomp_ms": 1e3 * ours["median"], "dpcomp_range_ms": [1e3 * ours["min"], 1e3 * ours["max"]],
                    "ddp_ms": 1e3 * ddp["median"], "ddp_range_ms": [1e3 * ddp["min"], 1e3 * ddp["max"]],
                    "ratio": ours["median"] / ddp["median"],
                    "ratio_range": [min(ratios), max(ratios)],
                    "dpcomp_compute_ms": 1e3 * median_part("compute_seconds"),
                    "dpcomp_exchange_ms": 1e3 * (median_part("encode_seconds") + median_part("comm_seconds")
                                                 + median_part("decode_seconds")),
                    "dpcomp_comm_ms": 1e3 * median_part("comm_seconds"),
                    "dpcomp_least_comm_ms": 1e3 * median_part("least_comm_seconds"),
                    "ddp_no_sync_ms": 1e3 * statistics.median(rounds["ddp"]["no-sync"]),
                    "sent_bytes": median_part("sent_bytes"),
                })
    if args.save:
        with open(args.save, "w") as f:
            json.dump(results, f, indent=1)
    if args.json:
        print(json.dumps(results))
        return
    print(f"W = {args.workers}, one thread per process, {args.rounds} rounds alternating; ms: median over "
          f"rounds of rank 0's median step [range of the rounds]; DDP on Gloo")
    print(f"{'model':<9} {'exchange':<17} {'dpcomp on':<9} {'dpcomp ms':>20} {'DDP ms':>20} {'ours/DDP':>17}"
          f" {'compute':>8} {'exchange':>8} {'comm':>6} {'least':>6} {'DDP no-sync':>11}")
    for r in results:
        label = LABELS[r["exchange"]].format(rank=r["rank"])
        ours = f"{r['dpcomp_ms']:.1f} [{r['dpcomp_range_ms'][0]:.1f}-{r['dpcomp_range_ms'][1]:.1f}]"
        ddp = f"{r['ddp_ms']:.1f} [{r['ddp_range_ms'][0]:.1f}-{r['ddp_range_ms'][1]:.1f}]"
        ratio = f"{r['ratio']:.2f} [{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}]"
        print(f"{r['model']:<9} {label:<17} {r['transport']:<9} {ours:>20} {ddp:>20} {ratio:>17}"
              f" {r['dpcomp_compute_ms']:>8.1f} {r['dpcomp_exchange_ms']:>8.1f} {r['dpcomp_comm_ms']:>6.1f}"
              f" {r['dpcomp_least_comm_ms']:>6.1f} {r['ddp_no_sync_ms']:>11.1f}")
    print("compute, exchange (encode + comm + decode), comm (inside the collectives, rank 0): dpcomp's parts, "
          "median of the rounds' medians; least: comm on the rank that waited least (the transfer itself); "
          "DDP no-sync: DDP's step under no_sync(), no communication")


if __name__ == "__main__":
    main()
