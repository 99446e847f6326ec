//! A federated run's checkpoint, written after every round when the run has a folder (`dpcomp
//! grid` cells, `dpcomp fl --out`), so a run killed mid-way (a session's end, a machine going
//! back) continues instead of starting over: a Fashion-MNIST FL-CS cell of the paper's 200
//! rounds takes longer than one session on two cores.
//!
//! - `checkpoint/server.safetensors`: the global weights `w` and, when the server keeps it, its
//!   momentum `momentum` (Algorithm 3: in the compressed domain for FL-CS);
//! - `checkpoint/compressor.safetensors`: what the messages carry between rounds
//!   (`messages::RoundMessages::state`: FL-CS's error e);
//! - `checkpoint/state.json`: rounds done, the last message length, the accountant.
//!
//! Folder, manifest and swap are `train::checkpoint`'s: a half-written or edited checkpoint is
//! refused, never trained on. A run restarted with the settings in its folder's `config.toml`
//! (or an older run's `config.json`, `config_file`) continues after its last saved round and
//! keeps the metrics of the rounds before it (it may have more rounds, or another device); one
//! with other settings is refused naming each that differs, and only `dpcomp fl --restart`
//! (`fl::clear_run`) discards it. A finished run removes its checkpoint (its summary is what
//! stays). Runs with canary clients (audits) are not checkpointed: their scores are kept in
//! memory.
//!
//! Randomness. The clients' batches, the sampled clients and the sketches' rows are seeded by
//! (seed, round, client) and need nothing saved. The Gaussian noise comes from LibTorch's
//! generator, seeded once when the run starts (the model's initialisation draws from it first),
//! and tch gives no access to that generator's state. So a resumed run seeds it and builds the
//! model as the first start did, then draws and drops one round's noise per round done
//! (`PrivacyEngine::replay_noise`): its generator then stands where the uninterrupted run's
//! does, and the rounds after the resume draw the same noise (`tests/federated/fl.rs` compares a resumed
//! private FL-CS run with an uninterrupted one, round by round).

use crate::error::{Error, Result};
use crate::privacy::accountant::Accountant;
use crate::train::checkpoint::{open, read_compressor, save_folder, write_json};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

use super::FlSettings;

/// What `state.json` records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct FlState {
    /// The rounds finished when the checkpoint was saved; the run continues with the next.
    pub rounds_done: usize,
    /// m: the sketch's length, or the elements of the last compressor message.
    pub message_length: i64,
    /// Every round's DP step so far (client-level DP): a resumed run continues its ε.
    pub accountant: Option<Accountant>,
}

/// A checkpoint as read back.
pub(crate) struct Saved {
    /// `state.json`.
    pub state: FlState,
    /// The global weights w [n].
    pub weights: Tensor,
    /// The server's momentum u ([m] for FL-CS, in the compressed domain; else [n]), when saved.
    pub momentum: Option<Tensor>,
    /// `RoundMessages::state` by name (FL-CS's error e).
    pub messages: HashMap<String, Tensor>,
}

/// Saves the server's state after round `state.rounds_done`.
pub(crate) fn save(
    run_dir: &Path,
    state: &FlState,
    weights: &Tensor,
    momentum: Option<&Tensor>,
    messages: &[(String, Tensor)],
) -> Result<()> {
    save_folder(run_dir, |tmp| {
        let mut server = vec![("w".to_string(), weights.shallow_clone())];
        if let Some(m) = momentum {
            server.push(("momentum".to_string(), m.shallow_clone()));
        }
        Tensor::write_safetensors(&server, tmp.join("server.safetensors"))?;
        if !messages.is_empty() {
            Tensor::write_safetensors(messages, tmp.join("compressor.safetensors"))?;
        }
        write_json(&tmp.join("state.json"), state)
    })
}

/// The settings a federated run may change when it continues from its checkpoint: more rounds
/// (`rounds`, not fewer than it has done) and another device.
pub const RESUME_MAY_CHANGE: [&str; 2] = ["rounds", "device"];

