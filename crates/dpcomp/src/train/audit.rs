//! One training run audited with canaries (Steinke, Nasr and Jagielski, "Privacy
//! Auditing with One (1) Training Run", NeurIPS 2023): the run trains as `dpcomp train` would,
//! with m canaries planted (`privacy::canary`), and ends with the accounted ε beside the
//! audited lower bound (`privacy::audit::outcome_of`). The canaries are fixed by the audit's own
//! seed before the run; the guesses are the top and bottom of the scores, a rule fixed in
//! advance, so the bound is valid whatever the scores turn out to be.
//!
//! An audited run is one process (no W workers) and is not resumable: the every-step scores are
//! not checkpointed.

use super::builder::TrainerBuilder;
use super::input_canaries::InputCanaries;
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::privacy::audit::{
    audit_power, audit_scores, outcome_of, refutes, AuditOutcome, Guesses,
};
use crate::privacy::canary::{CanarySettings, GradientCanaries, Observe};
use serde::Serialize;

/// Which canaries the run carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum CanaryKind {
    /// Gradients of the clip norm added to the clipped sum (`GradientCanaries`).
    WhiteBox,
    /// Mislabelled training examples, scored by their final loss (`InputCanaries`).
    BlackBox,
}

/// How `audit_training` audits a run, fixed before it starts (so the bound stays valid).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditSettings {
    /// White-box gradient canaries or black-box mislabelled examples.
    pub kind: CanaryKind,
    /// How many canaries, their seed and (white box) their directions and what the auditor sees.
    pub canaries: CanarySettings,
    /// How many "included" and "excluded" guesses the auditor makes; in total at least 1 and at
    /// most `canaries.canaries`, or `audit_training` refuses.
    pub guesses: Guesses,
    /// 1 − confidence of the lower bound.
    pub beta: f64,
}

/// What `dpcomp audit` prints and writes to `audit.json` in the run folder.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AuditReport {
    /// The audited run's task name.
    pub task: String,
    /// The run's compressor label ("identity", "dgc x256", ...), as in `summary.json`.
    pub compressor: String,
    /// Which canaries the run carried.
    pub kind: CanaryKind,
    /// White box: what the auditor saw (black box: the final model only).
    pub observe: Option<Observe>,
    /// White box with dense random directions instead of Dirac ones (false for black box).
    pub dense: bool,
    /// σ of the run (0 audits the clipping alone).
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub noise_multiplier: f64,
    /// q, the probability that a step samples a given example.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub sample_rate: f64,
    /// DP steps the run took.
    pub steps: u64,
    /// ε of the run by its accountant at `outcome.delta` (∞ at σ 0, written "inf").
    #[serde(with = "crate::json_floats::epsilon_f64")]
    pub accounted_epsilon: f64,
    /// How the run drew its batches, as in `summary.json`: "poisson", or "shuffle
    /// (approximation: ...)" when `accounted_epsilon` assumes Poisson sampling the run did
    /// not use (absent from reports written before it was recorded).
    #[serde(default)]
    pub sampling: Option<String>,
    /// The audit of `observe` (black box: of the final model).
    pub outcome: AuditOutcome,
    /// White box: both observations of the same run (`outcome` is one of them).
    pub every_step: Option<AuditOutcome>,
    /// White box: the audit from the final weights alone (`Observe::Final`).
    pub final_weights: Option<AuditOutcome>,
    /// The bound had every guess been right: the most this audit could show.
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub max_bound: f64,
    /// White box: how many times a canary was sampled into a step.
    pub canary_samples: Option<u64>,
    /// The trained model's test accuracy after its last epoch, in [0, 1].
    #[serde(deserialize_with = "crate::json_floats::nan_if_null")]
    pub test_accuracy: f64,
    /// The audited bound exceeds the accounted ε: the run's privacy claim is refuted (with the
    /// stated confidence), a bug in the mechanism or its accounting.
    pub flagged: bool,
}

