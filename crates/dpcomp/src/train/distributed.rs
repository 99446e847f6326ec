//! The trainer's data-parallel pieces (`docs/guide/distributed.md`): what W workers must
//! agree on before they train, how each draws its own random stream, how the epoch's numbers
//! and the compressors' states are brought together on rank 0, which alone writes the run folder.
//!
//! The step itself is `train::exchange`; the transport is `comm`.

use crate::comm::Communicator;
use crate::compress::{Decoder, Encoder};
use crate::config::TrainConfig;
use crate::data::{Dataset, Features, TaskData};
use crate::error::{Error, Result};
use crate::host;
use std::collections::HashMap;
use std::path::Path;
use tch::{Kind, Tensor};

/// The seed rank `rank`'s random stream (batches, augmentation, dropout, noise) starts from:
/// rank 0 keeps the run's seed, so one worker is the single-process run draw for draw; every
/// other rank gets a well-mixed seed of its own (SplitMix64 of (seed, rank)).
pub fn worker_seed(seed: u64, rank: usize) -> u64 {
    if rank == 0 {
        return seed;
    }
    let mut z = seed ^ (rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What every worker's configuration must share: all of it but the data folder and the device,
/// which may differ from machine to machine.
fn shared_settings(config: &TrainConfig) -> String {
    let mut shared = config.clone();
    shared.data.data_dir = None;
    shared.device = Default::default();
    shared.to_toml()
}

/// How many differing settings an error lists before it says how many more there are.
const LISTED_DIFFERENCES: usize = 8;

/// Every setting in which `theirs` differs from `mine` (two `shared_settings` texts), by its
/// dotted TOML key (`optimizer.lr`), in key order, with its value in each (`None`: unset there).
fn settings_that_differ(mine: &str, theirs: &str) -> Vec<(String, Option<String>, Option<String>)> {
    fn flatten(prefix: &str, table: &toml::Table, into: &mut Vec<(String, String)>) {
        for (key, value) in table {
            let key = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match value {
                toml::Value::Table(inner) => flatten(&key, inner, into),
                other => into.push((key, other.to_string())),
            }
        }
    }
    let settings = |text: &str| -> std::collections::BTreeMap<String, String> {
        let mut flat = Vec::new();
        match text.parse::<toml::Table>() {
            Ok(table) => flatten("", &table, &mut flat),
            // Only another build's serialisation could fail to parse: the whole text is the setting.
            Err(_) => flat.push(("(the whole configuration)".to_string(), text.to_string())),
        }
        flat.into_iter().collect()
    };
    let (mine, theirs) = (settings(mine), settings(theirs));
    let keys: std::collections::BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
    keys.into_iter()
        .filter(|key| mine.get(*key) != theirs.get(*key))
        .map(|key| {
            (
                key.clone(),
                mine.get(key).cloned(),
                theirs.get(key).cloned(),
            )
        })
        .collect()
}

/// Checks that every rank runs rank 0's configuration (but for the data folder and the device);
/// the error, the same on every rank, names each setting that differs and its value on rank 0
/// and on each rank that differs (`optimizer.lr is 0.5 on rank 0 but 0.25 on rank 1`).
fn check_same_settings(comm: &mut dyn Communicator, config: &TrainConfig) -> Result<()> {
    let all = comm.all_gather(shared_settings(config).as_bytes())?;
    let zero = String::from_utf8_lossy(&all[0]).into_owned();
    let mut differences = Vec::new();
    for (rank, theirs) in all.iter().enumerate().skip(1) {
        if *theirs == all[0] {
            continue;
        }
        let theirs = String::from_utf8_lossy(theirs);
        for (key, on_zero, on_rank) in settings_that_differ(&zero, &theirs) {
            let value = |v: Option<String>| v.unwrap_or_else(|| "unset".to_string());
            differences.push(format!(
                "{key} is {} on rank 0 but {} on rank {rank}",
                value(on_zero),
                value(on_rank)
            ));
        }
    }
    if differences.is_empty() {
        return Ok(());
    }
    let more = differences.len().saturating_sub(LISTED_DIFFERENCES);
    differences.truncate(LISTED_DIFFERENCES);
    let mut listed = differences.join("; ");
    if more > 0 {
        listed.push_str(&format!("; and {more} more"));
    }
    Err(comm.error(format!(
        "the configuration differs between ranks: {listed} (every rank must run the same \
         configuration; only the data folder and the device may differ)"
    )))
}

/// A cheap fingerprint of a split: its size, its labels (summed, and weighted by position so that
/// a reordering shows) and its features' shapes and sums. Two workers reading different files,
/// limits or preprocessing differ in it.
fn fingerprint(data: &Dataset) -> String {
    fingerprint_with(data, |sum| format!("{sum:e}"))
}

/// The training and test splits' fingerprint a checkpoint records (`TrainState::data`), with
/// float sums to 9 significant digits so that the same data held on another device or summed by
/// another number of threads (a resume may change both) prints the same.
pub fn data_fingerprint(data: &TaskData) -> String {
    let print = |d: &Dataset| fingerprint_with(d, |sum| format!("{sum:.8e}"));
    format!("train: {}; test: {}", print(&data.train), print(&data.test))
}

fn fingerprint_with(data: &Dataset, float: impl Fn(f64) -> String) -> String {
    let n = data.len();
    let labels = data.labels.to_kind(Kind::Int64);
    let positions = Tensor::arange(n, (Kind::Int64, labels.device()));
    let mut text = format!(
        "{n} examples, labels {} / {}",
        host::i64_scalar(&labels.sum(Kind::Int64)),
        host::i64_scalar(&(labels * positions).sum(Kind::Int64))
    );
    let tensors: Vec<&Tensor> = match &data.features {
        Features::Tokens { ids, lengths } => vec![ids, lengths],
        Features::Images(images) => vec![images],
        Features::TextPair {
            ids,
            token_types,
            attention_mask,
        } => vec![ids, token_types, attention_mask],
        Features::Rows(rows) => vec![rows],
    };
    for t in tensors {
        let sum = if t.is_floating_point() {
            float(host::f64_scalar(&t.sum(Kind::Double)))
        } else {
            host::i64_scalar(&t.sum(Kind::Int64)).to_string()
        };
        text.push_str(&format!(", {:?} summing to {sum}", t.size()));
    }
    text
}

/// Checks, on every rank, that all W workers run the same settings on the same data from the
/// same weights and (when resuming) the same checkpoint state; any difference is an error on
/// every rank naming what differs: the settings that differ and their values on each rank, or
/// the data, the checkpoint's state or the weights (`Communicator::check_same`, `comm::weights`).
pub fn check_workers_agree(
    comm: &mut dyn Communicator,
    config: &TrainConfig,
    data: &TaskData,
    params: &[(String, Tensor)],
    state: &str,
) -> Result<()> {
    check_same_settings(comm, config)?;
    let data_print = format!(
        "train: {}; test: {}",
        fingerprint(&data.train),
        fingerprint(&data.test)
    );
    comm.check_same("the training data", data_print.as_bytes())?;
    comm.check_same("the checkpoint's state", state.as_bytes())?;
    crate::comm::weights::check_initial_weights(comm, params)
}

/// `values` summed over the workers in f64, in rank order, identically on every rank (an
/// all-gather of their bytes: exact, unlike an f32 all-reduce).
pub fn sum_over_workers(comm: &mut dyn Communicator, values: &[f64]) -> Result<Vec<f64>> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = comm.all_gather(&bytes)?;
    let mut sums = vec![0.0; values.len()];
    for (rank, theirs) in all.iter().enumerate() {
        if theirs.len() != bytes.len() {
            return Err(comm.error(format!(
                "rank {rank} sent {} bytes of epoch totals, expected {}",
                theirs.len(),
                bytes.len()
            )));
        }
        for (sum, b) in sums.iter_mut().zip(theirs.chunks_exact(8)) {
            *sum += f64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
    }
    Ok(sums)
}

/// Every rank's encoder state on every rank, in rank order: each rank's tensors laid out as this
/// rank's own (every worker's encoder is built from the same compressor and shapes).
pub fn gather_encoder_states(
    comm: &mut dyn Communicator,
    mine: &[(String, Tensor)],
) -> Result<Vec<Vec<(String, Tensor)>>> {
    let all = comm.all_gather(&crate::comm::weights::parameter_bytes(mine))?;
    let expected: usize = mine
        .iter()
        .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
        .sum();
    let mut states = Vec::with_capacity(all.len());
    for (rank, bytes) in all.iter().enumerate() {
        if bytes.len() != expected {
            return Err(comm.error(format!(
                "rank {rank}'s compressor state has {} bytes, this rank's {expected}",
                bytes.len()
            )));
        }
        let mut at = 0;
        let mut state = Vec::with_capacity(mine.len());
        for (name, t) in mine {
            let length = t.numel() * t.kind().elt_size_in_bytes();
            let theirs = Tensor::from_data_size(&bytes[at..at + length], &t.size(), t.kind());
            state.push((name.clone(), theirs));
            at += length;
        }
        states.push(state);
    }
    Ok(states)
}

/// Name prefix of rank `rank`'s encoder state in a W-worker checkpoint.
fn encoder_prefix(rank: usize) -> String {
    format!("encoder.rank{rank}.")
}

/// Name prefix of the decoder of sender `sender`'s messages in a W-worker checkpoint.
fn decoder_prefix(sender: usize) -> String {
    format!("decoder.sender{sender}.")
}

/// A W-worker checkpoint's `compressor.safetensors`: every rank's encoder state
/// (`encoder.rank{r}.*`) and the decoders of every sender (`decoder.sender{s}.*`, the same on
/// every rank).
pub fn compressor_checkpoint(
    encoders: Vec<Vec<(String, Tensor)>>,
    decoders: &[Box<dyn Decoder>],
) -> Vec<(String, Tensor)> {
    let mut state = Vec::new();
    for (rank, encoder) in encoders.into_iter().enumerate() {
        let prefix = encoder_prefix(rank);
        state.extend(
            encoder
                .into_iter()
                .map(|(n, t)| (format!("{prefix}{n}"), t)),
        );
    }
    for (sender, decoder) in decoders.iter().enumerate() {
        let prefix = decoder_prefix(sender);
        state.extend(
            decoder
                .state()
                .into_iter()
                .map(|(n, t)| (format!("{prefix}{n}"), t)),
        );
    }
    state
}

/// Restores rank `rank`'s encoder and every sender's decoder from a W-worker checkpoint's
/// compressor state (`compressor_checkpoint`).
pub fn load_compressor_checkpoint(
    saved: HashMap<String, Tensor>,
    rank: usize,
    encoder: &mut dyn Encoder,
    decoders: &mut [Box<dyn Decoder>],
) -> Result<()> {
    // parts[0]: this rank's encoder; parts[1 + s]: the decoder of sender s.
    let mut parts: Vec<HashMap<String, Tensor>> =
        (0..=decoders.len()).map(|_| HashMap::new()).collect();
    let mine = encoder_prefix(rank);
    for (name, t) in saved {
        if let Some(n) = name.strip_prefix(&mine) {
            parts[0].insert(n.to_string(), t);
        } else if let Some((sender, n)) = (0..decoders.len()).find_map(|s| {
            name.strip_prefix(&decoder_prefix(s))
                .map(|n| (s, n.to_string()))
        }) {
            parts[sender + 1].insert(n, t);
        }
    }
    let mut parts = parts.into_iter();
    if !encoder.state().is_empty() {
        encoder.load_state(parts.next().expect("the encoder's part"))?;
    } else {
        parts.next();
    }
    for (decoder, part) in decoders.iter_mut().zip(parts) {
        if !decoder.state().is_empty() {
            decoder.load_state(part)?;
        }
    }
    Ok(())
}

/// How `train_in_threads` starts: a fresh run, or the resumption of one (`TrainerBuilder::resume`).
#[derive(Debug, Clone)]
pub enum Start {
    /// A new run of this configuration (`run_dir` must not hold another).
    Fresh(TrainConfig),
    /// The run already in `run_dir`, from its last checkpoint, with these changed settings
    /// (only those of `RESUME_MAY_CHANGE`).
    Resume(crate::config::TrainOverrides),
}

/// Trains the run in `run_dir` with `workers` data-parallel workers as threads of this process
/// (`comm::ThreadGroup`: one computes at a time, each with its own random stream), which is what
/// an MPI job of as many ranks computes: the in-process reference of the MPI tests, and a way to
/// try a configuration without MPI. Each worker makes the task's model and data with `tasks`
/// (`TrainerBuilder::tasks`); `observers` hear of rank 0's progress. Returns every rank's
/// summary in rank order; when a rank fails, its error (rather than the others' "a rank left").
pub fn train_in_threads(
    workers: usize,
    start: Start,
    run_dir: &Path,
    tasks: std::sync::Arc<dyn super::parts::TaskSource>,
    observers: Vec<Box<dyn super::observer::Observer + Send>>,
) -> Result<Vec<super::metrics::Summary>> {
    if !(1..=crate::comm::MAX_THREAD_WORKERS).contains(&workers) {
        return Err(Error::bad_value(
            "workers",
            format!(
                "{workers}: expected 1 to {} thread workers (more run as MPI ranks under mpiexec)",
                crate::comm::MAX_THREAD_WORKERS
            ),
        ));
    }
    let run_dir = run_dir.to_path_buf();
    let rank_0_observers = std::sync::Mutex::new(observers);
    let results = crate::comm::ThreadGroup::run(workers, move |comm| {
        let rank = comm.rank();
        let comm: Box<dyn Communicator> = Box::new(comm);
        let builder = super::Trainer::builder(&run_dir)
            .communicator(comm)
            .tasks(tasks.clone());
        let mut trainer = match &start {
            Start::Fresh(config) => builder.config(config.clone()).build()?,
            Start::Resume(overrides) => builder.resume(overrides.clone()).build()?,
        };
        if rank == 0 {
            let observers =
                std::mem::take(&mut *rank_0_observers.lock().unwrap_or_else(|e| e.into_inner()));
            for observer in observers {
                trainer.observe(observer);
            }
        }
        trainer.run()
    })?;
    let mut summaries = Vec::with_capacity(workers);
    let mut comm_error = None;
    for result in results {
        match result {
            Ok(summary) => summaries.push(summary),
            Err(e @ Error::Comm { .. }) => {
                comm_error.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match comm_error {
        Some(e) => Err(e),
        None => Ok(summaries),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_seeds_keep_rank_0_and_differ_elsewhere() {
        assert_eq!(worker_seed(42, 0), 42);
        let seeds: Vec<u64> = (0..8).map(|r| worker_seed(42, r)).collect();
        for i in 0..8 {
            for j in i + 1..8 {
                assert_ne!(seeds[i], seeds[j], "ranks {i} and {j}");
            }
        }
        assert_ne!(worker_seed(42, 1), worker_seed(43, 1));
    }

    #[test]
    fn the_settings_that_differ_are_named_with_both_values() {
        let mut zero = TrainConfig::new("surnames");
        zero.optimizer.lr = 0.5;
        let mut one = zero.clone();
        assert!(settings_that_differ(&shared_settings(&zero), &shared_settings(&one)).is_empty());
        one.optimizer.lr = 0.25;
        one.privacy.noise_multiplier = Some(1.0);
        one.data.data_dir = Some("/elsewhere".into()); // may differ between machines
        let differ = settings_that_differ(&shared_settings(&zero), &shared_settings(&one));
        assert_eq!(
            differ,
            [
                (
                    "optimizer.lr".to_string(),
                    Some("0.5".to_string()),
                    Some("0.25".to_string())
                ),
                (
                    "privacy.noise_multiplier".to_string(),
                    None,
                    Some("1.0".to_string())
                ),
            ]
        );
    }

    #[test]
    fn workers_with_another_setting_fail_naming_it_on_every_rank() {
        let epochs = TrainConfig::new("surnames").epochs;
        let results = crate::comm::ThreadGroup::run(3, move |mut comm| {
            let mut config = TrainConfig::new("surnames");
            config.optimizer.momentum = 0.0;
            if comm.rank() == 2 {
                config.optimizer.momentum = 0.9;
                config.epochs = epochs + 1;
            }
            check_same_settings(&mut comm, &config)
        })
        .unwrap();
        for (rank, result) in results.iter().enumerate() {
            let message = result.as_ref().unwrap_err().to_string();
            assert!(
                message.contains("the configuration differs between ranks")
                    && message.contains("optimizer.momentum is 0.0 on rank 0 but 0.9 on rank 2")
                    && message.contains(&format!(
                        "epochs is {epochs} on rank 0 but {} on rank 2",
                        epochs + 1
                    ))
                    && !message.contains("rank 1:"),
                "rank {rank}: {message}"
            );
        }
    }
}
