//! A Hugging Face model folder's weights: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` maps every tensor to (what `save_pretrained` writes past its
//! `max_shard_size`); and the writer of such a file, with the `{"format": "pt"}` metadata that
//! `transformers` checks before it loads one.

use crate::error::{Error, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// The file holding a single-file checkpoint's tensors.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Every tensor of a model folder, by its name in the file, with the file it came from (for the
/// errors that name a missing or misshapen tensor).
pub struct Checkpoint {
    tensors: HashMap<String, (Tensor, PathBuf)>,
    /// The folder read.
    pub dir: PathBuf,
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Reads `dir/model.safetensors`, or where that is absent, every shard that
    /// `dir/model.safetensors.index.json` names. Half-precision tensors stay as stored
    /// (`Checkpoint::take` converts).
    pub fn read(dir: &Path) -> Result<Self> {
        let single = dir.join(WEIGHTS_FILE);
        let index = dir.join(INDEX_FILE);
        let mut tensors = HashMap::new();
        if single.is_file() {
            read_file(&single, &mut tensors)?;
        } else if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            let parsed: Index = serde_json::from_str(&text).map_err(|e| {
                Error::bad_file(
                    &index,
                    format!("expected a safetensors index with a \"weight_map\": {e}"),
                )
            })?;
            let shards: std::collections::BTreeSet<&String> = parsed.weight_map.values().collect();
            for shard in shards {
                if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
                    return Err(Error::bad_file(
                        &index,
                        format!("weight_map names the shard {shard:?}: expected a file name in the model folder"),
                    ));
                }
                read_file(&dir.join(shard), &mut tensors)?;
            }
            for (name, shard) in &parsed.weight_map {
                if !tensors.contains_key(name) {
                    return Err(Error::bad_file(
                        dir.join(shard),
                        format!("holds no tensor {name}, which {INDEX_FILE} places there"),
                    ));
                }
            }
        } else {
            return Err(Error::bad_file(
                dir,
                format!("no {WEIGHTS_FILE} or {INDEX_FILE}: expected a Hugging Face model folder (save_pretrained's)"),
            ));
        }
        Ok(Checkpoint {
            tensors,
            dir: dir.to_path_buf(),
        })
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The names of every tensor, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Tensor `name` as float32 after checking that it has `shape` and finite values: an error
    /// naming the file and the tensor otherwise (or that it is missing).
    pub fn take(&self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let (tensor, file) = self.tensors.get(name).ok_or_else(|| {
            Error::bad_file(
                &self.dir,
                format!("missing tensor {name}: the checkpoint does not hold it"),
            )
        })?;
        crate::nn::check_loaded(file, name, tensor, shape)?;
        Ok(tensor.to_kind(Kind::Float))
    }
}

fn read_file(path: &Path, into: &mut HashMap<String, (Tensor, PathBuf)>) -> Result<()> {
    if !path.is_file() {
        return Err(Error::bad_file(
            path,
            "no such file; expected safetensors weights",
        ));
    }
    let tensors = Tensor::read_safetensors(path)
        .map_err(|e| Error::bad_file(path, format!("not a safetensors file: {e}")))?;
    for (name, tensor) in tensors {
        into.insert(name, (tensor, path.to_path_buf()));
    }
    Ok(())
}

/// Writes `tensors` (name, tensor) to `path` as safetensors with the `{"format": "pt"}` metadata
/// `transformers` and `peft` expect; each tensor is written contiguous, as float32 unless it is
/// an integer tensor.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let mut bytes: Vec<(String, Vec<u8>, Vec<usize>, Dtype)> = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let (tensor, dtype) = match tensor.kind() {
            Kind::Int64 => (tensor.contiguous(), Dtype::I64),
            _ => (tensor.to_kind(Kind::Float).contiguous(), Dtype::F32),
        };
        let tensor = tensor.to_device(tch::Device::Cpu);
        // Written once, at the end of a run: the one read of each tensor's bytes.
        let data = crate::host::to_bytes(&tensor);
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        bytes.push((name.clone(), data, shape, dtype));
    }
    let views = bytes
        .iter()
        .map(|(name, data, shape, dtype)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|view| (name.as_str(), view))
                .map_err(|e| Error::bad_value(name.clone(), format!("cannot be written: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let serialized = safetensors::tensor::serialize(views, &metadata)
        .map_err(|e| Error::bad_file(path, format!("cannot serialise the tensors: {e}")))?;
    crate::run_folder::replace(path, &serialized)
}
