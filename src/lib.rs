//! dpcomp: differentially private deep learning with gradient compression, on LibTorch.
//!
//! The framework's surface: `nn` (layers that record per-sample gradients) and `models`,
//! `data` (datasets and Poisson sampling), `host` (every read of a tensor's value to the host,
//! counted; issue 37: a training step makes none), `privacy` (the `PrivacyEngine` and its
//! builder, accountants, calibration, audits), `compress` (typed compressor settings and their byte
//! messages), `train` (the `Trainer` and its builder, optimisers, the `Updater`, observers),
//! `comm` (W workers over threads or MPI), `fl` (federated learning), `convex` (DP-SGD for
//! convex losses), `analysis`, and the reproduction's runners (`experiment`, `grid`, `plot`).
//! `prelude` has what a training of one's own needs. Modules marked hidden in these docs are
//! plumbing that the `dpcomp` binary and the tests share; they are not part of the API.
//!
//! ```
//! use dpcomp::prelude::*;
//! let params = [tch::Tensor::zeros([10], (tch::Kind::Float, tch::Device::Cpu))];
//! let engine = PrivacyEngine::builder()
//!     .noise_multiplier(1.1)
//!     .delta(1e-5)
//!     .dataset_size(60_000)
//!     .expected_batch_size(256.0)
//!     .max_grad_norm(1.0)
//!     .epochs(10)
//!     .build(&params)?;
//! assert_eq!(engine.sample_rate(), 256.0 / 60_000.0);
//! # Ok::<(), dpcomp::error::Error>(())
//! ```
#![deny(missing_docs)]

#[doc(hidden)]
pub mod allocator;
pub mod analysis;
pub(crate) mod audit_experiment;
#[doc(hidden)]
pub mod bench;
pub mod comm;
pub mod compress;
pub mod config;
pub mod convex;
#[doc(hidden)]
pub mod csv_table;
#[doc(hidden)]
pub mod cuda_memory;
pub mod cuda_settings;
pub mod data;
pub mod error;
pub mod experiment;
pub mod fl;
pub mod grid;
pub mod host;
#[doc(hidden)]
pub mod json_floats;
pub mod models;
pub mod nn;
#[cfg(feature = "plot")]
pub mod plot;
pub mod privacy;
pub(crate) mod progress_bar;
#[doc(hidden)]
pub mod rng_state;
pub(crate) mod run_folder;
#[doc(hidden)]
pub mod run_lock;
#[doc(hidden)]
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
    pub use crate::nn::per_sample::Activations;
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
