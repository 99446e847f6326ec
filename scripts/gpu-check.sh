#!/usr/bin/env bash
# The GPU check: one script, about eight minutes on a CUDA machine, that proves
# dpcomp there and writes what it measured as JSON under $OUT (or --out):
#
#   1. correctness: `dpcomp check-device` (per-sample gradients of the four models against
#      per-example autograd, every compressor against its CPU result) and the RDP accountant's
#      golden value (Opacus's test: sigma 1.5, q 0.04, 2250 steps, delta 1e-5 -> 7.32911117143);
#   2. `dpcomp bench dp|compress` per task with peak device memory, and the same shapes in eager
#      PyTorch (benches/train_vs_pytorch.py) and Opacus (benches/dp_vs_opacus.py) on the same
#      device in the same run;
#   3. short real trainings: Surnames DP 5 epochs with DGC x16, CIFAR-10 DP 3 epochs on the
#      kit's subset (held on the device), SNLI one epoch on the dev split (MiniLM architecture,
#      random weights: the pretrained ones do not travel, see gpu-kit.sh); every epoch logs the
#      host reads its steps made on the device (`host_reads_per_step`), and CIFAR-10
#      with DGC x256 runs twice, with and without the message's bytes made each step
#      (`--verify-wire`), for the step time the bytes cost; then data-parallel over c10d under
#      torchrun: NCCL with one rank and Gloo on the device's tensors with two ranks, every
#      collective checked (check-comm) and a short Surnames training each against one process
#      and two thread workers on the same device, with step time and host reads per step;
#   4. then, while minutes remain, unfinished `full` cells of the grids whose data travel
#      complete (Surnames: the paper grids and the ablation), resumable; run folders
#      packed into runs.tar.gz.
#
# It reads the kit that scripts/gpu-kit.sh made (gpu-kit/). Files written (at most 8, flat):
# gpu_check.json (summary and ratios), check_device.json, benches.json, trainings.json, c10d.json,
# log.txt, runs.tar.gz. Exit status: non-zero when a correctness check failed.
#
#   bash scripts/gpu-check.sh --device cuda                 # there, ~8 minutes
#   bash scripts/gpu-check.sh --device cpu                  # the rehearsal here, shortened
#   bash scripts/gpu-check.sh --device cpu --quick          # the test's rehearsal (~1-2 minutes)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

device=cuda
kit="gpu-kit"
out="${OUT:-$root/gpu-check-out}"
minutes=8
quick=0
grids="experiments/surnames_ablation.toml experiments/surnames_dgc.toml experiments/surnames_powersgd.toml experiments/surnames_denoise.toml"
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --kit) kit="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --minutes) minutes="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        --grids) grids="$2"; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "gpu-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu-check.sh: --device $device: expected cuda or cpu" >&2; exit 2 ;; esac
[ -f "$kit/dpcomp.gz" ] || { echo "gpu-check.sh: $kit/dpcomp.gz missing: run scripts/gpu-kit.sh here and carry $kit" >&2; exit 2; }
started=$(date +%s)
deadline=$((started + minutes * 60))
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
log() { echo "[gpu-check $(( $(date +%s) - started ))s] $*"; }

# --- the kit, unpacked ------------------------------------------------------------------------
work="$(mktemp -d /tmp/dpcomp-gpu-check.XXXXXX)"
trap 'rm -rf "$work"' EXIT
gunzip -c "$kit/dpcomp.gz" > "$work/dpcomp" && chmod +x "$work/dpcomp"
dpcomp="$work/dpcomp"
mkdir -p "$work/data"
cp -r "$kit/data/." "$work/data/"
find "$work/data" -name '*.gz' -exec gunzip -f {} +
export DPCOMP_DATA="$work/data"
if [ "$device" = cpu ] && [ -x "$root/.venv/bin/python" ]; then
    py="$root/.venv/bin/python"
else
    py="${PYTHON:-python3}"
