//! Round two of the hostile tester's probes: data-parallel runs with empty shares, run folders
//! holding the user's files, logs cut short by a full disk, interrupted federated runs restarted
//! with other settings, resumes on other data, integer settings past what TOML holds, and
//! divergence that is not the learning rate's. Each test failed before its fix.

use crate::common;
use common::require_shared_data;
use dpcomp::error::Error;
use dpcomp_lab::Task;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn dpcomp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// 33 names over 2 workers in batches of 32: the second step's batch has one name, so one
/// worker's share is empty. It must contribute nothing and the run must finish (it panicked
/// in LibTorch's LSTM); on CIFAR-10 2 images over 3 workers must not read as "diverged".
#[test]
fn empty_worker_shares_contribute_nothing_and_the_run_finishes() {
    let Some(data) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut cases = vec![("surnames", "33", "2", data)];
    // CIFAR-10 is not shipped: its case runs where a data folder has it.
    if let Some(cifar) = common::require_cifar10() {
        cases.push(("cifar10", "2", "3", cifar));
    }
    for (task, limit, workers, data) in cases {
        let run = work.path().join(task);
        let out = dpcomp(&[
            "train",
            "--task",
            task,
            "--epochs",
            "1",
            "--limit-train",
            limit,
            "--limit-test",
            "10",
            "--batch-size",
            "32",
            "--data-dir",
            &data.display().to_string(),
            "--out",
            &run.display().to_string(),
            "--thread-workers",
            workers,
            "--quiet",
        ]);
        assert!(out.status.success(), "{task}: {}", stderr(&out));
        let s = summary(&run);
        assert!(s["stopped"].is_null(), "{task}: {s}");
        assert!(
            s["final_accuracy"].as_f64().unwrap().is_finite(),
            "{task}: {s}"
        );
    }
}