/// Trains `config` with the canaries of `settings` and audits it; `trainer` names the run folder
/// and where the model and data come from (`TrainerBuilder::model` or `tasks`), `observers` hear
/// of the training's progress (`Trainer::observe`).
pub fn audit_training(
    trainer: TrainerBuilder,
    config: TrainConfig,
    settings: &AuditSettings,
    observers: Vec<Box<dyn super::observer::Observer>>,
) -> Result<AuditReport> {
    // σ given, or calibrated from the target ε over the run's epochs as a training run does
    // (`TrainerBuilder::config`), so that the audit checks the run `train` would make.
    if config.privacy.noise_multiplier.is_none() && config.privacy.target_epsilon.is_none() {
        return Err(Error::bad_value(
            "privacy.noise_multiplier",
            "not set: an audit checks a private run (give `privacy.noise_multiplier`, 0 to audit the clipping alone, or `privacy.target_epsilon` to calibrate it)",
        ));
    }
    let m = settings.canaries.canaries;
    if settings.guesses.total() == 0 || settings.guesses.total() > m {
        return Err(Error::bad_value(
            "guesses",
            format!(
                "{} included + {} excluded for {m} canaries: expected 0 < guesses <= canaries",
                settings.guesses.included, settings.guesses.excluded
            ),
        ));
    }
    let delta = config.privacy.delta;
    let (mut trainer, input) = match settings.kind {
        CanaryKind::WhiteBox => (trainer.config(config).build()?, None),
        CanaryKind::BlackBox => {
            let canary_settings = settings.canaries;
            let planted = std::rc::Rc::new(std::cell::RefCell::new(None));
            let slot = planted.clone();
            let trainer = trainer
                .config(config)
                .edit_data(Box::new(move |mut data| {
                    let classes = data.classes.len() as i64;
                    let (canaries, train) =
                        InputCanaries::carve(&canary_settings, &data.train, classes)?;
                    data.train = train;
                    *slot.borrow_mut() = Some(canaries);
                    Ok(data)
                }))
                .build()?;
            let canaries = planted.borrow_mut().take();
            (trainer, canaries)
        }
    };
    let sigma = trainer
        .config
        .privacy
        .noise_multiplier
        .expect("a private run's σ is given or calibrated at its start");
    for observer in observers {
        trainer.observe(observer);
    }
    if settings.kind == CanaryKind::WhiteBox {
        let tensors: Vec<tch::Tensor> = trainer
            .params
            .iter()
            .map(|(_, p)| p.shallow_clone())
            .collect();
        let engine = trainer
            .privacy
            .as_ref()
            .expect("a private run has an engine");
        let optimizer = &trainer.config.optimizer;
        let momentum = match optimizer.kind {
            crate::config::OptimizerKind::Sgd => optimizer.momentum,
            crate::config::OptimizerKind::Adam => 0.0,
        };
        trainer.canaries = Some(GradientCanaries::new(
            settings.canaries,
            &tensors,
            engine.clipping().rule(),
            trainer.config.privacy.max_grad_norm,
            engine.sample_rate(),
            (optimizer.lr, momentum),
        )?);
    }
    let summary = trainer.run()?;
    let tensors: Vec<tch::Tensor> = trainer
        .params
        .iter()
        .map(|(_, p)| p.shallow_clone())
        .collect();
    let audit = |scores: &[f64], included: &[bool]| {
        outcome_of(scores, included, settings.guesses, delta, settings.beta)
    };
    let (outcome, every_step, final_weights, samples) = match (&trainer.canaries, &input) {
        (Some(c), _) => {
            let (every_step, final_weights) =
                audit_scores(&c.finish(&tensors), settings.guesses, delta, settings.beta)?;
            let outcome = match settings.canaries.observe {
                Observe::EveryStep => every_step,
                Observe::Final => final_weights,
            };
            (
                outcome,
                Some(every_step),
                Some(final_weights),
                Some(c.samples),
            )
        }
        (None, Some(c)) => {
            let scores = c.scores(trainer.model.as_ref(), trainer.device)?;
            (audit(&scores, &c.included)?, None, None, None)
        }
        (None, None) => unreachable!("an audited run carries canaries"),
    };
    let accounted_epsilon = if sigma == 0.0 {
        f64::INFINITY
    } else {
        trainer.epsilon()?.unwrap_or(f64::INFINITY)
    };
    let report = AuditReport {
        task: trainer.config.task.to_string(),
        compressor: summary.compressor.clone(),
        kind: settings.kind,
        observe: (settings.kind == CanaryKind::WhiteBox).then_some(settings.canaries.observe),
        dense: settings.kind == CanaryKind::WhiteBox && settings.canaries.dense,
        noise_multiplier: sigma,
        sample_rate: trainer.sample_rate(),
        steps: trainer.state.steps_done,
        accounted_epsilon,
        sampling: summary.sampling.clone(),
        max_bound: audit_power(m, settings.guesses, delta, settings.beta)?,
        canary_samples: samples,
        test_accuracy: summary.last_test_accuracy,
        flagged: refutes(
            [Some(&outcome), every_step.as_ref(), final_weights.as_ref()]
                .into_iter()
                .flatten(),
            accounted_epsilon,
        ),
        outcome,
        every_step,
        final_weights,
    };
    let path = trainer.run_dir.join("audit.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).expect("the audit report serialises"),
    )
    .map_err(|e| Error::io(&path, e))?;
    Ok(report)
}
