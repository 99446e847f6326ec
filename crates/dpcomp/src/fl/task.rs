//! What a federated run trains and evaluates: one of dpcomp's networks on its dataset
//! (`FlModel` on `FlData`, `setup`), or a model of one's own on the clients' data of one's own
//! (`FederatedRunBuilder::model` and `clients`). Either way the run sends one flat vector: for a
//! model of one's own, its *trainable* variables sorted by name (`Model::trainable_variables`),
//! so a fine-tuning run's frozen weights never change and never cross (LoRA: the adapters and
//! the head are the vector).
//!
//! A model of one's own trains locally as the `Trainer`'s non-private step does (`Ctx::train`,
//! the loss `Model::mean_loss` of a batch, `Ctx::backward`, plain SGD), so a language model
//! works like a classifier; it is evaluated by `Model::mean_loss` and `Model::correct`.

use super::client::{client_update, LocalTraining};
use super::evaluate::{Evaluated, Evaluator, Metric};
use super::metrics::Evaluation;
use super::round::Clients;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::nn::Ctx;
use crate::train::optimizer::Optimizer;
use crate::train::sgd::Sgd;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

/// A model of one's own and its data, as `FederatedRunBuilder::model` and `clients` take them.
pub(crate) struct OwnParts {
    pub model: Box<dyn Model>,
    pub clients: Vec<Dataset>,
    pub test: Dataset,
}

impl OwnParts {
    /// Checks the parts for a run of `clients` clients: one dataset per client, none empty, a
    /// test dataset that is not empty, features the model reads (`Model::check_features`) and
    /// something to train.
    pub fn check(&self, clients: usize) -> Result<()> {
        if self.clients.len() != clients {
            return Err(Error::bad_value(
                "clients",
                format!(
                    "{} client datasets, but the settings' `clients` is {clients}: give one dataset per client",
                    self.clients.len()
                ),
            ));
        }
        if let Some(k) = self.clients.iter().position(Dataset::is_empty) {
            return Err(Error::bad_value(
                "clients",
                format!("client {k}'s dataset is empty: every client needs examples"),
            ));
        }
        if self.test.is_empty() {
            return Err(Error::bad_value(
                "clients",
                "the test dataset is empty: the global model is evaluated on it every round",
            ));
        }
        if self.model.trainable_parameter_count() == 0 {
            return Err(Error::bad_value(
                "model",
                "no trainable variable: the run sends the updates of the trainable variables",
            ));
        }
        for data in self.clients.iter().chain([&self.test]) {
            self.model.check_features(&data.features)?;
        }
        Ok(())
    }
}

/// The run's model and data, from the first round on.
// One per run, so the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Task {
    /// dpcomp's network on its dataset: the clients' shared model and the server's evaluator.
    Fl {
        clients: Clients,
        evaluator: Evaluator,
    },
    /// A model of one's own (one model: each client starts from the global weights, and the
    /// evaluation sets them again).
    Own(OwnTask),
}

/// A model of one's own, each client's examples and the test examples, on the model's device.
pub(crate) struct OwnTask {
    model: Box<dyn Model>,
    clients: Vec<Dataset>,
    test: Dataset,
    /// At most this many test examples are evaluated (0: all).
    eval_examples: usize,
}

/// Examples per forward pass of a model of one's own in evaluation.
const OWN_EVAL_BATCH: i64 = 256;

impl Task {
    /// Client `k`'s update Δw = w_local − `global` after its local training (`seed` orders
    /// its mini-batches).
    pub fn update(
        &mut self,
        global: &Tensor,
        k: usize,
        local: &LocalTraining,
        seed: u64,
    ) -> Result<Tensor> {
        match self {
            Task::Fl { clients, .. } => client_update(
                &mut clients.model,
                global,
                &clients.x,
                &clients.y,
                &clients.shards[k],
                local,
                seed,
            ),
            Task::Own(own) => own.update(global, k, local, seed),
        }
    }

    /// How many examples client `k` holds (the weight of its update without DP).
    pub fn examples(&self, k: usize) -> usize {
        match self {
            Task::Fl { clients, .. } => clients.shards[k].len(),
            Task::Own(own) => own.clients[k].len() as usize,
        }
    }

    /// The global model with weights `w`, evaluated.
    pub fn evaluate(&mut self, w: &Tensor) -> Result<Evaluated> {
        match self {
            Task::Fl { evaluator, .. } => evaluator.evaluate(w),
            Task::Own(own) => own.evaluate(w),
        }
    }

    /// The metric the summary takes its best round on (accuracy for a model of one's own).
    pub fn metric(&self) -> Metric {
        match self {
            Task::Fl { evaluator, .. } => evaluator.metric,
            Task::Own(_) => Metric::Accuracy,
        }
    }

