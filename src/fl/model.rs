//! The federated models. The paper's architectures are not in its text, so these are small
//! standard choices, documented here and in the README:
//!
//! - Fashion-MNIST: a LeNet-style CNN, Conv 5x5 1→8 → ReLU → MaxPool 2 → Conv 5x5 8→16 → ReLU →
//!   MaxPool 2 → Linear 256→10: 5,994 parameters. Small on purpose: under client-level DP the
//!   noise norm grows with √n, and the CPU profile trains it for thousands of client-rounds.
//! - Breast cancer: a one-hidden-layer MLP 30→32→2 with ReLU (1,058 parameters); `hidden = 0`
//!   gives logistic regression.
//!
//! The layers are dpcomp's own (`nn::Conv2d`, `nn::Linear`), the ones every private model is
//! built from; client-level DP clips whole updates, not per-sample gradients, so nothing is
//! recorded (`Ctx::eval`) and local training runs on autograd. Weights start as PyTorch's
//! layers do (uniform ±1/√fan_in, `nn::uniform_init`). The parameters are handled as one flat
//! vector (sorted by name), the thing FL sends.

use crate::nn::{Conv2d, Ctx, Linear};
use tch::{nn, Device, Kind, Tensor};

// One per model, so the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Net {
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

pub struct FlModel {
    vs: nn::VarStore,
    net: Net,
}

impl FlModel {
    /// The Fashion-MNIST CNN (inputs [B, 1, 28, 28]).
    pub fn fashion_cnn(device: Device) -> FlModel {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let net = Net::Cnn {
            conv1: Conv2d::new(&(&root / "conv1"), 1, 8, 5, 1, 0, true),
            conv2: Conv2d::new(&(&root / "conv2"), 8, 16, 5, 1, 0, true),
            fc: Linear::new(&(&root / "fc"), 256, 10, true),
        };
        FlModel { vs, net }
    }

    /// An MLP `inputs`→`hidden`→`classes` (logistic regression when `hidden` is 0).
    pub fn mlp(inputs: i64, hidden: i64, classes: i64, device: Device) -> FlModel {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let (hidden_layer, width) = if hidden > 0 {
            (
                Some(Linear::new(&(&root / "hidden"), inputs, hidden, true)),
                hidden,
            )
        } else {
            (None, inputs)
        };
        let out = Linear::new(&(&root / "out"), width, classes, true);
        FlModel {
            vs,
            net: Net::Mlp {
                hidden: hidden_layer,
                out,
            },
        }
    }

    /// Logits [B, classes].
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let ctx = &mut Ctx::eval();
        match &self.net {
            Net::Cnn { conv1, conv2, fc } => {
                let xs = conv1.forward(xs, ctx).relu().max_pool2d_default(2);
                let xs = conv2.forward(&xs, ctx).relu().max_pool2d_default(2);
                fc.forward(&xs.flatten(1, -1), ctx)
            }
            Net::Mlp { hidden, out } => match hidden {
                Some(h) => out.forward(&h.forward(xs, ctx).relu(), ctx),
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

    /// All parameters as one vector [n] (a copy).
    pub fn flat(&self) -> Tensor {
        let parts: Vec<Tensor> = self
            .variables()
            .iter()
            .map(|t| t.detach().reshape([-1]))
            .collect();
        Tensor::cat(&parts, 0)
    }

    /// Overwrites the parameters with `flat` [n].
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

    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    pub fn kind(&self) -> Kind {
        self.variables()[0].kind()
    }
}
