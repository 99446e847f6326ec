//! The training loop: one readable pass from configuration to metrics and checkpoints.
//!
//! Per step: forward -> mean cross-entropy -> one backward -> the global gradient norm clipped to
//! C (the paper clips even without privacy) -> SGD. After every epoch: test accuracy, one line in
//! `metrics.jsonl`, a checkpoint. The figure a run reports is the mean test accuracy of its last
//! 10 epochs (`../shared/papers/dp-and-gradient-compression.txt`, "we measure the test accuracy
//! ... at the end of every epoch and use an average of the last 10 epochs").

pub mod adam;
pub mod audit;
pub mod builder;
pub mod checkpoint;
pub mod distributed;
pub mod exchange;
pub mod metrics;
pub mod observer;
pub mod optimizer;
pub mod private;
pub mod sgd;
pub mod update;
pub mod upload;

use crate::analysis::{fixed_batches, gradient_error};
use crate::comm::Communicator;
use crate::compress::message::paper_gib;
use crate::config::{ClippingMode, OptimizerKind, Sampling, TaskName, TrainConfig, TrainOverrides};
use crate::data::sampler;
use crate::data::{Batch, Dataset, TaskData};
use crate::error::{Error, Result, SettingConflict};
use crate::models::Model;
use crate::nn::Ctx;
use crate::privacy::accountant::Accountant;
use crate::privacy::engine::{AdaptiveClipping, Clipping, PrivacyEngine};
use crate::privacy::noise::NoiseSource;
use crate::run_lock::RunLock;
use crate::tasks;
use adam::Adam;
use checkpoint::TrainState;
use exchange::Exchange;
use metrics::{EpochMetrics, Summary};
use optimizer::Optimizer;
use private::{dp_step, DpSettings};
use sgd::{clip_global_norm, Sgd};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Device, Kind, Reduction, Tensor};
use update::Updater;

/// The LibTorch seed of epoch `epoch` (0-based) of a run seeded with `seed`: every epoch starts
/// from its own seed, so resuming at an epoch boundary replays the same random draws.
pub fn epoch_seed(seed: u64, epoch: usize) -> i64 {
    // SplitMix64 finaliser of (seed, epoch): distinct, well-mixed seeds per epoch.
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(epoch as u64 + 1);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 1) as i64
}

/// Loss (mean cross-entropy) and accuracy of `model` on `data`, in evaluation mode.
pub fn evaluate(
    model: &dyn Model,
    data: &Dataset,
    batch_size: usize,
    device: Device,
) -> Result<(f64, f64)> {
    let n = data.len();
    if n == 0 {
        return Ok((f64::NAN, f64::NAN));
    }
    let all = Tensor::arange(n, (Kind::Int64, Device::Cpu));
    let (loss_sum, correct) = evaluation_sums(model, data, &all, batch_size, device)?;
    Ok((loss_sum / n as f64, correct as f64 / n as f64))
}

/// Summed cross-entropy and correct predictions of `model` on the examples `index` (CPU int64)
/// of `data`, in evaluation mode, in batches of `batch_size`: `evaluate`'s sums, and each
/// worker's share of them in a data-parallel run.
pub fn evaluation_sums(
    model: &dyn Model,
    data: &Dataset,
    index: &Tensor,
    batch_size: usize,
    device: Device,
) -> Result<(f64, i64)> {
    let n = index.size()[0];
    tch::no_grad(|| {
        let mut loss_sum = Tensor::zeros([], (Kind::Double, device));
        let mut correct = Tensor::zeros([], (Kind::Int64, device));
        let mut start = 0;
        while start < n {
            let len = (batch_size as i64).min(n - start);
            let batch = data.batch(&index.narrow(0, start, len), device, false);
            let logits = model.forward(&batch.features, &mut Ctx::eval())?;
            loss_sum += logits
                .cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::Mean, -100, 0.0)
                .to_kind(Kind::Double)
                * len as f64;
            correct += logits
                .argmax(-1, false)
                .eq_tensor(&batch.labels)
                .sum(Kind::Int64);
            start += len;
        }
        Ok((loss_sum.double_value(&[]), correct.int64_value(&[])))
    })
}

/// One non-private SGD step: forward -> mean cross-entropy -> backward -> global gradient norm
/// clipped to `max_grad_norm` -> compress -> decompress -> SGD update (`updater`). Returns
/// (summed loss, correct predictions) as tensors on the model's device, without a host sync.
pub fn train_step(
    model: &dyn Model,
    params: &[(String, Tensor)],
    updater: &mut Updater,
    batch: &Batch,
    max_grad_norm: f64,
) -> Result<(Tensor, Tensor)> {
    train_step_share(model, params, updater, batch, max_grad_norm, 1.0)
}

/// `train_step` on one worker's share of a logical batch: its mean loss weighted by
/// `share_weight` = W · share / logical batch, so that the mean of the W workers' updates is the
/// logical batch's mean gradient whatever the shares' sizes (1.0 with one worker, and exactly
/// 1.0 with equal shares). An empty share (the last shuffled batch of an epoch can have fewer
/// examples than there are workers) runs no forward pass and sends a zero gradient, so that the
/// other workers' collectives still meet it; its loss and count are zero.
fn train_step_share(
    model: &dyn Model,
    params: &[(String, Tensor)],
    updater: &mut Updater,
    batch: &Batch,
    max_grad_norm: f64,
    share_weight: f64,
) -> Result<(Tensor, Tensor)> {
    if batch.is_empty() {
        return empty_share_step(params, updater, batch.labels.device());
    }
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let mut ctx = Ctx::train();
    let logits = model.forward(&batch.features, &mut ctx)?;
    let loss = logits.cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::Mean, -100, 0.0);
    for (_, p) in params {
        p.shallow_clone().zero_grad();
    }
    if share_weight == 1.0 {
        ctx.backward(&loss);
    } else {
        ctx.backward(&(&loss * share_weight));
    }
    let grads: Vec<Tensor> = params.iter().map(|(_, p)| p.grad()).collect();
    let _ = clip_global_norm(&grads, max_grad_norm);
    updater.step(&tensors, &grads)?;
    let correct = logits
        .argmax(-1, false)
        .eq_tensor(&batch.labels)
        .sum(Kind::Int64);
    Ok((loss.detach() * batch.len() as f64, correct))
}

/// The step of a worker whose share of the logical batch is empty: a zero gradient through the
/// updater (so that the exchange with the other workers happens), zero loss and zero correct.
fn empty_share_step(
    params: &[(String, Tensor)],
    updater: &mut Updater,
    device: Device,
) -> Result<(Tensor, Tensor)> {
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let zeros: Vec<Tensor> = tensors.iter().map(Tensor::zeros_like).collect();
    updater.step(&tensors, &zeros)?;
    Ok((
        Tensor::zeros([], (Kind::Float, device)),
        Tensor::zeros([], (Kind::Int64, device)),
    ))
}

/// How `TrainState::stopped` starts when a run stopped because its loss became non-finite.
pub const DIVERGED: &str = "diverged";

/// The settings `dpcomp train --resume` may change: more epochs, a moved data folder, another
/// device (and `--quiet`, which is not a setting). Every other flag must match the run.
pub const RESUME_MAY_CHANGE: [&str; 3] = ["epochs", "data.data_dir", "device"];

