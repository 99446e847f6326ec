//! Starting a run: a fresh one in an empty run folder (`config.toml` first), or the continuation
//! of one from its checkpoint with every invariant checked (the accountant's history, the data,
//! the workers, the logs), and building the model, data, compressor, optimiser and privacy
//! engine that both share.

use super::adam::Adam;
use super::checkpoint::TrainState;
use super::exchange::Exchange;
use super::optimizer::Optimizer;
use super::parts::{self, Parts};
use super::sgd::Sgd;
use super::update::Updater;
use super::{checkpoint, distributed, metrics, DataEdit, OwnTask, Trainer, RESUME_MAY_CHANGE};
use crate::comm::Communicator;
use crate::config::{ClippingMode, OptimizerKind, TrainConfig, TrainOverrides};
use crate::data::TaskData;
use crate::error::{Error, Result, SettingConflict};
use crate::models::Model;
use crate::privacy::builder::BatchSampling;
use crate::privacy::engine::{AdaptiveClipping, Clipping, PrivacyEngine};
use crate::privacy::noise::NoiseSource;
use crate::run_lock::RunLock;
use std::path::Path;
use tch::Device;

/// The privacy engine of a private run (`None` when `privacy.noise_multiplier` and
/// `privacy.target_epsilon` are both unset), from the run's settings and what the trainer knows:
/// its training split's N and `optimizer.batch_size` B (q = 1 / ⌈N / B⌉, E\[B\] = qN: the
/// builder's `batch_size` rule, the one formula for an epoch's steps) and its epochs (the
/// training's length). A target ε calibrates σ over that length when σ is not given; with σ given
/// (a resumed run records the calibrated one) it is the engine's step budget, which stops the run
/// early (`PrivacyEngine::steps_left`).
fn privacy_engine(
    config: &TrainConfig,
    params: &[(String, tch::Tensor)],
    train_examples: i64,
) -> Result<Option<PrivacyEngine>> {
    if !config.private() {
        return Ok(None);
    }
    let examples = train_examples.max(0) as u64;
    // Poisson sampling at q = 1 / ceil(N / B) cannot give a batch above N: refused, as the
    // engine builder refuses it, rather than trained silently at q = 1.
    let sampling =
        BatchSampling::new(examples, config.optimizer.batch_size as u64).map_err(|e| match e {
            Error::BadValue { what, .. } => Error::bad_value("optimizer.batch_size", what),
            other => other,
        })?;
    let privacy = &config.privacy;
    let clipping = match privacy.clipping {
        ClippingMode::Flat => Clipping::Flat {
            max_norm: privacy.max_grad_norm,
        },
        ClippingMode::PerLayer => Clipping::per_layer_even(privacy.max_grad_norm, params.len()),
        ClippingMode::Adaptive => Clipping::Adaptive(AdaptiveClipping {
            radius: privacy.max_grad_norm,
            target_quantile: privacy.target_quantile,
            learning_rate: privacy.clip_learning_rate,
            count_noise: privacy
                .count_noise
                .unwrap_or_else(|| AdaptiveClipping::default_count_noise(sampling.expected_batch)),
        }),
    };
    let mut builder = PrivacyEngine::builder()
        .dataset_size(examples)
        .batch_size(config.optimizer.batch_size as u64)
        .epochs(config.epochs as u64)
        .delta(privacy.delta)
        .accountant(privacy.accountant)
        .clipping(clipping)
        .noise_source(if privacy.secure_noise {
            NoiseSource::secure()
        } else {
            NoiseSource::Seeded
        });
    if let Some(sigma) = privacy.noise_multiplier {
        builder = builder.noise_multiplier(sigma);
    }
    if let Some(target) = privacy.target_epsilon {
        builder = builder.target_epsilon(target);
    }
    let engine = builder.build(params).map_err(|e| match e {
        Error::BadValue { field, what } if field == "epochs" => Error::bad_value("epochs", what),
        Error::BadValue { field, what } => Error::bad_value(format!("privacy.{field}"), what),
        other => other,
    })?;
    Ok(Some(engine))
}

