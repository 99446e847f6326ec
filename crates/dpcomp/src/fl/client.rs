//! One client's part of a round (Algorithm 1 of Kerkouche et al. 2021):
//! start from the global model, run T_gd local steps of mini-batch SGD (or full-batch gradient
//! descent) on the client's own examples, return the update Δw = w_local − w_global. A client
//! reads only the global model and its own data, so clients could run in parallel. The local
//! steps use the optimiser every run uses (`train::Sgd`, no momentum).

use super::model::FlModel;
use crate::error::Result;
use crate::train::optimizer::Optimizer;
use crate::train::sgd::Sgd;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tch::Tensor;

/// Each client's local training in a round (`FlSettings::local`): T_gd steps of plain SGD on its
/// own examples, from the global weights.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LocalTraining {
    /// T_gd, local steps per round.
    pub steps: usize,
    /// Examples per local step; 0 (or at least the client's size) is full-batch GD.
    pub batch: usize,
    /// The local SGD step size (no momentum).
    pub learning_rate: f64,
}

/// The update of one client whose examples are `examples` (row indices into `x`, `y`). `seed`
/// orders its mini-batches (reshuffled every local epoch).
pub fn client_update(
    model: &mut FlModel,
    global: &Tensor,
    x: &Tensor,
    y: &Tensor,
    examples: &[i64],
    local: &LocalTraining,
    seed: u64,
) -> Result<Tensor> {
    model.set_flat(global);
    let device = x.device();
    let size = examples.len();
    let batch = if local.batch == 0 || local.batch >= size {
        size
    } else {
        local.batch
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<i64> = examples.to_vec();
    let mut position = size;
    let variables = model.variables();
    let mut sgd = Sgd::new(local.learning_rate, 0.0);
    for _ in 0..local.steps {
        if position + batch > size {
            order.shuffle(&mut rng);
            position = 0;
        }
        let index = Tensor::from_slice(&order[position..position + batch]).to_device(device);
        position += batch;
        let logits = model.forward(&x.index_select(0, &index))?;
        let loss = logits.cross_entropy_for_logits(&y.index_select(0, &index));
        for v in &variables {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        loss.backward();
        let grads: Vec<Tensor> = variables.iter().map(Tensor::grad).collect();
        sgd.step(&variables, &grads);
    }
    Ok(model.flat() - global)
}
