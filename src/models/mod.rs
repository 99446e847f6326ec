//! The paper's four models (`../shared/papers/dp-and-gradient-compression.txt`, "tasks"), built
//! only from layers whose per-sample gradients can be taken (no fused LSTM, no BatchNorm).

pub mod bert;
pub mod cifar_cnn;
pub mod resnet18;
pub mod surnames_lstm;

use crate::data::Features;
use crate::nn::Ctx;
use tch::{nn, Tensor};

pub use bert::{BertClassifier, BertConfig};
pub use cifar_cnn::CifarCnn;
pub use resnet18::ResNet18;
pub use surnames_lstm::SurnamesLstm;

/// A classifier: features -> logits [B, classes].
pub trait Model {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Tensor;

    /// The store that owns every parameter (trainable or frozen), for saving and loading.
    fn var_store(&self) -> &nn::VarStore;

    /// The parameters that training updates, in a fixed order (sorted by name).
    fn trainable_variables(&self) -> Vec<(String, Tensor)> {
        let mut vars: Vec<(String, Tensor)> = self
            .var_store()
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }

    /// Number of trainable scalars.
    fn trainable_parameter_count(&self) -> i64 {
        self.trainable_variables()
            .iter()
            .map(|(_, t)| t.numel() as i64)
            .sum()
    }

    /// Number of all scalars, frozen ones included.
    fn parameter_count(&self) -> i64 {
        self.var_store()
            .variables()
            .values()
            .map(|t| t.numel() as i64)
            .sum()
    }
}

/// Panics with the variant's name: the models are only ever given their own task's features,
/// which the trainer guarantees.
pub(crate) fn wrong_features(model: &str, features: &Features) -> ! {
    let got = match features {
        Features::Tokens { .. } => "token sequences",
        Features::Images(_) => "images",
        Features::TextPair { .. } => "sentence pairs",
    };
    panic!("{model} was given {got}")
}
