//! The federated models. The paper's architectures are not in its text, so these are small
//! standard choices, documented here and in the README:
//!
//! - Fashion-MNIST, `lenet` (the default): a LeNet-style CNN, Conv 5x5 1→8 → ReLU → MaxPool 2 →
//!   Conv 5x5 8→16 → ReLU → MaxPool 2 → Linear 256→10: 5,994 parameters. Small on purpose: under
//!   client-level DP the noise norm grows with √n, and the CPU profile trains it for thousands of
//!   client-rounds.
//! - Fashion-MNIST, `fedavg-cnn` (the size the paper's costs imply): McMahan et al.'s
//!   FedAvg CNN ("Communication-Efficient Learning of Deep Networks from Decentralized Data",
//!   2017), Conv 5x5 1→32 (padding 2) → ReLU → MaxPool 2 → Conv 5x5 32→64 (padding 2) → ReLU →
//!   MaxPool 2 → Linear 3136→512 → ReLU → Linear 512→10: n = 1,663,370 parameters. The derivation:
//!   the paper's cost is r · n · 32 · Round · C bits (Kerkouche et al. 2021, Table III's
//!   paragraph) and its only absolute figure is FL-STD-DP's 22.18 MB at round 25 with r = 1
//!   (same text, "only 22.18 Megabyte"), so n · C = 22.18e6 · 8 / (32 · 25) = 221,800 (± 50 from
//!   the rounding; MB = 10^6 bytes; with 2^20, 232,575). The text gives neither n nor C, nor any
//!   other absolute cost (its 95% and 80% savings are ratios of r and Round). The standard
//!   federated CNN's n with C = 2/15 gives n · C = 221,783, inside the rounding interval (Keras's
//!   MNIST example CNN, 1,199,882, would need C = 0.18485, no simple fraction; the FedAvg 2NN,
//!   199,210, would need C > 1): we take n = 1,663,370 and C = 2/15.
//! - Breast cancer: a one-hidden-layer MLP 30→32→2 with ReLU (1,058 parameters); `hidden = 0`
//!   gives logistic regression.
//!
//! The layers are dpcomp's own (`nn::Conv2d`, `nn::Linear`), the ones every private model is
//! built from; client-level DP clips whole updates, not per-sample gradients, so nothing is
//! recorded (`Ctx::eval`) and local training runs on autograd. Weights start as PyTorch's
//! layers do (uniform ±1/√fan_in, `nn::uniform_init`). The parameters are handled as one flat
//! vector (sorted by name), the thing FL sends. Each network is also a `Model`, so the
//! centralised `Trainer` trains it with per-sample clipping (the same layers, recording).

use crate::data::Features;
use crate::error::Result;
use crate::models::Model;
use crate::nn::{Conv2d, Conv2dConfig, Ctx, Linear, LinearConfig};
use tch::{nn, Device, Kind, Tensor};

// One per model, so the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Net {
    FedavgCnn {
        conv1: Conv2d,
        conv2: Conv2d,
        fc1: Linear,
        fc2: Linear,
    },
    Cnn {
        conv1: Conv2d,
        conv2: Conv2d,
        fc: Linear,
    },
    Mlp {
        hidden: Option<Linear>,
        out: Linear,
    },
}

/// A federated network (module docs) and its parameters, handled as the one flat vector \[n\]
/// that clients train from and send updates of (`flat`, `set_flat`).
pub struct FlModel {
    vs: nn::VarStore,
    net: Net,
}

/// The network of a federated run (`--model`); each dataset has its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum FlNet {
    /// Fashion-MNIST's LeNet-style CNN, 5,994 parameters (the default).
    Lenet,
    /// McMahan et al.'s FedAvg CNN, 1,663,370 parameters: the size the paper's costs imply.
    FedavgCnn,
    /// The tabular MLP (breast cancer's only network).
    Mlp,
}

impl FlNet {
    /// The network as `--model` and settings files name it: `lenet`, `fedavg-cnn` or `mlp`.
    pub fn name(self) -> &'static str {
        match self {
            FlNet::Lenet => "lenet",
            FlNet::FedavgCnn => "fedavg-cnn",
            FlNet::Mlp => "mlp",
        }
    }
}

impl FlModel {
    /// McMahan et al.'s FedAvg CNN for 28x28 images (module docs: 1,663,370 parameters).
    /// Its sizes are constants; the `Result` is the layer constructors'.
    pub fn fedavg_cnn(device: Device) -> Result<FlModel> {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let net = Net::FedavgCnn {
            conv1: Conv2d::new(
                &(&root / "conv1"),
                1,
                32,
                5,
                Conv2dConfig {
                    padding: 2,
                    ..Default::default()
                },
            )?,
            conv2: Conv2d::new(
                &(&root / "conv2"),
                32,
                64,
                5,
                Conv2dConfig {
                    padding: 2,
                    ..Default::default()
                },
            )?,
            fc1: Linear::new(&(&root / "fc1"), 7 * 7 * 64, 512, LinearConfig::default())?,
            fc2: Linear::new(&(&root / "fc2"), 512, 10, LinearConfig::default())?,
        };
        Ok(FlModel { vs, net })
    }

