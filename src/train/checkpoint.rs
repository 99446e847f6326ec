//! A run's checkpoint, written after every epoch: `checkpoint/model.safetensors` (all weights),
//! `checkpoint/optimizer.safetensors` (momentum buffers, when any),
//! `checkpoint/compressor.safetensors` (residuals, velocities, PowerSGD's Q, when any) and
//! `checkpoint/state.json` (epochs done, steps, wall time, accountant, upstream bits). Written to `checkpoint.tmp/` and renamed into place, so a run
//! killed while saving keeps its previous checkpoint.
//!
//! Randomness needs no saved generator state: every epoch reseeds LibTorch from (seed, epoch), so
//! a run resumed after epoch k draws exactly what the uninterrupted run draws in epoch k + 1.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{nn, Tensor};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TrainState {
    pub epochs_done: usize,
    pub steps_done: u64,
    pub wall_seconds: f64,
    /// Every DP step taken so far: a resumed run continues its ε, never restarts it.
    #[serde(default)]
    pub accountant: Option<crate::privacy::accountant::Accountant>,
    /// Why training stopped before its last epoch (the privacy budget).
    #[serde(default)]
    pub stopped: Option<String>,
    /// Upstream bits sent so far (all messages of all steps).
    #[serde(default)]
    pub upstream_bits: u64,
    /// The same in the paper's unit (64 bits per transmitted element).
    #[serde(default)]
    pub upstream_paper_bits: u64,
}

pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoint")
}

/// Copies every tensor of the safetensors file at `path` into the variable of the same name.
/// Every variable must be present with the same shape.
pub fn load_weights(vs: &nn::VarStore, path: &Path) -> Result<()> {
    let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(path)
        .map_err(|e| Error::bad_file(path, e.to_string()))?
        .into_iter()
        .collect();
    for (name, mut var) in vs.variables() {
        let src = tensors
            .get(&name)
            .ok_or_else(|| Error::bad_file(path, format!("missing tensor {name}")))?;
        if src.size() != var.size() {
            return Err(Error::bad_file(
                path,
                format!("{name}: shape {:?}, expected {:?}", src.size(), var.size()),
            ));
        }
        tch::no_grad(|| var.copy_(src));
    }
    Ok(())
}

pub fn save(
    run_dir: &Path,
    vs: &nn::VarStore,
    momentum: &[(String, Tensor)],
    compressor: &[(String, Tensor)],
    state: &TrainState,
) -> Result<()> {
    let dir = checkpoint_dir(run_dir);
    let tmp = run_dir.join("checkpoint.tmp");
    let old = run_dir.join("checkpoint.old");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    vs.save(tmp.join("model.safetensors"))?;
    if !momentum.is_empty() {
        Tensor::write_safetensors(momentum, tmp.join("optimizer.safetensors"))?;
    }
    if !compressor.is_empty() {
        Tensor::write_safetensors(compressor, tmp.join("compressor.safetensors"))?;
    }
    let json = serde_json::to_string_pretty(state).expect("state serialises");
    std::fs::write(tmp.join("state.json"), json)
        .map_err(|e| Error::io(tmp.join("state.json"), e))?;
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(&dir, &old).map_err(|e| Error::io(&dir, e))?;
    }
    std::fs::rename(&tmp, &dir).map_err(|e| Error::io(&tmp, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// The checkpoint's folder: `checkpoint/`, or `checkpoint.old/` when a save was cut between its
/// two renames.
pub fn find(run_dir: &Path) -> Option<PathBuf> {
    [checkpoint_dir(run_dir), run_dir.join("checkpoint.old")]
        .into_iter()
        .find(|d| d.join("state.json").is_file())
}

pub fn read_state(dir: &Path) -> Result<TrainState> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))
}

/// Momentum buffers by variable name (empty when the run has none).
pub fn read_momentum(dir: &Path) -> Result<HashMap<String, Tensor>> {
    read_optional(&dir.join("optimizer.safetensors"))
}

/// The compressor's state tensors by name (empty when it keeps none).
pub fn read_compressor(dir: &Path) -> Result<HashMap<String, Tensor>> {
    read_optional(&dir.join("compressor.safetensors"))
}

fn read_optional(path: &Path) -> Result<HashMap<String, Tensor>> {
    let path = path.to_path_buf();
    if !path.is_file() {
        return Ok(HashMap::new());
    }
    Ok(Tensor::read_safetensors(&path)
        .map_err(|e| Error::bad_file(&path, e.to_string()))?
        .into_iter()
        .collect())
}