/// ceil(examples / batch size): the steps of one epoch, and 1 / q under DP (one formula for the
/// trainer's loop and the privacy engine's q).
fn steps_per_epoch_of(examples: i64, batch_size: usize) -> i64 {
    let batch = batch_size as i64;
    (examples + batch - 1) / batch
}

/// σ for a run given `privacy.target_epsilon` and no `privacy.noise_multiplier`: the smallest
/// that keeps all `epochs` x ⌈N / B⌉ steps at q = 1 / (steps per epoch) within the target at δ
/// on the configured accountant (`PrivacyEngine::builder().target_epsilon`, Opacus's
/// `make_private_with_epsilon`); `None` when σ is given or the run is not private.
fn calibrated_sigma(config: &TrainConfig, train_examples: i64) -> Result<Option<f64>> {
    let (None, Some(target)) = (
        config.privacy.noise_multiplier,
        config.privacy.target_epsilon,
    ) else {
        return Ok(None);
    };
    let steps_per_epoch = steps_per_epoch_of(train_examples, config.optimizer.batch_size) as u64;
    let steps = (config.epochs as u64)
        .checked_mul(steps_per_epoch)
        .ok_or_else(|| {
            Error::bad_value(
                "epochs",
                format!(
                    "{}: at {steps_per_epoch} steps an epoch, more steps than can be counted",
                    config.epochs
                ),
            )
        })?;
    let sigma = crate::privacy::calibrate::noise_multiplier_for(
        config.privacy.accountant,
        target,
        1.0 / steps_per_epoch as f64,
        steps,
        config.privacy.delta,
    )
    .map_err(|e| match e {
        Error::BadValue { field, what } => Error::bad_value(format!("privacy.{field}"), what),
        other => other,
    })?;
    Ok(Some(sigma))
}

/// A model and data of one's own (`TrainerBuilder::model`).
pub(crate) struct OwnTask {
    model: Box<dyn Model>,
    data: TaskData,
}

/// A change to a built-in task's loaded data before training (`TrainerBuilder::edit_data`).
pub type DataEdit = Box<dyn FnOnce(TaskData) -> Result<TaskData>>;

/// A model, its data and optimiser, and where the run writes. Built by `Trainer::new`,
/// `Trainer::resume` or `Trainer::builder`; its parts are read through accessors, so the
/// engine's invariants (no noise without an accountant step, the run folder's one writer)
/// cannot be bypassed.
pub struct Trainer {
    pub(crate) config: TrainConfig,
    pub(crate) device: Device,
    pub(crate) data: TaskData,
    pub(crate) model: Box<dyn Model>,
    /// Compressor and optimiser: what happens to each step's final gradient.
    pub(crate) updater: Updater,
    /// Trainable variables, sorted by name.
    pub(crate) params: Vec<(String, Tensor)>,
    pub(crate) run_dir: PathBuf,
    pub(crate) state: TrainState,
    pub(crate) history: Vec<EpochMetrics>,
    /// Who hears of the run's progress (`observe`); nobody by default: the library writes
    /// nothing to stderr on its own.
    observer: Option<Box<dyn observer::Observer>>,
    /// Under DP: σ, q, clipping, the noise source (seeded, or a CSPRNG with `--secure-noise`)
    /// and the accountant, which only the engine advances (`PrivacyEngine::privatize`).
    pub(crate) privacy: Option<PrivacyEngine>,
    /// An audit's white-box canaries (`privacy::canary`, `dpcomp audit`), set after `new`.
    pub(crate) canaries: Option<crate::privacy::canary::GradientCanaries>,
    /// This process's exclusive hold on `run_dir` (see `run_lock`); `None` on the ranks other
    /// than 0 of a data-parallel run, which write nothing there.
    _lock: Option<RunLock>,
}

impl Trainer {
    /// A fresh run in `run_dir`, which must not hold another run's checkpoint. Writes
    /// `config.toml` before anything else.
    pub fn new(config: TrainConfig, run_dir: &Path) -> Result<Self> {
        Self::start(config, run_dir, None, None, None)
    }

    pub(crate) fn start(
        mut config: TrainConfig,
        run_dir: &Path,
        own: Option<OwnTask>,
        edit: Option<DataEdit>,
        comm: Option<Box<dyn Communicator>>,
    ) -> Result<Self> {
        config.validate()?;
        // Record the data folder this run reads, resolved ($DPCOMP_DATA or data/) and
        // absolute, so `eval`, `resume` and analyses find it later from anywhere.
        // (A run of one's own reads no data folder.)
        if own.is_none() {
            let data = crate::data::data_dir(config.data.data_dir.as_deref());
            config.data.data_dir = Some(std::path::absolute(&data).unwrap_or(data));
        }
        if comm.as_ref().is_some_and(|c| c.rank() > 0) {
            // Rank 0 alone touches the run folder.
            return Self::build(config, run_dir, None, own, edit, comm)
                .and_then(|t| t.checked_by_workers(""));
        }
        if checkpoint::find(run_dir).is_some() {
            return Err(Error::bad_value(
                "run_dir",
                format!(
                    "{} already holds a run; resume it (`resume`) or choose another run folder",
                    run_dir.display()
                ),
            ));
        }
        // Only a new or empty folder, or a dpcomp run folder, may hold a fresh run: a folder of
        // the user's is refused before anything is written (`run_folder`).
        crate::run_folder::check_fresh(run_dir)?;
        let created = !run_dir.exists();
        let lock = RunLock::acquire(run_dir)?;
        // Logs of an earlier start that left no checkpoint (a killed first epoch, or a cell
        // committed before it finished) belong to no run: start them afresh.
        let mut fresh = match crate::run_folder::FreshStart::claim(
            run_dir,
            created,
            &[
                "metrics.jsonl",
                "upstream.csv",
                "summary.json",
                "traffic.csv",
            ],
        ) {
            Ok(fresh) => fresh,
            Err(e) => {
                drop(lock);
                if created {
                    let _ = std::fs::remove_dir(run_dir);
                }
                return Err(e);
            }
        };
        let config_path = run_dir.join("config.toml");
        fresh.wrote("config.toml");
        let built = std::fs::write(&config_path, config.to_toml())
            .map_err(|e| Error::io(&config_path, e))
            .and_then(|()| Self::build(config.clone(), run_dir, Some(lock), own, edit, comm))
            .and_then(|t| t.checked_by_workers(""))
            .and_then(|t| {
                // A σ calibrated from the target ε is part of the run's settings: a resume
                // reads it back rather than calibrating again.
                if t.config != config {
                    crate::run_folder::replace(&config_path, t.config.to_toml().as_bytes())?;
                }
                Ok(t)
            });
        match built {
            Ok(trainer) => Ok(trainer),
            Err(e) => {
                // A start that failed before training (missing data, a bad option) leaves
                // nothing behind but what was there before it.
                fresh.undo();
                Err(e)
            }
        }
    }

