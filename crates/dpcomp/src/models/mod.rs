//! A model zoo: the four models of Lin 2022's tasks (their settings are the lab's), built
//! only from layers whose per-sample gradients can be taken (no fused LSTM, no BatchNorm).

pub mod bert;
pub mod cifar_cnn;
pub mod resnet18;
pub mod surnames_lstm;

use crate::data::Features;
use crate::error::{Error, Result};
use crate::nn::Ctx;
use tch::{nn, Kind, Tensor};

pub use bert::{BertClassifier, BertConfig};
pub use cifar_cnn::CifarCnn;
pub use resnet18::ResNet18;
pub use surnames_lstm::SurnamesLstm;

/// A classifier: features -> logits [B, classes].
///
/// A model of one's own implements `forward` and `var_store`; the parameter lists and counts
/// come from its store. Here a logistic regression on rows of 4 features:
///
/// ```
/// use dpcomp::prelude::*;
/// use tch::{nn, Device, Kind, Tensor};
///
/// struct Logistic {
///     vs: nn::VarStore,
///     linear: Linear,
/// }
///
/// impl Model for Logistic {
///     fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
///         let Features::Rows(x) = features else {
///             return Err(Error::bad_value("features", "expected rows [B, 4]"));
///         };
///         self.linear.forward(x, ctx)
///     }
///     fn var_store(&self) -> &nn::VarStore {
///         &self.vs
///     }
/// }
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let linear = Linear::new(&(vs.root() / "linear"), 4, 2, LinearConfig::default())?;
/// let model = Logistic { vs, linear };
/// let rows = Features::Rows(Tensor::ones([3, 4], (Kind::Float, Device::Cpu)));
/// assert_eq!(model.forward(&rows, &mut Ctx::eval())?.size(), [3, 2]);
/// assert_eq!(model.trainable_parameter_count(), 4 * 2 + 2);
/// let names: Vec<String> = model.trainable_variables().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["linear.bias", "linear.weight"]); // sorted by name
/// let images = Features::Images(Tensor::zeros([1, 3, 32, 32], (Kind::Float, Device::Cpu)));
/// assert!(model.forward(&images, &mut Ctx::eval()).is_err());
/// # Ok::<(), dpcomp::Error>(())
/// ```
pub trait Model {
    /// Logits [B, classes]. Features of another kind or shape than the model reads are an error
    /// (checked from the tensors' sizes only, so no device synchronisation per step).
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor>;

    /// Checks a whole split's features once, before any step: their kind and shape, and the
    /// values a forward pass would index with (token ids within the vocabulary, lengths within
    /// the sequence). Out-of-range indices make LibTorch abort on CPU and assert on CUDA, so
    /// they are refused here with an error instead. The default accepts everything; the
    /// paper's models override it.
    fn check_features(&self, _features: &Features) -> Result<()> {
        Ok(())
    }

    /// The store that owns every parameter (trainable or frozen), for saving and loading.
    fn var_store(&self) -> &nn::VarStore;

    /// Each example's loss, \[B\]: what DP-SGD clips the gradient of. By default the
    /// cross-entropy of `output` [B, classes] against `labels`; a model whose output is not one
    /// row of class scores per example overrides it, with `mean_loss` and `correct` (a language
    /// model: each sequence's mean cross-entropy of its next tokens).
    fn example_losses(&self, output: &Tensor, _features: &Features, labels: &Tensor) -> Tensor {
        output.cross_entropy_loss::<Tensor>(labels, None, tch::Reduction::None, -100, 0.0)
    }

    /// The mean of `example_losses` over the batch, the non-private step's loss.
    fn mean_loss(&self, output: &Tensor, _features: &Features, labels: &Tensor) -> Tensor {
        output.cross_entropy_loss::<Tensor>(labels, None, tch::Reduction::Mean, -100, 0.0)
    }

    /// The sum over the batch of each example's accuracy, a float64 scalar on the output's
    /// device (no host read): by default how many examples' arg-max class is their label.
    fn correct(&self, output: &Tensor, _features: &Features, labels: &Tensor) -> Tensor {
        output
            .argmax(-1, false)
            .eq_tensor(labels)
            .sum(Kind::Int64)
            .to_kind(Kind::Double)
    }

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

/// The error for features of another kind than `model` reads (`expected`).
pub(crate) fn wrong_features(model: &str, expected: &str, features: &Features) -> Error {
    let got = match features {
        Features::Tokens { .. } => "token sequences",
        Features::Images(_) => "images",
        Features::Rows(_) => "rows of a model of one's own",
        Features::TextPair { .. } => "sentence pairs",
    };
    Error::bad_value(
        format!("{model} input"),
        format!("given {got}, expected {expected}"),
    )
}

/// Images must be [B, 3, 32, 32] (the CIFAR size the models' layers are built for).
pub(crate) fn check_image_shape(model: &str, images: &Tensor) -> Result<()> {
    let size = images.size();
    if size.len() != 4 || size[1..] != [3, 32, 32] {
        return Err(Error::bad_value(
            format!("{model} input"),
            format!("images of shape {size:?}, expected [batch, 3, 32, 32]"),
        ));
    }
    Ok(())
}

/// Padded sequences: `ids` [B, T] and `lengths` \[B\], both integer.
pub(crate) fn check_token_shape(model: &str, ids: &Tensor, lengths: &Tensor) -> Result<()> {
    let (ids_size, lengths_size) = (ids.size(), lengths.size());
    if ids_size.len() != 2 || lengths_size.len() != 1 || ids_size[0] != lengths_size[0] {
        return Err(Error::bad_value(
            format!("{model} input"),
            format!("token ids {ids_size:?} and lengths {lengths_size:?}, expected [batch, length] and [batch]"),
        ));
    }
    check_integer(model, "token ids", ids)?;
    check_integer(model, "lengths", lengths)
}

pub(crate) fn check_integer(model: &str, what: &str, values: &Tensor) -> Result<()> {
    match values.kind() {
        Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8 => Ok(()),
        kind => Err(Error::bad_value(
            format!("{model} input"),
            format!("{what} of kind {kind:?}, expected integers"),
        )),
    }
}

/// Every value of `values` lies in [low, high) (an empty tensor passes).
pub(crate) fn check_range(
    model: &str,
    what: &str,
    values: &Tensor,
    low: i64,
    high: i64,
) -> Result<()> {
    if values.numel() == 0 {
        return Ok(());
    }
    let (min, max) = (
        crate::host::i64_scalar(&values.min()),
        crate::host::i64_scalar(&values.max()),
    );
    if min < low || max >= high {
        return Err(Error::bad_value(
            format!("{model} input"),
            format!(
                "{what} range from {min} to {max}, expected {low} to {}",
                high - 1
            ),
        ));
    }
    Ok(())
}

/// Labels must be class indices in [0, classes): cross-entropy indexes with them.
pub fn check_labels(labels: &Tensor, classes: i64) -> Result<()> {
    if labels.dim() != 1 {
        return Err(Error::bad_value(
            "labels",
            format!("shape {:?}, expected [examples]", labels.size()),
        ));
    }
    check_integer("classifier", "labels", labels)?;
    check_range("classifier", "labels", labels, 0, classes)
}