fi
torch_lib="$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" \
    || { echo "gpu-check.sh: $py cannot import torch" >&2; exit 2; }
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ls "$kit"/wheels/*.whl >/dev/null 2>&1 && ! "$py" -c 'import opacus' 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$kit"/wheels/*.whl \
        && export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
have_opacus=0
"$py" -c 'import opacus' 2>/dev/null && have_opacus=1
# A MiniLM of the real architecture with random weights (names and shapes from the kit): BERT
# embeddings N(0, 0.02), LayerNorm 1 and 0, biases 0, as BERT initialises.
bert="$work/bert"
mkdir -p "$bert"
cp "$kit"/bert/* "$bert/"
"$py" - "$kit/bert_shapes.json" "$bert/model.safetensors" <<'PY' || { echo "gpu-check.sh: could not build the random MiniLM" >&2; exit 2; }
import json, struct, sys, torch
torch.manual_seed(0)
header, blobs, offset = {}, [], 0
for name, shape in sorted(json.load(open(sys.argv[1])).items()):
    if "LayerNorm.weight" in name:
        t = torch.ones(shape)
    elif name.endswith("bias") or "LayerNorm" in name:
        t = torch.zeros(shape)
    elif "position_ids" in name:
        t = torch.arange(shape[-1]).view(shape)
    else:
        t = torch.randn(shape) * 0.02
    blob = t.contiguous().numpy().tobytes()
    dtype = "I64" if t.dtype == torch.int64 else "F32"
    header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
# safetensors: 8-byte little-endian header length, the JSON header, then the raw tensors.
raw = json.dumps(header).encode()
raw += b" " * (-len(raw) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    for blob in blobs:
        f.write(blob)
PY
export CUDA_MODULE_LOADING=LAZY
PYTHONUNBUFFERED=1
export PYTHONUNBUFFERED

# --- 0. the machine ---------------------------------------------------------------------------
log "device $device, kit $kit ($(cat "$kit/kit.txt" | tr '\n' ' ')), python $("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'), opacus $have_opacus"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# Steps and sizes: the GPU gets the benchmarks' settings (docs/results/benchmarks.md); the CPU
# rehearsal the same paths, shortened.
if [ "$device" = cuda ]; then
    steps=20; warmup=3; rounds=3; limit_surnames=""; limit_cifar=""; limit_snli=""
    epochs_surnames=5; epochs_cifar=3
elif [ "$quick" = 1 ]; then
    steps=1; warmup=1; rounds=1; limit_surnames="--limit-train 640 --limit-test 200"
    limit_cifar="--limit-train 256 --limit-test 128"; limit_snli="--limit-train 64 --limit-test 64"
    epochs_surnames=1; epochs_cifar=1
else
    steps=3; warmup=1; rounds=1; limit_surnames="--limit-train 3200 --limit-test 1000"
    limit_cifar="--limit-train 1024 --limit-test 512"; limit_snli="--limit-train 256 --limit-test 256"
    epochs_surnames=2; epochs_cifar=1
fi
small_batch=""
peer_batch=16
[ "$device" = cpu ] && small_batch="--batch-size 16"
[ "$quick" = 1 ] && small_batch="--batch-size 4" && peer_batch=4
failed=0

# --- 1. correctness ---------------------------------------------------------------------------
log "1. correctness: check-device"
if ! "$dpcomp" check-device --device "$device" --json-out "$out/check_device.json" > /dev/null; then
    failed=1
    log "check-device FAILED (see check_device.json)"
fi
# Opacus's RDPAccountant golden value, so the RDP accountant (the default is the tight PLD one).
"$dpcomp" epsilon --noise-multiplier 1.5 --sample-rate 0.04 --steps 2250 --delta 1e-5 --accountant rdp --json > "$work/epsilon.json"
"$py" - "$work/epsilon.json" "$out/check_device.json" <<'PY' || failed=1
import json, sys
eps = json.load(open(sys.argv[1]))["epsilon"]
report = json.load(open(sys.argv[2]))
ok = abs(eps - 7.32911117143) < 1e-8
report["checks"].append({"name": "accountant/opacus_golden_rdp", "error": abs(eps - 7.32911117143),
                         "tolerance": 1e-8, "passed": ok,
                         "detail": f"epsilon {eps!r} for sigma 1.5, q 0.04, 2250 steps, delta 1e-5 (Opacus's test: 7.32911117143)"})
report["passed"] = report["passed"] and ok
json.dump(report, open(sys.argv[2], "w"), indent=1)
print("checks:", sum(c["passed"] for c in report["checks"]), "of", len(report["checks"]), "passed")
sys.exit(0 if report["passed"] else 1)
PY

# --- 2. benchmarks ----------------------------------------------------------------------------
benches="$work/benches.jsonl"
: > "$benches"
bench() {  # name, command...: one JSON line tagged with its name, or an error line
    local name="$1"; shift
    local line
    if line="$("$@" 2> "$work/bench.err")"; then
        printf '{"bench": "%s", "result": %s}\n' "$name" "$(echo "$line" | tail -n 1)" >> "$benches"
    else
        printf '{"bench": "%s", "error": %s}\n' "$name" "$("$py" -c 'import json,sys; print(json.dumps(sys.stdin.read()[-2000:]))' < "$work/bench.err")" >> "$benches"
        log "bench $name failed: $(tail -n 3 "$work/bench.err")"
    fi
}
log "2. benchmarks"
for task in surnames cifar10 cifar100 snli; do
    b="$small_batch"
    bench "dp/$task" "$dpcomp" bench dp --task "$task" --device "$device" --steps "$steps" --warmup "$warmup" \
        --rounds "$rounds" --bert-dir "$bert" $b --json
done
# The two-pass DP step (norms taken in gradient hooks, which autograd runs on its device thread
# on CUDA): its memory and time against the one-pass step's above.
for task in cifar10 cifar100; do
    bench "dp_two_pass/$task" "$dpcomp" bench dp --task "$task" --device "$device" --steps "$steps" \
        --warmup "$warmup" --rounds "$rounds" $small_batch --grad-sample two-pass --json
done
# On ResNet-18 (CIFAR-100), the benchmarks' yardstick; the quick rehearsal exercises the same code on
# the smaller CNN.
compress_task=cifar100
[ "$quick" = 1 ] && compress_task=cifar10
for spec in "dgc_x256:dgc --rate 256" "dgc_x16:dgc --rate 16" "powersgd_rank1:powersgd --rank 1" \
            "powersgd_rank4:powersgd --rank 4" "denoise_x256:denoise --rate 256"; do
    bench "compress/$compress_task/${spec%%:*}" "$dpcomp" bench compress --task "$compress_task" --device "$device" \
        --steps "$steps" --warmup "$warmup" --rounds "$rounds" $small_batch --compressor ${spec#*:} --json
done
for task in surnames cifar10 cifar100; do
    batch=$(case $task in surnames) echo 32 ;; cifar10) echo 128 ;; cifar100) echo 64 ;; esac)
    [ "$device" = cpu ] && batch=$peer_batch
    bench "eager_pytorch/$task" "$py" benches/train_vs_pytorch.py --task "$task" --batch-size "$batch" \
        --steps "$steps" --warmup "$warmup" --rounds "$rounds" --device "$device" --dpcomp "$dpcomp"
    if [ "$have_opacus" = 1 ]; then
        bench "opacus/$task" "$py" benches/dp_vs_opacus.py --task "$task" --batch-size "$batch" \
            --steps "$steps" --warmup "$warmup" --rounds "$rounds" --device "$device" --dpcomp "$dpcomp"
    else
        log "opacus not importable: its comparison skipped"
    fi
done
"$py" -c 'import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])], indent=1))' "$benches" > "$out/benches.json"

# --- 3. short real trainings ------------------------------------------------------------------
log "3. trainings"
runs="$work/runs"
mkdir -p "$runs"
train() {  # name, flags...
    local name="$1"; shift
    local t0=$(date +%s)
    if "$dpcomp" train --device "$device" --out "$runs/$name" --quiet "$@"; then
        log "train $name: $(( $(date +%s) - t0 )) s"
    else
        log "train $name FAILED"
        echo "{\"failed\": true}" > "$runs/$name/failed.json" 2>/dev/null || true
    fi
}
train surnames_dp_dgc16 --task surnames --epochs "$epochs_surnames" --noise-multiplier 0.8 \
    --compressor dgc --rate 16 $limit_surnames
train cifar10_dp --task cifar10 --epochs "$epochs_cifar" --noise-multiplier 0.8 $limit_cifar
train snli_dp_random_minilm --task snli --epochs 1 --noise-multiplier 0.8 --bert-dir "$bert" $limit_snli
# The same steps with and without the message's bytes made: bytes are made only where
# they cross a process, or with --verify-wire.
train cifar10_dp_dgc256 --task cifar10 --epochs 1 --noise-multiplier 0.8 --compressor dgc --rate 256 $limit_cifar
train cifar10_dp_dgc256_bytes --task cifar10 --epochs 1 --noise-multiplier 0.8 --compressor dgc --rate 256 \
    --verify-wire $limit_cifar
# --- 3b. data-parallel over c10d (torchrun) ----------------------------------------------------
# NCCL with one rank (on the CPU rehearsal, where NCCL cannot run: Gloo) and Gloo on the
# device's tensors with two ranks: check-comm checks every collective, the tensor ones on the
# device; the same short non-private Surnames training runs under torchrun and, as the
# reference, in one process and as two thread workers on the same device (same seed: the same
# initial weights, drawn by the device's generator, and the same batches), and once on the CPU
# (for information: the device's generator draws other initial weights). Written to c10d.json.
log "3b. data-parallel over c10d"
c10d="$work/c10d"
mkdir -p "$c10d"
one_comm=nccl
[ "$device" = cpu ] && one_comm=auto
c10d_flags="--task surnames --epochs 1 --limit-train 1280 --limit-test 256"
[ "$quick" = 1 ] && c10d_flags="--task surnames --epochs 1 --limit-train 320 --limit-test 64"
launch() {  # processes, dpcomp arguments...: one torchrun job on this machine
    local n="$1"; shift
    DPCOMP_COLLECTIVE_TIMEOUT=120 "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" \
        --no-python "$dpcomp" "$@"
}
if "$py" -c 'import torch.distributed.run' 2>/dev/null; then
    launch 1 check-comm --device "$device" --comm "$one_comm" --json > "$c10d/check_one_rank.json" 2> "$c10d/check_one_rank.err" \
        || log "check-comm, one rank, --comm $one_comm FAILED: $(tail -n 3 "$c10d/check_one_rank.err")"
    launch 2 check-comm --device "$device" --comm gloo --json > "$c10d/check_gloo_two_ranks.json" 2> "$c10d/check_gloo_two_ranks.err" \
        || log "check-comm, two ranks over Gloo FAILED: $(tail -n 3 "$c10d/check_gloo_two_ranks.err")"
    c10d_train() {  # name, how (one|threads|cpu|torchrun N COMM)...
        local name="$1" how="$2"; shift 2
        local t0=$(date +%s) ok=0
        case "$how" in
            one) "$dpcomp" train --device "$device" $c10d_flags --quiet --out "$runs/$name" && ok=1 ;;
            threads) "$dpcomp" train --device "$device" $c10d_flags --quiet --thread-workers 2 --out "$runs/$name" && ok=1 ;;
            cpu) "$dpcomp" train --device cpu $c10d_flags --quiet --out "$runs/$name" && ok=1 ;;
            torchrun) launch "$1" train --device "$device" --comm "$2" $c10d_flags --quiet --out "$runs/$name" && ok=1 ;;
        esac
        if [ "$ok" = 1 ]; then log "train $name: $(( $(date +%s) - t0 )) s"; else log "train $name FAILED"; fi
    }
    c10d_train c10d_one_process one
    c10d_train c10d_torchrun_one_rank torchrun 1 "$one_comm"
    c10d_train c10d_thread_workers threads
    c10d_train c10d_torchrun_gloo_two_ranks torchrun 2 gloo
    [ "$device" = cuda ] && c10d_train c10d_cpu_one_process cpu
else
    log "torch.distributed.run not importable: c10d checks skipped"
fi
"$py" - "$c10d" "$runs" "$device" "$one_comm" "$out/c10d.json" <<'PY' || failed=1
import json, os, sys
c10d, runs, device, one_comm, out = sys.argv[1:6]
# The kit's tolerance for a device against its reference (check-device's compressors): 1e-4 of
# the larger magnitude.
TOLERANCE = 1e-4
report = {"device": device, "tolerance": TOLERANCE, "checks": [], "runs": {}}

def check(name, passed, detail, error=None):
    report["checks"].append({"name": name, "passed": bool(passed), "error": error,
                             "tolerance": TOLERANCE if error is not None else None, "detail": detail})

for label, comm, ranks in [("check_one_rank", one_comm, 1), ("check_gloo_two_ranks", "gloo", 2)]:
    try:
        result = json.load(open(os.path.join(c10d, label + ".json")))
        names = [r["collective"] for r in result["rank0"]]
        want = ["all_reduce_sum", "all_gather", "broadcast", "barrier", "all_reduce_tensor", "all_gather_tensor"]
        check(f"c10d/{label}", result["workers"] == ranks and names == want,
              f"--comm {comm}, {ranks} rank(s) over {result['transport']}: every collective's result checked on every rank, the tensor ones on {device}")
        report[label] = result
    except Exception as e:
        err = os.path.join(c10d, label + ".err")
        tail = open(err).read()[-1500:] if os.path.exists(err) else ""
        check(f"c10d/{label}", False, f"no result ({e}): {tail}")

def last(name):
    path = os.path.join(runs, name, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return rows[-1] if rows else None

for name in ["c10d_one_process", "c10d_torchrun_one_rank", "c10d_thread_workers",
             "c10d_torchrun_gloo_two_ranks", "c10d_cpu_one_process"]:
    row = last(name)
    if row is None:
        continue
    steps = max(row.get("steps") or 0, 1)
    report["runs"][name] = {
        "train_loss": row["train_loss"], "test_loss": row["test_loss"],
        "test_accuracy": row["test_accuracy"], "steps": row.get("steps"),
        "step_ms": 1e3 * row["epoch_seconds"] / steps,
        "host_reads_per_step": row.get("host_reads_per_step"),
        "comm_seconds": (row.get("workers") or {}).get("comm_seconds"),
    }

def difference(a, b):
    keys = ["train_loss", "test_loss"]
    scale = max(max(abs(a[k]), abs(b[k])) for k in keys) or 1.0
    return max(abs(a[k] - b[k]) for k in keys) / scale

for run, reference, what in [
        ("c10d_torchrun_one_rank", "c10d_one_process", f"one rank under torchrun (--comm {one_comm}) against one process"),
        ("c10d_torchrun_gloo_two_ranks", "c10d_thread_workers", "two ranks over Gloo against two thread workers")]:
    a, b = report["runs"].get(run), report["runs"].get(reference)
    if a is None or b is None:
        check(f"c10d/{run}", False, f"{what}: {run if a is None else reference} did not finish")
        continue
    error = difference(a, b)
    check(f"c10d/{run}", error <= TOLERANCE,
          f"{what} on {device}: train and test loss within {TOLERANCE} of the larger", error)
if "c10d_cpu_one_process" in report["runs"]:
    report["cpu_reference_difference"] = difference(report["runs"]["c10d_one_process"], report["runs"]["c10d_cpu_one_process"])
report["passed"] = all(c["passed"] for c in report["checks"])
json.dump(report, open(out, "w"), indent=1)
print("c10d checks:", sum(c["passed"] for c in report["checks"]), "of", len(report["checks"]), "passed")
sys.exit(0 if report["passed"] else 1)
PY

"$py" - "$runs" "$out/trainings.json" <<'PY'
import json, os, sys
runs, rows = sys.argv[1], {}
for name in sorted(os.listdir(runs)):
    path = os.path.join(runs, name, "metrics.jsonl")
    if os.path.exists(path):
        rows[name] = [json.loads(l) for l in open(path) if l.strip()]
    else:
        rows[name] = {"failed": True}
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY

# --- 4. full cells while minutes remain -------------------------------------------------------
if [ "$quick" = 0 ]; then
    grid_runs="$work/grid-runs"
    for grid in $grids; do
        left=$((deadline - $(date +%s)))
        [ "$left" -gt 60 ] || { log "4. no time left for $grid"; break; }
        # Cells already finished in the repository are copied first, so only unfinished ones run.
        name="$(basename "$grid" .toml)"
        mkdir -p "$grid_runs/$name"
        if [ -d "experiments/runs/$name/full" ]; then
            cp -r "experiments/runs/$name/full" "$grid_runs/$name/"
            # Copied, not run here: left out of runs.tar.gz.
            for cell in "$grid_runs/$name/full"/*/; do
                echo "runs/grids/$name/full/$(basename "$cell")" >> "$work/copied-cells"
            done
        fi
        todo=$("$dpcomp" grid "$grid" --profile full --runs "$grid_runs" --list 2>/dev/null | grep -vc "Finished" || true)
        log "4. $grid: $todo unfinished full cells, $left s left"
        [ "$todo" -gt 0 ] || continue
        timeout "$((left - 30))" "$dpcomp" grid "$grid" --profile full --runs "$grid_runs" || log "$grid stopped (time or error); it resumes"
    done
    [ -d "$grid_runs" ] && cp -r "$grid_runs" "$runs/grids"