    /// Continues the run in `run_dir` from its last checkpoint. `epochs`, when given, replaces
    /// the saved epoch count (to extend a finished run).
    pub fn resume(run_dir: &Path, epochs: Option<usize>) -> Result<Self> {
        let changes = TrainOverrides {
            epochs,
            ..TrainOverrides::default()
        };
        Self::continue_run(run_dir, changes, None, None)
    }

    pub(crate) fn continue_run(
        run_dir: &Path,
        overrides: TrainOverrides,
        own: Option<OwnTask>,
        comm: Option<Box<dyn Communicator>>,
    ) -> Result<Self> {
        let writes = comm.as_ref().is_none_or(|c| c.rank() == 0);
        let workers = comm.as_ref().map_or(1, |c| c.size());
        if !run_dir.is_dir() {
            // Checked before the lock, which would create a mistyped folder.
            return Err(Error::bad_value(
                "run_dir",
                format!(
                    "{}: no such folder; expected the folder of a run to continue",
                    run_dir.display()
                ),
            ));
        }
        let lock = if writes {
            Some(RunLock::acquire(run_dir)?)
        } else {
            None
        };
        let config_path = run_dir.join("config.toml");
        let saved = TrainConfig::from_toml_file(&config_path)?;
        let mut config = saved.clone();
        overrides.apply(&mut config);
        let conflicts: Vec<SettingConflict> = saved
            .differences(&config)
            .into_iter()
            .filter(|(field, _, _)| !RESUME_MAY_CHANGE.contains(&field.as_str()))
            .map(|(field, saved, given)| SettingConflict {
                field,
                saved,
                given,
            })
            .collect();
        if !conflicts.is_empty() {
            return Err(Error::ResumeConflict {
                run_dir: run_dir.to_path_buf(),
                may_change: RESUME_MAY_CHANGE.iter().map(|f| f.to_string()).collect(),
                conflicts,
            });
        }
        config.validate()?;
        let dir = checkpoint::open(run_dir)?;
        let state = checkpoint::read_state(&dir)?;
        if config.epochs < state.epochs_done {
            return Err(Error::bad_value(
                "epochs",
                format!(
                    "{}: {} has already trained {} epochs; give at least that many",
                    config.epochs,
                    run_dir.display(),
                    state.epochs_done
                ),
            ));
        }
        if state.workers.unwrap_or(1) != workers {
            return Err(Error::bad_value(
                "workers",
                format!(
                    "{workers}, but {} was trained by {} worker(s): resume it with as many (each holds its own compressor state and data shard)",
                    run_dir.display(),
                    state.workers.unwrap_or(1)
                ),
            ));
        }
        let mut trainer = Self::build(config, run_dir, lock, own, None, comm)?;
        trainer.check_accountant(&state, &dir)?;
        if let (Some(engine), Some(accountant)) =
            (trainer.privacy.as_mut(), state.accountant.clone())
        {
            engine
                .resume(accountant, state.clip_radius)
                .map_err(|e| Error::bad_file(dir.join("state.json"), e.to_string()))?;
        }
        checkpoint::load_weights(trainer.model.var_store(), &dir.join("model.safetensors"))?;
        let optimizer_state = checkpoint::read_momentum(&dir)?;
        let optimizer_path = dir.join("optimizer.safetensors");
        trainer
            .updater
            .optimizer
            .load_state(&trainer.params, &optimizer_state, &optimizer_path)?;
        let compressor_state = checkpoint::read_compressor(&dir)?;
        let rank = trainer.rank();
        if let Some(exchange) = trainer.updater.exchange.as_mut() {
            distributed::load_compressor_checkpoint(
                compressor_state,
                rank,
                trainer.updater.compressor.encoder.as_mut(),
                &mut exchange.decoders,
            )
            .map_err(|e| Error::bad_file(dir.join("compressor.safetensors"), e.to_string()))?;
        } else if !trainer.updater.compressor.state().is_empty() {
            trainer
                .updater
                .compressor
                .load_state(compressor_state)
                .map_err(|e| Error::bad_file(dir.join("compressor.safetensors"), e.to_string()))?;
        }
        // The same data as the run trained on (the data folder may move, its files may not
        // change): a checkpoint made before fingerprints were recorded is not checked.
        let data_now = trainer.state.data.take();
        if let (Some(saved), Some(now)) = (&state.data, &data_now) {
            if saved != now {
                return Err(Error::bad_value(
                    "data.data_dir",
                    format!(
                        "{}: holds other data than {} was trained on (the checkpoint's splits: {saved}; now: {now}); resume with the run's data",
                        crate::data::data_dir(trainer.config.data.data_dir.as_deref()).display(),
                        run_dir.display()
                    ),
                ));
            }
        }
        // The accountant now lives in the engine alone; the state's copy is written at each save.
        trainer.state = TrainState {
            accountant: None,
            data: data_now,
            ..state
        };
        let metrics_path = run_dir.join("metrics.jsonl");
        trainer.history = if writes {
            metrics::read_and_truncate(&metrics_path, trainer.state.epochs_done)?
        } else {
            metrics::read_first(&metrics_path, trainer.state.epochs_done)?
        };
        if trainer.history.len() != trainer.state.epochs_done {
            // Past epochs' test accuracies cannot be rebuilt (their weights are gone), and a
            // summary over fewer rows than it claims would be wrong: refuse.
            return Err(Error::bad_file(
                &metrics_path,
                format!(
                    "{} rows for the {} epochs the checkpoint has trained; restore the file or start the run again",
                    trainer.history.len(),
                    trainer.state.epochs_done
                ),
            ));
        }
        let state_json = serde_json::to_string(&trainer.state).expect("state serialises");
        let trainer = trainer.checked_by_workers(&state_json)?;
        if !writes {
            return Ok(trainer);
        }
        if workers > 1 {
            metrics::truncate_upstream(&run_dir.join("traffic.csv"), trainer.state.steps_done)?;
        }
        let upstream_path = run_dir.join("upstream.csv");
        let upstream_rows = metrics::truncate_upstream(&upstream_path, trainer.state.steps_done)?;
        if upstream_rows != trainer.state.steps_done {
            return Err(Error::bad_file(
                &upstream_path,
                format!(
                    "{upstream_rows} rows for the {} steps the checkpoint has taken; restore the file or start the run again",
                    trainer.state.steps_done
                ),
            ));
        }
        gradient_error::truncate(run_dir, trainer.state.epochs_done)?;
        if trainer.config != saved {
            crate::run_folder::replace(&config_path, trainer.config.to_toml().as_bytes())?;
        }
        Ok(trainer)
    }

    /// The privacy invariant across a resume: a private run's checkpoint holds one accounted
    /// step per step taken, every one at this run's σ and sampling rate; a non-private run's
    /// holds none. Anything else (a null, shortened or edited history) would restart or
    /// under-count ε, so the resume is refused.
    fn check_accountant(&self, state: &TrainState, dir: &Path) -> Result<()> {
        let path = dir.join("state.json");
        match (&state.accountant, self.config.privacy.noise_multiplier) {
            (None, None) => Ok(()),
            (Some(a), None) if a.history.is_empty() => Ok(()),
            (Some(_), None) => Err(Error::bad_file(
                &path,
                "holds an accountant's history but the run is not private",
            )),
            (None, Some(_)) if state.steps_done == 0 => Ok(()),
            (None, Some(_)) => Err(Error::bad_file(
                &path,
                format!(
                    "no accountant history for a private run that has taken {} steps: its ε cannot be continued",
                    state.steps_done
                ),
            )),
            (Some(a), Some(_)) => {
                if a.steps() != state.steps_done {
                    return Err(Error::bad_file(
                        &path,
                        format!(
                            "the accountant has {} steps but the run has taken {}: ε would be under-counted",
                            a.steps(),
                            state.steps_done
                        ),
                    ));
                }
                // Each block's (σ, q) is checked by `PrivacyEngine::resume`.
                Ok(())
            }
        }
    }