    /// The model of one's own, holding the weights it was last given (`None` for dpcomp's
    /// networks).
    pub fn into_model(self) -> Option<Box<dyn Model>> {
        match self {
            Task::Fl { .. } => None,
            Task::Own(own) => Some(own.model),
        }
    }
}

impl OwnTask {
    /// The task of `parts` (checked by `check`), its examples moved to the model's device.
    pub fn new(parts: OwnParts, eval_examples: usize) -> OwnTask {
        let device = parts.model.var_store().device();
        OwnTask {
            clients: parts
                .clients
                .into_iter()
                .map(|d| d.to_device(device))
                .collect(),
            test: parts.test.to_device(device),
            model: parts.model,
            eval_examples,
        }
    }
    /// The trainable variables, sorted by name.
    fn variables(&self) -> Vec<Tensor> {
        self.model
            .trainable_variables()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// The trainable variables' shapes, in the flat vector's order.
    pub fn shapes(&self) -> Vec<Vec<i64>> {
        self.variables().iter().map(Tensor::size).collect()
    }

    /// The trainable variables as one vector \[n\] (a copy), float32 on the model's device.
    pub fn flat(&self) -> Tensor {
        let parts: Vec<Tensor> = self
            .variables()
            .iter()
            .map(|t| t.detach().to_kind(Kind::Float).reshape([-1]))
            .collect();
        Tensor::cat(&parts, 0)
    }

    /// Overwrites the trainable variables with `flat` \[n\].
    fn set_flat(&mut self, flat: &Tensor) {
        let _guard = tch::no_grad_guard();
        let mut offset = 0;
        for mut t in self.variables() {
            let n = t.numel() as i64;
            t.copy_(&flat.narrow(0, offset, n).view(t.size().as_slice()));
            offset += n;
        }
        assert_eq!(offset, flat.size()[0], "flat vector of the wrong length");
    }

    /// Client `k`'s update: `local.steps` SGD steps on its examples from `global`, each on a
    /// batch of `local.batch` examples (all of them when 0 or more), reshuffled every local
    /// epoch in the order `seed` draws.
    fn update(
        &mut self,
        global: &Tensor,
        k: usize,
        local: &LocalTraining,
        seed: u64,
    ) -> Result<Tensor> {
        self.set_flat(global);
        let size = self.clients[k].len() as usize;
        let batch = if local.batch == 0 || local.batch >= size {
            size
        } else {
            local.batch
        };
        let device = self.model.var_store().device();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut order: Vec<i64> = (0..size as i64).collect();
        let mut position = size;
        let variables = self.variables();
        let mut sgd = Sgd::new(local.learning_rate, 0.0);
        for _ in 0..local.steps {
            if position + batch > size {
                order.shuffle(&mut rng);
                position = 0;
            }
            let index = Tensor::from_slice(&order[position..position + batch]);
            position += batch;
            let data = self.clients[k].batch(&index, device, true);
            for v in &variables {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let mut ctx = Ctx::train();
            let output = self.model.forward(&data.features, &mut ctx)?;
            let loss = self.model.mean_loss(&output, &data.features, &data.labels);
            ctx.backward(&loss);
            let grads: Vec<Tensor> = variables.iter().map(Tensor::grad).collect();
            sgd.step(&variables, &grads);
        }
        Ok(self.flat() - global)
    }

    /// The model with weights `w` on the first `eval_examples` test examples (0: all): the
    /// examples' mean loss (`Model::mean_loss`, batch by batch) and their mean accuracy
    /// (`Model::correct`). The model defines an example's accuracy, so no per-class recall is
    /// computed: the balanced accuracy reported is the accuracy, and there is no AUROC.
    fn evaluate(&mut self, w: &Tensor) -> Result<Evaluated> {
        self.set_flat(w);
        let _guard = tch::no_grad_guard();
        let count = match self.eval_examples {
            0 => self.test.len(),
            k => i64::try_from(k).unwrap_or(i64::MAX).min(self.test.len()),
        };
        let device = self.model.var_store().device();
        let (mut loss, mut correct) = (0.0, 0.0);
        for start in (0..count).step_by(OWN_EVAL_BATCH as usize) {
            let size = (count - start).min(OWN_EVAL_BATCH);
            let index = Tensor::arange_start(start, start + size, (Kind::Int64, Device::Cpu));
            let data = self.test.batch(&index, device, false);
            let output = self.model.forward(&data.features, &mut Ctx::eval())?;
            let mean = self.model.mean_loss(&output, &data.features, &data.labels);
            loss += crate::host::f64_scalar(&mean) * size as f64;
            correct +=
                crate::host::f64_scalar(&self.model.correct(&output, &data.features, &data.labels));
        }
        let accuracy = correct / count as f64;
        Ok(Evaluated {
            test: Evaluation {
                loss: loss / count as f64,
                accuracy,
                balanced_accuracy: accuracy,
                auroc: None,
            },
            validation_metric: None,
        })
    }
}
