//! dpcomp: differentially private deep learning with gradient compression, on LibTorch.
//!
//! DP-SGD with per-sample gradients from one backward pass (clipping, calibrated noise, Poisson
//! sampling, RDP and PLD accountants), gradient compressors that send real byte messages (DGC,
//! PowerSGD, Denoise, the federated sketches, and the families researchers compare against:
//! QSGD, TernGrad, signSGD, random-k, threshold-v, casts, natural compression), a `Trainer` that
//! runs any model and data with checkpoints and resumes, data-parallel workers over threads
//! or MPI, federated learning, and privacy auditing.
//!
//! Where things live:
//!
//! | module | what it holds |
//! |---|---|
//! | [`nn`], [`models`] | layers that record what per-sample gradients need; the [`Model`] trait and a model zoo (LSTM, CNN, ResNet-18, BERT) |
//! | [`hf`] | Hugging Face transformers in and out: BERT, RoBERTa, GPT-2, Llama; full, last-k, BiTFiT and LoRA fine-tuning |
//! | [`data`] | datasets, Poisson and shuffled batches, loaders of the public data sets |
//! | [`privacy`] | the [`privacy::engine::PrivacyEngine`] (clip, noise, account), accountants, σ calibration, audits |
//! | [`compress`] | typed compressor settings ([`compress::Compressor`]), encoders, decoders and their byte messages |
//! | [`train`] | the [`Trainer`] and its builder, optimisers, the `Updater`, observers |
//! | [`config`], [`error`] | a run's settings ([`TrainConfig`], its `config.toml`); the library's [`Error`] |
//! | [`run_folder`], [`run_lock`], [`run_log`] | a run's folder: files written whole, one process at a time, packed logs |
//! | [`cuda_settings`], [`cuda_memory`], [`allocator`] | CUDA's math settings, peak device memory, the host allocator's settings |
//! | [`comm`] | W workers over threads or MPI |
//! | [`fl`] | federated learning with compressive sensing |
//! | [`host`] | every read of a tensor's value to the host, counted (a training step makes none) |
//!
//! The papers' tasks, experiment grids, figures, analyses and convex DP-SGD are a crate of their
//! own on this one (`dpcomp-lab`); the `dpcomp` command line is built on both.
//!
//! The papers whose methods dpcomp implements, cited in these docs by author and year:
//! Lin 2022, "On the Interaction Between Differential Privacy and Gradient Compression in Deep
//! Learning"; Kerkouche, Ács, Castelluccia and Genevès 2021, "Compression Boosts Differentially
//! Private Federated Learning"; Wang, Lei, Ying and Zhang 2022, "Differentially Private SGD with
//! Non-Smooth Losses"; and for the audits, Steinke, Nasr and Jagielski 2023, "Privacy Auditing
//! with One (1) Training Run".
//!
//! [`prelude`] has what a training of one's own needs.
//!
//! A private training in a loop of one's own: a linear classifier on synthetic rows, DP-SGD at
//! σ 1.5 with Poisson batches of expected size 40 out of 1,000 rows (q = 0.04) for 2,250 steps.
//! Its ε is the accountant's for those settings, the value Opacus's own test expects
//! (7.32911117143 at δ = 10⁻⁵), and the model still learns.
//!
//! ```
//! use dpcomp::prelude::*;
//! use tch::{nn, Device, Kind, Reduction, Tensor};
//!
//! tch::manual_seed(0);
//! let x = Tensor::randn([1000, 4], (Kind::Float, Device::Cpu));
//! let y = x.select(1, 0).gt(0.0).to_kind(Kind::Int64); // the label is the first feature's sign
//! let vs = nn::VarStore::new(Device::Cpu);
//! let model = Linear::new(&(vs.root() / "linear"), 4, 2, LinearConfig::default())?;
//! let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
//! let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
//!
//! let mut engine = PrivacyEngine::builder()
//!     .noise_multiplier(1.5)
//!     .max_grad_norm(1.0)
//!     .dataset_size(1000)
//!     .batch_size(40) // q = 1 / ⌈1000 / 40⌉ = 0.04, 25 steps an epoch
//!     .epochs(90)
//!     .delta(1e-5)
//!     .accountant(AccountantKind::Rdp) // Opacus's RDPAccountant, whose test gives that ε
//!     .build(&params)?;
//! let mut sgd = Sgd::new(0.5, 0.0);
//! for _ in 0..90 {
//!     for index in poisson_batches(1000, engine.sample_rate(), 25) {
//!         let mut ctx = Ctx::private();
//!         let logits = model.forward(&x.index_select(0, &index), &mut ctx)?;
//!         let loss = logits.cross_entropy_loss::<Tensor>(
//!             &y.index_select(0, &index), None, Reduction::Sum, -100, 0.0);
//!         let per_sample = per_sample_of(&mut ctx, &params, &loss)?;
//!         let grads = engine.privatize(&engine.clip(&per_sample))?; // noise + accountant step
//!         tch::no_grad(|| sgd.step(&tensors, &grads));
//!     }
//! }
//! assert_eq!(engine.accountant().steps(), 2250);
//! assert!((engine.epsilon()? - 7.32911117143).abs() < 1e-8);
//! let logits = tch::no_grad(|| model.forward(&x, &mut Ctx::eval()))?;
//! let accuracy = logits.argmax(-1, false).eq_tensor(&y).to_kind(Kind::Double).mean(Kind::Double);
//! assert!(dpcomp::host::f64_scalar(&accuracy) > 0.9);
//! # Ok::<(), dpcomp::error::Error>(())
//! ```
#![deny(missing_docs)]

pub mod allocator;
pub mod comm;
pub mod compress;
pub mod config;
pub mod cuda_memory;
pub mod cuda_settings;
pub mod data;
pub mod error;
pub mod fl;
pub mod hf;
pub mod host;
pub mod json_floats;
pub mod models;
pub mod nn;
pub mod privacy;
pub(crate) mod progress_bar;
pub mod rng_state;
pub mod run_folder;
pub mod run_lock;
pub mod run_log;
pub mod train;

pub use config::TrainConfig;

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
    pub use crate::privacy::engine::{
        AdaptiveClipping, Clipped, Clipping, LossReduction, PrivacyEngine,
    };
    pub use crate::privacy::grad_sample::per_sample_of;
    pub use crate::privacy::noise::NoiseSource;
    pub use crate::train::adam::Adam;
    pub use crate::train::checkpoint::{load_weights, save_weights};
    pub use crate::train::metrics::Summary;
    pub use crate::train::observer::Observer;
    pub use crate::train::optimizer::Optimizer;
    pub use crate::train::parts::CompressorFactory;
    pub use crate::train::sgd::Sgd;
    pub use crate::train::update::Updater;
    pub use crate::train::{evaluate, Trainer};
}
