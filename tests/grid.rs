//! `dpcomp grid`: the CIFAR-100 experiment end to end on tiny files in the official layout
//! (no CIFAR-100 here), its results table, ε against the accountant's formula, and skipping /
//! resuming cells.

mod common;

use dpcomp::grid::{cell_state, CellState, Experiment};
use dpcomp::privacy::calibrate::epsilon_for;

#[test]
fn cifar100_grid_runs_end_to_end_on_tiny_files() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_cifar100(&dir.path().join("data"), 8, 4);

    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/cifar100_dgc.toml");
    let mut experiment = Experiment::from_file(&path).unwrap();
    let data_dir = dir.path().join("data").display().to_string();
    experiment.base.insert("data_dir".into(), data_dir.into());
    experiment.base.insert("device".into(), "cpu".into());
    experiment.base.insert("batch_size".into(), 4.into());
    let runs = dir.path().join("runs");
    let rows = dpcomp::grid::run(&experiment, "cpu", &[], &runs, false).unwrap();

    // The paper's grid: σ 0, 0.4, 0.8 x DGC rates 1, 16, 256.
    assert_eq!(rows.len(), 9);
    let epochs = 3; // the cpu profile
    let steps_per_epoch = 2; // 8 images, batch 4
    for r in &rows {
        assert_eq!(r.epochs, epochs);
        assert!((0.0..=1.0).contains(&r.final_accuracy));
        if r.noise_multiplier == 0.0 {
            assert_eq!(r.epsilon, None, "{}: σ = 0 is ε = ∞", r.cell);
        } else {
            // What `dpcomp epsilon --sample-rate 0.5 --noise-multiplier σ --steps 6 --delta 1e-5`
            // prints.
            let expected = epsilon_for(
                r.noise_multiplier,
                1.0 / steps_per_epoch as f64,
                (epochs * steps_per_epoch) as u64,
                1e-5,
            )
            .unwrap();
            assert_eq!(r.epsilon, Some(expected), "{}", r.cell);
        }
        // 11,373,732 parameters; rate 1 sends them dense every step.
        let dense = 11_373_732.0 * 32.0 * (epochs * steps_per_epoch) as f64 / 1e9;
        let rate = dense / r.upstream_gigabits;
        assert!(
            (rate / r.rate - 1.0).abs() < 0.01,
            "{}: rate {rate}",
            r.cell
        );
    }
    let root = runs.join("cifar100_dgc/cpu");
    let table = std::fs::read_to_string(root.join("results.md")).unwrap();
    assert_eq!(table.matches("| cifar100 |").count(), 9, "{table}");
    let csv = std::fs::read_to_string(root.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 10);

    // The figures, from the logs: PNG and SVG of each.
    let figures = dpcomp::plot::plot(&root, &dir.path().join("figures"), "cifar100_dgc").unwrap();
    assert_eq!(figures.len(), 8);
    for f in &figures {
        let bytes = std::fs::read(f).unwrap();
        if f.extension().unwrap() == "png" {
            assert_eq!(&bytes[1..4], b"PNG", "{}", f.display());
        } else {
            assert!(
                String::from_utf8_lossy(&bytes).contains("<svg"),
                "{}",
                f.display()
            );
        }
    }

    // Finished cells are skipped; a cell whose summary is missing is resumed (nothing left to
    // train: it only writes its summary again), with unchanged weights.
    let cells = experiment.cells("cpu", &[]).unwrap();
    let first = root.join(&cells[0].name);
    assert_eq!(
        cell_state(&first, &cells[0].config).unwrap(),
        CellState::Finished
    );
    let weights = std::fs::read(first.join("checkpoint/model.safetensors")).unwrap();
    std::fs::remove_file(first.join("summary.json")).unwrap();
    assert_eq!(
        cell_state(&first, &cells[0].config).unwrap(),
        CellState::Interrupted { epochs_done: 3 }
    );
    let only = vec![
        ("rate".to_string(), "1".to_string()),
        ("noise_multiplier".to_string(), "0".to_string()),
    ];
    let again = dpcomp::grid::run(&experiment, "cpu", &only, &runs, false).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].cell, cells[0].name);
    assert_eq!(
        std::fs::read(first.join("checkpoint/model.safetensors")).unwrap(),
        weights
    );

    // A cell folder with other settings is refused rather than silently mixed.
    let mut changed = experiment.clone();
    changed.base.insert("lr".into(), 0.5.into());
    let err = dpcomp::grid::run(&changed, "cpu", &only, &runs, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("other settings"), "{err}");
    // Unknown profile and axis are clear errors.
    let err = experiment.cells("gpu", &[]).unwrap_err().to_string();
    assert!(err.contains("cpu") && err.contains("full"), "{err}");
    let err = experiment
        .cells("cpu", &[("sigma".into(), "0".into())])
        .unwrap_err()
        .to_string();
    assert!(err.contains("noise_multiplier"), "{err}");
}