    /// With W > 1 workers: every rank checks that all share the configuration, the data, the
    /// weights and `state` (the checkpoint's, when resuming), `distributed::check_workers_agree`.
    fn checked_by_workers(mut self, state: &str) -> Result<Self> {
        let Some(exchange) = self.updater.exchange.as_mut() else {
            return Ok(self);
        };
        distributed::check_workers_agree(
            exchange.comm.as_mut(),
            &self.config,
            &self.data,
            &self.params,
            state,
        )?;
        Ok(self)
    }

    /// This worker's rank (0 without workers).
    pub fn rank(&self) -> usize {
        self.updater.exchange.as_ref().map_or(0, |x| x.comm.rank())
    }

    /// W, the number of data-parallel workers (1 without).
    pub fn workers(&self) -> usize {
        self.updater.exchange.as_ref().map_or(1, Exchange::workers)
    }

    /// Whether this process writes the run folder (rank 0).
    fn writes(&self) -> bool {
        self.rank() == 0
    }

    fn build(
        mut config: TrainConfig,
        run_dir: &Path,
        lock: Option<RunLock>,
        own: Option<OwnTask>,
        edit: Option<DataEdit>,
        comm: Option<Box<dyn Communicator>>,
    ) -> Result<Self> {
        for warning in config.warnings() {
            log::warn!("{warning}");
        }
        let (device, data, model) = match (own, &config.task) {
            (None, _) => tasks::prepare_edited(&config, edit)?,
            (Some(OwnTask { model, data }), TaskName::Own(_)) => {
                let device = config.device.device()?;
                tasks::check_data(model.as_ref(), &data, data.classes.len() as i64)?;
                if let Some((name, p)) = model
                    .trainable_variables()
                    .into_iter()
                    .find(|(_, p)| p.device() != device)
                {
                    return Err(Error::bad_value(
                        "device",
                        format!("{device:?}, but the model's parameter {name} is on {:?}: build the model on the run's device", p.device()),
                    ));
                }
                // `data.limit_train` / `limit_test` apply to data of one's own as to a task's.
                let mut data = data;
                if let Some(n) = config.data.limit_train {
                    data.train = data.train.truncate(n as i64);
                }
                if let Some(n) = config.data.limit_test {
                    data.test = data.test.truncate(n as i64);
                }
                (device, tasks::hold_on_device(data, device), model)
            }
            (Some(_), TaskName::Builtin(task)) => {
                return Err(Error::bad_value(
                    "task",
                    format!("{task} is a built-in task, but a model was given: name a task of one's own (`TrainConfig::own`)"),
                ))
            }
        };
        let params = model.trainable_variables();
        if params.is_empty() {
            return Err(Error::bad_value(
                "model",
                "has no trainable variable: nothing to train (build its layers on the model's VarStore with gradients enabled)",
            ));
        }
        // An empty split would train on nothing or report a NaN accuracy with exit 0 (and a
        // sampling rate of infinity under DP): refused before training.
        for (split, d) in [("training", &data.train), ("test", &data.test)] {
            if d.is_empty() {
                let source = match &config.task {
                    TaskName::Builtin(task) => format!(
                        "{task}'s data in {}",
                        crate::data::data_dir(config.data.data_dir.as_deref()).display()
                    ),
                    TaskName::Own(_) => "the data given with the model".to_string(),
                };
                return Err(Error::bad_value(
                    "data",
                    format!("the {split} split of {source} has no examples (check its files: a names folder needs names in more than one example per split, an SNLI file labelled pairs other than \"-\"); expected at least one"),
                ));
            }
        }
        let shapes: Vec<Vec<i64>> = params.iter().map(|(_, p)| p.size()).collect();
        let compressor = config.compressor_spec()?.link(&shapes, device)?;
        let optimizer: Box<dyn Optimizer> = match config.optimizer.kind {
            OptimizerKind::Sgd => {
                Box::new(Sgd::new(config.optimizer.lr, config.optimizer.momentum))
            }
            OptimizerKind::Adam => Box::new(Adam::new(
                config.optimizer.lr,
                config.optimizer.adam_beta1,
                config.optimizer.adam_beta2,
                config.optimizer.adam_eps,
            )),
        };
        if let Some(sigma) = calibrated_sigma(&config, data.train.len())? {
            config.privacy.noise_multiplier = Some(sigma);
            config.validate()?;
        }
        let privacy = match config.privacy.noise_multiplier {
            Some(sigma) => {
                let steps_per_epoch =
                    steps_per_epoch_of(data.train.len(), config.optimizer.batch_size);
                let noise = if config.privacy.secure_noise {
                    NoiseSource::secure()
                } else {
                    NoiseSource::Seeded
                };
                let clipping = match config.privacy.clipping {
                    ClippingMode::Flat => Clipping::Flat {
                        max_norm: config.privacy.max_grad_norm,
                    },
                    ClippingMode::PerLayer => {
                        Clipping::per_layer_even(config.privacy.max_grad_norm, params.len())
                    }
                    ClippingMode::Adaptive => {
                        let expected_batch = data.train.len() as f64 / steps_per_epoch as f64;
                        Clipping::Adaptive(AdaptiveClipping {
                            radius: config.privacy.max_grad_norm,
                            target_quantile: config.privacy.target_quantile,
                            learning_rate: config.privacy.clip_learning_rate,
                            count_noise: config.privacy.count_noise.unwrap_or_else(|| {
                                AdaptiveClipping::default_count_noise(expected_batch)
                            }),
                        })
                    }
                };
                let q = 1.0 / steps_per_epoch as f64;
                let engine = PrivacyEngine::builder()
                    .noise_multiplier(sigma)
                    .sample_rate(q)
                    .expected_batch_size(data.train.len() as f64 / steps_per_epoch as f64)
                    .delta(config.privacy.delta)
                    .accountant(config.privacy.accountant)
                    .clipping(clipping)
                    .noise_source(noise)
                    .build(&params)?;
                Some(engine)
            }
            None => None,
        };
        let mut updater = Updater::new(optimizer, compressor);
        updater.clip_noised = config.compression.clip_noised;
        let mut privacy = privacy;
        if let Some(comm) = comm.filter(|c| c.size() > 1) {
            let workers = comm.size();
            if let Some(c2) = config.compression.clip_noised {
                return Err(Error::bad_value(
                    "compression.clip_noised",
                    format!("{c2} with {workers} workers: each worker's update carries only its share of the noise, so clipping it before the exchange would not be post-processing of a private value; run it with one worker"),
                ));
            }
            if !config.analysis.grad_error_epochs.is_empty() {
                return Err(Error::bad_value(
                    "analysis.grad_error_epochs",
                    format!("{:?} with {workers} workers: the gradient-error analysis measures one worker's pipeline; run it with one", config.analysis.grad_error_epochs),
                ));
            }
            if let Some(engine) = privacy.as_mut() {
                if matches!(config.privacy.clipping, ClippingMode::Adaptive) {
                    return Err(Error::bad_value(
                        "privacy.clipping",
                        format!("adaptive with {workers} workers: its noisy unclipped count would need every rank's count added first, which is not supported; use flat or per-layer clipping"),
                    ));
                }
                // Each rank's share of the noise: σ²C²/W (the sum has the single-process σC),
                // or with --local-noise the whole σ²C² (each message private on its own).
                // Sharing is sound only when the update depends on the ranks' noised sums
                // through their total: a gathered compressor decodes each rank's message on
                // its own, so the released weights would be private only at σ/√W.
                let kind = config.compression.kind;
                if !config.privacy.local_noise && !kind.exchanged_by_sum() {
                    return Err(Error::bad_value(
                        "privacy.local_noise",
                        format!("false with {workers} workers and the {kind} compressor: its messages are gathered and each worker's is decoded on its own, so the weights depend on every worker's message, not only on their sum; with the noise shared among the workers (σ/√W each) they would be private only at σ/√{workers}. Give every worker the whole noise (local_noise = true, `--local-noise`; ε is then each worker's, as reported), or use a compressor whose exchange sums the workers' messages (identity, powersgd, fl-rnd, fl-freq, fl-cs)"),
                    ));
                }
                engine.share_noise_among(if config.privacy.local_noise {
                    1
                } else {
                    workers
                })?;
            }
            let spec = config.compressor_spec()?;
            let decoders = (0..workers)
                .map(|_| spec.decoder(&shapes, device))
                .collect::<Result<Vec<_>>>()?;
            updater.exchange = Some(Exchange::new(comm, decoders));
        }
        let data_print = distributed::data_fingerprint(&data);
        Ok(Trainer {
            updater,
            config,
            device,
            data,
            model,
            params,
            run_dir: run_dir.to_path_buf(),
            state: TrainState {
                data: Some(data_print),
                ..TrainState::default()
            },
            history: Vec::new(),
            observer: None,
            privacy,
            canaries: None,
            _lock: lock,
        })
    }

