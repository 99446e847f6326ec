//! A federated run's set-up, before Algorithm 1's first round (Kerkouche et al. 2021): the
//! initial weights w₀, the clients' shards of the training examples (a validation split held out
//! of every shard), the server's state (encoders and decoder, the privacy engine, canary
//! clients), the run folder (refused when it holds another run, locked, `config.toml` written)
//! and, for a folder with a checkpoint, the resume: the server's state and the rounds done read
//! back, so the run continues as if it had never stopped (`checkpoint`).

use super::data::FlData;
use super::evaluate::Evaluator;
use super::messages::RoundMessages;
use super::record::History;
use super::round::{Clients, Server};
use super::task::{OwnParts, OwnTask, Task};
use super::{checkpoint, config_file, FlSettings, RoundMetrics};
use crate::error::{Error, Result};
use crate::privacy::canary::{CanarySettings, GradientCanaries};
use crate::privacy::engine::{Clipping, PrivacyEngine};
use crate::privacy::noise::NoiseSource;
use crate::run_lock::RunLock;
use std::path::Path;
use tch::{Kind, Tensor};

/// Everything the rounds work on, as the first round (or a resumed run's next) finds it.
pub(crate) struct Started {
    pub task: Task,
    pub server: Server,
    pub history: History,
    /// The rounds done before (a resumed run's).
    pub rounds_done: usize,
    /// The run folder's lock, held until the run returns (`run_lock`).
    pub _lock: Option<RunLock>,
}

/// What a run trains on: dpcomp's network for the settings' dataset, loaded, or a model and
/// data of one's own (`task`).
pub(crate) enum Source<'d> {
    Fl(&'d FlData),
    Own(OwnParts),
}

/// Sets up the run of `settings` on `source`, in the folder `out` when given (a resumed run when
/// it holds a checkpoint), with canary clients when `canaries` are given. LibTorch's generator
/// is seeded here, then draws the initial weights of dpcomp's networks (and, each round, the
/// noise): the order of those draws is what makes a run reproducible from its seed. A model of
/// one's own starts from the weights it holds; its runs have no folder (`FederatedRunBuilder`).
pub(crate) fn start(
    settings: &FlSettings,
    source: Source,
    out: Option<&Path>,
    canaries: Option<CanarySettings>,
) -> Result<Started> {
    let (task, w, shapes, device) = match source {
        Source::Fl(given) => {
            let device = settings.device.device()?;
            let data = given.to_device(device);
            tch::manual_seed(settings.seed as i64);
            let global_model = data.model(settings.model, device)?;
            let client_model = data.model(settings.model, device)?;
            let w = global_model.flat();
            let shapes: Vec<Vec<i64>> = global_model.variables().iter().map(Tensor::size).collect();
            let (shards, validation_index) = split_examples(settings, &data)?;
            let evaluator = Evaluator::new(
                global_model,
                &data,
                &validation_index,
                settings.eval_examples,
            );
            let clients = Clients {
                x: data.train_x.shallow_clone(),
                y: data.train_y.shallow_clone(),
                shards,
                model: client_model,
            };
            (Task::Fl { clients, evaluator }, w, shapes, device)
        }
        Source::Own(parts) => {
            let device = parts.model.var_store().device();
            tch::manual_seed(settings.seed as i64);
            let own = OwnTask::new(parts, settings.eval_examples);
            let (w, shapes) = (own.flat(), own.shapes());
            (Task::Own(own), w, shapes, device)
        }
    };
    let messages = RoundMessages::new(settings, &shapes, device)?;
    let folder = match out {
        Some(dir) => Some(open_folder(dir, settings, canaries.is_some())?),
        None => None,
    };
    let mut server = server(settings, w, messages, canaries)?;
    let (lock, saved, rows) = match folder {
        Some(f) => (Some(f.lock), f.saved, f.rows),
        None => (None, None, Vec::new()),
    };
    let rounds_done = rows.len();
    if let Some(saved) = saved {
        restore(&mut server, saved, rounds_done)?;
    }
    Ok(Started {
        history: History::new(task.metric(), rows),
        task,
        server,
        rounds_done,
        _lock: lock,
    })
}

/// The server before the first round: w₀, no momentum yet, m and P from the sketch (n for the
/// compressors, until their first message), the privacy engine and the canary clients.
fn server(
    settings: &FlSettings,
    w: Tensor,
    messages: RoundMessages,
    canaries: Option<CanarySettings>,
) -> Result<Server> {
    let n = w.size()[0];
    let (m, chunks) = messages.sketch_shape().unwrap_or((n, None));
    let engine = privacy_engine(settings, &w)?;
    let canaries = canary_clients(settings, canaries, &w)?;
    Ok(Server {
        w,
        momentum: None,
        messages,
        engine,
        canaries,
        parameters: n,
        message_length: m,
        chunks,
    })
}

