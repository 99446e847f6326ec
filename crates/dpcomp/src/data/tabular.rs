//! Tabular binary-classification data (breast cancer and generated rows), for convex losses and
//! federated clients: features [n, d] (f64) and labels
//! ±1, split 80/20 with a fixed seed, scaled as `preprocess` says (public log map, private or
//! training-set standardisation; what each costs in privacy is there), then every row projected
//! into the unit ball (x / max(1, ||x||)). The projection
//! makes X = max ||x|| <= 1 a bound that holds for any dataset, not one read off this one (a
//! data-dependent bound would itself leak), so the constants L and M of `loss.rs` are public.

use super::preprocess::{PreprocessCost, Scaling};
use crate::error::{Error, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use std::path::Path;
use tch::Tensor;

/// Every feature row has norm at most this after loading: the X of the losses' constants.
pub const FEATURE_NORM_BOUND: f64 = 1.0;

/// The split seed: the same 80/20 split on every run.
pub const SPLIT_SEED: u64 = 20_261_130;

/// A binary-classification table split 80/20, features scaled and every row in the unit ball.
pub struct Tabular {
    /// Where it came from: `breast_cancer`, the CSV's path, or the synthetic set's name.
    pub name: String,
    /// Training features [n, d], f64, rows of norm at most `FEATURE_NORM_BOUND`.
    pub x_train: Tensor,
    /// Training labels \[n\], f64, each -1 or +1.
    pub y_train: Tensor,
    /// Test features [n_test, d], scaled as the training rows.
    pub x_test: Tensor,
    /// Test labels \[n_test\], -1 or +1.
    pub y_test: Tensor,
    /// How the features were scaled and the privacy that spent on the training rows; `None` for
    /// generated data (already in the unit ball, no statistics taken).
    pub preprocess: Option<PreprocessCost>,
}

impl Tabular {
    /// n, the training rows.
    pub fn train_len(&self) -> usize {
        self.y_train.size()[0] as usize
    }

    /// d, the features per row.
    pub fn dim(&self) -> i64 {
        self.x_train.size()[1]
    }

    /// X = max_i ||x_i|| over the training rows (<= 1 after the projection).
    pub fn max_norm(&self) -> f64 {
        crate::host::f64_scalar(
            &self
                .x_train
                .norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
                .max(),
        )
    }
}

/// A CSV of numeric features with the label in the last column (0/1 or -1/+1; 0 maps to -1). A
/// first line that is not all numbers, or whose column count differs from the rest (scikit-learn's
/// `569,30,malignant,benign` header), is skipped.
pub fn read_csv(path: &Path, name: &str, scaling: &Scaling) -> Result<Tabular> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let parse = |line: &str| -> Option<Vec<f64>> {
        line.split(',')
            .map(|f| f.trim().parse::<f64>().ok())
            .collect()
    };
    let columns = lines
        .get(1)
        .or(lines.first())
        .map(|l| l.split(',').count())
        .unwrap_or(0);
    let mut rows: Vec<Vec<f64>> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        match parse(line) {
            Some(row) if row.len() == columns => rows.push(row),
            _ if i == 0 => continue,
            _ => {
                return Err(Error::bad_file(
                    path,
                    format!(
                        "line {}: expected {columns} numbers separated by commas",
                        i + 1
                    ),
                ))
            }
        }
    }
    if rows.len() < 10 || columns < 2 {
        return Err(Error::bad_file(
            path,
            format!(
                "{} rows of {columns} columns: expected at least 10 rows of features + label",
                rows.len()
            ),
        ));
    }
    for (i, row) in rows.iter().enumerate() {
        if let Some(j) = row.iter().position(|v| !v.is_finite()) {
            return Err(Error::bad_file(
                path,
                format!(
                    "data row {}, column {}: {}: expected a finite number",
                    i + 1,
                    j + 1,
                    row[j]
                ),
            ));
        }
    }
    let d = columns - 1;
    let mut labels = Vec::with_capacity(rows.len());
    let mut features = Vec::with_capacity(rows.len() * d);
    for (i, row) in rows.iter().enumerate() {
        let label = match row[d] {
            1.0 => 1.0,
            v if v == 0.0 || v == -1.0 => -1.0,
            v => {
                return Err(Error::bad_file(
                    path,
                    format!("row {}: label {v}, expected 0/1 or -1/+1", i + 1),
                ))
            }
        };
        labels.push(label);
        features.extend_from_slice(&row[..d]);
    }
    let x = Tensor::from_slice(&features).view([rows.len() as i64, d as i64]);
    let y = Tensor::from_slice(&labels);
    split_and_scale(name, &x, &y, scaling)
}

