//! A run's checkpoint, written after every epoch: `checkpoint/model.safetensors` (all weights),
//! `checkpoint/optimizer.safetensors` (momentum buffers, when any),
//! `checkpoint/compressor.safetensors` (residuals, velocities, PowerSGD's Q, when any) and
//! `checkpoint/state.json` (epochs done, steps, wall time, accountant, upstream bits), and
//! `checkpoint/manifest.json` (size and SHA-256 of every other file). Written to
//! `checkpoint.tmp/` and renamed into place, so a run killed while saving keeps its previous
//! checkpoint. `open` checks the manifest before anything is loaded: a truncated, overwritten,
//! added or missing file is refused instead of training on whatever it now holds.
//!
//! Randomness needs no saved generator state: every epoch reseeds LibTorch from (seed, epoch), so
//! a run resumed after epoch k draws exactly what the uninterrupted run draws in epoch k + 1.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{nn, Tensor};

/// A run's progress, saved as the checkpoint's `state.json` after every epoch and read back on
/// resume (`Trainer::state` shows the live one).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TrainState {
    /// Epochs finished (and checkpointed); a resume starts the next one.
    pub epochs_done: usize,
    /// Optimiser steps taken since the run started.
    pub steps_done: u64,
    /// Seconds of training so far, summed over epochs (the time between sessions not counted).
    pub wall_seconds: f64,
    /// Every DP step taken so far: a resumed run continues its ε, never restarts it.
    #[serde(default)]
    pub accountant: Option<crate::privacy::accountant::Accountant>,
    /// Adaptive clipping's current radius C_t (`privacy::engine::AdaptiveClipping`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_radius: Option<f64>,
    /// Why training stopped before its last epoch (the privacy budget).
    #[serde(default)]
    pub stopped: Option<String>,
    /// Upstream bits sent so far (all messages of all steps).
    #[serde(default)]
    pub upstream_bits: u64,
    /// The same in the paper's unit (64 bits per transmitted element).
    #[serde(default)]
    pub upstream_paper_bits: u64,
    /// W, when the run is trained by several data-parallel workers: a resume needs
    /// as many (`compressor.safetensors` then holds every rank's encoder state). Absent for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// A fingerprint of the training and test splits the run trains on
    /// (`distributed::data_fingerprint`): a resume on other data (a data folder whose files
    /// changed, every label rotated) is refused. Absent in checkpoints made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The epoch after which the checkpoint's weights, optimiser and compressor state were
    /// saved, when it is earlier than `epochs_done`: a run whose loss diverged keeps its last
    /// finite weights (`save_keeping_weights`) while its progress and accountant count every
    /// step taken. Absent when the weights are `epochs_done`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_epoch: Option<usize>,
    /// The run's settings when the checkpoint was saved (`settings_record`: `config.toml`'s
    /// text without the settings a resume may change): a `config.toml` edited since (its δ,
    /// its sampling, anything that changes ε or the training) is refused on resume, as a
    /// setting given anew is. Absent in checkpoints made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
}

/// The settings a checkpoint records (`TrainState::settings`): `config`'s TOML text with the
/// settings a resume may change (`train::RESUME_MAY_CHANGE`: epochs, data folder, device) at
/// fixed values, so that every worker's and every resume's record of one run is the same.
pub fn settings_record(config: &crate::config::TrainConfig) -> String {
    let mut fixed = config.clone();
    fixed.epochs = 0;
    fixed.data.data_dir = None;
    fixed.device = Default::default();
    fixed.to_toml()
}

/// The settings among `RESUME_MAY_CHANGE`'s complement that differ between a checkpoint's
/// record (`TrainState::settings`) and `config`, as (dotted field, recorded, now): empty when
/// they agree or when the checkpoint has no record. An error when the record does not parse.
pub fn settings_edited(
    state: &TrainState,
    config: &crate::config::TrainConfig,
    state_path: &Path,
) -> Result<Vec<(String, String, String)>> {
    let Some(text) = &state.settings else {
        return Ok(Vec::new());
    };
    let table: toml::Table =
        toml::from_str(text).map_err(|e| Error::bad_file(state_path, format!("settings: {e}")))?;
    let recorded =
        crate::config::TrainConfig::from_table(table, &state_path.display().to_string())?;
    Ok(recorded
        .differences(config)
        .into_iter()
        .filter(|(field, _, _)| !super::RESUME_MAY_CHANGE.contains(&field.as_str()))
        .collect())
}

