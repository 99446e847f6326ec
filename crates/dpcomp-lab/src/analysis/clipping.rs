//! Which clipping radius C minimises the gradient error (the paper's Figures 3.10-3.11 and
//! appendix F): a model of the error as a function of C, its minimiser, and a sweep that
//! measures the error directly.
//!
//! ## The model (our derivation; the paper's formula is missing from the text)
//!
//! DP-SGD's estimate of the batch's mean gradient ḡ = (1/B) Σ_i g_i is
//! ĝ(C) = (1/B) (Σ_i c_i g_i + z), c_i = min(1, C/||g_i||), z ~ N(0, σ²C² I_m). The noise is
//! independent of everything else and has mean zero, so
//!
//!   E||ĝ(C) - ḡ||² = ||(1/B) Σ_i (c_i - 1) g_i||² + m σ² C² / B²,
//!
//! a clipping bias (zero once C exceeds every norm) plus the noise variance (growing as C²). The
//! bias needs every g_i; the model replaces them by what a DP query could give: assume every
//! per-sample gradient has the median norm G. Then c_i = min(1, C/G) for all i, the clipped
//! mean is min(1, C/G) ḡ, and the bias is (1 - C/G)₊² ||ḡ||²:
//!
//!   E_mean(C) = (1 - C/G)₊² ||ḡ||² + m σ² C² / B²                         (mean-informed)
//!
//! With only G known one must also assume the gradients are aligned (||ḡ|| = G, the paper's
//! form, which uses the median norm, m and σ only):
//!
//!   E_median(C) = (G - C)₊² + m σ² C² / B²                                 (median-only)
//!
//! Both are convex in C. For C < G, d/dC E_mean = -2 (||ḡ||²/G)(1 - C/G) + 2 m σ² C / B² = 0
//! gives
//!
//!   C*_mean = G ||ḡ||² B² / (||ḡ||² B² + m σ² G²),   C*_median = G B² / (B² + m σ²),
//!
//! both < G when σ > 0, and = G (no clipping bias, no noise) when σ = 0. With m ~ 10⁵-10⁶
//! parameters and B ~ 10², m σ² ≫ B², so the model clips far below the median, and the more so
//! the more parameters and noise there are: the paper's point that C should depend on m and σ.
//! The paper itself suspects (its Figure 3.11) that the median-only form errs when ||ḡ|| ≪ G;
//! the mean-informed form is that correction.
//!
//! ## The measurement
//!
//! On fixed batches, at a log-spaced grid of C (plus G and both model minimisers), the squared
//! error of `draws` noisy clipped means against ḡ, averaged; the clipping part alone is exact.

use super::{squared_norm, BatchGradients, NOISE_SEED};
use dpcomp::data::Dataset;
use dpcomp::error::{Error, Result};
use dpcomp::models::Model;
use serde::{Deserialize, Serialize};
use std::path::Path;
use tch::{Device, Tensor};

/// The sweep file in an output folder (all noise multipliers), next to `clipping.csv`.
pub const FILE: &str = "clipping.json";

/// Writes `clipping.json` and `clipping.csv` (one row per noise multiplier and radius) to `dir`.
pub fn write(dir: &Path, sweeps: &[ClippingSweep]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(FILE);
    let json = serde_json::to_string_pretty(sweeps).expect("sweeps serialise");
    std::fs::write(&path, json).map_err(|e| Error::io(&path, e))?;
    let header = [
        "task",
        "epoch",
        "noise_multiplier",
        "batch_size",
        "parameters",
        "median_norm",
        "mean_gradient_norm",
        "max_norm",
        "measured",
        "clip_bias2",
        "model_median",
        "model_mean",
    ];
    let mut rows = Vec::new();
    for s in sweeps {
        let m = &s.model;
        for p in &s.points {
            rows.push(vec![
                s.task.clone(),
                s.epoch.to_string(),
                m.noise_multiplier.to_string(),
                m.batch_size.to_string(),
                m.parameters.to_string(),
                m.median_norm.to_string(),
                m.mean_gradient_norm.to_string(),
                p.max_norm.to_string(),
                p.measured.to_string(),
                p.clip_bias2.to_string(),
                p.model_median.to_string(),
                p.model_mean.to_string(),
            ]);
        }
    }
    crate::csv_table::write(&dir.join("clipping.csv"), &header, &rows)
}

/// The sweeps of `dir/clipping.json`.
pub fn read(dir: &Path) -> Result<Vec<ClippingSweep>> {
    let path = dir.join(FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))
}