/// (each client's examples, the validation examples): a seeded share `validation` of the
/// training examples is held out (`validation_split`), and `partition` splits the rest among
/// the clients. Row indices into the training split.
fn split_examples(settings: &FlSettings, data: &FlData) -> Result<(Vec<Vec<i64>>, Vec<i64>)> {
    let labels: Vec<i64> = crate::host::to_vec_i64(&data.train_y.to_device(tch::Device::Cpu))?;
    let (kept, validation_index) =
        validation_split(labels.len(), settings.validation, settings.seed);
    let kept_labels: Vec<i64> = kept.iter().map(|&i| labels[i as usize]).collect();
    let shards = settings
        .partition
        .split(&kept_labels, settings.clients, settings.seed)?
        .into_iter()
        .map(|shard| shard.into_iter().map(|i| kept[i as usize]).collect())
        .collect();
    Ok((shards, validation_index))
}

/// (the training examples the clients split, the validation examples): a share `validation`
/// of the `n` training examples drawn by `seed`, both sorted; all to the clients when 0.
fn validation_split(n: usize, validation: f64, seed: u64) -> (Vec<i64>, Vec<i64>) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let held = (validation * n as f64).round() as usize;
    let mut order: Vec<i64> = (0..n as i64).collect();
    if held > 0 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5641_4C49_4441_5445);
        order.shuffle(&mut rng);
    }
    let (mut validation_index, mut kept) = (order[..held].to_vec(), order[held..].to_vec());
    validation_index.sort_unstable();
    kept.sort_unstable();
    (kept, validation_index)
}

/// The run folder as the run found it: locked, with a resumed run's checkpoint and the rows of
/// its rounds done.
struct Folder {
    lock: RunLock,
    saved: Option<checkpoint::Saved>,
    rows: Vec<RoundMetrics>,
}

/// Opens the run folder `dir`: a fresh run's must be new, empty or an unfinished dpcomp run's
/// (`run_folder`), never a finished run's; one with a checkpoint for these settings resumes
/// (other settings are refused by `checkpoint::load`; audited runs never resume). The lock is
/// taken, `config.toml` written, and a resumed run's rows read back.
fn open_folder(dir: &Path, settings: &FlSettings, audited: bool) -> Result<Folder> {
    // Checked before the lock creates the folder.
    let has_checkpoint = crate::train::checkpoint::find(dir).is_some();
    let created = !dir.exists();
    if !has_checkpoint {
        crate::run_folder::check_fresh(dir)?;
        if dir.join("summary.json").is_file() {
            return Err(Error::bad_value(
                "out",
                format!(
                    "{}: already holds a finished federated run (summary.json); choose another folder, or discard it with `--restart`",
                    dir.display()
                ),
            ));
        }
    }
    let lock = RunLock::acquire(dir)?;
    if audited && has_checkpoint {
        return Err(Error::bad_value(
            "out",
            format!(
                "{}: holds an interrupted federated run, and an audited run does not resume; choose another folder, or discard it with `--restart`",
                dir.display()
            ),
        ));
    }
    let saved = checkpoint::load(dir, settings)?;
    let rounds_done = saved.as_ref().map_or(0, |s| s.state.rounds_done);
    write_settings(dir, settings, rounds_done, created)?;
    let rows = match rounds_done {
        0 => Vec::new(),
        done => rows_done(dir, done)?,
    };
    Ok(Folder { lock, saved, rows })
}

/// Writes the folder's `config.toml`. A fresh start first claims the folder, dropping an
/// earlier start's logs and the settings file of the version before `config.toml`; a start
/// that cannot write its settings (a full disk) leaves what it found.
fn write_settings(
    dir: &Path,
    settings: &FlSettings,
    rounds_done: usize,
    created: bool,
) -> Result<()> {
    let fresh = match rounds_done {
        0 => Some(crate::run_folder::FreshStart::claim(
            dir,
            created,
            &["metrics.jsonl", config_file::LEGACY_CONFIG_FILE],
        )?),
        _ => None,
    };
    let had_config = dir.join(config_file::CONFIG_FILE).exists();
    let written = config_file::write(dir, settings);
    if let (Err(_), Some(mut fresh)) = (&written, fresh) {
        if !had_config {
            fresh.wrote(config_file::CONFIG_FILE);
        }
        fresh.undo();
    }
    written
}