#[test]
fn every_experiment_file_resolves_in_both_profiles() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        if dpcomp::convex::experiment::is_convex(&path).unwrap() {
            let convex = dpcomp::convex::experiment::ConvexExperiment::from_file(&path).unwrap();
            assert!(convex.profiles.contains_key("cpu") && convex.profiles.contains_key("full"));
            assert_eq!(convex.profiles["cpu"].seeds, 20);
            continue;
        }
        if dpcomp::fl::experiment::is_fl(&path).unwrap() {
            let fl = dpcomp::fl::experiment::FlExperiment::from_file(&path).unwrap();
            for profile in ["cpu", "full"] {
                let cells = fl.cells(profile).unwrap();
                // Per dataset: FL-STD, 3 ratios of RND and FREQ, 3 x 2 row choices of CS; x DP.
                assert_eq!(cells.len(), 2 * 2 * (1 + 3 + 3 + 6), "{profile}");
                for (dataset, name, settings) in &cells {
                    settings.validate().unwrap();
                    // Private cells reach ε <= 1 after their rounds (σ from the accountant).
                    if let Some(p) = settings.privacy {
                        let eps = dpcomp::privacy::calibrate::epsilon_for(
                            p.noise_multiplier,
                            settings.fraction,
                            settings.rounds as u64,
                            p.delta,
                        )
                        .unwrap();
                        assert!(eps <= 1.0 + 1e-9 && eps > 0.99, "{dataset}/{name}: {eps}");
                    }
                }
            }
            let cpu = fl.cells("cpu").unwrap();
            assert!(cpu
                .iter()
                .any(|(d, _, s)| d == "fashion-mnist" && s.rounds == 100));
            continue;
        }
        let experiment = Experiment::from_file(&path).unwrap();
        for profile in ["cpu", "full"] {
            let cells = experiment.cells(profile, &[]).unwrap();
            assert!(!cells.is_empty(), "{}", path.display());
            for c in &cells {
                assert!(
                    c.config.noise_multiplier.is_some(),
                    "{}: every cell clips per sample",
                    c.name
                );
            }
        }
        seen += 1;
    }
    assert!(seen >= 8);
}

#[test]
fn table_valued_axes_bundle_settings_under_a_label() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/surnames_denoise.toml");
    let experiment = Experiment::from_file(&path).unwrap();
    // noise 3 x rate 2 x variant 4 (DGC, model-wise top-k, Denoise layer- and model-wise).
    assert_eq!(experiment.cells("cpu", &[]).unwrap().len(), 24);
    let model_wise = experiment
        .cells("cpu", &[("variant".to_string(), "dgc-model".to_string())])
        .unwrap();
    assert_eq!(model_wise.len(), 6);
    assert_eq!(
        model_wise[0].config.compressor,
        dpcomp::compress::CompressorKind::Dgc
    );
    assert_eq!(
        model_wise[0].config.compressor_options,
        vec!["scope=model".to_string()]
    );
    let only = vec![
        ("variant".to_string(), "denoise-model".to_string()),
        ("rate".to_string(), "256".to_string()),
        ("noise_multiplier".to_string(), "0.8".to_string()),
    ];
    let cells = experiment.cells("cpu", &only).unwrap();
    assert_eq!(cells.len(), 1);
    let c = &cells[0];
    assert_eq!(
        c.name,
        "noise_multiplier-0.8_rate-256_variant-denoise-model"
    );
    assert_eq!(
        c.config.compressor,
        dpcomp::compress::CompressorKind::Denoise
    );
    assert_eq!(c.config.compressor_options, vec!["scope=model".to_string()]);
    assert_eq!(
        (c.config.rate, c.config.noise_multiplier, c.config.epochs),
        (256.0, Some(0.8), 15)
    );
    // A bundle without a label cannot name its cells.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "name = \"x\"\n[base]\ntask = \"surnames\"\n[grid]\nvariant = [{ compressor = \"dgc\" }]\n[profiles.cpu]\n",
    )
    .unwrap();
    let err = Experiment::from_file(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.toml") && err.contains("label"), "{err}");
}