/// The same empty share under a real MPI launcher: the job ends (it hung after the panic), and
/// with the same result as the thread workers.
#[test]
fn empty_worker_shares_under_mpiexec_end_the_job() {
    let Some(data) = require_shared_data() else {
        return;
    };
    if Command::new("mpiexec").arg("--version").output().is_err() {
        common::skip("mpiexec not installed");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("mpi");
    let mut child = Command::new("mpiexec")
        .args([
            "-n",
            "2",
            env!("CARGO_BIN_EXE_dpcomp"),
            "train",
            "--task",
            "surnames",
        ])
        .args([
            "--epochs",
            "1",
            "--limit-train",
            "33",
            "--limit-test",
            "10",
            "--quiet",
        ])
        .args(["--data-dir", &data.display().to_string()])
        .args(["--out", &run.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("mpiexec -n 2 with an empty share did not end within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success());
    assert!(summary(&run)["stopped"].is_null());
}

/// A folder holding a file of the user's is refused before anything is written, and a start
/// that fails never deletes the `--config` file it was given.
#[test]
fn a_folder_of_the_users_is_refused_and_its_files_kept() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("mine");
    std::fs::create_dir(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(&config, "task = \"surnames\"\n").unwrap();
    let out = dpcomp(&[
        "train",
        "--config",
        &config.display().to_string(),
        "--out",
        &dir.display().to_string(),
        "--data-dir",
        "/nonexistent",
    ]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("--out") && e.contains("not a dpcomp run folder"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "task = \"surnames\"\n"
    );
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(names.len(), 1, "only the user's config.toml stays");

    // A dpcomp run folder's own failed start removes what it wrote, and nothing else.
    let run = work.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--out",
        &run.display().to_string(),
        "--data-dir",
        "/nonexistent",
    ]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read_dir(&run).unwrap().count(), 0);
}

/// A run killed while appending a metrics row (a full disk) resumes: the rows after the
/// checkpoint, half a row included, are dropped and those epochs train again.
#[test]
fn a_half_written_metrics_row_does_not_stop_the_resume() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run");
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.epochs = 2;
    c.data.limit_train = Some(200);
    c.data.limit_test = Some(50);
    c.data.data_dir = Some(root.clone());
    c.device = dpcomp::config::DeviceChoice::Cpu;
    let mut trainer = dpcomp_lab::tasks::start(c, &run).unwrap();
    trainer.run().unwrap();
    drop(trainer);
    let metrics = run.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.push_str("{\"epoch\":3,\"steps\":12,\"train_lo");
    std::fs::write(&metrics, text).unwrap();
    let mut resumed = dpcomp_lab::tasks::resume(&run, Some(3)).unwrap();
    let s = resumed.run().unwrap();
    assert_eq!(s.epochs, 3);
    let rows = dpcomp::train::metrics::read(&metrics).unwrap();
    assert_eq!(rows.iter().map(|m| m.epoch).collect::<Vec<_>>(), [1, 2, 3]);
}

/// A resume on a names folder whose files were rotated (every label wrong) is refused.
#[test]
fn a_resume_on_other_data_is_refused() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    std::fs::create_dir_all(data.join("names")).unwrap();
    let mut files: Vec<_> = std::fs::read_dir(root.join("names"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        std::fs::copy(f, data.join("names").join(f.file_name().unwrap())).unwrap();
    }
    let run = work.path().join("run");
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.epochs = 1;
    c.data.limit_train = Some(200);
    c.data.limit_test = Some(50);
    c.data.data_dir = Some(data.clone());
    c.device = dpcomp::config::DeviceChoice::Cpu;
    let mut trainer = dpcomp_lab::tasks::start(c, &run).unwrap();
    trainer.run().unwrap();
    drop(trainer);
    // Rotate the files' contents: each language's names now sit under the next language.
    let texts: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    for (i, f) in files.iter().enumerate() {
        let target = data.join("names").join(f.file_name().unwrap());
        std::fs::write(target, &texts[(i + 1) % texts.len()]).unwrap();
    }
    match dpcomp_lab::tasks::resume(&run, Some(2)) {
        Err(Error::BadValue { field, what }) => {
            assert_eq!(field, "data.data_dir");
            assert!(what.contains("other data"), "{what}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a resume on rotated labels was accepted"),
    }
}

/// Integer settings past i64::MAX (TOML's largest) are errors naming the flag, not a panic,
/// and leave no run folder; so is an epoch count whose steps overflow the step counter.
#[test]
fn integer_settings_beyond_toml_are_errors_naming_the_flag() {
    let work = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--seed", "9223372036854775808"),
        ("--limit-train", "9223372036854775808"),
        ("--batch-size", "18446744073709551615"),
        ("--epochs", "9223372036854775808"),
    ] {
        let run = work.path().join(flag.trim_start_matches('-'));
        let out = dpcomp(&[
            "train",
            "--task",
            "surnames",
            flag,
            value,
            "--out",
            &run.display().to_string(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{flag}: {}", stderr(&out));
        let e = stderr(&out);
        assert!(e.contains(flag) && e.contains("at most"), "{flag}: {e}");
        assert!(!run.exists(), "{flag} left {}", run.display());
    }
    // Epochs whose steps overflow the step counter under a privacy budget (it wrapped and
    // stopped after 16 steps with a false budget statement).
    let Some(data) = require_shared_data() else {
        return;
    };
    let run = work.path().join("budget").display().to_string();
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1152921504606846977",
        "--target-epsilon",
        "5",
        "--noise-multiplier",
        "1",
        "--data-dir",
        &data.display().to_string(),
        "--out",
        &run,
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--epochs"), "{}", stderr(&out));
}

/// σ·C beyond what f32 noise can hold, and an adaptive radius's learning rate that would
/// collapse it in a step, are refused naming their settings (both used to "diverge" and were
/// blamed on --lr).
#[test]
fn noise_and_radius_settings_that_break_training_are_refused_up_front() {
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run").display().to_string();
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--noise-multiplier",
        "1e308",
        "--out",
        &run,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--noise-multiplier"),
        "{}",
        stderr(&out)
    );
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.privacy.noise_multiplier = Some(1.0);
    c.privacy.clipping = dpcomp::config::ClippingMode::Adaptive;
    let mut engine_settings = dpcomp::privacy::engine::AdaptiveClipping::new(1.0, 10.0);
    engine_settings.learning_rate = 1000.0;
    let clipping = dpcomp::privacy::engine::Clipping::Adaptive(engine_settings);
    let error = common::engine(1.0, 0.01, 10.0, clipping, 1)
        .err()
        .expect("eta 1000 is refused")
        .to_string();
    assert!(error.contains("clip_learning_rate"), "{error}");
    // The radius stays bounded whatever the released fraction.
    let mut a = dpcomp::privacy::engine::AdaptiveClipping::new(1.0, 10.0);
    a.learning_rate = 20.0;
    for _ in 0..100 {
        a.update(0.0);
    }
    assert_eq!(
        a.radius,
        dpcomp::privacy::engine::AdaptiveClipping::MAX_RADIUS
    );
}

/// An interrupted federated run restarted with other settings is refused naming them (it was
/// thrown away), more rounds continue it, and `clear_run` (`--restart`) starts it afresh.
#[test]
fn an_interrupted_federated_run_is_never_thrown_away() {
    use dpcomp::fl::{data::FlData, data::FlDataset, FederatedRun, FlSettings};
    let _serial = common::serial();
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    let data = FlData::load(FlDataset::BreastCancer, &data_dir).unwrap();
    // A run into `dir` to its end (its summary), or stopped after a round.
    let run = |settings: &FlSettings, dir: &std::path::Path, stop_after: Option<usize>| {
        let mut run = FederatedRun::builder()
            .settings(settings.clone())
            .data(&data)
            .out(dir);
        if let Some(round) = stop_after {
            run = run.stop_after(round);
        }
        run.build()?.run().map(|outcome| outcome.summary)
    };
    let mut settings = FlSettings::defaults(FlDataset::BreastCancer);
    settings.rounds = 4;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("fl");
    run(&settings, &dir, Some(2)).unwrap();
    let mut other = settings.clone();
    other.seed = 1;
    match run(&other, &dir, None) {
        Err(Error::ResumeConflict { conflicts, .. }) => {
            assert_eq!(conflicts.len(), 1, "{conflicts:?}");
            assert_eq!(conflicts[0].field, "seed");
        }
        other => panic!(
            "expected a refusal naming the seed, got {:?}",
            other.map(|s| s.map(|s| s.rounds_run))
        ),
    }
    assert!(
        dpcomp::train::checkpoint::find(&dir).is_some(),
        "the checkpoint is kept"
    );
    let mut longer = settings.clone();
    longer.rounds = 6;
    let s = run(&longer, &dir, None).unwrap().unwrap();
    assert_eq!(s.rounds_run, 6);
    let rows = dpcomp::fl::read_rows(&dir.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.len(), 6);
    // A finished run is not replaced silently either; `clear_run` discards it explicitly.
    assert!(run(&longer, &dir, None).is_err());
    dpcomp::fl::clear_run(&dir).unwrap();
    let s = run(&other, &dir, None).unwrap().unwrap();
    assert_eq!(s.rounds_run, 4);
    // A folder of the user's is refused.
    let mine = work.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("config.json"), "{}").unwrap();
    assert!(run(&settings, &mine, None).is_err());
    assert_eq!(
        std::fs::read_to_string(mine.join("config.json")).unwrap(),
        "{}"
    );
}

/// Settings checked as the user typed them, and inputs that used to hang, panic or exit 0 with a
/// meaningless result.
#[test]
fn bad_settings_elsewhere_are_errors_naming_what_was_typed() {
    let work = tempfile::tempdir().unwrap();
    // A federated shard count whose product with the clients overflows (it panicked).
    let shards = dpcomp::data::partition::Partition::parse("shards:9223372036854775808").unwrap();
    assert!(shards.split(&[0, 1, 0, 1], 2, 0).is_err());
    // synthetic:10:1000 never ended (rejection sampling of margin-1 points).
    let started = Instant::now();
    let e = dpcomp::data::tabular::synthetic(10, 1000, 4.0, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("1000 dimensions"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // The grid's --only with a value no cell has "finished" 0 cells with exit 0.
    let grid =
        dpcomp_lab::grid::Experiment::from_file(Path::new("experiments/surnames_clipping.toml"))
            .unwrap();
    let only = vec![("setting".to_string(), "sigma-9".to_string())];
    let e = grid.cells("cpu", &only).err().unwrap().to_string();
    assert!(e.contains("sigma-0.4-C-3"), "{e}");
    // The same for a federated grid (its cells are selected by another function).
    let out = dpcomp(&[
        "grid",
        "experiments/fl_scale.toml",
        "--only",
        "ratio=0.77",
        "--list",
        "--runs",
        &work.path().join("fl-runs").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ratio=0.77: no cell"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("ratio takes 0.05"),
        "{}",
        stderr(&out)
    );
    // Numbers as typed, not derived from them.
    for (args, named) in [
        (vec!["convex", "--epsilon=-1"], "--epsilon -1"),
        (vec!["convex", "--delta", "5"], "--delta 5"),
        (
            vec![
                "fl",
                "--dp",
                "--noise-multiplier",
                "1",
                "--full-clip",
                "nan",
            ],
            "--full-clip",
        ),
        (
            vec!["audit", "--task", "surnames", "--canaries", "0"],
            "--canaries 0",
        ),
        (
            vec!["bench", "train", "--task", "surnames", "--batch-size", "0"],
            "--batch-size",
        ),
        (
            vec![
                "analyze",
                "clipping",
                "--task",
                "surnames",
                "--out",
                "/nonexistent/x",
                "--sigmas",
                "nan",
            ],
            "--sigmas",
        ),
    ] {
        let out = dpcomp(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(named), "{args:?}: {}", stderr(&out));
    }
    // A mistyped --resume folder is not created.
    let missing = work.path().join("typo");
    let out = dpcomp(&["train", "--resume", "--out", &missing.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no such folder"), "{}", stderr(&out));
    assert!(!missing.exists());
}

/// An empty training or test split is refused before training, naming the data; a model with
/// no trainable variable is an error, not a panic in the clipping.
#[test]
fn empty_splits_and_models_without_parameters_are_refused() {
    let work = tempfile::tempdir().unwrap();
    let names = work.path().join("data").join("names");
    std::fs::create_dir_all(&names).unwrap();
    std::fs::write(names.join("English.txt"), "Smith\n").unwrap();
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--data-dir",
        &work.path().join("data").display().to_string(),
        "--out",
        &work.path().join("run").display().to_string(),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("has no examples"), "{}", stderr(&out));
    assert!(!work.path().join("run").exists());
    let e = common::engine(
        1.0,
        0.01,
        10.0,
        dpcomp::privacy::engine::Clipping::Flat { max_norm: 1.0 },
        0,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("no trainable variable"), "{e}");
}

/// Every layer given an input of a shape it cannot take returns an error that names the layer
/// and both shapes (it panicked inside LibTorch with C++ frames), in evaluation, non-private
/// training and private training alike.
#[test]
fn a_layer_given_an_input_it_cannot_take_is_an_error_naming_it() {
    use dpcomp::nn::*;
    use tch::{nn, Device, Kind, Tensor};
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let float = |shape: &[i64]| Tensor::zeros(shape, (Kind::Float, Device::Cpu));
    let linear = Linear::new(&(&root / "linear"), 5, 3, LinearConfig::default()).unwrap();
    let conv_config = Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let conv = Conv2d::new(&(&root / "conv"), 3, 4, 5, conv_config).unwrap();
    let embedding = Embedding::new(&(&root / "embedding"), 10, 4).unwrap();
    let lstm = Lstm::new(&(&root / "lstm"), 4, 6).unwrap();
    let gru = Gru::new(&(&root / "gru"), 4, 6).unwrap();
    let layer_norm = LayerNorm::new(&(&root / "layer_norm"), 4, 1e-5).unwrap();
    let group_norm = GroupNorm::new(&(&root / "group_norm"), 2, 4).unwrap();
    let instance_norm = InstanceNorm2d::new(&(&root / "instance_norm"), 4).unwrap();
    let attention_config = AttentionConfig {
        heads: 2,
        ..Default::default()
    };
    let attention = MultiheadAttention::new(&(&root / "attention"), 4, attention_config).unwrap();
    let ids = Tensor::zeros([2, 3], (Kind::Int64, Device::Cpu));
    let contexts: [fn() -> Ctx; 3] = [Ctx::eval, Ctx::train, Ctx::private];
    for make in contexts {
        type Case<'a> = (
            &'a str,
            Box<dyn Fn(&mut Ctx) -> dpcomp::error::Result<Tensor> + 'a>,
        );
        let cases: Vec<Case> = vec![
            (
                "Linear(5 -> 3) input: shape [2, 7], expected [.., 5]",
                Box::new(|c| linear.forward(&float(&[2, 7]), c)),
            ),
            (
                "Conv2d(3 -> 4, kernel 5) input: shape [2, 2, 8, 8]",
                Box::new(|c| conv.forward(&float(&[2, 2, 8, 8]), c)),
            ),
            (
                "Conv2d(3 -> 4, kernel 5) input: shape [2, 3, 2, 8], expected height and width",
                Box::new(|c| conv.forward(&float(&[2, 3, 2, 8]), c)),
            ),
            (
                "Embedding(10 x 4) input: shape [2, 3], expected integer ids",
                Box::new(|c| embedding.forward(&float(&[2, 3]), c)),
            ),
            (
                "Lstm(4 -> 6) input: shape [2, 3, 5]",
                Box::new(|c| lstm.forward(&float(&[2, 3, 5]), c)),
            ),
            (
                "Lstm(4 -> 6) input: shape [2, 4]",
                Box::new(|c| lstm.forward(&float(&[2, 4]), c)),
            ),
            (
                "Gru(4 -> 6) input: shape [2, 3, 5]",
                Box::new(|c| gru.forward(&float(&[2, 3, 5]), c)),
            ),
            (
                "LayerNorm(4) input: shape [2, 3, 5]",
                Box::new(|c| layer_norm.forward(&float(&[2, 3, 5]), c)),
            ),
            (
                "GroupNorm(2 groups, 4 channels) input: shape [2, 6, 3, 3]",
                Box::new(|c| group_norm.forward(&float(&[2, 6, 3, 3]), c)),
            ),
            (
                "InstanceNorm2d input: shape [2, 5, 3, 3]",
                Box::new(|c| instance_norm.forward(&float(&[2, 5, 3, 3]), c)),
            ),
            (
                "MultiheadAttention(4, 2 heads) input: shape [2, 3, 5]",
                Box::new(|c| attention.forward(&float(&[2, 3, 5]), None, c)),
            ),
            // A mask that does not broadcast reaches LibTorch's kernel: its first line, no frames.
            (
                "MultiheadAttention(4, 2 heads) input:",
                Box::new(|c| {
                    let mask = Tensor::ones([2, 1, 1, 7], (Kind::Bool, Device::Cpu));
                    attention.forward(&float(&[2, 3, 4]), Some(&mask), c)
                }),
            ),
        ];
        for (expected, forward) in &cases {
            let mut ctx = make();
            let message = forward(&mut ctx).err().unwrap().to_string();
            assert!(
                message.starts_with(expected),
                "{message}\nexpected {expected}"
            );
            assert!(!message.contains("frame #"), "{message}");
        }
        // The right shapes still pass.
        let mut ctx = make();
        assert_eq!(
            linear.forward(&float(&[2, 5]), &mut ctx).unwrap().size(),
            [2, 3]
        );
        assert_eq!(embedding.forward(&ids, &mut ctx).unwrap().size(), [2, 3, 4]);
        assert_eq!(
            lstm.forward(&float(&[2, 3, 4]), &mut ctx).unwrap().size(),
            [2, 3, 6]
        );
    }
    // A model of one's own passes the error on through `Model::forward`.
    struct Rows {
        vs: nn::VarStore,
        layer: Linear,
    }
    impl dpcomp::models::Model for Rows {
        fn forward(
            &self,
            features: &dpcomp::data::Features,
            ctx: &mut Ctx,
        ) -> dpcomp::error::Result<Tensor> {
            let dpcomp::data::Features::Rows(xs) = features else {
                unreachable!("the test gives rows")
            };
            self.layer.forward(xs, ctx)
        }
        fn var_store(&self) -> &nn::VarStore {
            &self.vs
        }
    }
    let vs = nn::VarStore::new(Device::Cpu);
    let layer = Linear::new(&vs.root(), 6, 2, LinearConfig::default()).unwrap();
    let model = Rows { vs, layer };
    let rows = dpcomp::data::Features::Rows(float(&[4, 5]));
    let error = dpcomp::models::Model::forward(&model, &rows, &mut Ctx::private())
        .err()
        .unwrap();
    assert_eq!(
        error.to_string(),
        "Linear(6 -> 2) input: shape [4, 5], expected [.., 6]"
    );
    // Invalid geometry is refused when the layer is built.
    let bad = Conv2dConfig {
        stride: 0,
        ..Default::default()
    };
    let other = nn::VarStore::new(Device::Cpu);
    let error = Conv2d::new(&other.root(), 3, 4, 3, bad).err().unwrap();
    assert_eq!(error.to_string(), "Conv2d stride: 0, expected at least 1");
}
