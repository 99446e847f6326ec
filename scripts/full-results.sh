#!/usr/bin/env bash
# Tables and figures of the paper-scale grids from the committed logs in experiments/runs/
# (finished cells only; trains nothing, so it is safe while grid workers are running):
# experiments/results/<name>.full.{csv,md} and experiments/results/<name>-full/*.png (each
# figure once, as PNG; `dpcomp plot` also draws SVG, which stays in the run folder's figures/,
# not committed), then the numbers behind the README's verdict table (experiments/claims.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin=target/release/dpcomp
for name in surnames_dgc surnames_powersgd surnames_denoise surnames_clipping cifar10_dgc; do
    [ -d "experiments/runs/$name/full" ] || continue
    "$bin" grid "experiments/$name.toml" --profile full --runs experiments/runs --tables-only \
        --results-dir experiments/results
    if ls experiments/runs/"$name"/full/*/summary.json >/dev/null 2>&1; then
        figures="experiments/runs/$name/full/figures"
        rm -rf "$figures" "experiments/results/$name-full"
        "$bin" plot "experiments/runs/$name/full" --out "$figures" --title "$name (full)" >/dev/null
        mkdir -p "experiments/results/$name-full"
        cp "$figures"/*.png "experiments/results/$name-full/"
    fi
done
python3 experiments/claims.py
