//! The IDX format of MNIST and Fashion-MNIST (LeCun's `train-images-idx3-ubyte` files, gzipped or
//! not): a big-endian header `0x00 0x00 <type> <dims>`, then one big-endian u32 per dimension,
//! then the values. Only unsigned bytes (type 0x08) occur in these datasets and only those are
//! read. Fashion-MNIST comes from the Debian package `dataset-fashion-mnist`, which installs the
//! four official files under `/usr/share/datasets/fashion-mnist/`.

use crate::error::{Error, Result};
use flate2::read::GzDecoder;
use std::io::Read;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// Where the Debian package puts the files.
pub const FASHION_MNIST_SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// An IDX array of unsigned bytes: its shape and values in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IdxArray {
    pub shape: Vec<usize>,
    pub values: Vec<u8>,
}

/// Parses IDX bytes (already decompressed). `path` only names the file in errors.
pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<IdxArray> {
    if bytes.len() < 4 {
        return Err(Error::bad_file(
            path,
            format!(
                "{} bytes: an IDX file starts with a 4-byte magic number",
                bytes.len()
            ),
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(Error::bad_file(
            path,
            format!(
                "magic number {:02x}{:02x}{:02x}{:02x}: expected 0000 then the type and dimension bytes (not an IDX file?)",
                bytes[0], bytes[1], bytes[2], bytes[3]
            ),
        ));
    }
    if bytes[2] != 0x08 {
        return Err(Error::bad_file(
            path,
            format!(
                "value type 0x{:02x}: expected 0x08 (unsigned byte)",
                bytes[2]
            ),
        ));
    }
    let dims = bytes[3] as usize;
    if dims == 0 || bytes.len() < 4 + 4 * dims {
        return Err(Error::bad_file(
            path,
            format!(
                "{dims} dimensions in {} bytes: header truncated",
                bytes.len()
            ),
        ));
    }
    let shape: Vec<usize> = (0..dims)
        .map(|d| {
            let at = 4 + 4 * d;
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
        })
        .collect();
    let expected: usize = shape.iter().product();
    let body = &bytes[4 + 4 * dims..];
    if body.len() != expected {
        return Err(Error::bad_file(
            path,
            format!(
                "shape {shape:?} needs {expected} bytes of values, the file has {}",
                body.len()
            ),
        ));
    }
    Ok(IdxArray {
        shape,
        values: body.to_vec(),
    })
}

/// Reads an IDX file, decompressing it when its name ends in `.gz`.
pub(crate) fn read(path: &Path) -> Result<IdxArray> {
    let raw = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| Error::bad_file(path, format!("not a valid gzip stream: {e}")))?;
        out
    } else {
        raw
    };
    parse(&bytes, path)
}

/// Images uint8 [N, 1, 28, 28] and labels int64 \[N\] of one split.
#[derive(Debug)]
pub struct ImageSplit {
    /// The images, [N, 1, 28, 28] uint8.
    pub images: Tensor,
    /// Their labels in 0..10, `[N]` int64.
    pub labels: Tensor,
}

/// The MNIST-family folder: `--data-dir/fashion-mnist` when it exists, else the Debian package's.
pub fn fashion_mnist_dir(data_dir: &Path) -> PathBuf {
    let local = data_dir.join("fashion-mnist");
    if local.is_dir() {
        local
    } else {
        PathBuf::from(FASHION_MNIST_SYSTEM_DIR)
    }
}

/// Reads `<prefix>-images-idx3-ubyte[.gz]` and `<prefix>-labels-idx1-ubyte[.gz]` from `dir`
/// (`prefix` is `train` or `t10k`), checking that the counts agree and labels are below 10.
pub fn read_split(dir: &Path, prefix: &str) -> Result<ImageSplit> {
    let find = |stem: &str| -> Result<PathBuf> {
        for name in [format!("{stem}.gz"), stem.to_string()] {
            let path = dir.join(name);
            if path.is_file() {
                return Ok(path);
            }
        }
        Err(Error::bad_file(
            dir.join(format!("{stem}.gz")),
            "missing; expected the official MNIST-format files (install the Debian package dataset-fashion-mnist, or put them in <data-dir>/fashion-mnist)",
        ))
    };
    let images_path = find(&format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find(&format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read(&images_path)?;
    let labels = read(&labels_path)?;
    if images.shape.len() != 3 {
        return Err(Error::bad_file(
            &images_path,
            format!(
                "shape {:?}: expected 3 dimensions [N, rows, columns]",
                images.shape
            ),
        ));
    }
    if labels.shape.len() != 1 || labels.shape[0] != images.shape[0] {
        return Err(Error::bad_file(
            &labels_path,
            format!(
                "shape {:?}: expected one label per image ({} images in {})",
                labels.shape,
                images.shape[0],
                images_path.display()
            ),
        ));
    }
    if let Some(bad) = labels.values.iter().find(|&&l| l >= 10) {
        return Err(Error::bad_file(
            &labels_path,
            format!("label {bad}: expected 0..=9"),
        ));
    }
    let (n, h, w) = (
        images.shape[0] as i64,
        images.shape[1] as i64,
        images.shape[2] as i64,
    );
    Ok(ImageSplit {
        images: Tensor::from_slice(&images.values).view([n, 1, h, w]),
        labels: Tensor::from_slice(&labels.values).to_kind(Kind::Int64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u8, shape: &[u32]) -> Vec<u8> {
        let mut bytes = vec![0, 0, kind, shape.len() as u8];
        for d in shape {
            bytes.extend_from_slice(&d.to_be_bytes());
        }
        bytes
    }

    #[test]
    fn parses_and_rejects() {
        let path = Path::new("x.idx");
        let mut ok = header(8, &[2, 3]);
        ok.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
        let a = parse(&ok, path).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.values, vec![1, 2, 3, 4, 5, 6]);
        let bad_magic = [vec![1u8, 0], ok[2..].to_vec()].concat();
        let e = parse(&bad_magic, path).unwrap_err().to_string();
        assert!(e.contains("magic number"), "{e}");
        let floats = [header(0x0d, &[2, 3]), vec![0; 6]].concat();
        assert!(parse(&floats, path)
            .unwrap_err()
            .to_string()
            .contains("0x08"));
        let short = [header(8, &[2, 3]), vec![0; 5]].concat();
        let e = parse(&short, path).unwrap_err().to_string();
        assert!(e.contains("needs 6 bytes") && e.contains("has 5"), "{e}");
    }
}
