//! `Trainer::run`: the epochs, each a pass of steps, then the epoch's totals over the workers,
//! evaluation, one row in `metrics.jsonl` and a checkpoint.

use super::checkpoint::TrainState;
use super::metrics::{EpochMetrics, Summary};
use super::private::dp_step;
use super::step::{empty_share_step, train_step_share};
use super::{checkpoint, distributed, metrics, observer, traffic, Trainer, DIVERGED};
use crate::compress::message::paper_gib;
use crate::config::Sampling;
use crate::error::{Error, Result};
use crate::host;
use crate::privacy::engine::PrivacyEngine;
use std::time::Instant;
use tch::{Kind, Tensor};

/// What one epoch's steps added up to on this worker (`Trainer::train_epoch`), before the
/// totals over the workers (`Trainer::finish_epoch`).
struct EpochSteps {
    epoch: usize,
    started: Instant,
    /// Steps taken (0 when the budget allowed none).
    steps: usize,
    /// Examples in this worker's batches.
    seen: i64,
    /// Device tensors: summed loss, correct predictions and clipped examples (read once, at
    /// the epoch's end).
    loss_sum: Tensor,
    correct: Tensor,
    clipped: Tensor,
    traffic: Vec<traffic::TrafficRow>,
    upstream: Vec<metrics::UpstreamRow>,
    /// Host reads the steps made (`dpcomp::host`), the logging intervals' not included.
    host_reads: u64,
}

impl Trainer {
    /// Trains the remaining epochs, evaluating and checkpointing after each. Under DP every
    /// step is accounted, and training stops before a step that would exceed --target-epsilon.
    pub fn run(&mut self) -> Result<Summary> {
        // The engine's step budget: the epochs' steps, or fewer when σ is given with a target ε.
        let mut budget = self.privacy.as_ref().and_then(PrivacyEngine::steps_left);
        if budget == Some(0) && self.state.steps_done == 0 {
            // Not even one step fits the target: refuse rather than "finish" a run that never
            // trained (σ = 0 lands here too: its ε is infinite).
            let engine = self
                .privacy
                .as_ref()
                .expect("a budget comes from an engine");
            return Err(Error::bad_value(
                "privacy.target_epsilon",
                format!(
                    "{}: a single step at noise multiplier {} and sampling rate {:.6} already spends epsilon {:.4} (delta {}); raise the target or the noise multiplier",
                    engine.target_epsilon().unwrap_or(f64::NAN),
                    engine.noise_multiplier(),
                    engine.sample_rate(),
                    engine.epsilon_after_next_step()?,
                    engine.delta()
                ),
            ));
        }
        self.refuse_settings_nobody_carries_out()?;
        self.between_epochs()?;
        while self.state.epochs_done < self.config.epochs && self.state.stopped.is_none() {
            let steps = self.train_epoch(&mut budget)?;
            if steps.steps == 0 {
                // The budget ran out exactly at the end of the previous epoch: nothing was
                // trained, so there is no epoch to evaluate or log (and no zero-loss row).
                self.save_checkpoint()?;
                break;
            }
            self.finish_epoch(steps)?;
        }
        if let Some(reason) = &self.state.stopped {
            for o in &mut self.observers {
                o.stopped(reason);
            }
        }
        let summary = self.summary()?;
        if self.writes() {
            let path = self.run_dir.join("summary.json");
            let text = serde_json::to_string_pretty(&summary).expect("summary serialises");
            crate::run_folder::replace(&path, text.as_bytes())?;
        }
        Ok(summary)
    }

