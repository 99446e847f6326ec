//! Gradient error (the paper's Figures 3.6-3.9 and appendices C-E): on fixed batches, the squared
//! distance between the true mean gradient ḡ = (1/B) Σ_i g_i (unclipped, noiseless) and the
//! gradient after each stage of the pipeline, cumulatively:
//!
//! - `clip`: ĝ_clip = (1/B) Σ_i c_i g_i, c_i = min(1, C / ||g_i||) (per-sample clipping under DP;
//!   without DP, the mean gradient clipped to global norm C, as the non-private step does);
//! - `noise`: ĝ_noise = ĝ_clip + N(0, σ² C² I) / B (the Gaussian mechanism; zero without DP);
//! - `compress`: what the receiver decompresses from the message of ĝ_noise, sent by a fresh copy
//!   of the run's compressor state (residuals, velocities, warm-start factors as they are at that
//!   point of training), so error feedback and Denoise's averaging count as they do in training.
//!
//! Each stage is drawn `draws` times (noise draws; the compress stage reuses the noise stage's
//! draws, paired) and its mean squared error E||ĝ - ḡ||² is split into bias² = ||E ĝ - ḡ||² and
//! variance = E||ĝ - E ĝ||² (unbiased estimates from the draws, so error = bias² + variance up to
//! rounding; a bias² far below variance / draws can come out slightly negative and is reported
//! as measured), then averaged over the fixed batches. The divisor is the batch's size B (a fixed
//! batch has no Poisson size to divide by).
//!
//! Results go to the run's `grad_error.jsonl`, one line per measured epoch.

use super::{flatten, squared_norm, unflatten, BatchGradients, NOISE_SEED};
use dpcomp::compress::{Compressor, Link};
use dpcomp::data::Dataset;
use dpcomp::error::{Error, Result};
use dpcomp::json_floats::nan_if_null;
use dpcomp::models::Model;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// The run file the measurements are appended to.
pub const FILE: &str = "grad_error.jsonl";

/// The privacy mechanism whose error is measured.
#[derive(Debug, Clone, Copy)]
pub enum Mechanism {
    /// DP-SGD: per-sample clipping to C and N(0, σ²C²) on the sum (σ = 0: clipping only).
    PerSample {
        /// σ: the noise's standard deviation per unit C (0: clipping only).
        noise_multiplier: f64,
        /// C, the per-sample clipping radius (L2).
        max_norm: f64,
    },
    /// Non-private training: the mean gradient clipped to global norm C.
    GlobalClip {
        /// C, the radius the mean gradient's global L2 norm is clipped to.
        max_norm: f64,
    },
}

/// Mean squared error of one stage against the true mean gradient, and its split.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageError {
    /// "clip", "noise" or "compress".
    pub stage: String,
    /// E||ĝ - ḡ||², the mean squared distance from the true mean gradient (averaged over the
    /// batches).
    #[serde(deserialize_with = "nan_if_null")]
    pub error: f64,
    /// ||E ĝ - ḡ||², the squared bias (unbiased estimate; may come out slightly negative).
    #[serde(deserialize_with = "nan_if_null")]
    pub bias2: f64,
    /// E||ĝ - E ĝ||², the variance over the draws (0 for the deterministic `clip` stage).
    #[serde(deserialize_with = "nan_if_null")]
    pub variance: f64,
}

/// One measurement, as a line of `grad_error.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GradientErrorRecord {
    /// Epochs trained before the measurement (0: the initial weights).
    pub epoch: usize,
    /// Optimiser steps the run had taken before the measurement.
    pub steps: u64,
    /// σ (0 without DP).
    pub noise_multiplier: f64,
    /// C, the run's clipping radius.
    pub max_norm: f64,
    /// B, examples per fixed batch: the run's expected batch size.
    pub batch_size: i64,
    /// Fixed batches measured (`analysis::fixed_batches`).
    pub batches: usize,
    /// Noise draws per batch.
    pub draws: usize,
    /// m, trainable scalars.
    pub parameters: i64,
    /// Median per-sample gradient norm (mean over the batches).
    #[serde(deserialize_with = "nan_if_null")]
    pub median_norm: f64,
    /// ||ḡ|| (mean over the batches).
    #[serde(deserialize_with = "nan_if_null")]
    pub mean_gradient_norm: f64,
    /// The run's compressor label ("identity", "dgc x256", "powersgd r1", ...).
    pub compressor: String,
    /// The stages' errors, in pipeline order: "clip", "noise", "compress".
    pub stages: Vec<StageError>,
}

