#!/usr/bin/env bash
# The main job: installs what is missing (scripts/setup.sh), builds the release binary, and trains
# the Surnames LSTM for 5 epochs with the paper's settings on the names data the repository ships,
# printing the test accuracy.
# Extra arguments go to `dpcomp train` (e.g. --epochs 100) and replace the defaults they name.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/setup.sh
# shellcheck disable=SC2086 # the features are several words
cargo build --release --quiet $DPCOMP_CARGO_FEATURES
# Where cargo put it (CARGO_TARGET_DIR, else target/).
dpcomp="${CARGO_TARGET_DIR:-target}/release/dpcomp"
# The Surnames data ship with the repository in data/names/, so the job downloads nothing: it
# reads $DPCOMP_DATA when that folder has names/, else the checkout's data/.
data="${DPCOMP_DATA:-data}"
if [ ! -d "$data/names" ]; then
    echo "[run] $data has no names/: reading the Surnames data shipped in data/names/" >&2
    data="data"
fi
# The job's defaults, each left out when the caller gives that flag itself (clap refuses a flag
# given twice).
defaults=()
given() { local flag="$1"; shift; for a in "$@"; do [[ "$a" == "$flag" || "$a" == "$flag="* ]] && return 0; done; return 1; }
given --task "$@" || defaults+=(--task surnames)
given --epochs "$@" || defaults+=(--epochs 5)
given --data-dir "$@" || defaults+=(--data-dir "$data")
given --out "$@" || defaults+=(--out "runs/surnames-$(date +%Y%m%d-%H%M%S)")
exec "$dpcomp" train "${defaults[@]}" "$@"