/// The Wisconsin breast-cancer table in `data_dir/breast_cancer/breast_cancer.csv` (569 rows,
/// 30 features; label 1 benign -> +1, 0 malignant -> -1).
pub fn breast_cancer(data_dir: &Path, scaling: &Scaling) -> Result<Tabular> {
    let path = data_dir.join("breast_cancer").join("breast_cancer.csv");
    let data = read_csv(&path, "breast_cancer", scaling)?;
    if data.dim() != 30 || data.train_len() + data.y_test.size()[0] as usize != 569 {
        return Err(Error::bad_file(
            &path,
            "expected scikit-learn's 569 rows of 30 features and a label",
        ));
    }
    Ok(data)
}

/// The table named by `spec` (`--data`, a grid's `data`): `breast_cancer`, `csv:PATH` or
/// `synthetic:N:D` (10 <= N <= `MAX_SYNTHETIC_ROWS` rows of D features, N D at most
/// `MAX_SYNTHETIC_VALUES`, seed 0; `scaling` does not apply to it).
pub fn named(spec: &str, data_dir: Option<&Path>, scaling: &Scaling) -> Result<Tabular> {
    if spec == "breast_cancer" {
        return breast_cancer(&data_dir_or_default(data_dir), scaling);
    }
    if let Some(path) = spec.strip_prefix("csv:") {
        return read_csv(Path::new(path), path, scaling);
    }
    if let Some(rest) = spec.strip_prefix("synthetic:") {
        let parts: Vec<&str> = rest.split(':').collect();
        if let [n, d] = parts.as_slice() {
            if let (Ok(n), Ok(d)) = (n.parse::<usize>(), d.parse::<i64>()) {
                return synthetic(n, d, 4.0, 0);
            }
        }
    }
    Err(Error::bad_value(
        "data",
        format!(
            "{spec:?}: expected breast_cancer, csv:PATH or synthetic:N:D ({})",
            synthetic_range()
        ),
    ))
}

/// The most rows `synthetic` draws (the convex algorithms' default T is n², so far fewer are
/// practical).
pub const MAX_SYNTHETIC_ROWS: usize = 1_000_000;

/// The most values (rows x features) `synthetic` holds: 80 MB as f64, in each of the few
/// copies the split keeps.
pub const MAX_SYNTHETIC_VALUES: u64 = 10_000_000;

fn synthetic_range() -> String {
    format!(
        "10 <= N <= {MAX_SYNTHETIC_ROWS} rows of D >= 1 features, N x D <= {MAX_SYNTHETIC_VALUES}"
    )
}

/// `--data-dir`, else $DPCOMP_DATA, else data/ (as the other datasets).
pub fn data_dir_or_default(data_dir: Option<&Path>) -> std::path::PathBuf {
    crate::data::data_dir(data_dir)
}

