//! The training configuration's sections against the flat `config.toml` of every committed run:
//! each reads, keeps every value it held, and round-trips through the sectioned form. Every
//! committed run's compressor (training and federated) reads as the same typed `Compressor`
//! from the older `rate`/`rank`/`options` form and from the table `config.toml` writes now,
//! with the same label, and every committed grid cell is still finished with the same settings.

use dpcomp::compress::encoding::Budget;
use dpcomp::compress::linear_sketch::Scheme;
use dpcomp::compress::{Compressor, Denoise, Dgc, PowerSgd, Qsgd, Scope, Setting, Sketch};
use dpcomp::config::{section_settings, CompressionSettings, TrainConfig, TOP_LEVEL_KEYS};
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
        // The framework reads a run's file over `TrainConfig::new`'s defaults, the lab over its
        // task's (the paper's): every committed file holds the settings where those differ, so
        // both read the same run.
        assert_eq!(
            dpcomp_lab::tasks::config_from_file(path).unwrap(),
            config,
            "{}: read differently over the paper's defaults",
            path.display()
        );
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
            // The compressor's older keys hold the same compressor in its own form.
            let compression = &config.compression;
            match (key.as_str(), value) {
                ("rate", toml::Value::Float(rate)) => {
                    assert_eq!(compression.rate(), *rate, "{}", path.display());
                    continue;
                }
                ("rank", toml::Value::Integer(rank)) => {
                    assert_eq!(compression.rank(), *rank, "{}", path.display());
                    continue;
                }
                ("compressor_options" | "compressor_option", toml::Value::Array(options)) => {
                    for option in options {
                        let setting: Setting = option.as_str().unwrap().parse().unwrap();
                        assert_eq!(
                            at(&written, &format!("compression.{}", setting.key)),
                            Some(&setting.value),
                            "{}: {option}",
                            path.display()
                        );
                    }
                    continue;
                }
                _ => {}
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
    let config = TrainConfig::from_table_over(
        toml::from_str(old).unwrap(),
        "old",
        dpcomp_lab::tasks::defaults,
    )
    .unwrap();
    let mut want = dpcomp_lab::tasks::paper_defaults(dpcomp_lab::Task::Surnames);
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

/// Every run folder at or below `dir`: one that holds a `config.toml` or a `config.json`.
fn run_folders(dir: &Path, out: &mut Vec<PathBuf>) {
    if dir.join("config.toml").is_file() || dir.join("config.json").is_file() {
        out.push(dir.to_path_buf());
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            run_folders(&path, out);
        }
    }
}

/// Every run folder under `experiments/` reads, training (`config.toml` with a `task`) and
/// federated (`config.toml` or an older `config.json`), and its settings written in today's
/// form read back equal, with the same compression label.
#[test]
fn every_run_folders_compressor_reads_and_round_trips_in_the_typed_form() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let mut folders = Vec::new();
    run_folders(&root, &mut folders);
    let (mut training, mut federated) = (0, 0);
    for dir in &folders {
        let toml_path = dir.join("config.toml");
        let is_training = std::fs::read_to_string(&toml_path)
            .ok()
            .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
            .is_some_and(|t| t.contains_key("task"));
        if is_training {
            training += 1;
            let config = TrainConfig::from_toml_file(&toml_path)
                .unwrap_or_else(|e| panic!("{}: {e}", toml_path.display()));
            let label = config.compression_label().unwrap();
            let written = config.to_toml();
            let again = TrainConfig::from_table(toml::from_str(&written).unwrap(), "again")
                .unwrap_or_else(|e| panic!("{}: {e}\n{written}", toml_path.display()));
            assert_eq!(again, config, "{}", toml_path.display());
            assert_eq!(again.compressor().unwrap(), config.compressor().unwrap());
            assert_eq!(again.compression_label().unwrap(), label, "{written}");
            // The written `[compression]` is today's form: no `options` list, and `rank` only
            // for PowerSGD.
            let table: toml::Table = toml::from_str(&written).unwrap();
            let compression = table["compression"].as_table().unwrap();
            assert!(!compression.contains_key("options"), "{written}");
            if compression.contains_key("rank") {
                assert_eq!(compression["kind"].as_str(), Some("powersgd"));
            }
        } else {
            federated += 1;
            let settings = dpcomp::fl::config_file::read(dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .unwrap_or_else(|| panic!("{}: no settings", dir.display()));
            settings.compressor().unwrap();
            let written = toml::to_string(&settings).unwrap();
            let again: dpcomp::fl::FlSettings = toml::from_str(&written).unwrap();
            assert_eq!(again, settings, "{}", dir.display());
            assert_eq!(
                again.scheme_label().unwrap(),
                settings.scheme_label().unwrap()
            );
        }
    }
    assert!(training > 300, "{training} training run folders");
    assert!(federated > 250, "{federated} federated run folders");
}