    /// The accountant of a private run (`None` without privacy).
    pub fn accountant(&self) -> Option<&Accountant> {
        self.privacy.as_ref().map(PrivacyEngine::accountant)
    }

    /// "seeded" or "secure" under DP.
    pub fn noise_label(&self) -> Option<String> {
        self.privacy.as_ref().map(|e| e.noise_label().to_string())
    }

    /// Sampling rate q of one DP step: 1 / (steps per epoch), as Opacus sets it.
    pub fn sample_rate(&self) -> f64 {
        1.0 / self.steps_per_epoch() as f64
    }

    pub fn steps_per_epoch(&self) -> i64 {
        steps_per_epoch_of(self.data.train.len(), self.config.optimizer.batch_size)
    }

    /// The run's settings (with a σ calibrated from a target ε filled in).
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The measurements taken during training (`[analysis]`): the one part of the settings a
    /// caller may change on a built trainer, since it changes no step and no privacy setting.
    pub fn analysis_settings_mut(&mut self) -> &mut crate::config::AnalysisSettings {
        &mut self.config.analysis
    }

    /// Where the model and the steps run.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The training and test splits, on the device.
    pub fn data(&self) -> &TaskData {
        &self.data
    }

    /// The model being trained.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// The trainable variables, sorted by name (what the optimiser updates).
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The run folder.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Epochs and steps done, traffic so far, why the run stopped (what a checkpoint holds).
    pub fn state(&self) -> &TrainState {
        &self.state
    }

    /// Every epoch's metrics row so far (`metrics.jsonl`), a resumed run's earlier ones first.
    pub fn history(&self) -> &[EpochMetrics] {
        &self.history
    }

    /// The privacy engine (σ, q, clipping, the accountant); `None` without DP.
    pub fn privacy(&self) -> Option<&PrivacyEngine> {
        self.privacy.as_ref()
    }

    /// The compressor and optimiser each step's gradient goes through.
    pub fn updater(&self) -> &Updater {
        &self.updater
    }

    /// Installs `observer`: it hears of every epoch's start and end, every step, the running
    /// totals every `Observer::interval` steps, and why a run stopped early. Replaces the
    /// observer installed before; `None` by default (a silent run).
    pub fn observe(&mut self, observer: Box<dyn observer::Observer>) {
        self.observer = Some(observer);
    }

    /// Removes the observer, so the run is silent again.
    pub fn silence(&mut self) {
        self.observer = None;
    }

    /// ε spent so far with the configured accountant; `None` without privacy.
    pub fn epsilon(&self) -> Result<Option<f64>> {
        match &self.privacy {
            Some(engine) => Ok(Some(engine.epsilon()?)),
            None => Ok(None),
        }
    }

    /// How many more DP steps the --target-epsilon budget allows (ε is monotone in the number
    /// of steps, so one bisection at the start of `run` replaces a check before every step).
    fn steps_within_budget(&self) -> Result<Option<u64>> {
        let (Some(target), Some(engine)) = (self.config.privacy.target_epsilon, &self.privacy)
        else {
            return Ok(None);
        };
        let (sigma, accountant) = (engine.noise_multiplier(), engine.accountant());
        let q = self.sample_rate();
        let fits = |extra: u64| -> Result<bool> {
            if extra == 0 {
                return Ok(accountant
                    .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                    .0
                    <= target);
            }
            let mut next = accountant.clone();
            next.step(sigma, q, extra)?;
            Ok(next
                .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                .0
                <= target)
        };
        let remaining = ((self.config.epochs - self.state.epochs_done) as u64)
            .checked_mul(self.steps_per_epoch() as u64)
            .ok_or_else(|| {
                Error::bad_value(
                    "epochs",
                    format!(
                        "{}: at {} steps an epoch that is more steps than a run can count (2^64)",
                        self.config.epochs,
                        self.steps_per_epoch()
                    ),
                )
            })?;
        if fits(remaining)? {
            return Ok(Some(remaining));
        }
        if !fits(0)? {
            return Ok(Some(0));
        }
        let (mut lo, mut hi) = (0u64, remaining); // fits(lo), !fits(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Some(lo))
    }

    fn budget_message(&self) -> Result<String> {
        let target = self.config.privacy.target_epsilon.unwrap_or(f64::NAN);
        let sigma = self.config.privacy.noise_multiplier.unwrap_or(0.0);
        let accountant = self.accountant().cloned().unwrap_or_default();
        let mut next = accountant.clone();
        next.step(sigma, self.sample_rate(), 1)?;
        let eps = next
            .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
            .0;
        Ok(format!(
            "stopped after {} steps: one more step would spend epsilon {eps:.4} > target {target} (delta {})",
            accountant.steps(),
            self.config.privacy.delta
        ))
    }

