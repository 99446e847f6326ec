#!/usr/bin/env bash
# The main job: installs what is missing (scripts/setup.sh), builds the release binary, and trains
# the Surnames LSTM for 5 epochs with the paper's settings, printing the test accuracy.
# Extra arguments go to `dpcomp train` (e.g. --epochs 100).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/setup.sh
# shellcheck disable=SC2086 # the features are several words
cargo build --release --quiet $DPCOMP_CARGO_FEATURES
data="${DPCOMP_DATA:-data}"
if [ ! -d "$data/names" ]; then
    target/release/dpcomp data fetch names --data-dir "$data"
fi
out="runs/surnames-$(date +%Y%m%d-%H%M%S)"
exec target/release/dpcomp train --task surnames --epochs 5 --data-dir "$data" --out "$out" "$@"
