//! Compressors, their byte messages and trainings through them.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod ablation_options;
mod compress;
mod compressed_training;
mod compressor_families;
mod wire;