/// `run_dir/checkpoint`, where a run's last complete checkpoint lives (`find` also accepts the
/// `checkpoint.old` a save cut short leaves).
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoint")
}

/// Writes every variable of `vs` (a model's weights, trainable or frozen) to the safetensors
/// file `path`, through a temporary file renamed over it, so a crash never leaves half a file:
/// how a model of one's own is saved after `Trainer::run` (`load_weights` reads it back).
///
/// ```
/// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
/// let _w = vs.root().randn("w", &[3, 2], 0.0, 1.0);
/// let dir = std::env::temp_dir().join(format!("dpcomp-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// dpcomp::train::checkpoint::save_weights(&vs, &dir.join("model.safetensors"))?;
/// let other = tch::nn::VarStore::new(tch::Device::Cpu);
/// let w2 = other.root().zeros("w", &[3, 2]);
/// dpcomp::train::checkpoint::load_weights(&other, &dir.join("model.safetensors"))?;
/// assert!(w2.equal(&vs.variables()["w"]));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub fn save_weights(vs: &nn::VarStore, path: &Path) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::write_safetensors(&named, &tmp).map_err(|e| Error::bad_file(&tmp, e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Copies every tensor of the safetensors file at `path` into the variable of the same name.
/// Every variable must be present with the same shape, finite (`check_loaded`).
pub fn load_weights(vs: &nn::VarStore, path: &Path) -> Result<()> {
    let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(path)
        .map_err(|e| Error::bad_file(path, e.to_string()))?
        .into_iter()
        .collect();
    for (name, mut var) in vs.variables() {
        let src = tensors
            .get(&name)
            .ok_or_else(|| Error::bad_file(path, format!("missing tensor {name}")))?;
        crate::nn::check_loaded(path, &name, src, &var.size())?;
        tch::no_grad(|| var.copy_(src));
    }
    Ok(())
}

/// Saves a training run's checkpoint into `run_dir` (`save_folder`): the weights of `vs`, the
/// optimiser's and the compressor's named state (files only when non-empty) and `state`.
pub(crate) fn save(
    run_dir: &Path,
    vs: &nn::VarStore,
    momentum: &[(String, Tensor)],
    compressor: &[(String, Tensor)],
    state: &TrainState,
) -> Result<()> {
    save_folder(run_dir, |tmp| {
        vs.save(tmp.join("model.safetensors"))?;
        if !momentum.is_empty() {
            Tensor::write_safetensors(momentum, tmp.join("optimizer.safetensors"))?;
        }
        if !compressor.is_empty() {
            Tensor::write_safetensors(compressor, tmp.join("compressor.safetensors"))?;
        }
        write_json(&tmp.join("state.json"), state)
    })
}