/// The model's inputs (module docs: E_median, E_mean and their minimisers), measured on fixed
/// batches by `sweep`, or written down to evaluate the model alone.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct ClippingModel {
    /// G: median per-sample gradient norm.
    pub median_norm: f64,
    /// ||ḡ||: norm of the mean gradient.
    pub mean_gradient_norm: f64,
    /// m: trainable scalars.
    pub parameters: i64,
    /// σ: the noise's standard deviation per unit C.
    pub noise_multiplier: f64,
    /// B: examples per batch (the noise's divisor).
    pub batch_size: i64,
}

impl ClippingModel {
    /// m σ² / B²: the noise variance per unit C².
    fn noise_per_c2(&self) -> f64 {
        self.parameters as f64 * self.noise_multiplier.powi(2) / (self.batch_size as f64).powi(2)
    }

    /// E_median(C) = (G - C)₊² + m σ² C² / B².
    pub fn error_median(&self, c: f64) -> f64 {
        (self.median_norm - c).max(0.0).powi(2) + self.noise_per_c2() * c * c
    }

    /// C*_median = G B² / (B² + m σ²) = G / (1 + m σ² / B²).
    pub fn minimiser_median(&self) -> f64 {
        self.median_norm / (1.0 + self.noise_per_c2())
    }

    /// E_mean(C) = (1 - C/G)₊² ||ḡ||² + m σ² C² / B².
    pub fn error_mean(&self, c: f64) -> f64 {
        let a2 = self.mean_gradient_norm.powi(2);
        (1.0 - c / self.median_norm).max(0.0).powi(2) * a2 + self.noise_per_c2() * c * c
    }

    /// C*_mean = G ||ḡ||² / (||ḡ||² + (m σ² / B²) G²).
    pub fn minimiser_mean(&self) -> f64 {
        let (g, a2) = (self.median_norm, self.mean_gradient_norm.powi(2));
        g * a2 / (a2 + self.noise_per_c2() * g * g)
    }
}

/// The error at one radius: measured (clipping part exact, noise drawn) and modelled.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClippingPoint {
    /// The clipping radius C.
    pub max_norm: f64,
    /// Mean over batches and draws of ||ĝ(C) - ḡ||².
    pub measured: f64,
    /// ||(1/B) Σ c_i g_i - ḡ||² (mean over batches).
    pub clip_bias2: f64,
    /// The median-only model's error E_median(C).
    pub model_median: f64,
    /// The mean-informed model's error E_mean(C).
    pub model_mean: f64,
}

/// One sweep over C at one noise multiplier.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClippingSweep {
    /// The task whose model and data were measured.
    pub task: String,
    /// Epochs the model had trained (0: initial weights).
    pub epoch: usize,
    /// Fixed batches the errors are averaged over.
    pub batches: usize,
    /// Noise draws per batch and radius.
    pub draws: usize,
    /// The model's inputs, measured on the batches (G and ||ḡ|| averaged over them).
    pub model: ClippingModel,
    /// The error at every radius swept, in increasing C (the log grid, G and both model
    /// minimisers).
    pub points: Vec<ClippingPoint>,
    /// The grid point of least measured error.
    pub measured_minimiser: f64,
    /// C*_median, the median-only model's minimiser.
    pub model_median_minimiser: f64,
    /// C*_mean, the mean-informed model's minimiser.
    pub model_mean_minimiser: f64,
    /// Measured error at C = G (the adaptive-clipping rule), at both model minimisers, and at
    /// the measured minimiser.
    pub measured_at_median_norm: f64,
    /// Measured error at C*_median.
    pub measured_at_model_median: f64,
    /// Measured error at C*_mean.
    pub measured_at_model_mean: f64,
    /// Measured error at `measured_minimiser`, the least of the sweep.
    pub measured_minimum: f64,
}

/// The largest σ a sweep accepts: far beyond any trained (the papers use 0.4 to 2), still small
/// enough that σ C and its square are ordinary f64 and f32 numbers.
pub const MAX_SWEPT_SIGMA: f64 = 1e3;

/// The noise multipliers a sweep accepts: σ sets the noise and, through the model of the error,
/// the radii swept, so a NaN or infinite σ made a grid of billions of radii and a negative or
/// absurd one meaningless numbers.
pub fn check_sigmas(noise_multipliers: &[f64]) -> Result<()> {
    if noise_multipliers.is_empty() {
        return Err(Error::bad_value(
            "sigmas",
            "empty: expected at least one noise multiplier",
        ));
    }
    for &sigma in noise_multipliers {
        if !(0.0..=MAX_SWEPT_SIGMA).contains(&sigma) {
            return Err(Error::bad_value(
                "sigmas",
                format!(
                    "{sigma}: expected a noise multiplier with 0 <= sigma <= {MAX_SWEPT_SIGMA}"
                ),
            ));
        }
    }
    Ok(())
}

