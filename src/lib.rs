//! dpcomp: differentially private deep learning with gradient compression, on LibTorch.
//!
//! See the README's architecture section for how the modules fit together.
pub mod allocator;
pub mod analysis;
pub mod audit_experiment;
pub mod bench;
pub mod comm;
pub mod compress;
pub mod config;
pub mod convex;
pub mod csv_table;
pub mod cuda_memory;
pub mod data;
pub mod error;
pub mod experiment;
pub mod fl;
pub mod grid;
pub mod json_floats;
pub mod models;
pub mod nn;
pub mod plot;
pub mod privacy;
pub mod rng_state;
pub(crate) mod run_folder;
pub mod run_lock;
pub mod tasks;
pub mod train;

pub use config::{Task, TrainConfig};

/// Unit tests that seed or draw from LibTorch's process-global generator take this lock, so that
/// tests running in parallel threads do not draw from each other's streams.
#[cfg(test)]
pub(crate) fn test_serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}
pub use error::{Error, Result};
pub use models::Model;
pub use train::Trainer;

/// What training a model and data of one's own needs: the layers and the context that records
/// them, the trait for a layer kind of one's own, the per-sample gradients of a forward pass, the
/// privacy engine, the optimisers and Poisson sampling for a loop of one's own
/// (`examples/private_tabular.rs`); or the `Trainer` with its configuration, datasets and
/// compressors, which runs the loop with checkpoints and resumes (`examples/own_model_trainer.rs`).
pub mod prelude {
    pub use crate::compress::{Compressor, CompressorKind, Denoise, Dgc, PowerSgd, Sketch};
    pub use crate::config::{AccountantKind, DeviceChoice, TrainConfig, TrainOverrides};
    pub use crate::data::sampler::{poisson_batches, shuffled_batches};
    pub use crate::data::{Dataset, Features, TaskData};
    pub use crate::error::{Error, Result};
    pub use crate::models::Model;
    pub use crate::nn::{
        AttentionConfig, Conv2d, Conv2dConfig, Ctx, Embedding, GroupNorm, Gru, InstanceNorm2d,
        LayerGradients, LayerNorm, Linear, LinearConfig, Lstm, MultiheadAttention, PerSample,
        PerSampleGradient, Recorded,
    };
    pub use crate::privacy::engine::{AdaptiveClipping, Clipped, Clipping, PrivacyEngine};
    pub use crate::privacy::grad_sample::per_sample_of;
    pub use crate::privacy::noise::NoiseSource;
    pub use crate::train::adam::Adam;
    pub use crate::train::checkpoint::{load_weights, save_weights};
    pub use crate::train::metrics::Summary;
    pub use crate::train::observer::Observer;
    pub use crate::train::optimizer::Optimizer;
    pub use crate::train::sgd::Sgd;
    pub use crate::train::update::Updater;
    pub use crate::train::{evaluate, Trainer};
}