    /// ε for the progress bar: live, or as of the last epoch's end.
    fn epsilon_shown(&self, live: bool) -> Result<Option<f64>> {
        if live {
            self.epsilon()
        } else {
            Ok(self
                .history
                .last()
                .and_then(|m| m.epsilon)
                .or(self.config.private().then_some(0.0)))
        }
    }

    /// Measures the gradient error at the current weights and compressor state on the fixed
    /// batches (`analysis::gradient_error`; batches of the expected batch size, σ and C of the
    /// run, a fresh copy of the compressor state), labelled with the epochs done so far.
    pub fn measure_gradient_error(&self) -> Result<gradient_error::GradientErrorRecord> {
        let n = self.data.train.len();
        let batch_size =
            if self.config.private() && self.config.privacy.sampling == Sampling::Poisson {
                (self.sample_rate() * n as f64).round().max(1.0) as usize
            } else {
                self.config.optimizer.batch_size
            };
        let batches = fixed_batches(n, batch_size, self.config.analysis.grad_error_batches);
        let max_norm = self.config.privacy.max_grad_norm;
        let mechanism = match self.config.privacy.noise_multiplier {
            Some(noise_multiplier) => gradient_error::Mechanism::PerSample {
                noise_multiplier,
                max_norm,
            },
            None => gradient_error::Mechanism::GlobalClip { max_norm },
        };
        let spec = self.config.compressor_spec()?;
        let shapes: Vec<Vec<i64>> = self.params.iter().map(|(_, p)| p.size()).collect();
        let source = gradient_error::CompressorSource {
            spec: &spec,
            shapes: &shapes,
            state: self.updater.compressor.state(),
            epoch: self.state.epochs_done,
            device: self.device,
        };
        let measured = gradient_error::measure(
            self.model.as_ref(),
            &self.params,
            &self.data.train,
            self.device,
            mechanism,
            &source,
            &batches,
            self.config.analysis.grad_error_draws,
        )?;
        Ok(gradient_error::GradientErrorRecord {
            epoch: self.state.epochs_done,
            steps: self.state.steps_done,
            noise_multiplier: self.config.privacy.noise_multiplier.unwrap_or(0.0),
            max_norm,
            batch_size: measured.batch_size,
            batches: batches.len(),
            draws: self.config.analysis.grad_error_draws,
            parameters: measured.parameters,
            median_norm: measured.median_norm,
            mean_gradient_norm: measured.mean_gradient_norm,
            compressor: spec.label(),
            stages: measured.stages,
        })
    }

    /// Measures and logs the gradient error when the configuration asks for it after
    /// `epochs_done` epochs.
    fn gradient_error_if_due(&self) -> Result<()> {
        if self
            .config
            .analysis
            .grad_error_epochs
            .contains(&self.state.epochs_done)
        {
            let record = self.measure_gradient_error()?;
            gradient_error::append(&self.run_dir, &record)?;
        }
        Ok(())
    }

    /// The DP-SGD settings of a step on `batch_len` examples; `None` without privacy. Under
    /// Poisson sampling the clipped sum is divided by the expected batch q N, never by the
    /// realised size: dividing by a size that depends on who was sampled would leak it (Opacus's
    /// `expected_batch_size`). Under shuffling the batch size is fixed, so it is the divisor.
    ///
    /// With W workers `batch_len` is the logical batch over all of them and the divisor is E[B]
    /// / W: each worker's gradient W (its clipped sum + its noise) / E[B] is an unbiased estimate
    /// of the whole noisy gradient, and the mean of the W is exactly (Σ clipped + Σ noise) / E[B].
    pub fn dp_settings(&self, batch_len: i64) -> Option<DpSettings> {
        self.privacy.as_ref()?;
        let expected_batch = match self.config.privacy.sampling {
            Sampling::Poisson => self.sample_rate() * self.data.train.len() as f64,
            Sampling::Shuffle => batch_len as f64,
        };
        Some(DpSettings {
            expected_batch: expected_batch / self.workers() as f64,
            physical_batch: self.config.privacy.physical_batch_size.map(|p| p as i64),
            mode: self.config.privacy.grad_sample,
        })
    }

    /// Epoch `epoch`'s batches: Poisson-sampled under DP (unless --sampling shuffle), else
    /// shuffled. Seeds LibTorch's generator first, which the epoch's augmentation and dropout
    /// then continue: from `seed` and the epoch (reproducible, and a resumed run draws what the
    /// uninterrupted one drew), or with `--secure-noise` from the operating system, because
    /// amplification by subsampling assumes no one can regenerate the batches.
    ///
    /// With W workers these are this rank's batches (rank 0 of one worker draws exactly the
    /// above): Poisson over its shard (examples ≡ rank mod W) at the global rate, from a stream
    /// of its own (`distributed::worker_seed`); shuffled, every rank draws the same permutation
    /// (from the run's seed, or under `--secure-noise` from `shuffle_seed`, rank 0's draw) and
    /// takes every W-th example of each batch from position `rank`, then reseeds its own stream.
    pub fn epoch_batches(&self, epoch: usize) -> Vec<Tensor> {
        self.worker_batches(epoch, None)
    }

    fn worker_batches(&self, epoch: usize, shuffle_seed: Option<i64>) -> Vec<Tensor> {
        let (rank, workers) = (self.rank(), self.workers());
        let seed_of = |rank: usize| {
            if self.config.privacy.secure_noise {
                crate::privacy::noise::os_seed()
            } else {
                epoch_seed(distributed::worker_seed(self.config.seed, rank), epoch)
            }
        };
        let n = self.data.train.len();
        if self.config.private() && self.config.privacy.sampling == Sampling::Poisson {
            tch::manual_seed(seed_of(rank));
            let steps = self.steps_per_epoch() as usize;
            return sampler::shard_poisson_batches(
                n,
                rank as i64,
                workers as i64,
                self.sample_rate(),
                steps,
            );
        }
        tch::manual_seed(shuffle_seed.unwrap_or_else(|| seed_of(0)));
        let batches = sampler::shuffled_batches(n, self.config.optimizer.batch_size as i64);
        if workers == 1 {
            return batches;
        }
        tch::manual_seed(seed_of(rank));
        batches
            .iter()
            .map(|b| b.slice(0, rank as i64, None, workers as i64).contiguous())
            .collect()
    }

    /// The size of step `step`'s logical batch over all workers under shuffling (the last batch
    /// of an epoch is shorter).
    fn shuffled_batch_len(&self, step: usize) -> i64 {
        let (n, b) = (
            self.data.train.len(),
            self.config.optimizer.batch_size as i64,
        );
        b.min(n - step as i64 * b)
    }