/// Writes a checkpoint folder: `write` fills `checkpoint.tmp/` (with `state.json` among its
/// files), the manifest seals it, and it is renamed over `checkpoint/` (the previous one kept as
/// `checkpoint.old/` until the rename is done). Training and federated runs both save this way.
pub fn save_folder(run_dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = checkpoint_dir(run_dir);
    let tmp = run_dir.join("checkpoint.tmp");
    let old = run_dir.join("checkpoint.old");
    let _ = std::fs::remove_dir_all(&tmp);
    let written = std::fs::create_dir_all(&tmp)
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|()| write(&tmp))
        .and_then(|()| write_manifest(&tmp));
    if let Err(e) = written {
        // A save cut short (a full disk) frees what it wrote; the previous checkpoint stays.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(&dir, &old).map_err(|e| Error::io(&dir, e))?;
    }
    std::fs::rename(&tmp, &dir).map_err(|e| Error::io(&tmp, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Saves `state` as the run's checkpoint while keeping the weights, optimiser and compressor
/// state of the checkpoint already in `run_dir` (checked against its manifest first): what a
/// run whose loss diverged saves, so that its last finite model is not replaced by a NaN one.
/// `weights_epoch` records the kept checkpoint's epoch. An error when `run_dir` holds
/// no checkpoint, or one that fails its manifest.
pub(crate) fn save_keeping_weights(run_dir: &Path, state: &TrainState) -> Result<()> {
    let kept = open(run_dir)?;
    let names = checkpoint_files(&kept)?;
    let before = read_state(&kept)?;
    let state = TrainState {
        // What goes with the kept weights: their epoch, and adaptive clipping's radius then.
        weights_epoch: Some(before.weights_epoch.unwrap_or(before.epochs_done)),
        clip_radius: before.clip_radius,
        ..state.clone()
    };
    save_folder(run_dir, |tmp| {
        for name in names.iter().filter(|n| n.as_str() != "state.json") {
            let (from, to) = (kept.join(name), tmp.join(name));
            std::fs::copy(&from, &to).map_err(|e| Error::io(&to, e))?;
        }
        write_json(&tmp.join("state.json"), &state)
    })
}

/// Removes every checkpoint folder of the run (a finished federated run keeps none).
pub fn remove(run_dir: &Path) {
    for name in ["checkpoint", "checkpoint.tmp", "checkpoint.old"] {
        let _ = std::fs::remove_dir_all(run_dir.join(name));
    }
}

/// `value` as pretty JSON at `path`.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let json = serde_json::to_string_pretty(value).expect("checkpoint state serialises");
    std::fs::write(path, json).map_err(|e| Error::io(path, e))
}

/// The checkpoint's folder: `checkpoint/`, or `checkpoint.old/` when a save was cut between its
/// two renames.
pub fn find(run_dir: &Path) -> Option<PathBuf> {
    [checkpoint_dir(run_dir), run_dir.join("checkpoint.old")]
        .into_iter()
        .find(|d| d.join("state.json").is_file())
}

/// The manifest's name inside a checkpoint folder.
pub const MANIFEST: &str = "manifest.json";

/// One file's entry in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileDigest {
    bytes: u64,
    sha256: String,
}

fn digest(path: &Path) -> Result<FileDigest> {
    let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(FileDigest {
        bytes: data.len() as u64,
        sha256: format!("{:x}", Sha256::digest(&data)),
    })
}

/// The files of a checkpoint folder other than the manifest, by name.
fn checkpoint_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != MANIFEST {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Writes `dir`'s manifest from the files now in it (`save` calls it; tests use it to reseal a
/// checkpoint they edited, to reach the checks behind the manifest).
pub fn write_manifest(dir: &Path) -> Result<()> {
    let mut manifest = BTreeMap::new();
    for name in checkpoint_files(dir)? {
        manifest.insert(name.clone(), digest(&dir.join(&name))?);
    }
    let path = dir.join(MANIFEST);
    let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    std::fs::write(&path, json).map_err(|e| Error::io(&path, e))
}

/// Checks every file of the checkpoint folder `dir` against its manifest: the same set of
/// files, each with its recorded size and SHA-256.
pub fn verify(dir: &Path) -> Result<()> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::bad_file(
            &path,
            format!("cannot read the checkpoint's manifest ({e}); without it the checkpoint cannot be checked, so it is not loaded"),
        )
    })?;
    let manifest: BTreeMap<String, FileDigest> =
        serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))?;
    let present = checkpoint_files(dir)?;
    for name in &present {
        if !manifest.contains_key(name) {
            return Err(Error::bad_file(
                dir.join(name),
                "not in the checkpoint's manifest (added after the checkpoint was written)",
            ));
        }
    }
    for (name, expected) in &manifest {
        let file = dir.join(name);
        if !file.is_file() {
            return Err(Error::bad_file(&file, "listed in the manifest but missing"));
        }
        let found = digest(&file)?;
        if &found != expected {
            return Err(Error::bad_file(
                &file,
                format!(
                    "corrupted: {} bytes with SHA-256 {}, the manifest records {} bytes with {}",
                    found.bytes, found.sha256, expected.bytes, expected.sha256
                ),
            ));
        }
    }
    Ok(())
}

/// The run's checkpoint folder (`find`), verified against its manifest; the error says when
/// there is none.
pub fn open(run_dir: &Path) -> Result<PathBuf> {
    let dir = find(run_dir).ok_or_else(|| {
        Error::bad_value(
            "resume",
            format!(
                "{} has no checkpoint yet; start it afresh instead of resuming (`resume`)",
                run_dir.display()
            ),
        )
    })?;
    verify(&dir)?;
    Ok(dir)
}

/// The `state.json` of the checkpoint folder `dir` (`find` or `open` gives it); an error when it
/// cannot be read or parsed.
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
