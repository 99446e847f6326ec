#!/usr/bin/env bash
# Tables and figures of the paper-scale grids from the committed logs in experiments/runs/
# (finished cells only; trains nothing, so it is safe while grid workers are running):
# experiments/results/<name>.full.{csv,md} and experiments/results/<name>-full/*.png and
# gradient_error.csv (each
# figure once, as PNG; `dpcomp plot` also draws SVG, which stays in the run folder's figures/,
# not committed), the ablations beside the grids they vary, then the numbers behind the
# verdict table (experiments/claims.py).
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
        # The gradient-error figures' numbers, where the grid measured them.
        if [ -f "$figures/gradient_error.csv" ]; then
            cp "$figures/gradient_error.csv" "experiments/results/$name-full/"
        fi
    fi
done
# The ablations (docs/results/compression-paper.md), drawn beside the grids whose arms they vary; the three accuracy figures
# are kept, in experiments/results/<name>/.
ablation() {
    local name="$1" title="$2"
    shift 2
    [ -d "experiments/runs/$name/full" ] || return 0
    "$bin" grid "experiments/$name.toml" --profile full --runs experiments/runs --tables-only \
        --results-dir experiments/results
    local figures="experiments/runs/$name/full/figures" beside=()
    for grid in "$@"; do beside+=(--beside "experiments/runs/$grid/full"); done
    rm -rf "$figures"
    "$bin" plot "experiments/runs/$name/full" "${beside[@]}" --out "$figures" --title "$title" >/dev/null
    mkdir -p "experiments/results/$name"
    for figure in accuracy_by_epsilon accuracy_by_bandwidth accuracy_per_epoch_smoothed; do
        cp "$figures/$figure.png" "experiments/results/$name/"
    done
}
ablation surnames_ablation "Surnames, with and without error feedback" surnames_dgc surnames_powersgd
ablation cifar10_ablation "CIFAR-10, with and without error feedback" cifar10_dgc
python3 experiments/claims.py