    /// Trains the remaining epochs, evaluating and checkpointing after each. Under DP every
    /// step is accounted, and training stops before a step that would exceed --target-epsilon.
    pub fn run(&mut self) -> Result<Summary> {
        let q = self.sample_rate();
        let mut budget = self.steps_within_budget()?;
        if budget == Some(0) && self.state.steps_done == 0 {
            // Not even one step fits the target: refuse rather than "finish" a run that never
            // trained (σ = 0 lands here too: its ε is infinite).
            let sigma = self.config.privacy.noise_multiplier.unwrap_or(0.0);
            let mut one = Accountant::default();
            one.step(sigma, q, 1)?;
            let eps = one
                .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                .0;
            return Err(Error::bad_value(
                "privacy.target_epsilon",
                format!(
                    "{}: a single step at noise multiplier {sigma} and sampling rate {q:.6} already spends epsilon {eps:.4} (delta {}); raise the target or the noise multiplier",
                    self.config.privacy.target_epsilon.unwrap_or(f64::NAN),
                    self.config.privacy.delta
                ),
            ));
        }
        if self.state.epochs_done == 0 && self.state.steps_done == 0 {
            gradient_error::truncate(&self.run_dir, 0)?;
            if gradient_error::read(&self.run_dir)?.is_empty() {
                self.gradient_error_if_due()?;
            }
        }
        while self.state.epochs_done < self.config.epochs && self.state.stopped.is_none() {
            let epoch = self.state.epochs_done;
            let started = Instant::now();
            self.updater.start_epoch(epoch);
            let shuffle_seed = self.shared_shuffle_seed()?;
            let batches = self.worker_batches(epoch, shuffle_seed);
            let mut traffic: Vec<distributed::TrafficRow> = Vec::new();
            let mut upstream: Vec<metrics::UpstreamRow> = Vec::with_capacity(batches.len());
            if let Some(o) = self.observer.as_mut() {
                o.epoch_started(epoch, self.config.epochs, batches.len());
            }
            let interval = self.observer.as_ref().map_or(0, |o| o.interval());
            let mut loss_sum = Tensor::zeros([], (Kind::Float, self.device));
            let mut correct = Tensor::zeros([], (Kind::Int64, self.device));
            let mut clipped = Tensor::zeros([], (Kind::Int64, self.device));
            let mut seen = 0i64;
            let mut steps_this_epoch = 0usize;
            for (step, index) in batches.iter().enumerate() {
                if budget == Some(0) {
                    self.state.stopped = Some(self.budget_message()?);
                    break;
                }
                steps_this_epoch += 1;
                budget = budget.map(|b| b - 1);
                let step_started = Instant::now();
                let logical_len = if self.workers() > 1 {
                    self.shuffled_batch_len(step)
                } else {
                    index.size()[0]
                };
                if let Some(settings) = self.dp_settings(logical_len) {
                    let totals = dp_step(
                        self.model.as_ref(),
                        &self.params,
                        &mut self.updater,
                        &self.data.train,
                        index,
                        self.device,
                        &settings,
                        self.privacy.as_mut().expect("a private step has an engine"),
                        self.canaries.as_mut(),
                    )?;
                    loss_sum += totals.loss_sum.to_kind(Kind::Float);
                    correct += totals.correct;
                    clipped += totals.clipped;
                } else {
                    let share = index.size()[0];
                    let (loss, right) = if share == 0 {
                        empty_share_step(&self.params, &mut self.updater, self.device)?
                    } else {
                        let batch = self.data.train.batch(index, self.device, true);
                        let share_weight =
                            self.workers() as f64 * share as f64 / logical_len as f64;
                        train_step_share(
                            self.model.as_ref(),
                            &self.params,
                            &mut self.updater,
                            &batch,
                            self.config.privacy.max_grad_norm,
                            share_weight,
                        )?
                    };
                    loss_sum += loss;
                    correct += right;
                }
                seen += index.size()[0];
                self.state.steps_done += 1;
                if self.workers() > 1 {
                    let cost = self.updater.last_traffic;
                    let exchange = cost.encode_seconds + cost.comm_seconds + cost.decode_seconds;
                    traffic.push(distributed::TrafficRow {
                        step: self.state.steps_done,
                        rank: self.rank(),
                        compute_seconds: (step_started.elapsed().as_secs_f64() - exchange).max(0.0),
                        cost,
                    });
                }
                self.state.upstream_bits += self.updater.last_bits;
                self.state.upstream_paper_bits += self.updater.last_paper_bits;
                upstream.push((
                    self.state.steps_done,
                    epoch + 1,
                    self.updater.last_bits,
                    self.updater.last_paper_bits,
                ));
                if let Some(o) = self.observer.as_mut() {
                    o.step_finished(epoch, step);
                }
                if interval > 0 && step % interval == interval - 1 {
                    // RDP is cheap enough to show live; the PLD's FFTs run once per epoch.
                    let live = self.config.privacy.accountant == crate::config::AccountantKind::Rdp;
                    let shown = seen.max(1) as f64;
                    let progress = observer::LiveProgress {
                        epoch,
                        step,
                        loss: loss_sum.double_value(&[]) / shown,
                        accuracy: correct.int64_value(&[]) as f64 / shown,
                        epsilon: self.epsilon_shown(live)?,
                        epsilon_is_live: live,
                        upstream_gigabits: self.state.upstream_bits as f64 / 1e9,
                        examples_per_second: shown / started.elapsed().as_secs_f64(),
                    };
                    if let Some(o) = self.observer.as_mut() {
                        o.progress(&progress);
                    }
                }
            }
            if steps_this_epoch == 0 {
                // The budget ran out exactly at the end of the previous epoch: nothing was
                // trained, so there is no epoch to evaluate or log (and no zero-loss row).
                self.save_checkpoint()?;
                break;
            }
            let train_seconds = started.elapsed().as_secs_f64();
            let mut epoch_traffic = None;
            let (mut loss_sum, mut correct, mut clipped) = (
                loss_sum.double_value(&[]),
                correct.int64_value(&[]) as f64,
                clipped.int64_value(&[]) as f64,
            );
            if let Some(exchange) = self.updater.exchange.as_mut() {
                // The epoch's totals over all workers, the same on every rank.
                let control = exchange.take_control();
                let comm = exchange.comm.as_mut();
                let totals = distributed::sum_over_workers(
                    comm,
                    &[
                        loss_sum,
                        correct,
                        clipped,
                        seen as f64,
                        (control.sent + control.received) as f64,
                    ],
                )?;
                (loss_sum, correct, clipped, seen) =
                    (totals[0], totals[1], totals[2], totals[3] as i64);
                let rows = distributed::gather_traffic(comm, &traffic)?;
                epoch_traffic = Some(distributed::EpochTraffic::of(
                    comm.size(),
                    &rows,
                    totals[4] as u64,
                ));
                traffic = rows;
            }
            let (test_loss, test_accuracy) = self.evaluate_on_workers()?;
            let epoch_seconds = started.elapsed().as_secs_f64();
            self.state.epochs_done += 1;
            self.state.wall_seconds += epoch_seconds;
            let per_example = |total: &f64| total / seen.max(1) as f64;
            let m = EpochMetrics {
                epoch: epoch + 1,
                steps: self.state.steps_done,
                train_loss: per_example(&loss_sum),
                train_accuracy: per_example(&correct),
                test_loss,
                test_accuracy,
                examples_per_second: seen as f64 / train_seconds,
                epoch_seconds,
                wall_seconds: self.state.wall_seconds,
                epsilon: self.epsilon()?,
                clipped_fraction: self.config.private().then(|| per_example(&clipped)),
                noise: self.noise_label(),
                clip_radius: self.privacy.as_ref().and_then(PrivacyEngine::clip_radius),
                upstream_bits: upstream.iter().map(|r| r.2).sum(),
                upstream_gigabits: self.state.upstream_bits as f64 / 1e9,
                upstream_paper_gib: paper_gib(self.state.upstream_paper_bits),
                workers: epoch_traffic,
            };
            if let Some(o) = self.observer.as_mut() {
                o.epoch_finished(&m);
            }
            let diverged = !m.train_loss.is_finite();
            if self.writes() {
                metrics::append(&self.run_dir.join("metrics.jsonl"), &m)?;
                metrics::append_upstream(&self.run_dir.join("upstream.csv"), &upstream)?;
                if !traffic.is_empty() {
                    distributed::append_traffic(&self.run_dir.join("traffic.csv"), &traffic)?;
                }
            }
            self.history.push(m);
            if diverged {
                // Every later epoch would train a NaN model: stop, and say where.
                self.state.stopped = Some(format!(
                    "{DIVERGED}: non-finite training loss in epoch {} (step {})",
                    epoch + 1,
                    self.state.steps_done
                ));
            }
            self.gradient_error_if_due()?;
            self.save_checkpoint()?;
        }
        if let (Some(reason), Some(o)) = (&self.state.stopped, self.observer.as_mut()) {
            o.stopped(reason);
        }
        let summary = Summary {
            task: self.config.task.to_string(),
            epochs: self.state.epochs_done,
            final_accuracy: metrics::final_accuracy(&self.history),
            last_test_accuracy: self.history.last().map_or(f64::NAN, |m| m.test_accuracy),
            wall_seconds: self.state.wall_seconds,
            epsilon: self.epsilon()?,
            delta: self.config.private().then_some(self.config.privacy.delta),
            noise_multiplier: self.config.privacy.noise_multiplier,
            sample_rate: self.config.private().then_some(q),
            sampling: self
                .config
                .private()
                .then(|| match self.config.privacy.sampling {
                    Sampling::Poisson => "poisson".to_string(),
                    Sampling::Shuffle => {
                        "shuffle (approximation: the accountant assumes Poisson sampling)"
                            .to_string()
                    }
                }),
            noise: self.noise_label(),
            stopped: self.state.stopped.clone(),
            compressor: self.config.compressor_spec()?.label(),
            upstream_gigabits: self.state.upstream_bits as f64 / 1e9,
            upstream_paper_gib: paper_gib(self.state.upstream_paper_bits),
            workers: (self.workers() > 1).then_some(self.workers()),
            aggregate_epsilon: self.aggregate_epsilon()?,
        };
        if self.writes() {
            let path = self.run_dir.join("summary.json");
            let text = serde_json::to_string_pretty(&summary).expect("summary serialises");
            crate::run_folder::replace(&path, text.as_bytes())?;
        }
        Ok(summary)
    }

