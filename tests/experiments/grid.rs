//! `dpcomp grid`: the CIFAR-100 experiment end to end on tiny files in the official layout
//! (no CIFAR-100 here), its results table, ε against the accountant's formula, and skipping /
//! resuming cells.

use crate::common;
use dpcomp::privacy::calibrate::epsilon_for;
use dpcomp_lab::experiment::ExperimentFile;
use dpcomp_lab::grid::{cell_state, CellState, Experiment};

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
    let rows = dpcomp_lab::grid::run(&experiment, "cpu", &[], &runs, &mut ()).unwrap();

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
            // What `dpcomp epsilon --sample-rate 0.5 --noise-multiplier σ --steps 6 --delta 1e-5
            // --accountant rdp` prints: the file pins the papers' RDP accountant.
            let expected = epsilon_for(
                r.noise_multiplier,
                1.0 / steps_per_epoch as f64,
                (epochs * steps_per_epoch) as u64,
                1e-5,
            )
            .unwrap();
            assert_eq!(r.epsilon, Some(expected), "{}", r.cell);
        }
        // 11,373,732 parameters; rate 1 sends them dense every step. The file keeps
        // k = ceil(numel / rate) elements per tensor (budget=elements), so the paper's unit
        // (64 bits per element) shrinks by the rate, and the wire bits (32-bit value + 32-bit
        // index per kept element, 32 bits per dense value) by the rate over 2.
        let steps = (epochs * steps_per_epoch) as f64;
        let dense_paper = 11_373_732.0 * 64.0 * steps / 8.0 / (1u64 << 30) as f64;
        let paper_rate = dense_paper / r.upstream_paper_gib;
        assert!(
            (paper_rate / r.rate - 1.0).abs() < 0.01,
            "{}: rate {paper_rate} in the paper's unit",
            r.cell
        );
        let dense_wire = 11_373_732.0 * 32.0 * steps / 1e9;
        let wire_rate = dense_wire / r.upstream_gigabits;
        let expected = if r.rate == 1.0 { 1.0 } else { r.rate / 2.0 };
        assert!(
            (wire_rate / expected - 1.0).abs() < 0.01,
            "{}: wire rate {wire_rate}",
            r.cell
        );
    }
    // What `dpcomp grid --list` estimates without training is what the runs sent.
    let cells = experiment.cells("cpu", &[]).unwrap();
    let estimates = dpcomp_lab::grid::upload_estimates(&cells);
    for (r, estimate) in rows.iter().zip(estimates) {
        let estimate = estimate.unwrap();
        assert_eq!(estimate.gigabits(), r.upstream_gigabits, "{}", r.cell);
        assert_eq!(estimate.paper_gib(), r.upstream_paper_gib, "{}", r.cell);
        assert_eq!(estimate.steps, (epochs * steps_per_epoch) as u64);
    }
    let root = runs.join("cifar100_dgc/cpu");
    let table = std::fs::read_to_string(root.join("results.md")).unwrap();
    assert_eq!(table.matches("| cifar100 |").count(), 9, "{table}");
    let csv = std::fs::read_to_string(root.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 10);

    // The figures, from the logs: PNG and SVG of each.
    let figures =
        dpcomp_lab::plot::plot(&root, &dir.path().join("figures"), "cifar100_dgc").unwrap();
    // Four figures and accuracy against upload, each in PNG and SVG.
    assert_eq!(figures.len(), 10);
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
    let again = dpcomp_lab::grid::run(&experiment, "cpu", &only, &runs, &mut ()).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].cell, cells[0].name);
    assert_eq!(
        std::fs::read(first.join("checkpoint/model.safetensors")).unwrap(),
        weights
    );

    // A cell folder with other settings is refused rather than silently mixed.
    let mut changed = experiment.clone();
    changed.base.insert("lr".into(), 0.5.into());
    let err = dpcomp_lab::grid::run(&changed, "cpu", &only, &runs, &mut ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("other settings"), "{err}");
    // A finished cell committed without its checkpoint (experiments/runs/ keeps only the logs)
    // is still finished; with neither checkpoint nor summary it is new.
    std::fs::remove_dir_all(first.join("checkpoint")).unwrap();
    assert_eq!(
        cell_state(&first, &cells[0].config).unwrap(),
        CellState::Finished
    );
    let mut longer = cells[0].config.clone();
    longer.epochs += 1;
    let err = cell_state(&first, &longer).unwrap_err().to_string();
    assert!(err.contains("no checkpoint"), "{err}");
    std::fs::remove_file(first.join("summary.json")).unwrap();
    assert_eq!(
        cell_state(&first, &cells[0].config).unwrap(),
        CellState::New
    );

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
        let experiment = match ExperimentFile::open(&path).unwrap() {
            ExperimentFile::Training(experiment) => experiment,
            // Training cells with canaries: the same checks on the cells below.
            ExperimentFile::Audit(audit) => {
                assert!(audit.settings.guesses.total() <= audit.settings.canaries.canaries);
                audit.grid
            }
            ExperimentFile::Convex(convex) => {
                assert!(
                    convex.profiles.contains_key("cpu") && convex.profiles.contains_key("full")
                );
                assert_eq!(convex.profiles["cpu"].seeds, 20);
                continue;
            }
            ExperimentFile::Federated(fl) => {
                let stem = path.file_stem().and_then(|s| s.to_str());
                let expected: &[(&str, usize)] = match stem {
                    // Per dataset: FL-STD, 3 ratios of RND and FREQ, 3 x 2 row choices of
                    // CS; x DP: 2 x 2 x 13.
                    Some("fl_cs") => &[("cpu", 52), ("full", 52)],
                    // Two datasets: FL-STD, 3 ratios of RND, FREQ and CS; x DP; x 2
                    // server momenta x 3 seeds: 2 x 10 x 2 x 2 x 3.
                    Some("fl_scale") => &[("cpu", 240), ("full", 240)],
                    // FL-STD-DP at 7 noise scales; one real run with 600 clients.
                    Some("fl_std_dp_noise") => &[("cpu", 7), ("clients-600", 1)],
                    // Every private scheme and ratio at one noise scale, 3 seeds: (1 + 3 x 3) x 3.
                    Some("fl_dp_population") => &[("cpu", 30)],
                    other => panic!("{other:?}: a new federated file; add its cell count"),
                };
                for &(profile, expected) in expected {
                    let cells = fl.cells(profile).unwrap();
                    assert_eq!(cells.len(), expected, "{}: {profile}", path.display());
                    if !matches!(stem, Some("fl_std_dp_noise" | "fl_dp_population")) {
                        let private = cells.iter().filter(|(_, _, s)| s.privacy.is_some()).count();
                        assert_eq!(
                            private,
                            cells.len() / 2,
                            "{profile}: half the cells are private"
                        );
                    }
                    for (dataset, name, settings) in &cells {
                        settings.validate().unwrap();
                        // Private cells at noise scale 1 reach ε <= 1 after their rounds (σ from
                        // the cell's accountant, RDP as the file pins); a scale s < 1 divides σ
                        // by 1/s.
                        if let Some(p) = settings.privacy {
                            let scale = name
                                .split('-')
                                .find_map(|part| part.strip_prefix("ns"))
                                .map_or(1.0, |v| v.parse::<f64>().unwrap());
                            let eps = dpcomp::privacy::calibrate::epsilon_with(
                                p.accountant,
                                p.noise_multiplier / scale,
                                settings.fraction,
                                settings.rounds as u64,
                                p.delta,
                            )
                            .unwrap();
                            assert!(eps <= 1.0 + 1e-9 && eps > 0.99, "{dataset}/{name}: {eps}");
                        }
                    }
                }
                if stem == Some("fl_std_dp_noise") {
                    // The cpu cell at scale 1/4 has the aggregate noise σ S / (C N) of the real
                    // ε 1 run with four times the clients.
                    let noise_on_average = |profile: &str, cell: &str| {
                        let cells = fl.cells(profile).unwrap();
                        let (_, _, s) = cells.iter().find(|(_, n, _)| n == cell).unwrap();
                        let p = s.privacy.unwrap();
                        p.noise_multiplier * p.clip / (s.fraction * s.clients as f64)
                    };
                    let emulated = noise_on_average("cpu", "std-r1-dp-ns0.25-m0-s0");
                    let real = noise_on_average("clients-600", "std-r1-dp-ns1-m0-s0");
                    assert!(
                        (emulated / real - 1.0).abs() < 1e-12,
                        "{emulated} vs {real}"
                    );
                    continue;
                }
                // The cpu profile shortens Fashion-MNIST (fl_cs: 100 rounds, fl_scale: 50); the
                // private-population file runs the 50 rounds its ε horizon implies.
                let cpu_rounds = if fl.name == "fl_cs" { 100 } else { 50 };
                let cpu = fl.cells("cpu").unwrap();
                assert!(cpu
                    .iter()
                    .any(|(d, _, s)| d == "fashion-mnist" && s.rounds == cpu_rounds));
                continue;
            }
        };
        for profile in ["cpu", "full"] {
            let cells = experiment.cells(profile, &[]).unwrap();
            assert!(!cells.is_empty(), "{}", path.display());
            for c in &cells {
                c.config
                    .validate()
                    .unwrap_or_else(|e| panic!("{} {profile} {}: {e}", path.display(), c.name));
                // σ given, or calibrated from a target ε: either way per-sample clipping.
                assert!(
                    c.config.privacy.noise_multiplier.is_some()
                        || c.config.privacy.target_epsilon.is_some(),
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
fn experiment_files_are_routed_by_kind_and_only_convex_sweeps_refuse_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.toml");
    std::fs::write(&path, "name = \"odd\"\nkind = \"quantum\"\n").unwrap();
    let err = ExperimentFile::open(&path).err().unwrap().to_string();
    assert!(
        err.contains("kind \"quantum\"") && err.contains("odd.toml"),
        "{err}"
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let only = vec![("seed".to_string(), "0".to_string())];
    let runs = dir.path().join("runs");
    let convex = ExperimentFile::open(&root.join("convex.toml")).unwrap();
    let err = convex
        .run("cpu", &only, &runs, None, &mut ())
        .err()
        .unwrap()
        .to_string();
    assert!(err.starts_with("only:") && err.contains("convex"), "{err}");
    // Federated cells are selected by their axes (numbers compare numerically); an unknown
    // axis is refused before anything runs.
    let fl = ExperimentFile::open(&root.join("fl_scale.toml")).unwrap();
    let pairs = |items: &[(&str, &str)]| -> Vec<(String, String)> {
        items
            .iter()
            .map(|(a, v)| (a.to_string(), v.to_string()))
            .collect()
    };
    let chosen = fl
        .list(
            "cpu",
            &pairs(&[
                ("dataset", "fashion-mnist"),
                ("dp", "true"),
                ("server_momentum", "0.0"),
                ("seed", "2"),
            ]),
            &runs,
        )
        .unwrap();
    assert_eq!(chosen.len(), 10, "STD, 3 RND, 3 FREQ, 3 CS");
    for cell in &chosen {
        assert!(
            cell.name.starts_with("fashion-mnist/") && cell.name.contains("-dp-m0-s2"),
            "{}",
            cell.name
        );
    }
    let five_percent = fl
        .list(
            "cpu",
            &pairs(&[("ratio", "0.050"), ("scheme", "cs")]),
            &runs,
        )
        .unwrap();
    assert_eq!(
        five_percent.len(),
        2 * 2 * 2 * 3,
        "datasets x dp x momenta x seeds"
    );
    // The same cells by the compressor's rate n / m: r 0.05 is rate 20.
    let rate_20 = fl
        .list("cpu", &pairs(&[("rate", "20"), ("scheme", "cs")]), &runs)
        .unwrap();
    let names = |cells: &[dpcomp_lab::experiment::CellListing]| -> Vec<String> {
        cells.iter().map(|c| c.name.clone()).collect()
    };
    assert_eq!(names(&rate_20), names(&five_percent));
    let err = fl
        .run("cpu", &pairs(&[("rank", "16")]), &runs, None, &mut ())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("only:") && err.contains("noise_scale"),
        "{err}"
    );
    let noise = ExperimentFile::open(&root.join("fl_std_dp_noise.toml")).unwrap();
    let quarter = noise
        .list("cpu", &pairs(&[("noise_scale", "0.25")]), &runs)
        .unwrap();
    assert_eq!(quarter.len(), 1);
    assert!(quarter[0].name.ends_with("std-r1-dp-ns0.25-m0-s0"));
    assert!(!runs.exists(), "a refused run wrote nothing");
    let surnames = ExperimentFile::open(&root.join("surnames_dgc.toml")).unwrap();
    assert_eq!(
        surnames.folder(&runs, "cpu"),
        runs.join("surnames_dgc").join("cpu")
    );
    let by_rate = vec![("rate".to_string(), "16".to_string())];
    let listed = surnames.list("cpu", &by_rate, &runs).unwrap();
    assert!(!listed.is_empty() && listed.iter().all(|c| c.state == "new"));
    assert!(
        listed.iter().all(|c| c.name.contains("rate-16")),
        "--only selects"
    );
}

#[test]
fn table_valued_axes_bundle_settings_under_a_label() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/surnames_denoise.toml");
    let experiment = Experiment::from_file(&path).unwrap();
    // noise 3 x rate 3 x variant 3 (DGC, model-wise Denoise without and with a second clipping).
    assert_eq!(experiment.cells("cpu", &[]).unwrap().len(), 27);
    let dgc = experiment
        .cells("cpu", &[("variant".to_string(), "dgc".to_string())])
        .unwrap();
    assert_eq!(dgc.len(), 9);
    assert!(
        matches!(
            &dgc[0].config.compression.compressor,
            dpcomp::compress::Compressor::Dgc(d)
                if d.budget == dpcomp::compress::encoding::Budget::Elements
        ),
        "{:?}",
        dgc[0].config.compression
    );
    let only = vec![
        ("variant".to_string(), "denoise-model-clip".to_string()),
        ("rate".to_string(), "256".to_string()),
        ("noise_multiplier".to_string(), "0.8".to_string()),
    ];
    let cells = experiment.cells("cpu", &only).unwrap();
    assert_eq!(cells.len(), 1);
    let c = &cells[0];
    assert_eq!(
        c.name,
        "noise_multiplier-0.8_rate-256_variant-denoise-model-clip"
    );
    assert_eq!(
        c.config.compression_label().unwrap(),
        "denoise x256 (budget=elements, clip=3.0, scope=model)"
    );
    assert_eq!(
        (
            c.config.compression.rate(),
            c.config.privacy.noise_multiplier,
            c.config.epochs
        ),
        (256.0, Some(0.8), 15)
    );
    // The full profile adds a seed axis: 3 seeds of every cell.
    let full = experiment.cells("full", &only).unwrap();
    assert_eq!(full.len(), 3);
    assert_eq!(
        full.iter().map(|c| c.config.seed).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(
        full[1].name,
        "noise_multiplier-0.8_rate-256_seed-1_variant-denoise-model-clip"
    );
    assert_eq!(
        dpcomp_lab::grid::without_seed(&full[1].name),
        "noise_multiplier-0.8_rate-256_variant-denoise-model-clip"
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

#[test]
fn full_profiles_run_three_seeds_and_only_selects_one() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/surnames_dgc.toml");
    let experiment = Experiment::from_file(&path).unwrap();
    assert_eq!(experiment.cells("cpu", &[]).unwrap().len(), 9);
    let full = experiment.cells("full", &[]).unwrap();
    assert_eq!(full.len(), 27);
    let seed1 = experiment
        .cells("full", &[("seed".to_string(), "1".to_string())])
        .unwrap();
    assert_eq!(seed1.len(), 9);
    assert!(seed1
        .iter()
        .all(|c| c.config.seed == 1 && c.name.ends_with("_seed-1")));
    // --only on the profile's own axis is an error in a profile without it.
    let err = experiment
        .cells("cpu", &[("seed".to_string(), "1".to_string())])
        .unwrap_err()
        .to_string();
    assert!(err.contains("seed"), "{err}");
    // A profile grid that is not a table of arrays is refused with the profile's name.
    let mut bad = experiment.clone();
    bad.profiles
        .get_mut("cpu")
        .unwrap()
        .insert("grid".into(), toml::Value::Integer(3));
    let err = bad.cells("cpu", &[]).unwrap_err().to_string();
    assert!(err.contains("profile cpu") && err.contains("grid"), "{err}");
}

/// The paper's bandwidths, computed without training from the full profiles: Surnames
/// uncompressed 44.15 (the paper's 44.22: 118,034 parameters x 64 bits x 50,200 steps) and
/// CIFAR-10 uncompressed 105.25 (the paper's 105.25: 361,290 x 64 x 39,100), each shrinking
/// by the DGC rate in the paper's unit.
#[test]
fn full_profiles_estimate_the_papers_bandwidths() {
    let _serial = common::serial();
    let Some(data) = common::require_cifar10() else {
        return;
    };
    let experiments = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    for (file, steps, dense) in [
        ("surnames_dgc.toml", 50_200u64, "44.15"),
        ("cifar10_dgc.toml", 39_100, "105.25"),
    ] {
        let mut experiment = Experiment::from_file(&experiments.join(file)).unwrap();
        experiment
            .base
            .insert("data_dir".into(), data.display().to_string().into());
        let only = [("noise_multiplier".to_string(), "0.4".to_string())];
        let mut cells = experiment.cells("full", &only).unwrap();
        cells.retain(|c| c.config.seed == 0);
        assert_eq!(cells.len(), 3, "{file}");
        let uploads: Vec<_> = dpcomp_lab::grid::upload_estimates(&cells)
            .into_iter()
            .map(|u| u.unwrap())
            .collect();
        assert!(uploads.iter().all(|u| u.steps == steps), "{file}");
        assert_eq!(format!("{:.2}", uploads[0].paper_gib()), dense, "{file}");
        for (c, u) in cells.iter().zip(&uploads) {
            let rate = uploads[0].paper_gib() / u.paper_gib();
            assert!(
                (rate / c.config.compression.rate() - 1.0).abs() < 0.01,
                "{file} {}: {rate}",
                c.name
            );
        }
    }
}

/// A cell whose `summary.json` has null numbers (a run on an empty test split writes its NaN
/// accuracies as null) still reads, as NaN: the grid's table builds with NaN in that cell's row
/// and the figures' reader takes it too. The compressor labels hold commas
/// (`denoise x256 (budget=elements, clip=3.0, scope=model)`), which the CSV quotes.
#[test]
fn a_summary_with_null_numbers_reads_as_nan_in_the_table() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/surnames_denoise.toml");
    let experiment = Experiment::from_file(&path).unwrap();
    let only = [("rate".to_string(), "256".to_string())];
    let cells = experiment.cells("cpu", &only).unwrap();
    let clipped: Vec<_> = cells
        .iter()
        .filter(|c| c.name.ends_with("variant-denoise-model-clip"))
        .take(2)
        .collect();
    assert_eq!(clipped.len(), 2);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("surnames_denoise/cpu");
    let label = "denoise x256 (budget=elements, clip=3.0, scope=model)";
    // The second cell's every number null.
    for (cell, x) in clipped.iter().zip(["0.5", "null"]) {
        let cell_dir = root.join(&cell.name);
        std::fs::create_dir_all(&cell_dir).unwrap();
        std::fs::write(cell_dir.join("config.toml"), cell.config.to_toml()).unwrap();
        std::fs::write(
            cell_dir.join("summary.json"),
            format!(
                r#"{{"task": "surnames", "epochs": 15, "final_accuracy": {x},
                "last_test_accuracy": {x}, "wall_seconds": {x}, "epsilon": 1.5,
                "delta": 0.00008, "noise_multiplier": 0.8, "sample_rate": 0.002,
                "sampling": "poisson", "stopped": null, "compressor": "{label}",
                "upstream_gigabits": {x}, "upstream_paper_gib": {x}}}"#
            ),
        )
        .unwrap();
    }
    let rows = dpcomp_lab::grid::write_results(&experiment, "cpu", dir.path()).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].final_accuracy, 0.5);
    let r = &rows[1];
    assert!(
        r.final_accuracy.is_nan() && r.wall_seconds.is_nan(),
        "{r:?}"
    );
    assert!(
        r.upstream_gigabits.is_nan() && r.upstream_paper_gib.is_nan(),
        "{r:?}"
    );

    let (header, records) = dpcomp_lab::csv_table::read(&root.join("results.csv")).unwrap();
    assert_eq!(header.len(), 14);
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0][column("compressor")], label);
    assert_eq!(records[0][column("final_accuracy")], "0.5");
    assert_eq!(records[1][column("cell")], clipped[1].name);
    assert_eq!(records[1][column("final_accuracy")], "NaN");
    assert_eq!(records[1][column("upstream_paper_gib")], "NaN");
    let md = std::fs::read_to_string(root.join("results.md")).unwrap();
    assert!(md.contains("| NaN% |"), "{md}");

    let logs = dpcomp_lab::plot::read_cells(&root).unwrap();
    assert_eq!(logs.len(), 2);
    assert!(logs.iter().any(|c| c.summary.final_accuracy.is_nan()));
}

