//! Glue between a configuration and its task: which files to read, which model to build.

use crate::config::{Task, TrainConfig};
use crate::data::{self, cifar, names, TaskData};
use crate::error::Result;
use crate::models::{BertClassifier, CifarCnn, Model, ResNet18, SurnamesLstm};
use std::path::{Path, PathBuf};
use tch::Device;

/// Loads the task's train and test splits from the data folder, applying `limit_train`.
pub fn load_data(config: &TrainConfig) -> Result<TaskData> {
    let root = data::data_dir(config.data.data_dir.as_deref());
    let mut data = match config.task.builtin()? {
        Task::Surnames => names::load(&root.join("names"), config.seed)?,
        Task::Cifar10 => {
            cifar::load_cifar10(&root.join("cifar-10-batches-bin"), config.data.augment)?
        }
        Task::Cifar100 => cifar::load_cifar100(
            &root.join("cifar-100-binary"),
            cifar::Cifar100Labels::Fine,
            config.data.augment,
        )?,
        #[cfg(feature = "text")]
        Task::Snli => {
            let bert_dir = resolve_bert_dir(&config.model.bert_dir)?;
            let config_path = bert_dir.join("config.json");
            let limits = crate::models::BertConfig::from_file(&config_path)?.encoder_limits(&config_path);
            data::snli::load(
                &root.join("snli_1.0"),
                &bert_dir,
                config.data.max_seq_len,
                &limits,
            )?
        }
        #[cfg(not(feature = "text"))]
        Task::Snli => {
            return Err(crate::error::Error::bad_value(
                "task",
                "snli needs dpcomp's `text` feature (the BERT tokenizer): add `features = [\"text\"]` to the dependency",
            ))
        }
    };
    if let Some(n) = config.data.limit_train {
        data.train = data.train.truncate(n as i64);
    }
    if let Some(n) = config.data.limit_test {
        data.test = data.test.truncate(n as i64);
    }
    Ok(data)
}

/// Device, data and a freshly initialised model (seeded with `config.seed`) for a configuration.
pub fn prepare(config: &TrainConfig) -> Result<(Device, TaskData, Box<dyn Model>)> {
    prepare_edited(config, None)
}

/// `prepare` with the loaded data (on the host) passed through `edit` first.
pub fn prepare_edited(
    config: &TrainConfig,
    edit: Option<data::DataEdit>,
) -> Result<(Device, TaskData, Box<dyn Model>)> {
    let device = config.device.device()?;
    let data = load_data(config)?;
    let data = match edit {
        Some(edit) => edit(data)?,
        None => data,
    };
    tch::manual_seed(config.seed as i64);
    let classes = data.classes.len() as i64;
    let task = config.task.builtin()?;
    let bert_dir = match task {
        Task::Snli => resolve_bert_dir(&config.model.bert_dir)?,
        _ => config.model.bert_dir.clone(),
    };
    let model = build_model(task, classes, device, &bert_dir)?;
    check_data(model.as_ref(), &data, classes)?;
    Ok((device, hold_on_device(data, device), model))
}

/// Datasets up to this size are moved to an accelerator whole (SNLI's training split, the
/// largest, is about 1.7 GB; CIFAR's 150 MB).
pub const DEVICE_DATA_LIMIT_BYTES: u64 = 16 << 30;

/// On an accelerator, both splits are moved there once when together they fit
/// `DEVICE_DATA_LIMIT_BYTES`, so that no step copies examples from the host; on the
/// CPU nothing changes.
pub fn hold_on_device(data: TaskData, device: Device) -> TaskData {
    if device == Device::Cpu || data.train.bytes() + data.test.bytes() > DEVICE_DATA_LIMIT_BYTES {
        return data;
    }
    TaskData {
        train: data.train.to_device(device),
        test: data.test.to_device(device),
        classes: data.classes,
    }
}

/// Checks both splits against the model once, before any step: feature kinds, shapes and index
/// ranges (`Model::check_features`) and labels within the classes. LibTorch aborts the process on
/// an out-of-range index, so data that would reach one is refused here with its split named.
pub fn check_data(model: &dyn Model, data: &TaskData, classes: i64) -> Result<()> {
    for (split, dataset) in [("training", &data.train), ("test", &data.test)] {
        let named = |e: crate::error::Error| {
            crate::error::Error::bad_value(format!("{split} split"), e.to_string())
        };
        model.check_features(&dataset.features).map_err(named)?;
        crate::models::check_labels(&dataset.labels, classes).map_err(named)?;
    }
    Ok(())
}

/// The BERT folder: `dir` itself when absolute or present from the working directory; a relative
/// `dir` (the default `models/all-MiniLM-L6-v2`) is also looked for in the project folder the
/// binary was built in (`scripts/setup.sh` installs it there) and beside the binary's
/// `target/<profile>/`, so `dpcomp` works from any working directory. The error lists every
/// place it looked.
pub fn resolve_bert_dir(dir: &Path) -> Result<PathBuf> {
    let mut candidates = vec![dir.to_path_buf()];
    if dir.is_relative() {
        candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir));
        if let Some(project) = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent()?.parent()?.parent().map(Path::to_path_buf))
        {
            candidates.push(project.join(dir));
        }
    }
    candidates.dedup();
    if let Some(found) = candidates.iter().find(|c| c.join("config.json").is_file()) {
        return Ok(found.clone());
    }
    Err(crate::error::Error::bad_value(
        "model.bert_dir",
        format!(
            "no BERT folder (config.json, model.safetensors, tokenizer) at {}; run scripts/setup.sh or set `model.bert_dir`",
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// The task's model with fresh weights (BERT: pretrained encoder, fresh head) on `device`.
pub fn build_model(
    task: Task,
    classes: i64,
    device: Device,
    bert_dir: &Path,
) -> Result<Box<dyn Model>> {
    Ok(match task {
        Task::Surnames => Box::new(SurnamesLstm::new(device, classes)?),
        Task::Cifar10 => Box::new(CifarCnn::new(device, classes)?),
        Task::Cifar100 => Box::new(ResNet18::new(device, classes)?),
        Task::Snli => Box::new(BertClassifier::from_pretrained(bert_dir, device, classes)?),
    })
}
