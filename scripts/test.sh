#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), then runs every test in
# release mode (the same build the main job uses) and the doctests, builds the documentation
# with warnings as errors, then builds and runs tests/dependent-crate.
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/setup.sh
# shellcheck disable=SC2086 # the features are several words
cargo test --release $DPCOMP_CARGO_FEATURES "$@"
# The crate documentation builds without a warning (broken intra-doc links, stray HTML).
# shellcheck disable=SC2086
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --quiet $DPCOMP_CARGO_FEATURES
# A crate of one's own on the lean core (`default-features = false`), run without LD_LIBRARY_PATH:
# it exits non-zero unless its private training reaches its accuracy and ε (issue 36).
cargo build --release -p dpcomp-dependent-check
env -u LD_LIBRARY_PATH "${CARGO_TARGET_DIR:-target}/release/dpcomp-dependent-check"