/// `dpcomp plot RUNS --beside OTHER`: an ablation's arms drawn with the grid they vary, from
/// the committed Surnames runs. The bars of both grids are in one figure, each arm a series of
/// its own (told apart by its compression setting).
#[test]
fn an_ablation_is_drawn_beside_the_grid_it_varies() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/runs");
    let dir = tempfile::tempdir().unwrap();
    let figures = dpcomp_lab::plot::plot_beside(
        &root.join("surnames_ablation/full"),
        &[root.join("surnames_dgc/full")],
        dir.path(),
        "surnames ablation",
    )
    .unwrap();
    // The four figures of training grids in two formats, and the gradient-error figures these
    // runs measured.
    assert!(figures.len() >= 8, "{} figures", figures.len());
    let svg = std::fs::read_to_string(dir.path().join("accuracy_by_epsilon.svg")).unwrap();
    for arm in [
        "dgc x16 (budget=elements, error_feedback=false)",
        "dgc x16 (budget=elements)",
        "dgc x256 (budget=elements)",
        "identity, clip_noised 3",
    ] {
        assert!(svg.contains(arm), "no series {arm:?} in the figure");
    }
    // Alone, the ablation's figure has only its own arms.
    let alone = tempfile::tempdir().unwrap();
    dpcomp_lab::plot::plot(
        &root.join("surnames_ablation/full"),
        alone.path(),
        "ablation",
    )
    .unwrap();
    let svg = std::fs::read_to_string(alone.path().join("accuracy_by_epsilon.svg")).unwrap();
    assert!(
        !svg.contains("dgc x16 (budget=elements)<"),
        "the DGC grid's arm drawn alone"
    );
}

