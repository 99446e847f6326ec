//! Datasets held in memory as tensors on the CPU, in the form each task's model reads, and batched
//! by index. Loaders read the official on-disk layouts (see `data/README.md`).

pub mod cifar;
#[cfg(feature = "fetch")]
pub mod fetch;
pub mod flchain;
pub mod idx;
pub mod names;
pub mod partition;
pub mod preprocess;
pub mod sampler;
#[cfg(feature = "text")]
pub mod snli;
pub mod tabular;

/// SNLI's longest WordPiece pair kept by default (`data.max_seq_len`).
pub const SNLI_DEFAULT_MAX_LEN: usize = 128;

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// A change to a built-in task's loaded data before training (`TrainerBuilder::edit_data`).
pub type DataEdit = Box<dyn FnOnce(TaskData) -> Result<TaskData>>;

/// The inputs of one or many examples, in the form the task's model reads.
#[derive(Debug)]
pub enum Features {
    /// Byte sequences padded with 0: `ids` [N, T] int64 and true `lengths` \[N\] int64.
    Tokens {
        /// Byte ids, [N, T] int64, 0 past each example's length.
        ids: Tensor,
        /// Each example's true length (1..=T), `[N]` int64.
        lengths: Tensor,
    },
    /// Images [N, 3, 32, 32]: uint8 in a dataset, normalised float32 in a batch.
    Images(Tensor),
    /// BERT sentence pairs `[CLS] a [SEP] b [SEP]`: `ids`, `token_types` and `attention_mask`,
    /// each [N, T] int64, padded with 0 to the longest pair.
    TextPair {
        /// WordPiece ids, [N, T].
        ids: Tensor,
        /// Segment ids: 0 for `[CLS] a [SEP]`, 1 for `b [SEP]`, [N, T].
        token_types: Tensor,
        /// 1 on real tokens, 0 on padding, [N, T].
        attention_mask: Tensor,
    },
    /// A model of one's own: any tensor with one example per index of its first dimension
    /// (tabular rows [N, d], sequences of vectors [N, T, d], ...), float or integer, batched as
    /// it is (no padding is trimmed, no transform applied).
    Rows(Tensor),
}

impl Features {
    /// Rows `index` (CPU int64 \[B\]) of CPU features, with padding trimmed to the longest
    /// selected sequence.
    pub fn select(&self, index: &Tensor) -> Features {
        let width = self
            .widths()
            .map(|w| max_or_zero(&w.index_select(0, index)));
        self.select_trimmed(index, width)
    }

    /// The true width of every example, for sequences (token lengths, or attention-mask sums);
    /// `None` for images.
    pub fn widths(&self) -> Option<Tensor> {
        match self {
            Features::Tokens { lengths, .. } => Some(lengths.shallow_clone()),
            Features::Images(_) | Features::Rows(_) => None,
            Features::TextPair { attention_mask, .. } => {
                Some(attention_mask.sum_dim_intlist(1, false, Kind::Int64))
            }
        }
    }

    /// Rows `index` (on the features' device), sequences cut to `width` columns (every column
    /// when `None`). Reads no tensor value, so on an accelerator it queues work without a sync.
    pub fn select_trimmed(&self, index: &Tensor, width: Option<i64>) -> Features {
        let cut = |t: Tensor| match width {
            Some(w) => t.narrow(1, 0, w),
            None => t,
        };
        match self {
            Features::Tokens { ids, lengths } => Features::Tokens {
                ids: cut(ids.index_select(0, index)),
                lengths: lengths.index_select(0, index),
            },
            Features::Images(images) => Features::Images(images.index_select(0, index)),
            Features::Rows(rows) => Features::Rows(rows.index_select(0, index)),
            Features::TextPair {
                ids,
                token_types,
                attention_mask,
            } => Features::TextPair {
                ids: cut(ids.index_select(0, index)),
                token_types: cut(token_types.index_select(0, index)),
                attention_mask: cut(attention_mask.index_select(0, index)),
            },
        }
    }

