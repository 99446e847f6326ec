//! The Trainer: runs, resumes, optimisers, parts of one's own, exports, and the host reads of a step.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod dp_training;
mod export_command;
mod export_to_pytorch;
mod hf_fine_tuning;
mod host_reads;
mod library_api;
mod optimizer;
mod own_model_trainer;
mod own_parts;
mod train;