/// The checkpoint to continue `run_dir` from: `None` when it has none. A checkpoint made with
/// other settings than `settings` (beyond `RESUME_MAY_CHANGE`) is refused naming each differing
/// setting, never thrown away (`dpcomp fl --restart` discards it explicitly); so is one already
/// past `settings.rounds`. A checkpoint that fails its manifest is an error, not a fresh start.
pub(crate) fn load(run_dir: &Path, settings: &FlSettings) -> Result<Option<Saved>> {
    if crate::train::checkpoint::find(run_dir).is_none() {
        return Ok(None);
    }
    let unreadable = "the interrupted run's settings cannot be read, so its checkpoint cannot be continued (start it afresh with `--restart`)";
    let saved: FlSettings = match super::config_file::read(run_dir) {
        Ok(Some(saved)) => saved,
        Ok(None) => {
            return Err(Error::bad_file(
                run_dir.join(super::config_file::CONFIG_FILE),
                format!("missing: {unreadable}"),
            ))
        }
        Err(Error::BadFile { path, what }) => {
            return Err(Error::bad_file(path, format!("{what}: {unreadable}")))
        }
        Err(e) => return Err(e),
    };
    let conflicts: Vec<crate::error::SettingConflict> = differences(&saved, settings)
        .into_iter()
        .filter(|c| !RESUME_MAY_CHANGE.contains(&c.field.as_str()))
        .collect();
    if !conflicts.is_empty() {
        return Err(Error::ResumeConflict {
            run_dir: run_dir.to_path_buf(),
            may_change: RESUME_MAY_CHANGE.iter().map(|f| f.to_string()).collect(),
            conflicts,
        });
    }
    let dir = open(run_dir)?;
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let state: FlState =
        serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))?;
    let path = dir.join("server.safetensors");
    let mut server: HashMap<String, Tensor> = Tensor::read_safetensors(&path)
        .map_err(|e| Error::bad_file(&path, e.to_string()))?
        .into_iter()
        .collect();
    if state.rounds_done >= settings.rounds {
        return Err(Error::bad_value(
            "rounds",
            format!(
                "{}: the interrupted run in {} is already after round {}; give more rounds to continue it",
                settings.rounds,
                run_dir.display(),
                state.rounds_done
            ),
        ));
    }
    let weights = server
        .remove("w")
        .ok_or_else(|| Error::bad_file(&path, "missing tensor w (the global weights)"))?;
    Ok(Some(Saved {
        state,
        weights,
        momentum: server.remove("momentum"),
        messages: read_compressor(&dir)?,
    }))
}

/// The settings that differ between `saved` and `given`, under their dotted JSON names
/// (`local.learning_rate`, `privacy.noise_multiplier`), with both values as JSON writes them.
pub(crate) fn differences(
    saved: &FlSettings,
    given: &FlSettings,
) -> Vec<crate::error::SettingConflict> {
    fn flatten(
        prefix: &str,
        value: &serde_json::Value,
        out: &mut std::collections::BTreeMap<String, String>,
    ) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    let name = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    flatten(&name, v, out);
                }
            }
            v => {
                out.insert(prefix.to_string(), v.to_string());
            }
        }
    }
    let (mut a, mut b) = (Default::default(), Default::default());
    flatten(
        "",
        &serde_json::to_value(saved).expect("settings serialise"),
        &mut a,
    );
    flatten(
        "",
        &serde_json::to_value(given).expect("settings serialise"),
        &mut b,
    );
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| crate::error::SettingConflict {
            field: k.clone(),
            saved: a.get(k).cloned().unwrap_or_else(|| "none".into()),
            given: b.get(k).cloned().unwrap_or_else(|| "none".into()),
        })
        .collect()
}

/// The round a run in `run_dir` with `settings` would continue after, if it has a checkpoint
/// for them (for `dpcomp grid --list`; `load` verifies the files before anything is used).
pub fn saved_round(run_dir: &Path, settings: &FlSettings) -> Option<usize> {
    let dir = crate::train::checkpoint::find(run_dir)?;
    let config = super::config_file::read(run_dir).ok()??;
    if &config != settings {
        return None;
    }
    let state: FlState =
        serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).ok()?).ok()?;
    Some(state.rounds_done)
}
