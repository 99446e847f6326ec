//! CIFAR-10 and CIFAR-100 in their official binary layouts.
//!
//! - `cifar-10-batches-bin/`: `data_batch_1..5.bin`, `test_batch.bin`; records of 1 label byte +
//!   3,072 pixel bytes (1,024 R, 1,024 G, 1,024 B, row-major).
//! - `cifar-100-binary/`: `train.bin`, `test.bin`; records of coarse label byte + fine label byte +
//!   3,072 pixel bytes.

use super::{read_file, require_dir, Dataset, Features, ImageTransform, TaskData};
use crate::error::{Error, Result};
use std::path::Path;
use tch::{Kind, Tensor};

const PIXELS: usize = 3 * 32 * 32;

/// The per-channel (red, green, blue) mean of CIFAR-10's 50,000 training images' pixels in
/// [0, 1], which the loader's `ImageTransform` subtracts before dividing by [`CIFAR10_STD`]:
/// the values to normalise with when a model trained here is used elsewhere (torchvision's
/// `transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)` after `ToTensor()`).
pub const CIFAR10_MEAN: [f64; 3] = [0.4914, 0.4822, 0.4465];
/// The per-channel standard deviation of CIFAR-10's training pixels in [0, 1] (see
/// [`CIFAR10_MEAN`]).
pub const CIFAR10_STD: [f64; 3] = [0.2470, 0.2435, 0.2616];
/// The per-channel mean of CIFAR-100's 50,000 training images' pixels in [0, 1], as
/// [`CIFAR10_MEAN`] is CIFAR-10's.
pub const CIFAR100_MEAN: [f64; 3] = [0.5071, 0.4865, 0.4409];
/// The per-channel standard deviation of CIFAR-100's training pixels in [0, 1].
pub const CIFAR100_STD: [f64; 3] = [0.2673, 0.2564, 0.2762];

/// Which label of a CIFAR-100 record to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cifar100Labels {
    /// The 20 superclasses.
    Coarse,
    /// The 100 classes (the paper's task).
    Fine,
}

/// Reads one binary batch file: `label_bytes` leading bytes per record, of which byte
/// `label_offset` is the label (< `classes`), then the pixels. Returns (images u8 [N,3,32,32],
/// labels i64 [N]).
fn read_records(
    path: &Path,
    label_bytes: usize,
    label_offset: usize,
    classes: u8,
) -> Result<(Tensor, Tensor)> {
    let bytes = read_file(path)?;
    let record = label_bytes + PIXELS;
    if bytes.is_empty() {
        return Err(Error::bad_file(
            path,
            format!("the file is empty (0 bytes): expected {record}-byte records ({label_bytes} label byte(s) and a 32x32 colour image each); download it again"),
        ));
    }
    if bytes.len() % record != 0 {
        return Err(Error::bad_file(
            path,
            format!(
                "{} bytes is not a whole number of {record}-byte records (record {} is truncated)",
                bytes.len(),
                bytes.len() / record
            ),
        ));
    }
    let n = bytes.len() / record;
    let mut pixels = Vec::with_capacity(n * PIXELS);
    let mut labels = Vec::with_capacity(n);
    for (i, rec) in bytes.chunks_exact(record).enumerate() {
        let label = rec[label_offset];
        if label >= classes {
            return Err(Error::bad_file(
                path,
                format!("record {i}: label {label}, expected 0..{}", classes - 1),
            ));
        }
        labels.push(label as i64);
        pixels.extend_from_slice(&rec[label_bytes..]);
    }
    let images = Tensor::from_slice(&pixels).view([n as i64, 3, 32, 32]);
    Ok((images, Tensor::from_slice(&labels)))
}

/// Reads `files`, each expected to hold `official` records (the published files' counts). A file
/// cut at a record boundary is still a valid file, so a different count is not an error (tests
/// use tiny files in the official layout), but it is said: a run on a partial download would
/// otherwise quietly train on less data.
fn read_split(
    files: &[std::path::PathBuf],
    label_bytes: usize,
    offset: usize,
    classes: u8,
    official: i64,
) -> Result<(Tensor, Tensor)> {
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for path in files {
        let (x, y) = read_records(path, label_bytes, offset, classes)?;
        let records = y.size()[0];
        if records != official {
            log::warn!(
                "{}: {records} records, the official file has {official} (partial download?)",
                path.display()
            );
        }
        images.push(x);
        labels.push(y);
    }
    Ok((Tensor::cat(&images, 0), Tensor::cat(&labels, 0)))
}

fn task(
    train: (Tensor, Tensor),
    test: (Tensor, Tensor),
    mean: [f64; 3],
    std: [f64; 3],
    augment: bool,
    classes: Vec<String>,
) -> TaskData {
    let split = |(images, labels): (Tensor, Tensor), augment| {
        Dataset::new(
            Features::Images(images),
            labels.to_kind(Kind::Int64),
            Some(ImageTransform { mean, std, augment }),
        )
    };
    TaskData {
        train: split(train, augment),
        test: split(test, false),
        classes,
    }
}

/// `dir` is the `cifar-10-batches-bin` folder.
pub fn load_cifar10(dir: &Path, augment: bool) -> Result<TaskData> {
    require_dir(dir, "CIFAR-10's cifar-10-batches-bin folder")?;
    let train_files: Vec<_> = (1..=5)
        .map(|i| dir.join(format!("data_batch_{i}.bin")))
        .collect();
    let train = read_split(&train_files, 1, 0, 10, 10_000)?;
    let test = read_split(&[dir.join("test_batch.bin")], 1, 0, 10, 10_000)?;
    // CIFAR-10 has 10 classes whatever `batches.meta.txt` says: the file gives their names
    // only, and one with another number of lines is not used (its lines used to set the
    // number of outputs).
    let meta = dir.join("batches.meta.txt");
    let numbered = || (0..10).map(|i| i.to_string()).collect::<Vec<_>>();
    let classes = match std::fs::read_to_string(&meta) {
        Ok(text) => {
            let names: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            if names.len() == 10 {
                names
            } else {
                log::warn!(
                    "{}: {} class names, CIFAR-10 has 10; the classes are numbered instead",
                    meta.display(),
                    names.len()
                );
                numbered()
            }
        }
        Err(_) => numbered(),
    };
    Ok(task(
        train,
        test,
        CIFAR10_MEAN,
        CIFAR10_STD,
        augment,
        classes,
    ))
}

/// `dir` is the `cifar-100-binary` folder.
pub fn load_cifar100(dir: &Path, labels: Cifar100Labels, augment: bool) -> Result<TaskData> {
    require_dir(dir, "CIFAR-100's cifar-100-binary folder")?;
    let (offset, classes) = match labels {
        Cifar100Labels::Coarse => (0, 20u8),
        Cifar100Labels::Fine => (1, 100u8),
    };
    let train = read_split(&[dir.join("train.bin")], 2, offset, classes, 50_000)?;
    let test = read_split(&[dir.join("test.bin")], 2, offset, classes, 10_000)?;
    let names = (0..classes).map(|i| i.to_string()).collect();
    Ok(task(
        train,
        test,
        CIFAR100_MEAN,
        CIFAR100_STD,
        augment,
        names,
    ))
}
