#!/usr/bin/env python3
"""Weight norms of finished DP runs against the random walk their noise alone would make.

Plain DP-SGD adds N(0, (σC/B)²) to every coordinate of the mean gradient each step, so after T
steps at learning rate η the noise alone has moved each coordinate by a random walk of standard
deviation η σ C / B sqrt(T), and a tensor of n coordinates by about that times sqrt(n). When the
measured norms equal that prediction, the weights are the accumulated noise and the signal is
negligible (the CIFAR-10 σ 0.8 collapse, claim 3 of the verdict table).

    .venv/bin/python experiments/weight_norms.py RUN_DIR [RUN_DIR ...] > out.json

Reads RUN_DIR/config.toml and RUN_DIR/checkpoint/{model.safetensors,state.json} (the checkpoint
is not committed: run the cell first). numpy only."""
import json
import math
import struct
import sys
import tomllib

import numpy as np


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
        out[name] = np.frombuffer(raw[8 + n + start : 8 + n + end], dtype=np.float32).reshape(v["shape"])
    return out


def report(run):
    config = tomllib.load(open(f"{run}/config.toml", "rb"))
    # Runs written since the sections ([optimizer], [privacy], ...) hold these settings there.
    for section in ("data", "model", "optimizer", "privacy", "compression", "analysis"):
        config.update({k: v for k, v in config.pop(section, {}).items() if k not in ("kind", "options")})
    state = json.load(open(f"{run}/checkpoint/state.json"))
    weights = load_safetensors(f"{run}/checkpoint/model.safetensors")
    steps = state["steps_done"]
    per_coordinate = config["lr"] * config["noise_multiplier"] * config["max_grad_norm"] / config["batch_size"] * math.sqrt(steps)
    tensors = []
    for name, w in sorted(weights.items()):
        predicted = per_coordinate * math.sqrt(w.size)
        tensors.append({"name": name, "elements": int(w.size), "norm": float(np.linalg.norm(w)),
                        "noise_walk_norm": predicted, "ratio": float(np.linalg.norm(w)) / predicted})
    return {"run": run, "steps": steps, "lr": config["lr"], "noise_multiplier": config["noise_multiplier"],
            "max_grad_norm": config["max_grad_norm"], "batch_size": config["batch_size"],
            "noise_walk_per_coordinate": per_coordinate, "tensors": tensors}


if __name__ == "__main__":
    print(json.dumps([report(run) for run in sys.argv[1:]], indent=1))