impl GradientErrorRecord {
    /// The error of the stage named `name` ("clip", "noise" or "compress"); `None` for another
    /// name.
    pub fn stage(&self, name: &str) -> Option<&StageError> {
        self.stages.iter().find(|s| s.stage == name)
    }
}

/// Running moments of draws of an estimate (Welford): mean vector, Σ||x - mean||², and the sum
/// of squared errors against the reference.
struct Moments {
    count: usize,
    mean: Tensor,
    m2: f64,
    squared_error: f64,
}

impl Moments {
    fn new(reference: &Tensor) -> Self {
        Moments {
            count: 0,
            mean: reference.zeros_like(),
            m2: 0.0,
            squared_error: 0.0,
        }
    }

    fn add(&mut self, x: &Tensor, reference: &Tensor) {
        self.count += 1;
        let before = x - &self.mean;
        self.mean += &before / self.count as f64;
        let after = x - &self.mean;
        self.m2 += dpcomp::host::f64_scalar(&(before * after).sum(Kind::Double));
        self.squared_error += squared_norm(&(x - reference));
    }

    /// (error, bias², variance) with the unbiased estimators over R draws: variance
    /// Σ||x - x̄||² / (R - 1), bias² ||x̄ - ḡ||² - variance / R (||x̄ - ḡ||² alone overstates the
    /// bias by variance / R), so that error = mean ||x - ḡ||² = bias² + variance exactly. One
    /// draw (a deterministic stage) has no variance.
    fn finish(&self, reference: &Tensor) -> [f64; 3] {
        let r = self.count.max(1) as f64;
        let variance = if self.count > 1 {
            (self.m2 / (r - 1.0)).max(0.0)
        } else {
            0.0
        };
        let error = self.squared_error / r;
        let bias2 = squared_norm(&(&self.mean - reference)) - variance / r;
        [error, bias2, variance]
    }
}

/// Where the compress stage's fresh compressors come from: the run's compressor and shapes, the
/// state to start from, and the epoch (for schedules such as DGC's warm-up).
pub struct CompressorSource<'a> {
    /// The run's compressor setting.
    pub compressor: &'a Compressor,
    /// The trainable parameters' shapes, in order.
    pub shapes: &'a [Vec<i64>],
    /// The compressor's state as the run holds it (as in `compressor.safetensors`; empty for a
    /// stateless compressor or at the start); copied, never written.
    pub state: Vec<(String, Tensor)>,
    /// The epoch (0-based) the compressor is told of (DGC's warm-up rate).
    pub epoch: usize,
    /// Where the compressors run: the gradients' device.
    pub device: Device,
}

impl CompressorSource<'_> {
    /// A new compressor holding a copy of the state (`load_state` copies, so the run's own
    /// tensors are never written).
    fn fresh(&self) -> Result<Link> {
        let mut compressor = self.compressor.link(self.shapes, self.device)?;
        let state: HashMap<String, Tensor> = self
            .state
            .iter()
            .map(|(k, t)| (k.clone(), t.shallow_clone()))
            .collect();
        if !state.is_empty() {
            compressor.load_state(state)?;
        }
        compressor.start_epoch(self.epoch);
        Ok(compressor)
    }
}

/// Stage errors and norms averaged over the fixed batches.
pub struct Measured {
    /// The errors of "clip", "noise" and "compress", in that order.
    pub stages: Vec<StageError>,
    /// Median per-sample gradient norm (mean over the batches).
    pub median_norm: f64,
    /// ||ḡ||, the norm of the true mean gradient (mean over the batches).
    pub mean_gradient_norm: f64,
    /// m, the trainable scalars.
    pub parameters: i64,
    /// B, examples per batch.
    pub batch_size: i64,
}

