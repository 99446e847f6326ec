//! The training configuration's sections against the flat `config.toml` of every committed run
//! (issue 16): each reads, keeps every value it held, and round-trips through the sectioned form.

use dpcomp::config::{section_settings, TrainConfig, TOP_LEVEL_KEYS};
use std::path::{Path, PathBuf};

fn config_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            config_files(&path, out);
        } else if path.file_name().is_some_and(|n| n == "config.toml") {
            out.push(path);
        }
    }
}

/// The value under a dotted key (`privacy.noise_multiplier`) of a serialised configuration.
fn at<'a>(table: &'a toml::Table, dotted: &str) -> Option<&'a toml::Value> {
    match dotted.split_once('.') {
        None => table.get(dotted),
        Some((section, field)) => table.get(section)?.as_table()?.get(field),
    }
}

#[test]
fn every_committed_run_config_reads_keeps_its_values_and_round_trips() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/runs");
    let mut files = Vec::new();
    config_files(&root, &mut files);
    assert!(
        files.len() > 100,
        "expected the committed runs, found {}",
        files.len()
    );
    let settings = section_settings();
    let mut flat_files = 0;
    for path in &files {
        let config =
            TrainConfig::from_toml_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let written = config.to_toml();
        let again: TrainConfig =
            TrainConfig::from_table(toml::from_str(&written).unwrap(), "again").unwrap();
        assert_eq!(config, again, "{}", path.display());
        // The written form has the sections and no flat key of a section's setting.
        let written: toml::Table = toml::from_str(&written).unwrap();
        for section in [
            "data",
            "model",
            "optimizer",
            "privacy",
            "compression",
            "analysis",
        ] {
            assert!(
                written.get(section).is_some_and(|v| v.is_table()),
                "{section}"
            );
        }
        for key in written.keys() {
            assert!(
                TOP_LEVEL_KEYS.contains(&key.as_str()) || written[key].is_table(),
                "{}: flat key {key} written",
                path.display()
            );
        }
        // Every value the old file held is the value of its setting now.
        let old: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        if old.values().all(|v| !v.is_table()) {
            flat_files += 1;
        }
        for (key, value) in &old {
            if value.is_table() {
                continue;
            }
            let dotted = if TOP_LEVEL_KEYS.contains(&key.as_str()) {
                key.clone()
            } else {
                let flat = if key == "compressor_option" {
                    "compressor_options"
                } else {
                    key
                };
                settings
                    .iter()
                    .find(|(_, f)| *f == flat)
                    .unwrap_or_else(|| panic!("{}: {key} has no setting", path.display()))
                    .0
                    .clone()
            };
            assert_eq!(
                at(&written, &dotted),
                Some(value),
                "{}: {key}",
                path.display()
            );
        }
    }
    assert!(
        flat_files > 100,
        "the committed runs were written flat: {flat_files}"
    );
}

#[test]
fn a_config_missing_later_settings_takes_its_tasks_defaults() {
    // A run from before the optimiser, clipping and compression settings existed.
    let old = "task = \"surnames\"\nepochs = 3\nbatch_size = 16\nlr = 1.5\nmomentum = 0.0\n\
        max_grad_norm = 2.0\nseed = 4\ndevice = \"cpu\"\naugment = false\nmax_seq_len = 128\n\
        bert_dir = \"models/x\"\neval_batch_size = 256\nnoise_multiplier = 0.7\ndelta = 8e-5\n\
        sampling = \"poisson\"\naccountant = \"rdp\"\ngrad_sample = \"tape\"\n";
    let config = TrainConfig::from_table(toml::from_str(old).unwrap(), "old").unwrap();
    let mut want = TrainConfig::paper_defaults(dpcomp::config::Task::Surnames);
    want.epochs = 3;
    want.optimizer.batch_size = 16;
    want.optimizer.lr = 1.5;
    want.privacy.max_grad_norm = 2.0;
    want.seed = 4;
    want.device = dpcomp::config::DeviceChoice::Cpu;
    want.data.max_seq_len = 128;
    want.model.bert_dir = "models/x".into();
    want.data.eval_batch_size = 256;
    want.privacy.noise_multiplier = Some(0.7);
    // The old run recorded the RDP accountant, which it keeps (the default is PLD now).
    want.privacy.accountant = dpcomp::config::AccountantKind::Rdp;
    assert_eq!(config, want);
    let err = TrainConfig::from_table(
        toml::from_str("task = \"surnames\"\nsigma = 1\n").unwrap(),
        "run/config.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("run/config.toml") && err.contains("unknown setting `sigma`"),
        "{err}"
    );
}
