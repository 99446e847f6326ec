//! The lab: experiment files and grids, analyses, convex DP-SGD, and the committed cells, logs and tables.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod analysis;
mod committed_cells;
mod committed_logs;
mod committed_tables;
mod config_files;
mod convex;
mod grid;
mod results_tables;