    /// One epoch's steps on this worker: its batches, each a private step (`private::dp_step`)
    /// or a non-private one, the bits each step's message took, and the observer's calls. Stops
    /// early, saying why in `state.stopped`, when the target ε allows no further step.
    fn train_epoch(&mut self, budget: &mut Option<u64>) -> Result<EpochSteps> {
        let epoch = self.state.epochs_done;
        let started = Instant::now();
        self.updater.start_epoch(epoch);
        let shuffle_seed = self.shared_shuffle_seed()?;
        let batches = self.worker_batches(epoch, shuffle_seed);
        let mut traffic: Vec<traffic::TrafficRow> = Vec::new();
        let mut upstream: Vec<metrics::UpstreamRow> = Vec::with_capacity(batches.len());
        for o in &mut self.observers {
            o.epoch_started(epoch, self.config.epochs, batches.len());
        }
        let intervals: Vec<usize> = self.observers.iter().map(|o| o.interval()).collect();
        let due = |step: usize, interval: usize| interval > 0 && step % interval == interval - 1;
        let mut loss_sum = Tensor::zeros([], (Kind::Float, self.device));
        let mut correct = Tensor::zeros([], (Kind::Double, self.device));
        let mut clipped = Tensor::zeros([], (Kind::Int64, self.device));
        let mut seen = 0i64;
        let mut steps = 0usize;
        let mut host_reads = 0u64;
        // Steps whose message size waits on the device (row in `upstream`, [wire, paper] bits).
        let mut pending: Vec<(usize, Tensor)> = Vec::new();
        for (step, index) in batches.iter().enumerate() {
            let reads = host::HostReads::start();
            if *budget == Some(0) {
                self.state.stopped = Some(self.budget_message()?);
                break;
            }
            steps += 1;
            *budget = budget.map(|b| b - 1);
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
                    let share_weight = self.workers() as f64 * share as f64 / logical_len as f64;
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
                traffic.push(traffic::TrafficRow {
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
            if let Some(bits) = self.updater.take_pending_bits() {
                pending.push((upstream.len() - 1, bits));
            }
            host_reads += reads.since();
            for o in &mut self.observers {
                o.step_finished(epoch, step);
            }
            if intervals.iter().any(|&i| due(step, i)) {
                self.resolve_pending_bits(&mut pending, &mut upstream);
                // RDP is cheap enough to show live; the PLD's FFTs run once per epoch.
                let live = self.config.privacy.accountant == crate::config::AccountantKind::Rdp;
                let shown = seen.max(1) as f64;
                let progress = observer::LiveProgress {
                    epoch,
                    step,
                    loss: host::f64_scalar(&loss_sum) / shown,
                    accuracy: host::f64_scalar(&correct) / shown,
                    epsilon: self.epsilon_shown(live)?,
                    epsilon_is_live: live,
                    upstream_gigabits: self.state.upstream_bits as f64 / 1e9,
                    examples_per_second: shown / started.elapsed().as_secs_f64(),
                };
                for (o, &interval) in self.observers.iter_mut().zip(&intervals) {
                    if due(step, interval) {
                        o.progress(&progress);
                    }
                }
            }
        }
        self.resolve_pending_bits(&mut pending, &mut upstream);
        Ok(EpochSteps {
            epoch,
            started,
            steps,
            seen,
            loss_sum,
            correct,
            clipped,
            traffic,
            upstream,
            host_reads,
        })
    }

    /// Adds the data-dependent message sizes the steps left on the device
    /// (`Updater::take_pending_bits`) to their rows and the run's totals: all of them in one
    /// host read, at a logging interval or the epoch's end.
    fn resolve_pending_bits(
        &mut self,
        pending: &mut Vec<(usize, Tensor)>,
        upstream: &mut [metrics::UpstreamRow],
    ) {
        if pending.is_empty() {
            return;
        }
        let sizes: Vec<Tensor> = pending.iter().map(|(_, t)| t.shallow_clone()).collect();
        let read = host::to_vec_i64(
            &Tensor::stack(&sizes, 0)
                .reshape([-1])
                .to_device(tch::Device::Cpu),
        )
        .expect("int64 sizes read back");
        for ((row, _), both) in pending.drain(..).zip(read.chunks(2)) {
            let (wire, paper) = (both[0] as u64, both[1] as u64);
            upstream[row].2 += wire;
            upstream[row].3 += paper;
            self.state.upstream_bits += wire;
            self.state.upstream_paper_bits += paper;
        }
    }

    /// The end of an epoch that trained: the totals over the workers, the test evaluation, the
    /// epoch's row (to the observer and `metrics.jsonl`), a stop if the loss diverged, the
    /// gradient-error measurement when due, and the checkpoint.
    fn finish_epoch(&mut self, steps: EpochSteps) -> Result<()> {
        let EpochSteps {
            epoch,
            started,
            steps: steps_taken,
            mut seen,
            loss_sum,
            correct,
            clipped,
            mut traffic,
            upstream,
            host_reads,
        } = steps;
        let train_seconds = started.elapsed().as_secs_f64();
        let mut epoch_traffic = None;
        let (mut loss_sum, mut correct, mut clipped) = (
            host::f64_scalar(&loss_sum),
            host::f64_scalar(&correct),
            host::i64_scalar(&clipped) as f64,
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
            let rows = traffic::gather_traffic(comm, &traffic)?;
            epoch_traffic = Some(traffic::EpochTraffic::of(
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
            host_reads_per_step: Some(host_reads as f64 / steps_taken.max(1) as f64),
        };
        for o in &mut self.observers {
            o.epoch_finished(&m);
        }
        let diverged = !m.train_loss.is_finite();
        if self.writes() {
            metrics::append(&self.run_dir.join("metrics.jsonl"), &m)?;
            metrics::append_upstream(&self.run_dir.join("upstream.csv"), &upstream)?;
            if !traffic.is_empty() {
                traffic::append_traffic(&self.run_dir.join("traffic.csv"), &traffic)?;
            }
        }
        self.history.push(m);
        if diverged {
            // Every later epoch would train a NaN model: stop, and say where and which weights
            // the checkpoint keeps. The last finite ones are the previous epoch's checkpoint
            // (every epoch that ended saved one); a run that diverged in its first epoch has
            // none, and keeps no checkpoint rather than a NaN model.
            let kept = if epoch > 0 {
                format!(
                    "the checkpoint keeps the weights after epoch {epoch}, the last finite ones"
                )
            } else {
                "no checkpoint is kept, as no epoch ended with finite weights".to_string()
            };
            self.state.stopped = Some(format!(
                "{DIVERGED}: non-finite training loss in epoch {} (step {}); {kept}",
                epoch + 1,
                self.state.steps_done
            ));
        }
        self.between_epochs()?;
        if diverged {
            // The state (every step taken, the accountant that spent them, the stop) is saved
            // with the previous checkpoint's weights, so that ε counts the diverged epoch's
            // steps and `eval` and `resume` read a finite model. No gather of compressor state
            // happens on any worker: all of them see the same non-finite loss.
            if epoch > 0 && self.writes() {
                checkpoint::save_keeping_weights(
                    &self.run_dir,
                    &TrainState {
                        accountant: self.accountant().cloned(),
                        workers: (self.workers() > 1).then_some(self.workers()),
                        settings: Some(checkpoint::settings_record(&self.config)),
                        ..self.state.clone()
                    },
                )?;
            }
            return Ok(());
        }
        self.save_checkpoint()?;
        Ok(())
    }

    /// Every observer's `between_epochs`, in the order installed. They are taken out for the
    /// call so that each sees the whole trainer; an error stops the run.
    fn between_epochs(&mut self) -> Result<()> {
        let mut observers = std::mem::take(&mut self.observers);
        let seen = observers
            .iter_mut()
            .try_for_each(|o| o.between_epochs(self));
        self.observers = observers;
        seen
    }

    /// A setting that an observer carries out (`Observer::carries_out`: the gradient-error
    /// probe's `analysis.grad_error_epochs`) but that no installed observer does is refused
    /// before the first step, naming the observer to install, rather than silently ignored.
    fn refuse_settings_nobody_carries_out(&self) -> Result<()> {
        let carried = |setting: &str| {
            self.observers
                .iter()
                .any(|o| o.carries_out() == Some(setting))
        };
        let epochs = &self.config.analysis.grad_error_epochs;
        if !epochs.is_empty() && !carried("analysis.grad_error_epochs") {
            return Err(Error::bad_value(
                "analysis.grad_error_epochs",
                format!(
                    "{epochs:?}: the gradient-error measurement is an observer; install it before `run` with `dpcomp::analysis::probe::GradientErrorProbe::install(&mut trainer)`"
                ),
            ));
        }
        Ok(())
    }

    /// What the run ended with (`summary.json`).
    fn summary(&self) -> Result<Summary> {
        let q = self.sample_rate();
        Ok(Summary {
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
            compressor: super::parts::compressor_label(&self.config)?,
            upstream_gigabits: self.state.upstream_bits as f64 / 1e9,
            upstream_paper_gib: paper_gib(self.state.upstream_paper_bits),
            workers: (self.workers() > 1).then_some(self.workers()),
            aggregate_epsilon: self.aggregate_epsilon()?,
            threads: usize::try_from(tch::get_num_threads()).ok(),
        })
    }

    /// Saves the checkpoint (rank 0). With W workers every rank takes part: each sends its
    /// encoder state, which rank 0 saves beside its own (`distributed::compressor_checkpoint`).
    pub(super) fn save_checkpoint(&mut self) -> Result<()> {
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
                weights_epoch: None,
                settings: Some(checkpoint::settings_record(&self.config)),
                ..self.state.clone()
            },
        )
    }
}
