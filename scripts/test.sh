#!/usr/bin/env bash
# The whole test suite: installs what is missing (scripts/setup.sh), checks formatting and
# clippy's lints (rustup's default profile installs both components), then runs every test in
# release mode (the same build the main job uses) and the doctests of the whole workspace (the
# framework crates/dpcomp, the lab crates/dpcomp-lab, the command line at the root), builds the
# two crates' documentation with warnings as errors, then builds and runs tests/dependent-crate.
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/setup.sh
# Formatting and lints first: they take a minute or two and fail fast. Every target (library,
# binary, tests, examples, benches, the dependent crate) must be rustfmt's and clippy-clean.
cargo fmt --all --check
# shellcheck disable=SC2086 # the features are several words
cargo clippy --release --workspace --all-targets $DPCOMP_CARGO_FEATURES -- -D warnings
# shellcheck disable=SC2086
cargo test --release --workspace $DPCOMP_CARGO_FEATURES "$@"
# The crate documentation builds without a warning (broken intra-doc links, stray HTML).
# Only the framework's and the lab's libraries are documented (`-p dpcomp -p dpcomp-lab --lib
# --no-deps`), in the release profile the tests were just built in, so that LibTorch's C++ wrapper in torch-sys's build script, dpcomp's
# own build.rs and every proc-macro are reused: rustdoc then only needs the dependencies checked
# (metadata: about 1 minute on 2 cores in a fresh clone, seconds afterwards). A plain
# `cargo doc` reruns all of those build scripts in the dev profile and documents 190 dependency
# crates: about 9 minutes on the same machine (measured 2026-12-07, see that day's commit).
# shellcheck disable=SC2086
RUSTDOCFLAGS="-D warnings" cargo doc --release -p dpcomp -p dpcomp-lab --lib --no-deps --quiet $DPCOMP_CARGO_FEATURES
# A crate of one's own on the lean core (`default-features = false`), run without LD_LIBRARY_PATH:
# it exits non-zero unless its private training reaches its accuracy and ε.
cargo build --release -p dpcomp-dependent-check
env -u LD_LIBRARY_PATH "${CARGO_TARGET_DIR:-target}/release/dpcomp-dependent-check"
