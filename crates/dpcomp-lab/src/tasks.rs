//! The papers' four tasks (Lin 2022): their names, their settings (`paper_defaults`), and the
//! `TaskSource` that makes their data and models for the framework's `Trainer`.

use dpcomp::config::{TrainConfig, TrainOverrides};
use dpcomp::data::{self, cifar, names, TaskData};
use dpcomp::error::{Error, Result};
use dpcomp::models::{BertClassifier, CifarCnn, Model, ResNet18, SurnamesLstm};
use dpcomp::train::builder::TrainerBuilder;
use dpcomp::train::parts::TaskSource;
use dpcomp::train::{DataEdit, Trainer};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tch::Device;

/// The paper's four tasks (Lin 2022).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Surnames: an LSTM classifying names by origin (18 classes).
    Surnames,
    /// CIFAR-10: the paper's CNN on 32x32 images (10 classes).
    Cifar10,
    /// CIFAR-100: ResNet-18 (100 classes).
    Cifar100,
    /// SNLI: a BERT encoder on sentence pairs (3 classes; needs the `text` feature).
    Snli,
}

impl Task {
    /// Every task.
    pub const ALL: [Task; 4] = [Task::Surnames, Task::Cifar10, Task::Cifar100, Task::Snli];

    /// The name `--task` and `config.toml` use ("surnames", "cifar10", ...).
    pub fn name(self) -> &'static str {
        match self {
            Task::Surnames => "surnames",
            Task::Cifar10 => "cifar10",
            Task::Cifar100 => "cifar100",
            Task::Snli => "snli",
        }
    }

    /// The task named `name`, if it is one of the four.
    pub fn from_name(name: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The task a configuration names, or an error naming the four.
    pub fn of(config: &TrainConfig) -> Result<Task> {
        Task::from_name(&config.task).ok_or_else(|| unknown(&config.task))
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn unknown(name: &str) -> Error {
    Error::bad_value(
        "task",
        format!(
            "{name:?}: expected one of surnames, cifar10, cifar100, snli (a model of one's own is \
             trained by the program that builds it: `TrainerBuilder::model`)"
        ),
    )
}

/// The paper's settings for `task`: learning rate, batch size, epochs, clipping radius and
/// δ (Lin 2022), the rest the sections' defaults.
pub fn paper_defaults(task: Task) -> TrainConfig {
    let (lr, batch_size, epochs, max_grad_norm) = match task {
        Task::Surnames => (2.0, 32, 100, 3.0),
        Task::Cifar10 => (0.1, 128, 100, 5.0),
        Task::Snli => (0.05, 32, 1, 21.0),
        Task::Cifar100 => (1.0, 64, 100, 1000.0),
    };
    let mut config = TrainConfig::new(task.name());
    config.epochs = epochs;
    config.optimizer.lr = lr;
    config.optimizer.batch_size = batch_size;
    config.privacy.max_grad_norm = max_grad_norm;
    config.privacy.delta = match task {
        Task::Surnames => 8e-5,
        Task::Cifar10 | Task::Cifar100 => 1e-5,
        Task::Snli => 1.0 / 549_361.0,
    };
    config.data.eval_batch_size = if task == Task::Snli { 128 } else { 1024 };
    config
}

/// The defaults of the task named `name`: the paper's for one of the four, `TrainConfig::new`'s
/// for a name of one's own.
pub fn defaults(name: &str) -> TrainConfig {
    match Task::from_name(name) {
        Some(task) => paper_defaults(task),
        None => TrainConfig::new(name),
    }
}

/// The paper's defaults of the task named `name`, or an error naming the four tasks.
pub fn known_defaults(name: &str) -> Result<TrainConfig> {
    Task::from_name(name)
        .map(paper_defaults)
        .ok_or_else(|| unknown(name))
}

/// The paper's defaults for the task the settings name (one of the four), then the settings.
pub fn resolve(overrides: TrainOverrides) -> Result<TrainConfig> {
    overrides.resolve_over(known_defaults)
}

/// A run's `config.toml` (or any settings file of that form), read with the paper's defaults
/// for what it leaves out.
pub fn config_from_file(path: &Path) -> Result<TrainConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
    TrainConfig::from_table_over(table, &path.display().to_string(), defaults)
}

/// The four tasks as the framework's `TaskSource`: their data from the data folder, their
/// models with fresh weights seeded from `config.seed`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PaperTasks;

impl PaperTasks {
    /// The source, shared, for `TrainerBuilder::tasks` and `train_in_threads`.
    pub fn shared() -> Arc<dyn TaskSource> {
        Arc::new(PaperTasks)
    }
}

impl TaskSource for PaperTasks {
    fn prepare(
        &self,
        config: &TrainConfig,
        edit: Option<DataEdit>,
    ) -> Result<(Box<dyn Model>, TaskData)> {
        let task = Task::of(config)?;
        let device = config.device.device()?;
        let data = load_data(config)?;
        let data = match edit {
            Some(edit) => edit(data)?,
            None => data,
        };
        tch::manual_seed(config.seed as i64);
        let classes = data.classes.len() as i64;
        let bert_dir = match task {
            Task::Snli => resolve_bert_dir(&config.model.bert_dir)?,
            _ => config.model.bert_dir.clone(),
        };
        let fine_tuning = config.model.fine_tuning_mode()?;
        let model = build_model(task, classes, device, &bert_dir, &fine_tuning)?;
        Ok((model, data))
    }

    fn data_source(&self, config: &TrainConfig) -> String {
        format!(
            "{}'s data in {}",
            config.task,
            data::data_dir(config.data.data_dir.as_deref()).display()
        )
    }
}

/// Device, data (on the device when it fits) and a freshly initialised model (seeded with
/// `config.seed`) for a configuration, checked against each other as the trainer checks them.
pub fn prepare(config: &TrainConfig) -> Result<(Device, TaskData, Box<dyn Model>)> {
    let (model, data) = PaperTasks.prepare(config, None)?;
    let device = config.device.device()?;
    dpcomp::train::check_data(model.as_ref(), &data, data.classes.len() as i64)?;
    Ok((device, dpcomp::train::hold_on_device(data, device), model))
}

/// Loads the task's train and test splits from the data folder, applying `limit_train` and
/// `limit_test`.
pub fn load_data(config: &TrainConfig) -> Result<TaskData> {
    let root = data::data_dir(config.data.data_dir.as_deref());
    let data = match Task::of(config)? {
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
            let limits = dpcomp::models::BertConfig::from_file(&config_path)?.encoder_limits(&config_path);
            data::snli::load(
                &root.join("snli_1.0"),
                &bert_dir,
                config.data.max_seq_len,
                &limits,
            )?
        }
        #[cfg(not(feature = "text"))]
        Task::Snli => {
            return Err(Error::bad_value(
                "task",
                "snli needs dpcomp's `text` feature (the BERT tokenizer): add `features = [\"text\"]` to the dependency",
            ))
        }
    };
    Ok(data.limited(config.data.limit_train, config.data.limit_test))
}

