#!/usr/bin/env bash
# Prepares, here, everything a CUDA machine without network or cargo needs to run
# scripts/gpu-check.sh, in the ignored folder gpu-kit/:
#
#   gpu-kit/dpcomp.gz          the release binary (without MPI; with c10d on Gloo and NCCL where
#                              their headers are here), stripped and gzipped (it finds LibTorch
#                              through LD_LIBRARY_PATH there; gpu-check.sh sets it from python3's torch)
#   gpu-kit/wheels/            opacus==1.6.0 (pure Python; numpy, scipy and opt-einsum are in the
#                              device image, see the device tool's KINDS.md), installed offline
#   gpu-kit/data/              names (all of it), SNLI dev and test, and a CIFAR-10 subset: the
#                              first TRAIN/5 records of each training file and the first TEST of
#                              the test file, gzipped: at most 8,000 and 2,000, fewer (4 to 1)
#                              where the working tree leaves less room
#   gpu-kit/bert/              MiniLM's config and tokenizer; its weights (91 MB) do not fit
#   gpu-kit/bert_shapes.json   the weights' names and shapes, from which gpu-check.sh builds a
#                              randomly initialised MiniLM of the same architecture
#
# Why a subset: the device tool carries at most 64 MiB per call, the working tree included
# (tracked and untracked files git does not ignore: 42 MiB on 2026-12-06, most of it committed
# grid cells and figures); the full CIFAR-10 training set is 154 MB. Unless --cifar-train and
# --cifar-test are given, the subset is sized to the room the rest leaves; the script refuses a
# kit that would not fit, and prints what it holds.
#
#   bash scripts/gpu-kit.sh                       # build, strip, download the wheel, pack data
#   bash scripts/gpu-kit.sh --bin PATH --no-wheels --out DIR   # the test's rehearsal kit
#
# On the device:  run(command="bash scripts/gpu-check.sh --device cuda", carry=["gpu-kit"]).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

out="gpu-kit"
bin=""
wheels=1
train=""
test=""
# What one device call may carry, less a margin for results committed later.
limit=$((60 * 1024 * 1024))
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        --no-wheels) wheels=0; shift ;;
        --cifar-train) train="$2"; shift 2 ;;
        --cifar-test) test="$2"; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "gpu-kit.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
log() { echo "[gpu-kit] $*" >&2; }

if [ -z "$bin" ]; then
    source scripts/setup.sh
    # Without the `mpi` feature: the GPU machine has no MPI library. With c10d on Gloo and NCCL
    # where Gloo's headers are here (they need only LibTorch there), for gpu-check.sh's torchrun
    # jobs; NCCL compiles where its headers are (build.rs).
    c10d=""
    [ -f /usr/include/gloo/config.h ] && c10d="--features gloo,nccl"
    cargo build --release --quiet --no-default-features $c10d --target-dir target/gpu-kit
    bin=target/gpu-kit/release/dpcomp
fi
[ -x "$bin" ] || { echo "gpu-kit.sh: --bin $bin: not an executable" >&2; exit 2; }
# The data folder as dpcomp resolves it: $DPCOMP_DATA (scripts/setup.sh sets it), else data/.
data="${DPCOMP_DATA:-$root/data}"
for need in names cifar-10-batches-bin snli_1.0; do
    [ -d "$data/$need" ] || { echo "gpu-kit.sh: $data/$need missing (set DPCOMP_DATA to the data folder)" >&2; exit 2; }
done
bert="$root/models/all-MiniLM-L6-v2"
[ -f "$bert/config.json" ] || { echo "gpu-kit.sh: $bert/config.json missing (run scripts/setup.sh)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/wheels" "$out/data/cifar-10-batches-bin" "$out/data/names" "$out/data/snli_1.0" "$out/bert"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$bin" "$tmp/dpcomp"
strip "$tmp/dpcomp" 2>/dev/null || log "strip unavailable: binary kept with symbols"
gzip -6 -c "$tmp/dpcomp" > "$out/dpcomp.gz"

if [ "$wheels" = 1 ]; then
    python="${root}/.venv/bin/python"
    [ -x "$python" ] || python=python3
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d "$out/wheels" "opacus==1.6.0"
fi

# What travels besides the kit: tracked files and untracked ones git does not ignore, summed in
# one pass (`du -c` over `xargs` would total only xargs' last batch).
tree_bytes() {
    git ls-files -z --cached --others --exclude-standard \
        | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
}
record=3073
if [ -z "$train" ] || [ -z "$test" ]; then
    # Room for CIFAR-10 records, counted uncompressed (gzip -1 saves a few per cent of them),
    # with 1 MiB for the rest of the kit still to come; train:test 4:1, train a multiple of 5.
    room=$((limit - $(tree_bytes) - $(du -sb "$out" | cut -f1) - 1048576 - 2 * 1048576))
    fit=$((room / record))
    [ "$fit" -ge 1250 ] || { echo "gpu-kit.sh: the working tree leaves room for $fit CIFAR-10 images (at least 1,250 needed): ignore or carry less" >&2; exit 1; }
    [ -n "$train" ] || { train=$((fit * 4 / 5 / 5 * 5)); [ "$train" -le 8000 ] || train=8000; }
    [ -n "$test" ] || { test=$((fit - train)); [ "$test" -le 2000 ] || test=2000; }
    [ "$test" -ge 250 ] || { echo "gpu-kit.sh: --cifar-train $train leaves room for $test test images (at least 250 needed)" >&2; exit 1; }
    log "CIFAR-10 subset sized to the room left: $train training and $test test images"
fi
for i in 1 2 3 4 5; do
    head -c $((record * (train / 5))) "$data/cifar-10-batches-bin/data_batch_$i.bin" \
        | gzip -1 > "$out/data/cifar-10-batches-bin/data_batch_$i.bin.gz"
done
head -c $((record * test)) "$data/cifar-10-batches-bin/test_batch.bin" \
    | gzip -1 > "$out/data/cifar-10-batches-bin/test_batch.bin.gz"
cp "$data/cifar-10-batches-bin/batches.meta.txt" "$out/data/cifar-10-batches-bin/" 2>/dev/null || true
cp "$data"/names/*.txt "$out/data/names/"
for split in dev test; do
    gzip -6 -c "$data/snli_1.0/snli_1.0_$split.jsonl" > "$out/data/snli_1.0/snli_1.0_$split.jsonl.gz"
done
for f in config.json tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json; do
    [ -f "$bert/$f" ] && cp "$bert/$f" "$out/bert/"
done
# Names and shapes from the safetensors header (8-byte length, then JSON), not the weights.
python3 - "$bert/model.safetensors" "$out/bert_shapes.json" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
json.dump(shapes, open(sys.argv[2], "w"), indent=0, sort_keys=True)
PY
printf 'cifar_train=%s\ncifar_test=%s\n' "$train" "$test" > "$out/kit.txt"

kit_bytes=$(du -sb "$out" | cut -f1)
tracked=$(tree_bytes)
total=$((kit_bytes + tracked))
log "$out: $((kit_bytes / 1024)) KiB; with the working tree ($((tracked / 1024)) KiB) $((total / 1048576)) MiB of the $((limit / 1048576)) MiB allowed"
if [ "$total" -gt "$limit" ]; then
    echo "gpu-kit.sh: kit + tracked tree = $total bytes, over $limit: lower --cifar-train" >&2
    exit 1
fi
