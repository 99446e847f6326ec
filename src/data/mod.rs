//! Datasets held in memory as tensors on the CPU, in the form each task's model reads, and batched
//! by index. Loaders read the official on-disk layouts (see `../shared/data/README.md`).

pub mod cifar;
pub mod fetch;
pub mod idx;
pub mod names;
pub mod partition;
pub mod sampler;
pub mod snli;

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// The inputs of one or many examples, in the form the task's model reads.
#[derive(Debug)]
pub enum Features {
    /// Byte sequences padded with 0: `ids` [N, T] int64 and true `lengths` [N] int64.
    Tokens { ids: Tensor, lengths: Tensor },
    /// Images [N, 3, 32, 32]: uint8 in a dataset, normalised float32 in a batch.
    Images(Tensor),
    /// BERT sentence pairs `[CLS] a [SEP] b [SEP]`: `ids`, `token_types` and `attention_mask`,
    /// each [N, T] int64, padded with 0 to the longest pair.
    TextPair {
        ids: Tensor,
        token_types: Tensor,
        attention_mask: Tensor,
    },
}

impl Features {
    /// Rows `index` (int64 [B]), with padding trimmed to the longest selected sequence.
    pub fn select(&self, index: &Tensor) -> Features {
        match self {
            Features::Tokens { ids, lengths } => {
                let lengths = lengths.index_select(0, index);
                let width = max_or_zero(&lengths);
                let ids = ids.index_select(0, index).narrow(1, 0, width);
                Features::Tokens { ids, lengths }
            }
            Features::Images(images) => Features::Images(images.index_select(0, index)),
            Features::TextPair {
                ids,
                token_types,
                attention_mask,
            } => {
                let attention_mask = attention_mask.index_select(0, index);
                let width = max_or_zero(&attention_mask.sum_dim_intlist(1, false, Kind::Int64));
                Features::TextPair {
                    ids: ids.index_select(0, index).narrow(1, 0, width),
                    token_types: token_types.index_select(0, index).narrow(1, 0, width),
                    attention_mask: attention_mask.narrow(1, 0, width),
                }
            }
        }
    }

    /// Rows `index` of features already on a device (no padding trimmed).
    pub fn select_on_device(&self, index: &Tensor) -> Features {
        match self {
            Features::Tokens { ids, lengths } => Features::Tokens {
                ids: ids.index_select(0, index),
                lengths: lengths.index_select(0, index),
            },
            Features::Images(images) => Features::Images(images.index_select(0, index)),
            Features::TextPair {
                ids,
                token_types,
                attention_mask,
            } => Features::TextPair {
                ids: ids.index_select(0, index),
                token_types: token_types.index_select(0, index),
                attention_mask: attention_mask.index_select(0, index),
            },
        }
    }

    pub fn to_device(&self, device: Device) -> Features {
        match self {
            Features::Tokens { ids, lengths } => Features::Tokens {
                ids: ids.to_device(device),
                lengths: lengths.to_device(device),
            },
            Features::Images(images) => Features::Images(images.to_device(device)),
            Features::TextPair {
                ids,
                token_types,
                attention_mask,
            } => Features::TextPair {
                ids: ids.to_device(device),
                token_types: token_types.to_device(device),
                attention_mask: attention_mask.to_device(device),
            },
        }
    }
}

/// Largest value of a CPU int64 tensor, 0 when it is empty (a Poisson batch may be).
fn max_or_zero(values: &Tensor) -> i64 {
    if values.numel() == 0 {
        0
    } else {
        values.max().int64_value(&[])
    }
}

/// How image batches are prepared: per-channel normalisation and optional augmentation
/// (random crop with 4-pixel zero padding and horizontal flip, training batches only).
#[derive(Debug, Clone)]
pub struct ImageTransform {
    pub mean: [f64; 3],
    pub std: [f64; 3],
    pub augment: bool,
}