    /// With `--local-noise` and W > 1 workers, ε of the aggregate update: every step it took,
    /// at the multiplier σ√W of the W workers' summed noise (`None` otherwise).
    fn aggregate_epsilon(&self) -> Result<Option<f64>> {
        let workers = self.workers();
        let Some(engine) = self.privacy.as_ref() else {
            return Ok(None);
        };
        // Only an update formed from the sum of the noised messages has the summed noise.
        if workers == 1
            || !self.config.privacy.local_noise
            || !self.config.compression.kind.exchanged_by_sum()
        {
            return Ok(None);
        }
        let mut aggregate = Accountant::default();
        for block in &engine.accountant().history {
            aggregate.step(
                block.noise_multiplier * (workers as f64).sqrt(),
                block.sample_rate,
                block.steps,
            )?;
        }
        Ok(Some(
            aggregate
                .epsilon(self.config.privacy.accountant, self.config.privacy.delta)?
                .0,
        ))
    }

    /// Test loss and accuracy. With W workers each evaluates the test examples i ≡ rank
    /// (mod W) and their sums are added (the weights are the same on every rank).
    fn evaluate_on_workers(&mut self) -> Result<(f64, f64)> {
        let (rank, workers) = (self.rank(), self.workers());
        let Some(exchange) = self.updater.exchange.as_mut() else {
            return evaluate(
                self.model.as_ref(),
                &self.data.test,
                self.config.data.eval_batch_size,
                self.device,
            );
        };
        let n = self.data.test.len();
        if n == 0 {
            return Ok((f64::NAN, f64::NAN));
        }
        let mine =
            Tensor::arange_start_step(rank as i64, n, workers as i64, (Kind::Int64, Device::Cpu));
        let (loss_sum, correct) = evaluation_sums(
            self.model.as_ref(),
            &self.data.test,
            &mine,
            self.config.data.eval_batch_size,
            self.device,
        )?;
        let sums =
            distributed::sum_over_workers(exchange.comm.as_mut(), &[loss_sum, correct as f64])?;
        Ok((sums[0] / n as f64, sums[1] / n as f64))
    }

    /// Rank 0's OS-drawn seed for the epoch's shared permutation, when W > 1 workers shuffle
    /// under `--secure-noise` (each would otherwise draw another permutation).
    fn shared_shuffle_seed(&mut self) -> Result<Option<i64>> {
        let shuffled =
            !(self.config.private() && self.config.privacy.sampling == Sampling::Poisson);
        let (secure, writes) = (self.config.privacy.secure_noise, self.writes());
        let Some(exchange) = self
            .updater
            .exchange
            .as_mut()
            .filter(|_| shuffled && secure)
        else {
            return Ok(None);
        };
        let mut seed = if writes {
            crate::privacy::noise::os_seed().to_le_bytes().to_vec()
        } else {
            Vec::new()
        };
        exchange.comm.broadcast(0, &mut seed)?;
        let bytes: [u8; 8] = seed.try_into().map_err(|_| {
            exchange
                .comm
                .error("the shuffle seed from rank 0 is not 8 bytes".into())
        })?;
        Ok(Some(i64::from_le_bytes(bytes)))
    }

    /// Saves the checkpoint (rank 0). With W workers every rank takes part: each sends its
    /// encoder state, which rank 0 saves beside its own (`distributed::compressor_checkpoint`).
    fn save_checkpoint(&mut self) -> Result<()> {
        let compressor = match self.updater.exchange.as_mut() {
            Some(exchange) => {
                let encoders = distributed::gather_encoder_states(
                    exchange.comm.as_mut(),
                    &self.updater.compressor.encoder.state(),
                )?;
                distributed::compressor_checkpoint(encoders, &exchange.decoders)
            }
            None => self.updater.compressor.state(),
        };
        if !self.writes() {
            return Ok(());
        }
        let names: Vec<String> = self.params.iter().map(|(n, _)| n.clone()).collect();
        let optimizer = self.updater.optimizer.state(&names);
        let workers = self.workers();
        checkpoint::save(
            &self.run_dir,
            self.model.var_store(),
            &optimizer,
            &compressor,
            &TrainState {
                accountant: self.accountant().cloned(),
                clip_radius: self.privacy.as_ref().and_then(PrivacyEngine::clip_radius),
                workers: (workers > 1).then_some(workers),
                ..self.state.clone()
            },
        )
    }
}