fi
# Checkpoints stay behind (the device's files come back 16 MiB at most each).
touch "$work/copied-cells"
tar -czf "$out/runs.tar.gz" -C "$work" --exclude='checkpoint' --exclude='checkpoint.tmp' \
    --exclude-from="$work/copied-cells" runs

# --- summary ----------------------------------------------------------------------------------
"$py" - "$out" "$device" "$(( $(date +%s) - started ))" <<'PY'
import json, os, sys
out, device, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
check = json.load(open(os.path.join(out, "check_device.json")))
c10d = json.load(open(os.path.join(out, "c10d.json"))) if os.path.exists(os.path.join(out, "c10d.json")) else {}
benches = {b["bench"]: b.get("result") for b in json.load(open(os.path.join(out, "benches.json")))}
trainings = json.load(open(os.path.join(out, "trainings.json")))
table = []
for task in ["surnames", "cifar10", "cifar100", "snli"]:
    dp = benches.get(f"dp/{task}") or {}
    eager = benches.get(f"eager_pytorch/{task}") or {}
    opacus = benches.get(f"opacus/{task}") or {}
    table.append({
        "task": task, "batch_size": dp.get("batch_size"),
        "nonprivate_step_ms": dp.get("nonprivate_mean_step_seconds", 0) * 1e3 or None,
        "dp_step_ms": dp.get("dp_mean_step_seconds", 0) * 1e3 or None,
        "ratio_dp_over_nonprivate": dp.get("ratio_dp_over_nonprivate"),
        "dp_host_reads_per_step": dp.get("dp_host_reads_per_step"),
        "nonprivate_peak_device_bytes": dp.get("nonprivate_peak_device_bytes"),
        "dp_peak_device_bytes": dp.get("dp_peak_device_bytes"),
        "ratio_dp_over_nonprivate_peak_device": dp.get("ratio_dp_over_nonprivate_peak_device"),
        "ratio_ours_over_eager_pytorch": eager.get("ratio_dpcomp_over_pytorch"),
        "speedup_over_opacus": opacus.get("speedup_opacus_over_dpcomp"),
        "opacus_mode": opacus.get("opacus_mode"),
    })