impl ImageTransform {
    /// uint8 [B, 3, H, W] on `device` -> normalised float32, augmented when `train`.
    /// Randomness comes from LibTorch's generator (seeded per epoch by the trainer).
    pub fn apply(&self, images: &Tensor, train: bool) -> Tensor {
        let device = images.device();
        let mean = Tensor::from_slice(&self.mean)
            .to_kind(Kind::Float)
            .to_device(device)
            .view([1, 3, 1, 1]);
        let std = Tensor::from_slice(&self.std)
            .to_kind(Kind::Float)
            .to_device(device)
            .view([1, 3, 1, 1]);
        let xs = (images.to_kind(Kind::Float) / 255.0 - mean) / std;
        if train && self.augment {
            random_flip(&random_crop(&xs, 4))
        } else {
            xs
        }
    }
}

/// Zero-pad by `pad` on each side, then cut an HxW window at a random offset per example,
/// vectorised as two gathers (rows, then columns).
fn random_crop(xs: &Tensor, pad: i64) -> Tensor {
    let size = xs.size();
    let (b, c, h, w) = (size[0], size[1], size[2], size[3]);
    let device = xs.device();
    let padded = xs.constant_pad_nd([pad, pad, pad, pad]);
    let opts = (Kind::Int64, device);
    let dy = Tensor::randint(2 * pad + 1, [b, 1], opts);
    let dx = Tensor::randint(2 * pad + 1, [b, 1], opts);
    let rows = (dy + Tensor::arange(h, opts).view([1, h])).view([b, 1, h, 1]);
    let cols = (dx + Tensor::arange(w, opts).view([1, w])).view([b, 1, 1, w]);
    let rows = rows.expand([b, c, h, w + 2 * pad], false);
    let cut_rows = padded.gather(2, &rows, false);
    cut_rows.gather(3, &cols.expand([b, c, h, w], false), false)
}

fn random_flip(xs: &Tensor) -> Tensor {
    let b = xs.size()[0];
    let flip = Tensor::rand([b, 1, 1, 1], (Kind::Float, xs.device())).lt(0.5);
    xs.flip([3]).where_self(&flip, xs)
}

/// One split of a task's data: features in stored form, labels int64 [N].
#[derive(Debug)]
pub struct Dataset {
    pub features: Features,
    pub labels: Tensor,
    pub image_transform: Option<ImageTransform>,
}

/// A batch on the model's device, ready for `Model::forward`.
#[derive(Debug)]
pub struct Batch {
    pub features: Features,
    pub labels: Tensor,
}

impl Batch {
    pub fn len(&self) -> i64 {
        self.labels.size()[0]
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Dataset {
    pub fn len(&self) -> i64 {
        self.labels.size()[0]
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Examples `index` (CPU int64 [B]) moved to `device` and transformed (`train` enables
    /// augmentation where configured).
    pub fn batch(&self, index: &Tensor, device: Device, train: bool) -> Batch {
        let features = self.features.select(index).to_device(device);
        let features = match (&self.image_transform, features) {
            (Some(transform), Features::Images(images)) => {
                Features::Images(transform.apply(&images, train))
            }
            (_, features) => features,
        };
        Batch {
            features,
            labels: self.labels.index_select(0, index).to_device(device),
        }
    }

    /// The first `n` examples (for `--limit-train`); all of them when `n` exceeds the size.
    pub fn truncate(self, n: i64) -> Dataset {
        if n >= self.len() {
            return self;
        }
        let index = Tensor::arange(n, (Kind::Int64, Device::Cpu));
        Dataset {
            features: self.features.select(&index),
            labels: self.labels.narrow(0, 0, n),
            image_transform: self.image_transform,
        }
    }
}

/// A task's train and test splits plus the names of its classes.
#[derive(Debug)]
pub struct TaskData {
    pub train: Dataset,
    pub test: Dataset,
    pub classes: Vec<String>,
}

/// Resolves the data directory: the flag, else `DPCOMP_DATA`, else `data/`.
pub fn data_dir(flag: Option<&Path>) -> PathBuf {
    match flag {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os("DPCOMP_DATA")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("data")),
    }
}

pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

pub(crate) fn require_dir(path: &Path, what: &str) -> Result<()> {
    if path.is_dir() {
        Ok(())
    } else {
        Err(Error::bad_file(
            path,
            format!(
                "no such folder; expected {what} (set --data-dir or DPCOMP_DATA, or run `dpcomp data fetch`)"
            ),
        ))
    }
}