/// The rows of the `rounds_done` rounds before a resume, as `metrics.jsonl` recorded them;
/// rows after the checkpoint (a run killed between its metrics and its save, or a row
/// half-written when the disk filled up) are dropped from the file: those rounds run again.
fn rows_done(dir: &Path, rounds_done: usize) -> Result<Vec<RoundMetrics>> {
    let metrics = dir.join("metrics.jsonl");
    let rows = super::read_rows_up_to(&metrics, rounds_done)?;
    if rows.len() < rounds_done {
        return Err(Error::bad_file(
            &metrics,
            format!(
                "{} rounds recorded, but the checkpoint is after round {rounds_done}; start the run afresh with `--restart`",
                rows.len()
            ),
        ));
    }
    let mut text = String::new();
    for row in &rows {
        text.push_str(&serde_json::to_string(row).expect("metrics serialise"));
        text.push('\n');
    }
    crate::run_folder::replace(&metrics, text.as_bytes())?;
    Ok(rows)
}

/// Client-level DP on the privacy engine: each client's message is one "example" clipped to S,
/// and the noise and the accountant's step happen together once per round. The noise is seeded
/// (reproducible experiments).
fn privacy_engine(settings: &FlSettings, w: &Tensor) -> Result<Option<PrivacyEngine>> {
    settings
        .privacy
        .map(|p| {
            PrivacyEngine::builder()
                .noise_multiplier(p.noise_multiplier)
                .sample_rate(settings.fraction)
                .dataset_size(settings.clients as u64)
                .delta(p.delta)
                .accountant(p.accountant)
                .max_grad_norm(p.clip)
                .noise_source(NoiseSource::Seeded)
                .build(std::slice::from_ref(w))
        })
        .transpose()
}

/// The white-box canary clients of an audited run (`FederatedRunBuilder::canaries`), whose
/// messages are clipped to S like the clients': the scores are in units of one clipped
/// message.
fn canary_clients(
    settings: &FlSettings,
    canaries: Option<CanarySettings>,
    w: &Tensor,
) -> Result<Option<GradientCanaries>> {
    let (Some(c), Some(p)) = (canaries, settings.privacy) else {
        return Ok(None);
    };
    Ok(Some(GradientCanaries::new(
        c,
        std::slice::from_ref(w),
        &Clipping::Flat { max_norm: p.clip },
        1e3 * p.clip,
        settings.fraction,
        // The server adds its update (w += η u): a negative step size for the audit.
        (-settings.server_learning_rate, settings.server_momentum),
    )?))
}

/// Puts a resumed run's server where the checkpoint after round `rounds_done` left it: weights,
/// momentum, the messages' state (FL-CS's error), m, the accountant, and LibTorch's generator
/// where the uninterrupted run's stands (one round's noise drawn and dropped per round done,
/// `checkpoint`).
fn restore(server: &mut Server, saved: checkpoint::Saved, rounds_done: usize) -> Result<()> {
    let n = server.parameters;
    if saved.weights.size() != [n] {
        return Err(Error::bad_value(
            "checkpoint",
            format!(
                "w has shape {:?}, this run's model has {n} parameters",
                saved.weights.size()
            ),
        ));
    }
    let device = server.w.device();
    server.w = saved.weights.to_device(device).to_kind(server.w.kind());
    server.momentum = saved.momentum.map(|t| t.to_device(device));
    server.messages.load_state(saved.messages)?;
    server.message_length = saved.state.message_length;
    if let Some(engine) = server.engine.as_mut() {
        let accountant = saved.state.accountant.ok_or_else(|| {
            Error::bad_value(
                "checkpoint",
                "a private run's checkpoint must record its accountant",
            )
        })?;
        engine.resume(accountant, None)?;
        let aggregated_length = if server.messages.is_linear() {
            server.message_length
        } else {
            n
        };
        engine.replay_noise(
            &[Tensor::zeros([aggregated_length], (Kind::Float, device))],
            rounds_done as u64,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::validation_split;

    #[test]
    fn the_validation_split_is_a_seeded_disjoint_share() {
        let (kept, held) = validation_split(1000, 0.1, 3);
        assert_eq!(held.len(), 100);
        assert_eq!(kept.len(), 900);
        let mut all: Vec<i64> = kept.iter().chain(&held).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<i64>>());
        assert_eq!(validation_split(1000, 0.1, 3), (kept, held.clone()));
        assert_ne!(validation_split(1000, 0.1, 4).1, held);
        // None held out: every example to the clients, in order (runs without a split unchanged).
        assert_eq!(validation_split(5, 0.0, 3), ((0..5).collect(), vec![]));
    }
}