/// The BERT folder: `dir` itself when absolute or present from the working directory; a relative
/// `dir` (the default `models/all-MiniLM-L6-v2`) is also looked for in the project folder the
/// binary was built in (`scripts/setup.sh` installs it there) and beside the binary's
/// `target/<profile>/`, so `dpcomp` works from any working directory. The error lists every
/// place it looked.
pub fn resolve_bert_dir(dir: &Path) -> Result<PathBuf> {
    let mut candidates = vec![dir.to_path_buf()];
    if dir.is_relative() {
        candidates.push(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(dir),
        );
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
    Err(Error::bad_value(
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

/// The task's model with fresh weights (BERT: pretrained encoder, fresh head, training what
/// `fine_tuning` says) on `device`.
pub fn build_model(
    task: Task,
    classes: i64,
    device: Device,
    bert_dir: &Path,
    fine_tuning: &dpcomp::hf::FineTuning,
) -> Result<Box<dyn Model>> {
    Ok(match task {
        Task::Surnames => Box::new(SurnamesLstm::new(device, classes)?),
        Task::Cifar10 => Box::new(CifarCnn::new(device, classes)?),
        Task::Cifar100 => Box::new(ResNet18::new(device, classes)?),
        Task::Snli => Box::new(BertClassifier::from_pretrained_with(
            bert_dir,
            device,
            classes,
            fine_tuning,
        )?),
    })
}

/// A trainer whose run folder is `run_dir` and whose model and data are the papers' task the
/// settings name (`TrainerBuilder::tasks` with `PaperTasks`); then `config` or `resume`.
pub fn trainer(run_dir: impl AsRef<Path>) -> TrainerBuilder {
    Trainer::builder(run_dir).tasks(PaperTasks::shared())
}

/// A fresh run of one of the papers' tasks in `run_dir`, which must not hold another run's
/// checkpoint. Writes `config.toml` before anything else.
pub fn start(config: TrainConfig, run_dir: impl AsRef<Path>) -> Result<Trainer> {
    trainer(run_dir).config(config).build()
}

/// Continues the run in `run_dir` from its last checkpoint. `epochs`, when given, replaces the
/// saved epoch count (to extend a finished run).
pub fn resume(run_dir: impl AsRef<Path>, epochs: Option<usize>) -> Result<Trainer> {
    let changes = TrainOverrides {
        epochs,
        ..TrainOverrides::default()
    };
    trainer(run_dir).resume(changes).build()
}