    /// The same features copied to `device`.
    pub fn to_device(&self, device: Device) -> Features {
        match self {
            Features::Tokens { ids, lengths } => Features::Tokens {
                ids: ids.to_device(device),
                lengths: lengths.to_device(device),
            },
            Features::Images(images) => Features::Images(images.to_device(device)),
            Features::Rows(rows) => Features::Rows(rows.to_device(device)),
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

/// Largest value of an int64 tensor, 0 when it is empty (a Poisson batch may be). The trainer's
/// widths and batch indices live in host memory on every device, so reading them is not a
/// device read (`host::cpu_i64_scalar`); widths on an accelerator are read and counted.
fn max_or_zero(values: &Tensor) -> i64 {
    if values.numel() == 0 {
        0
    } else if values.device() == Device::Cpu {
        crate::host::cpu_i64_scalar(&values.max())
    } else {
        crate::host::i64_scalar(&values.max())
    }
}

/// How image batches are prepared: per-channel normalisation and optional augmentation
/// (random crop with 4-pixel zero padding and horizontal flip, training batches only).
#[derive(Debug, Clone)]
pub struct ImageTransform {
    /// Per-channel (R, G, B) mean subtracted from pixels scaled to [0, 1].
    pub mean: [f64; 3],
    /// Per-channel standard deviation the centred pixels are divided by.
    pub std: [f64; 3],
    /// Random crop and flip on training batches.
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

/// One split of a task's data: features in stored form, labels int64 \[N\].
#[derive(Debug)]
pub struct Dataset {
    /// Every example's inputs, N along the first dimension (images stay uint8 here).
    pub features: Features,
    /// Class indices in 0..classes, `[N]` int64.
    pub labels: Tensor,
    /// How `batch` turns stored images into model input (`None`: features as stored).
    pub image_transform: Option<ImageTransform>,
    /// Each example's true sequence width kept on the CPU once the features live on an
    /// accelerator (`to_device`), so that trimming a batch's padding reads no device value.
    pub host_widths: Option<Tensor>,
}

/// A batch on the model's device, ready for `Model::forward`.
#[derive(Debug)]
pub struct Batch {
    /// The examples' inputs, padding trimmed and images transformed.
    pub features: Features,
    /// Their class indices, `[B]` int64.
    pub labels: Tensor,
}

impl Batch {
    /// B, the number of examples (0 happens under Poisson sampling).
    pub fn len(&self) -> i64 {
        self.labels.size()[0]
    }
    /// Whether the batch has no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Dataset {
    /// N, the number of examples.
    pub fn len(&self) -> i64 {
        self.labels.size()[0]
    }
    /// Whether the split has no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A dataset held on the CPU (the loaders' form).
    pub fn new(
        features: Features,
        labels: Tensor,
        image_transform: Option<ImageTransform>,
    ) -> Dataset {
        Dataset {
            features,
            labels,
            image_transform,
            host_widths: None,
        }
    }

    /// Where the examples are held.
    pub fn device(&self) -> Device {
        self.labels.device()
    }

    /// Bytes of the stored features and labels.
    pub fn bytes(&self) -> u64 {
        let size = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        let features = match &self.features {
            Features::Tokens { ids, lengths } => size(ids) + size(lengths),
            Features::Images(images) | Features::Rows(images) => size(images),
            Features::TextPair {
                ids,
                token_types,
                attention_mask,
            } => size(ids) + size(token_types) + size(attention_mask),
        };
        features + size(&self.labels)
    }

    /// The same examples held on `device`: on an accelerator, batches are then gathered there
    /// with no host-to-device copy of examples per step. The sequence widths stay on
    /// the CPU (`host_widths`).
    pub fn to_device(self, device: Device) -> Dataset {
        if device == self.device() {
            return self;
        }
        let host_widths = match self.device() {
            Device::Cpu => self.features.widths(),
            _ => self.host_widths,
        };
        Dataset {
            features: self.features.to_device(device),
            labels: self.labels.to_device(device),
            image_transform: self.image_transform,
            host_widths: host_widths.map(|w| w.to_device(Device::Cpu)),
        }
    }

    /// Examples `index` (CPU int64 \[B\]) on `device`, transformed (`train` enables augmentation
    /// where configured). From a CPU dataset the rows are gathered on the CPU and copied; from a
    /// dataset already on `device` only the index travels, asynchronously, and the rows are
    /// gathered there.
    pub fn batch(&self, index: &Tensor, device: Device, train: bool) -> Batch {
        // The host path: a CPU dataset that does not keep its widths apart (every loader's
        // output). Otherwise the widths come from `host_widths` and the rows are gathered where
        // the examples are.
        let (features, labels) = if self.device() == Device::Cpu && self.host_widths.is_none() {
            (
                self.features.select(index).to_device(device),
                self.labels.index_select(0, index).to_device(device),
            )
        } else {
            let width = self
                .host_widths
                .as_ref()
                .map(|w| max_or_zero(&w.index_select(0, index)));
            let index = match self.device() {
                Device::Cpu => index.shallow_clone(),
                // Copied from pinned memory without waiting: the host does not stall on the queue.
                there => crate::host::upload(index, there),
            };
            (
                self.features.select_trimmed(&index, width),
                self.labels.index_select(0, &index),
            )
        };
        let features = match (&self.image_transform, features.to_device(device)) {
            (Some(transform), Features::Images(images)) => {
                Features::Images(transform.apply(&images, train))
            }
            (_, features) => features,
        };
        Batch {
            features,
            labels: labels.to_device(device),
        }
    }

    /// The first `n` examples (for `--limit-train`); all of them when `n` exceeds the size.
    /// Consumes the data set (no copy when it is kept whole); `truncated` leaves it as it is.
    pub fn truncate(self, n: i64) -> Dataset {
        if n >= self.len() {
            return self;
        }
        self.truncated(n)
    }

    /// The first `n` examples (all of them when `n` exceeds the size) as a data set of their
    /// own, leaving this one as it is: a subset for a quick run beside the whole set.
    ///
    /// ```
    /// use dpcomp::prelude::*;
    /// let rows = tch::Tensor::arange(10, (tch::Kind::Float, tch::Device::Cpu)).view([5, 2]);
    /// let labels = tch::Tensor::from_slice(&[0i64, 1, 0, 1, 1]);
    /// let whole = Dataset::new(Features::Rows(rows), labels, None);
    /// let subset = whole.truncated(3);
    /// assert_eq!((subset.len(), whole.len()), (3, 5));
    /// ```
    pub fn truncated(&self, n: i64) -> Dataset {
        let n = n.min(self.len());
        let index = Tensor::arange(n, (Kind::Int64, Device::Cpu));
        let host_widths = self.host_widths.as_ref().map(|w| w.narrow(0, 0, n));
        let batch_index = index.to_device(self.device());
        Dataset {
            features: self.features.select_trimmed(&batch_index, None),
            labels: self.labels.narrow(0, 0, n),
            image_transform: self.image_transform.clone(),
            host_widths,
        }
    }
}

/// A task's train and test splits plus the names of its classes.
#[derive(Debug)]
pub struct TaskData {
    /// The split training samples batches from.
    pub train: Dataset,
    /// The split evaluation reports accuracy on.
    pub test: Dataset,
    /// Class names, indexed by label.
    pub classes: Vec<String>,
}

impl TaskData {
    /// The first `limit_train` training and `limit_test` test examples (`None`: all), as
    /// `[data] limit_train` / `limit_test` ask of every run.
    pub fn limited(mut self, limit_train: Option<usize>, limit_test: Option<usize>) -> TaskData {
        if let Some(n) = limit_train {
            self.train = self.train.truncate(n as i64);
        }
        if let Some(n) = limit_test {
            self.test = self.test.truncate(n as i64);
        }
        self
    }
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
                "no such folder; expected {what} (set `data_dir` or DPCOMP_DATA, or run `dpcomp data fetch`)"
            ),
        ))
    }
}