/// Sweeps C on `batches` of `data` at the model's current weights, once per noise multiplier
/// (the clipped means are shared: only the noise scale differs). `points` log-spaced radii run
/// from a thirtieth of the smallest model minimiser to ten times the largest median norm.
#[allow(clippy::too_many_arguments)]
pub fn sweep(
    task: &str,
    epoch: usize,
    model: &dyn Model,
    params: &[(String, Tensor)],
    data: &Dataset,
    device: Device,
    batches: &[Tensor],
    noise_multipliers: &[f64],
    draws: usize,
    points: usize,
) -> Result<Vec<ClippingSweep>> {
    if batches.is_empty() || draws == 0 || points < 2 {
        return Err(Error::bad_value(
            "clipping sweep",
            "needs at least one batch, one draw and two points",
        ));
    }
    check_sigmas(noise_multipliers)?;
    let gradients: Vec<BatchGradients> = batches
        .iter()
        .map(|index| BatchGradients::new(model, params, data, index, device))
        .collect::<Result<_>>()?;
    let n = gradients.len() as f64;
    let median_norm = gradients.iter().map(|g| g.median_norm()).sum::<f64>() / n;
    let mean_norm = gradients
        .iter()
        .map(|g| squared_norm(&g.mean).sqrt())
        .sum::<f64>()
        / n;
    let models: Vec<ClippingModel> = noise_multipliers
        .iter()
        .map(|&sigma| ClippingModel {
            median_norm,
            mean_gradient_norm: mean_norm,
            parameters: gradients[0].parameters(),
            noise_multiplier: sigma,
            batch_size: gradients[0].batch_size,
        })
        .collect();
    let smallest = models
        .iter()
        .flat_map(|m| [m.minimiser_median(), m.minimiser_mean()])
        .fold(median_norm, f64::min);
    let (lo, hi) = ((smallest / 30.0).ln(), (10.0 * median_norm).ln());
    let grid: Vec<f64> = (0..points)
        .map(|i| (lo + (hi - lo) * i as f64 / (points - 1) as f64).exp())
        .collect();
    let mut sweeps = Vec::new();
    for model_inputs in models {
        let mut radii = grid.clone();
        radii.extend([
            median_norm,
            model_inputs.minimiser_median(),
            model_inputs.minimiser_mean(),
        ]);
        radii.sort_by(f64::total_cmp);
        radii.dedup();
        tch::manual_seed(NOISE_SEED);
        let points: Vec<ClippingPoint> = radii
            .iter()
            .map(|&c| {
                let (mut measured, mut bias2) = (0.0, 0.0);
                for g in &gradients {
                    let clipped = g.weighted_mean(&g.clip_factors(c));
                    bias2 += squared_norm(&(&clipped - &g.mean));
                    let std = model_inputs.noise_multiplier * c / g.batch_size as f64;
                    for _ in 0..draws {
                        let noisy = &clipped + clipped.randn_like() * std;
                        measured += squared_norm(&(noisy - &g.mean));
                    }
                }
                ClippingPoint {
                    max_norm: c,
                    measured: measured / (n * draws as f64),
                    clip_bias2: bias2 / n,
                    model_median: model_inputs.error_median(c),
                    model_mean: model_inputs.error_mean(c),
                }
            })
            .collect();
        let at = |c: f64| {
            points
                .iter()
                .find(|p| p.max_norm == c)
                .map_or(f64::NAN, |p| p.measured)
        };
        let best = points
            .iter()
            .min_by(|a, b| a.measured.total_cmp(&b.measured))
            .expect("at least two points");
        sweeps.push(ClippingSweep {
            task: task.to_string(),
            epoch,
            batches: gradients.len(),
            draws,
            measured_minimiser: best.max_norm,
            measured_minimum: best.measured,
            model_median_minimiser: model_inputs.minimiser_median(),
            model_mean_minimiser: model_inputs.minimiser_mean(),
            measured_at_median_norm: at(median_norm),
            measured_at_model_median: at(model_inputs.minimiser_median()),
            measured_at_model_mean: at(model_inputs.minimiser_mean()),
            model: model_inputs,
            points,
        });
    }
    Ok(sweeps)
}