compress = {k.split("/", 2)[1] + "/" + k.split("/", 2)[2]: {"ratio_compress_over_backward": v.get("ratio_compress_over_backward"),
                                  "achieved_rate": v.get("achieved_rate"),
                                  "message_bytes_ms": (v.get("mean_message_bytes_seconds") or 0) * 1e3 or None,
                                  "ratio_message_bytes_over_compress": v.get("ratio_message_bytes_over_compress")}
            for k, v in benches.items() if k.startswith("compress/") and v}
final = {name: (rows[-1] if isinstance(rows, list) and rows else rows) for name, rows in trainings.items()}
# The host reads of every training's steps on this device, and the step time the
# message's bytes cost (examples per second without / with them made).
host_reads = {name: row.get("host_reads_per_step") for name, row in final.items() if isinstance(row, dict)}
plain, made = final.get("cifar10_dp_dgc256") or {}, final.get("cifar10_dp_dgc256_bytes") or {}
bytes_cost = None
if plain.get("examples_per_second") and made.get("examples_per_second"):
    bytes_cost = {"examples_per_second_in_memory": plain["examples_per_second"],
                  "examples_per_second_through_bytes": made["examples_per_second"],
                  "ratio_step_time_bytes_over_in_memory": plain["examples_per_second"] / made["examples_per_second"],
                  "same_upstream_bits": plain.get("upstream_bits") == made.get("upstream_bits")}
summary = {"device": device, "seconds": seconds, "correct": check["passed"] and c10d.get("passed", False),
           "failed_checks": [c["name"] for c in check["checks"] + c10d.get("checks", []) if not c["passed"]],
           "c10d": {"passed": c10d.get("passed"), "runs": c10d.get("runs"),
                    "cpu_reference_difference": c10d.get("cpu_reference_difference")},
           "failed_benches": [k for k, v in benches.items() if v is None],
           "steps": table, "compressors": compress, "host_reads_per_step": host_reads,
           "message_bytes_in_the_step": bytes_cost, "trainings_last_epoch": final}
json.dump(summary, open(os.path.join(out, "gpu_check.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
log "done in $(( $(date +%s) - started )) s; files in $out"
exit $failed
