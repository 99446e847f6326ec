//! Federated runs and their committed cells.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod fl;
mod fl_committed_cells;
mod own_model;