impl Trainer {
    pub(crate) fn start(
        mut config: TrainConfig,
        run_dir: &Path,
        parts: Parts,
        edit: Option<DataEdit>,
        comm: Option<Box<dyn Communicator>>,
    ) -> Result<Self> {
        if let Some(engine) = &parts.privacy {
            parts::write_privacy_settings(engine, &mut config.privacy, false)?;
        }
        config.parts = parts.names();
        config.validate()?;
        // Record the data folder this run reads, resolved ($DPCOMP_DATA or data/) and
        // absolute, so `eval`, `resume` and analyses find it later from anywhere.
        // (A model given with its data reads no data folder.)
        if parts.task.is_none() {
            let data = crate::data::data_dir(config.data.data_dir.as_deref());
            config.data.data_dir = Some(std::path::absolute(&data).unwrap_or(data));
            // The folder resolved from $DPCOMP_DATA is recorded too: it must be UTF-8 as well.
            config.check_paths()?;
        }
        if comm.as_ref().is_some_and(|c| c.rank() > 0) {
            // Rank 0 alone touches the run folder.
            return Self::build(config, run_dir, None, parts, edit, comm)
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
            .and_then(|()| Self::build(config.clone(), run_dir, Some(lock), parts, edit, comm))
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

    pub(crate) fn continue_run(
        run_dir: &Path,
        overrides: TrainOverrides,
        parts: Parts,
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
        overrides.apply(&mut config)?;
        if let Some(engine) = &parts.privacy {
            // Compared with the run's [privacy] below, like any setting given again.
            parts::write_privacy_settings(engine, &mut config.privacy, true)?;
        }
        // A path given now (`data.data_dir`) is compared and written as TOML text.
        config.check_paths()?;
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
        if writes {
            // A save cut short (a kill, a full disk) is of no use: free its space before this
            // resume rewrites the logs.
            let _ = std::fs::remove_dir_all(run_dir.join("checkpoint.tmp"));
        }
        let state = checkpoint::read_state(&dir)?;
        // config.toml is not sealed by the checkpoint's manifest: an edit made to it since the
        // checkpoint was saved (δ, the sampling) would change ε or the training unseen.
        let edited = checkpoint::settings_edited(&state, &saved, &dir.join("state.json"))?;
        if !edited.is_empty() {
            let fields: Vec<String> = edited
                .iter()
                .map(|(field, recorded, now)| {
                    format!("{field}: the checkpoint was saved with {recorded}, config.toml now has {now}")
                })
                .collect();
            return Err(Error::bad_file(
                &config_path,
                format!(
                    "edited since the checkpoint was saved ({}); only {} may change on resume: restore config.toml's values, or start a new run with the new settings",
                    fields.join("; "),
                    RESUME_MAY_CHANGE.join(", ")
                ),
            ));
        }
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
        let mut trainer = Self::build(config, run_dir, lock, parts, None, comm)?;
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
        if trainer.config != saved {
            crate::run_folder::replace(&config_path, trainer.config.to_toml().as_bytes())?;
        }
        Ok(trainer)
    }

    /// The privacy invariant across a resume: a private run's checkpoint holds one accounted
    /// step per step taken, every one at this run's σ and sampling rate; a non-private run's
    /// holds none. Anything else (a null, shortened or edited history) would restart or
    /// under-count ε, so the resume is refused.
    pub(super) fn check_accountant(&self, state: &TrainState, dir: &Path) -> Result<()> {
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
    pub(super) fn checked_by_workers(mut self, state: &str) -> Result<Self> {
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

    pub(super) fn build(
        mut config: TrainConfig,
        run_dir: &Path,
        lock: Option<RunLock>,
        mut parts: Parts,
        edit: Option<DataEdit>,
        comm: Option<Box<dyn Communicator>>,
    ) -> Result<Self> {
        for warning in config.warnings() {
            log::warn!("{warning}");
        }
        parts.check_against(&config.parts)?;
        let device = config.device.device()?;
        let own_model = parts.task.is_some();
        let (model, data) = match (parts.task.take(), &parts.tasks) {
            (Some(OwnTask { model, data }), _) => {
                // `data.limit_train` / `limit_test` apply to data of one's own as to a source's,
                // and before an edit, as a source applies them.
                let data = data.limited(config.data.limit_train, config.data.limit_test);
                let data = match edit {
                    Some(edit) => edit(data)?,
                    None => data,
                };
                (model, data)
            }
            (None, Some(source)) => source.prepare(&config, edit)?,
            (None, None) => {
                return Err(Error::bad_value(
                    "task",
                    format!(
                        "{:?}: no model and data were given (`TrainerBuilder::model`) and no task source makes them (`TrainerBuilder::tasks`)",
                        config.task
                    ),
                ))
            }
        };
        check_data(model.as_ref(), &data, data.classes.len() as i64)?;
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
        let data = hold_on_device(data, device);
        if device.is_cuda() {
            crate::cuda_settings::apply(&config.cuda)?;
        }
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
                let source = match &parts.tasks {
                    Some(source) if !own_model => source.data_source(&config),
                    _ => "the data given with the model".to_string(),
                };
                return Err(Error::bad_value(
                    "data",
                    format!("the {split} split of {source} has no examples (check its files: a names folder needs names in more than one example per split, an SNLI file labelled pairs other than \"-\"); expected at least one"),
                ));
            }
        }
        let shapes: Vec<Vec<i64>> = params.iter().map(|(_, p)| p.size()).collect();
        if let Some(engine) = &parts.privacy {
            parts::check_per_layer(engine, params.len())?;
        }
        let compressor = match parts.link(&shapes, device)? {
            Some(own) => own,
            None => config.compressor()?.link(&shapes, device)?,
        };
        let optimizer: Box<dyn Optimizer> = match parts.optimizer.take() {
            Some(own) => own,
            None => match config.optimizer.kind {
                OptimizerKind::Sgd => {
                    Box::new(Sgd::new(config.optimizer.lr, config.optimizer.momentum))
                }
                OptimizerKind::Adam => Box::new(Adam::new(
                    config.optimizer.lr,
                    config.optimizer.adam_beta1,
                    config.optimizer.adam_beta2,
                    config.optimizer.adam_eps,
                )),
            },
        };
        let privacy = match privacy_engine(&config, &params, data.train.len())? {
            Some(engine) => {
                // A σ calibrated from the target ε is part of the run's settings from now on.
                config.privacy.noise_multiplier = Some(engine.noise_multiplier());
                config.validate()?;
                Some(engine)
            }
            None => None,
        };
        let mut updater = Updater::new(optimizer, compressor);
        updater.clip_noised = config.compression.clip_noised;
        updater.verify_wire = config.compression.verify_wire;
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
                let kind = config.compression.kind();
                let label = match &config.parts.compressor {
                    Some(own) => format!("{own:?}"),
                    None => kind.to_string(),
                };
                if !config.privacy.local_noise && !parts::exchanged_by_sum(&config) {
                    let summed: Vec<&str> = crate::compress::CompressorKind::ALL
                        .iter()
                        .filter(|k| k.exchanged_by_sum())
                        .map(|k| k.name())
                        .collect();
                    return Err(Error::bad_value(
                        "privacy.local_noise",
                        format!("false with {workers} workers and the {label} compressor: its messages are gathered and each worker's is decoded on its own, so the weights depend on every worker's message, not only on their sum; with the noise shared among the workers (σ/√W each) they would be private only at σ/√{workers}. Give every worker the whole noise (local_noise = true, `--local-noise`; ε is then each worker's, as reported), or use a compressor whose exchange sums the workers' messages ({})", summed.join(", ")),
                    ));
                }
                engine.share_noise_among(if config.privacy.local_noise {
                    1
                } else {
                    workers
                })?;
            }
            let decoders = match &parts.compressor {
                Some(own) => (0..workers)
                    .map(|_| own.decoder(&shapes, device))
                    .collect::<Result<Vec<_>>>()?,
                None => {
                    let compressor = config.compressor()?;
                    (0..workers)
                        .map(|_| compressor.decoder(&shapes, device))
                        .collect::<Result<Vec<_>>>()?
                }
            };
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
            observers: Vec::new(),
            privacy,
            canaries: None,
            _lock: lock,
        })
    }
}

