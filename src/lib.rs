//! dpcomp: differentially private deep learning with gradient compression, on LibTorch.
//!
//! See the README's architecture section for how the modules fit together.
pub mod allocator;
pub mod analysis;
pub mod bench;
pub mod cli;
pub mod compress;
pub mod config;
pub mod convex;
pub mod cuda_memory;
pub mod data;
pub mod error;
pub mod fl;
pub mod grid;
pub mod models;
pub mod nn;
pub mod plot;
pub mod privacy;
pub mod run_lock;
pub mod tasks;
pub mod train;

pub use config::{Task, TrainConfig};
pub use error::{Error, Result};
pub use models::Model;
pub use train::Trainer;
