#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), then runs every test in
# release mode (the same build the main job uses). Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/setup.sh
# shellcheck disable=SC2086 # the features are several words
cargo test --release $DPCOMP_CARGO_FEATURES "$@"