/// Datasets up to this size are moved to an accelerator whole (SNLI's training split, the
/// largest of the data sets `dpcomp::data` reads, is about 1.7 GB; CIFAR's 150 MB).
pub const DEVICE_DATA_LIMIT_BYTES: u64 = 16 << 30;

/// On an accelerator, both splits are moved there once when together they fit
/// `DEVICE_DATA_LIMIT_BYTES`, so that no step copies examples from the host; on the
/// CPU nothing changes.
pub fn hold_on_device(data: TaskData, device: Device) -> TaskData {
    if device == Device::Cpu || data.train.bytes() + data.test.bytes() > DEVICE_DATA_LIMIT_BYTES {
        return data;
    }
    TaskData {
        train: data.train.to_device(device),
        test: data.test.to_device(device),
        classes: data.classes,
    }
}

/// Checks both splits against the model once, before any step: feature kinds, shapes and index
/// ranges (`Model::check_features`) and labels within the classes. LibTorch aborts the process on
/// an out-of-range index, so data that would reach one is refused here with its split named.
pub fn check_data(model: &dyn Model, data: &TaskData, classes: i64) -> Result<()> {
    for (split, dataset) in [("training", &data.train), ("test", &data.test)] {
        let named = |e: Error| Error::bad_value(format!("{split} split"), e.to_string());
        model.check_features(&dataset.features).map_err(named)?;
        crate::models::check_labels(&dataset.labels, classes).map_err(named)?;
    }
    Ok(())
}