#[test]
fn a_finished_target_epsilon_cell_is_finished_although_its_run_recorded_sigma() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_cifar100(&dir.path().join("data"), 8, 4);
    let file = dir.path().join("target.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "target"
description = "one cell at a target epsilon"
[base]
task = "cifar100"
data_dir = "{}"
device = "cpu"
batch_size = 4
accountant = "pld"
delta = 1e-5
[grid]
target_epsilon = [50.0]
[profiles.cpu]
epochs = 1
"#,
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let experiment = Experiment::from_file(&file).unwrap();
    let runs = dir.path().join("runs");
    let rows = dpcomp_lab::grid::run(&experiment, "cpu", &[], &runs, &mut ()).unwrap();
    assert_eq!(rows.len(), 1);
    // The run met ε 50 with the σ it calibrated and wrote into its config.toml.
    assert!(
        rows[0].noise_multiplier > 0.0,
        "{}",
        rows[0].noise_multiplier
    );
    let cells = experiment.cells("cpu", &[]).unwrap();
    let folder = runs.join("target/cpu").join(&cells[0].name);
    let saved = std::fs::read_to_string(folder.join("config.toml")).unwrap();
    assert!(saved.contains("noise_multiplier"), "{saved}");
    assert_eq!(
        cell_state(&folder, &cells[0].config).unwrap(),
        CellState::Finished
    );
    // A second process reaching the finished cell skips it instead of refusing the grid.
    let again = dpcomp_lab::grid::run(&experiment, "cpu", &[], &runs, &mut ()).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].noise_multiplier, rows[0].noise_multiplier);
}
