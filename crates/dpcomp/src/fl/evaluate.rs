//! The server's evaluation of the global model after each round (Algorithm 1 of Kerkouche et
//! al. 2021 reports the test metric every round): on the test examples and, in runs with one, on
//! the validation split the clients never see.

use super::data::FlData;
use super::metrics::{self, Evaluation};
use super::model::FlModel;
use crate::error::Result;
use tch::Tensor;

/// The metric the summary takes its best round on: balanced accuracy for two classes (the
/// medical tables), accuracy otherwise (Fashion-MNIST).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    Accuracy,
    BalancedAccuracy,
}

impl Metric {
    /// The metric of a dataset of `classes` classes.
    pub fn of_classes(classes: i64) -> Metric {
        if classes == 2 {
            Metric::BalancedAccuracy
        } else {
            Metric::Accuracy
        }
    }

    /// Its name in `summary.json` (`FlSummary::metric`).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::BalancedAccuracy => "balanced_accuracy",
        }
    }

    /// Its value among a round's `accuracy` and `balanced_accuracy`.
    pub fn pick(self, accuracy: f64, balanced_accuracy: f64) -> f64 {
        match self {
            Metric::Accuracy => accuracy,
            Metric::BalancedAccuracy => balanced_accuracy,
        }
    }
}

/// The global model and the examples it is evaluated on, after each round.
pub(crate) struct Evaluator {
    model: FlModel,
    test: (Tensor, Tensor),
    validation: Option<(Tensor, Tensor)>,
    /// The summary's metric, which the validation split reports.
    pub metric: Metric,
}

/// One round's evaluation.
pub(crate) struct Evaluated {
    /// On the test examples.
    pub test: Evaluation,
    /// The metric on the validation split (runs with one).
    pub validation_metric: Option<f64>,
}

impl Evaluator {
    /// Evaluates `model` on the first `eval_examples` test examples of `data` (0: all) and on at
    /// most as many of the validation examples `validation_index` (rows of the training split).
    pub fn new(
        model: FlModel,
        data: &FlData,
        validation_index: &[i64],
        eval_examples: usize,
    ) -> Evaluator {
        let validation = (!validation_index.is_empty()).then(|| {
            // A round's evaluation of a large model otherwise outlasts its training.
            let count = match eval_examples {
                0 => validation_index.len(),
                k => k.min(validation_index.len()),
            };
            let index =
                Tensor::from_slice(&validation_index[..count]).to_device(data.train_x.device());
            (
                data.train_x.index_select(0, &index),
                data.train_y.index_select(0, &index),
            )
        });
        let tests = data.test_y.size()[0];
        let count = match eval_examples {
            0 => tests,
            k => i64::try_from(k).unwrap_or(i64::MAX).min(tests),
        };
        Evaluator {
            model,
            test: (
                data.test_x.narrow(0, 0, count),
                data.test_y.narrow(0, 0, count),
            ),
            validation,
            metric: Metric::of_classes(data.classes),
        }
    }

    /// The global model with weights `w`, on the test examples and the validation split.
    pub fn evaluate(&mut self, w: &Tensor) -> Result<Evaluated> {
        self.model.set_flat(w);
        let test = evaluate(&self.model, &self.test.0, &self.test.1)?;
        let validation_metric = match &self.validation {
            Some((x, y)) => {
                let e = evaluate(&self.model, x, y)?;
                Some(self.metric.pick(e.accuracy, e.balanced_accuracy))
            }
            None => None,
        };
        Ok(Evaluated {
            test,
            validation_metric,
        })
    }
}

/// Test metrics of `model` on (`x`, `y`), in batches of 2,000.
fn evaluate(model: &FlModel, x: &Tensor, y: &Tensor) -> Result<Evaluation> {
    let _guard = tch::no_grad_guard();
    let count = x.size()[0];
    let logits: Vec<Tensor> = (0..count)
        .step_by(2000)
        .map(|start| model.forward(&x.narrow(0, start, (count - start).min(2000))))
        .collect::<Result<_>>()?;
    Ok(metrics::evaluate(&Tensor::cat(&logits, 0), y))
}