/// Measures the three stages on `batches` of `data` at the model's current weights.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    model: &dyn Model,
    params: &[(String, Tensor)],
    data: &Dataset,
    device: Device,
    mechanism: Mechanism,
    compressor: &CompressorSource,
    batches: &[Tensor],
    draws: usize,
) -> Result<Measured> {
    if batches.is_empty() || draws == 0 {
        return Err(Error::bad_value(
            "gradient error",
            "needs at least one batch and one draw",
        ));
    }
    tch::manual_seed(NOISE_SEED);
    let names = ["clip", "noise", "compress"];
    let mut totals = [[0.0f64; 3]; 3];
    let (mut median_norm, mut mean_norm) = (0.0, 0.0);
    let (mut parameters, mut batch_size) = (0, 0);
    for index in batches {
        let gradients = BatchGradients::new(model, params, data, index, device)?;
        let reference = &gradients.mean;
        let b = gradients.batch_size as f64;
        median_norm += gradients.median_norm();
        mean_norm += squared_norm(reference).sqrt();
        parameters = gradients.parameters();
        batch_size = gradients.batch_size;
        let (clipped, noise_std) = match mechanism {
            Mechanism::PerSample {
                noise_multiplier,
                max_norm,
            } => (
                gradients.weighted_mean(&gradients.clip_factors(max_norm)),
                noise_multiplier * max_norm / b,
            ),
            Mechanism::GlobalClip { max_norm } => {
                let norm = squared_norm(reference).sqrt();
                (reference * (max_norm / (norm + 1e-6)).min(1.0), 0.0)
            }
        };
        let mut moments = [
            Moments::new(reference),
            Moments::new(reference),
            Moments::new(reference),
        ];
        moments[0].add(&clipped, reference);
        for _ in 0..draws {
            let noisy = if noise_std > 0.0 {
                &clipped + clipped.randn_like() * noise_std
            } else {
                clipped.shallow_clone()
            };
            moments[1].add(&noisy, reference);
            let mut sender = compressor.fresh()?;
            let received = tch::no_grad(|| {
                let (_, received) = sender.round_trip(&unflatten(&noisy, compressor.shapes));
                flatten(&received)
            });
            moments[2].add(&received, reference);
        }
        for (total, m) in totals.iter_mut().zip(&moments) {
            for (t, v) in total.iter_mut().zip(m.finish(reference)) {
                *t += v;
            }
        }
    }
    let n = batches.len() as f64;
    Ok(Measured {
        stages: names
            .iter()
            .zip(totals)
            .map(|(name, [error, bias2, variance])| StageError {
                stage: name.to_string(),
                error: error / n,
                bias2: bias2 / n,
                variance: variance / n,
            })
            .collect(),
        median_norm: median_norm / n,
        mean_gradient_norm: mean_norm / n,
        parameters,
        batch_size,
    })
}

/// Appends `record` to `<run>/grad_error.jsonl` (`run_log::append_line`, which unpacks a
/// packed log first).
pub fn append(run_dir: &Path, record: &GradientErrorRecord) -> Result<()> {
    let path = run_dir.join(FILE);
    let line = serde_json::to_string(record).expect("record serialises");
    dpcomp::run_log::append_line(&path, &line)
}

/// The records of `<run>/grad_error.jsonl`, or of its packed form `grad_error.jsonl.gz`
/// (`run_log`; none when neither exists).
pub fn read(run_dir: &Path) -> Result<Vec<GradientErrorRecord>> {
    Ok(dpcomp::run_log::read_rows(&run_dir.join(FILE), usize::MAX)?.unwrap_or_default())
}

/// Replaces `<run>/grad_error.jsonl` with `records` (and drops a packed copy,
/// `run_folder::replace`).
pub fn write(run_dir: &Path, records: &[GradientErrorRecord]) -> Result<()> {
    let path = run_dir.join(FILE);
    let text: String = records
        .iter()
        .map(|r| serde_json::to_string(r).expect("record serialises") + "\n")
        .collect();
    dpcomp::run_folder::replace(&path, text.as_bytes())
}

/// Keeps only the records of epochs <= `epochs_done` (a resumed run measures later ones again).
pub fn truncate(run_dir: &Path, epochs_done: usize) -> Result<()> {
    let Some((path, text)) = dpcomp::run_log::read_text(&run_dir.join(FILE))? else {
        return Ok(());
    };
    // A last line cut short (a full disk during its append) belongs to an epoch after the
    // checkpoint: it is dropped with the other records measured after it.
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str::<GradientErrorRecord>(line) {
            Ok(r) => records.push(r),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                return write(
                    run_dir,
                    &records
                        .into_iter()
                        .filter(|r| r.epoch <= epochs_done)
                        .collect::<Vec<_>>(),
                );
            }
            Err(e) => return Err(Error::bad_file(&path, format!("line {}: {e}", i + 1))),
        }
    }
    if records.iter().all(|r| r.epoch <= epochs_done) {
        return Ok(());
    }
    let kept: Vec<GradientErrorRecord> = records
        .into_iter()
        .filter(|r| r.epoch <= epochs_done)
        .collect();
    write(run_dir, &kept)
}