/// A few committed runs' compressors, exactly: what their older `[compression]` (or flat keys,
/// or `config.json`) said, as typed settings and as the label their tables show.
#[test]
fn committed_runs_read_as_their_exact_compressors() {
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/runs");
    let train = |folder: &str| {
        let config = TrainConfig::from_toml_file(&runs.join(folder).join("config.toml")).unwrap();
        (
            config.compressor().unwrap(),
            config.compression_label().unwrap(),
        )
    };
    // A flat file, a setting given at its default: the label keeps it.
    assert_eq!(
        train("cifar10_dgc_conventions/cpu/convention-bits"),
        (
            Compressor::Dgc(Dgc {
                rate: 256.0,
                budget: Budget::Bits,
                ..Default::default()
            }),
            "dgc x256 (budget=bits)".to_string()
        )
    );
    assert_eq!(
        train(
            "surnames_denoise/full/noise_multiplier-0.4_rate-1_seed-0_variant-denoise-model-clip"
        ),
        (
            Compressor::Denoise(Denoise {
                rate: 1.0,
                budget: Budget::Elements,
                scope: Scope::Model,
                clip: 3.0,
                ..Default::default()
            }),
            "denoise x1 (budget=elements, clip=3.0, scope=model)".to_string()
        )
    );
    assert_eq!(
        train("surnames_families/full/noise_multiplier-0.4_seed-0_variant-qsgd-s16"),
        (
            Compressor::Qsgd(Qsgd::default()),
            "qsgd (levels=16)".to_string()
        )
    );
    let (dgc, label) = train("cifar10_ablation/full/variant-s0.8-dgc-x256-no-ef-seed0");
    assert_eq!(
        dgc,
        Compressor::Dgc(Dgc {
            rate: 256.0,
            budget: Budget::Elements,
            residual_decay: 0.0,
            ..Default::default()
        })
    );
    assert_eq!(label, "dgc x256 (budget=elements, error_feedback=false)");
    let (powersgd, label) =
        train("surnames_ablation/full/noise_multiplier-0.4_seed-0_variant-powersgd-r16-no-ef");
    assert_eq!(
        powersgd,
        Compressor::PowerSgd(PowerSgd {
            rank: 16,
            residual_decay: 0.0,
            ..Default::default()
        })
    );
    assert_eq!(label, "powersgd r16 (error_feedback=false)");
    // A federated run's older `config.json` (scheme cs, ratio 0.05).
    let cs =
        dpcomp::fl::config_file::read(&runs.join("fl_scale/cpu/fashion-mnist/cs-r0.05-dp-m0-s0"))
            .unwrap()
            .unwrap();
    assert_eq!(
        cs.compression.compressor,
        Compressor::Sketch(Sketch::new(Scheme::Cs, 20.0))
    );
    // The older and today's forms of one `[compression]` table are one compressor; the new
    // one is written back as it was read.
    let old: CompressionSettings = toml::from_str(
        "kind = \"denoise\"\nrate = 16.0\nrank = 1\noptions = [\"budget=elements\", \"scope=model\", \"clip=3.0\"]\nverify_wire = false",
    )
    .unwrap();
    let text = "kind = \"denoise\"\nbudget = \"elements\"\nclip = 3.0\nrate = 16.0\nscope = \"model\"\nverify_wire = false\n";
    let new: CompressionSettings = toml::from_str(text).unwrap();
    assert_eq!(old, new);
    assert_eq!(toml::to_string(&old).unwrap(), text);
    assert_eq!(
        new.label(),
        "denoise x16 (budget=elements, clip=3.0, scope=model)"
    );
}

/// Every cell of every committed training and audit grid that has a run folder is finished
/// with the settings its experiment file gives today (`grid::cell_state` compares the parsed
/// settings, the compressor as a typed value).
#[test]
fn every_committed_grid_cell_is_still_finished_with_the_same_settings() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(repo.join("experiments")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let mut table: toml::Table =
            toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let grid = match table.get("kind").and_then(|k| k.as_str()) {
            None => dpcomp_lab::grid::Experiment::from_file(&path).unwrap(),
            // An audit grid's cells are those of the training grid its file holds besides
            // `kind` and `[audit]`.
            Some("audit") => {
                table.remove("kind");
                table.remove("audit");
                let cells = scratch.path().join(path.file_name().unwrap());
                std::fs::write(&cells, toml::to_string(&table).unwrap()).unwrap();
                dpcomp_lab::grid::Experiment::from_file(&cells).unwrap()
            }
            Some(_) => continue,
        };
        for profile in grid.profiles.keys() {
            let root = repo.join("experiments/runs").join(&grid.name).join(profile);
            if !root.is_dir() {
                continue;
            }
            for cell in grid.cells(profile, &[]).unwrap() {
                let dir = root.join(&cell.name);
                if !dir.join("summary.json").is_file() {
                    continue;
                }
                assert_eq!(
                    dpcomp_lab::grid::cell_state(&dir, &cell.config)
                        .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
                    dpcomp_lab::grid::CellState::Finished,
                    "{}",
                    dir.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "{checked} committed cells checked");
}