/// Linearly separable data with margin whose optimum is known: x uniform in the unit ball of
/// R^d, w* = `scale` u for a random unit u, y = sign(w*ᵀx), keeping only rows with
/// |w*ᵀx| >= 1. Every margin of w* is then >= 1, so the hinge and q-norm hinge risks are 0 at w*
/// (their minimum), for any radius R >= ||w*|| = `scale`.
///
/// Every draw comes from a generator of its own seeded with `seed`, never from LibTorch's global
/// one: another thread drawing from that (a concurrent test, a training run) would otherwise
/// change the data this seed gives.
///
/// In high dimension almost no point of the ball has margin 1 (⟨x, u⟩ is about N(0, 1/d), so at
/// |w*| 4 and d 1000 a point is kept with probability about 1e-15): the draws stop after
/// 200 n + 100,000 attempts with an error naming the dimension, instead of running forever.
pub fn synthetic(n: usize, d: i64, scale: f64, seed: u64) -> Result<Tabular> {
    let values = (n as u64).checked_mul(d.max(0) as u64);
    if !(10..=MAX_SYNTHETIC_ROWS).contains(&n)
        || d < 1
        || values.is_none_or(|v| v > MAX_SYNTHETIC_VALUES)
    {
        return Err(Error::bad_value(
            "data",
            format!("synthetic:{n}:{d}: expected {}", synthetic_range()),
        ));
    }
    // Rows need margin |<x, w*>| >= 1 with |x| <= 1: none exist unless |w*| > 1 (the rejection
    // loop below would never end).
    if !(scale > 1.0 && scale.is_finite()) {
        return Err(Error::bad_value(
            "scale",
            format!("{scale}: synthetic data needs a finite |w*| > 1 for a margin of 1"),
        ));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dim = d as usize;
    let gaussian = |rng: &mut rand::rngs::StdRng| -> Vec<f64> {
        (0..dim).map(|_| rng.sample(StandardNormal)).collect()
    };
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let u = gaussian(&mut rng);
    let u_norm = norm(&u);
    let w_star: Vec<f64> = u.iter().map(|a| a / u_norm * scale).collect();
    let mut rows: Vec<f64> = Vec::with_capacity(n * dim);
    let mut labels: Vec<f64> = Vec::with_capacity(n);
    let max_draws = 200 * n as u64 + 100_000;
    let mut draws = 0u64;
    while labels.len() < n {
        draws += 1;
        if draws > max_draws {
            return Err(Error::bad_value(
                "data",
                format!(
                    "synthetic:{n}:{d}: in {d} dimensions too few points of the unit ball have margin 1 at |w*| {scale} ({} of {max_draws} draws kept); use fewer dimensions (d <= 100 keeps about 1 in 100)",
                    labels.len()
                ),
            ));
        }
        // A direction uniform on the sphere times a radius U^(1/d): uniform in the ball.
        let g = gaussian(&mut rng);
        let radius = rng.random::<f64>().powf(1.0 / d as f64) / norm(&g);
        let x: Vec<f64> = g.iter().map(|a| a * radius).collect();
        let margin: f64 = x.iter().zip(&w_star).map(|(a, b)| a * b).sum();
        if margin.abs() >= 1.0 {
            rows.extend_from_slice(&x);
            labels.push(margin.signum());
        }
    }
    let x = Tensor::from_slice(&rows).view([n as i64, d]);
    let y = Tensor::from_slice(&labels);
    let (train, test) = split_index(n);
    Ok(Tabular {
        name: format!("synthetic(n {n}, d {d}, |w*| {scale})"),
        x_train: x.index_select(0, &train),
        y_train: y.index_select(0, &train),
        x_test: x.index_select(0, &test),
        y_test: y.index_select(0, &test),
        preprocess: None,
    })
}

/// Fixed 80/20 split of 0..n.
fn split_index(n: usize) -> (Tensor, Tensor) {
    let mut order: Vec<i64> = (0..n as i64).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(SPLIT_SEED));
    let cut = (n * 4) / 5;
    (
        Tensor::from_slice(&order[..cut]),
        Tensor::from_slice(&order[cut..]),
    )
}

fn split_and_scale(name: &str, x: &Tensor, y: &Tensor, scaling: &Scaling) -> Result<Tabular> {
    let (train, test) = split_index(y.size()[0] as usize);
    let (x_train, x_test, cost) = super::preprocess::scale(
        &x.index_select(0, &train),
        &x.index_select(0, &test),
        scaling,
    )?;
    Ok(Tabular {
        name: name.to_string(),
        x_train,
        y_train: y.index_select(0, &train),
        x_test,
        y_test: y.index_select(0, &test),
        preprocess: Some(cost),
    })
}
