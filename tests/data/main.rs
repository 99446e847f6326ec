//! Data sets, their loaders and the downloader.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod data_tests;
mod fetch;