    /// The Fashion-MNIST CNN (inputs [B, 1, 28, 28]). Its sizes are constants; the `Result` is
    /// the layer constructors'.
    pub fn fashion_cnn(device: Device) -> Result<FlModel> {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let net = Net::Cnn {
            conv1: Conv2d::new(&(&root / "conv1"), 1, 8, 5, Conv2dConfig::default())?,
            conv2: Conv2d::new(&(&root / "conv2"), 8, 16, 5, Conv2dConfig::default())?,
            fc: Linear::new(&(&root / "fc"), 256, 10, LinearConfig::default())?,
        };
        Ok(FlModel { vs, net })
    }

    /// An MLP `inputs`→`hidden`→`classes` (logistic regression when `hidden` is 0).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) naming the layer's argument when
    /// `inputs` or `classes` is below 1 (`Linear in_dim: 0, expected at least 1`); a negative
    /// `hidden` counts as 0.
    pub fn mlp(inputs: i64, hidden: i64, classes: i64, device: Device) -> Result<FlModel> {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let (hidden_layer, width) = if hidden > 0 {
            (
                Some(Linear::new(
                    &(&root / "hidden"),
                    inputs,
                    hidden,
                    LinearConfig::default(),
                )?),
                hidden,
            )
        } else {
            (None, inputs)
        };
        let out = Linear::new(&(&root / "out"), width, classes, LinearConfig::default())?;
        Ok(FlModel {
            vs,
            net: Net::Mlp {
                hidden: hidden_layer,
                out,
            },
        })
    }

    /// Logits [B, classes]; an input of another shape than the network reads is an error.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.forward_in(xs, &mut Ctx::eval())
    }

    /// `forward` in the context `ctx` (which records what per-sample gradients need when the
    /// `Trainer` trains the network, `Model`).
    fn forward_in(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        match &self.net {
            Net::FedavgCnn {
                conv1,
                conv2,
                fc1,
                fc2,
            } => {
                let xs = conv1.forward(xs, ctx)?.relu().max_pool2d_default(2);
                let xs = conv2.forward(&xs, ctx)?.relu().max_pool2d_default(2);
                let xs = fc1.forward(&xs.flatten(1, -1), ctx)?.relu();
                fc2.forward(&xs, ctx)
            }
            Net::Cnn { conv1, conv2, fc } => {
                let xs = conv1.forward(xs, ctx)?.relu().max_pool2d_default(2);
                let xs = conv2.forward(&xs, ctx)?.relu().max_pool2d_default(2);
                fc.forward(&xs.flatten(1, -1), ctx)
            }
            Net::Mlp { hidden, out } => match hidden {
                Some(h) => out.forward(&h.forward(xs, ctx)?.relu(), ctx),
                None => out.forward(xs, ctx),
            },
        }
    }

    /// The parameters sorted by name.
    pub fn variables(&self) -> Vec<Tensor> {
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars.into_iter().map(|(_, t)| t).collect()
    }

    /// n, the number of parameters.
    pub fn parameter_count(&self) -> i64 {
        self.variables().iter().map(|t| t.numel() as i64).sum()
    }

    /// All parameters as one vector \[n\] (a copy).
    pub fn flat(&self) -> Tensor {
        let parts: Vec<Tensor> = self
            .variables()
            .iter()
            .map(|t| t.detach().reshape([-1]))
            .collect();
        Tensor::cat(&parts, 0)
    }

    /// Overwrites the parameters with `flat` \[n\].
    pub fn set_flat(&mut self, flat: &Tensor) {
        let _guard = tch::no_grad_guard();
        let mut offset = 0;
        for mut t in self.variables() {
            let n = t.numel() as i64;
            t.copy_(&flat.narrow(0, offset, n).view(t.size().as_slice()));
            offset += n;
        }
        assert_eq!(offset, flat.size()[0], "flat vector of the wrong length");
    }

    /// The store that holds the parameters (to save or load them by name, as safetensors).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// The parameters' element type (float32 as built).
    pub fn kind(&self) -> Kind {
        self.variables()[0].kind()
    }
}

/// A federated network is also a `Model` of one's own for the centralised `Trainer`
/// (`TrainerBuilder::model`): its features are `Features::Rows`, the tables' rows [B, d] or
/// Fashion-MNIST's images [B, 1, 28, 28] as `FlData` holds them; its parameters are the
/// store's, in `variables`' order.
impl Model for FlModel {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Rows(xs) = features else {
            return Err(crate::models::wrong_features(
                "federated network",
                "rows: a table's [batch, features] or images [batch, 1, 28, 28]",
                features,
            ));
        };
        self.forward_in(xs, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}
