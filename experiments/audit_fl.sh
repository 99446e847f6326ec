#!/bin/bash
# Canary-client audits of client-level DP on Fashion-MNIST (the default LeNet, 1,000
# clients sampled at C 0.01), 100 rounds, ratio 0.05 (rate 20), 500 Dirac canary clients:
# FL-STD, FL-RND and FL-CS, each at sigma 0 and at the sigma of epsilon 1. Folders keep the
# paper's r (FL-STD's too, which sends everything). Skips cells that have audit.json.
#   bash experiments/audit_fl.sh     (about 1-2 min a cell on one core)
set -euo pipefail
cd "$(dirname "$0")/.."
DPCOMP=${DPCOMP:-target/release/dpcomp}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for scheme in std cs rnd; do
  case $scheme in
    std) compression="--compressor identity" ;;
    *) compression="--compressor fl-$scheme --rate 20" ;;
  esac
  for privacy in "sigma0:--noise-multiplier 0" "eps1:--target-epsilon 1"; do
    label=${privacy%%:*}
    flags=${privacy#*:}
    dir=experiments/runs/audit_fl/fashion-mnist/$scheme-r0.05-$label
    [ -f "$dir/audit.json" ] && continue
    rm -rf "$dir"
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    "$DPCOMP" fl --dataset fashion-mnist $compression --dp $flags \
      --rounds 100 --audit-canaries 500 --out "$dir" > "$dir/stdout.txt" 2>&1
  done
done
# Finished runs' logs are committed packed (metrics.jsonl.gz), as `dpcomp grid` leaves them.
"$DPCOMP" pack experiments/runs/audit_fl
