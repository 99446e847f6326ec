//! What a clone carries of the experiments: the finished cells under `experiments/runs/` keep
//! their logs packed (`metrics.jsonl.gz`, `grad_error.jsonl.gz`, `dpcomp::run_log`), which read
//! as the plain logs did, and a grid packs a cell when it finishes, resumes a packed one and
//! skips a packed finished one. A figure under `experiments/` is committed only when a page
//! shows it: `.gitignore` ignores the others, and names exactly the shown ones.

use crate::common;
use dpcomp::run_log::{self, Packing};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every folder at or below `dir` that holds a `summary.json` (a finished run), sorted.
fn finished_runs(dir: &Path) -> Vec<PathBuf> {
    let mut runs = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        if folder.join("summary.json").is_file() {
            runs.push(folder.clone());
        }
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            }
        }
    }
    runs.sort();
    runs
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// Every finished committed run has its logs packed, none plain, and its packed metrics read as
/// a training run's epochs (as many as its summary reports) or a federated run's rounds.
#[test]
fn every_finished_committed_run_has_its_logs_packed() {
    let runs = finished_runs(&repo().join("experiments/runs"));
    assert!(runs.len() > 200, "found only {} finished runs", runs.len());
    let mut grad_error_logs = 0;
    for run in &runs {
        for name in run_log::LOGS {
            assert!(
                !run.join(name).exists(),
                "{}: {name} is not packed (dpcomp pack {})",
                run.display(),
                run.display()
            );
        }
        assert!(
            run.join("metrics.jsonl.gz").is_file(),
            "{}: no metrics.jsonl.gz",
            run.display()
        );
        let metrics = run.join("metrics.jsonl");
        let summary = std::fs::read_to_string(run.join("summary.json")).unwrap();
        match serde_json::from_str::<dpcomp::train::metrics::Summary>(&summary) {
            Ok(summary) => {
                let epochs = dpcomp::train::metrics::read(&metrics)
                    .unwrap_or_else(|e| panic!("{}: {e}", run.display()));
                assert_eq!(epochs.len(), summary.epochs, "{}", run.display());
            }
            Err(_) => {
                let rounds = dpcomp::fl::read_rows(&metrics)
                    .unwrap_or_else(|e| panic!("{}: {e}", run.display()));
                assert!(!rounds.is_empty(), "{}", run.display());
            }
        }
        if run.join("grad_error.jsonl.gz").is_file() {
            let records = dpcomp_lab::analysis::gradient_error::read(run).unwrap();
            assert!(!records.is_empty(), "{}", run.display());
            grad_error_logs += 1;
        }
    }
    assert!(
        grad_error_logs > 100,
        "{grad_error_logs} gradient-error logs"
    );
}

/// A committed grid's packed cells read exactly the rows of their plain logs, pack again to the
/// same bytes, and are finished for `dpcomp grid` in either form.
#[test]
fn a_packed_cell_reads_as_its_plain_logs_and_is_finished() {
    let experiment =
        dpcomp_lab::grid::Experiment::from_file(&repo().join("experiments/cifar10_dgc.toml"))
            .unwrap();
    let committed = repo().join("experiments/runs/cifar10_dgc/cpu");
    let copy = tempfile::tempdir().unwrap();
    copy_tree(&committed, copy.path());
    let cells = experiment.cells("cpu", &[]).unwrap();
    assert_eq!(cells.len(), 9);
    for cell in &cells {
        let dir = copy.path().join(&cell.name);
        assert_eq!(
            dpcomp_lab::grid::cell_state(&dir, &cell.config).unwrap(),
            dpcomp_lab::grid::CellState::Finished,
            "{}",
            cell.name
        );
        let metrics = dir.join("metrics.jsonl");
        let packed_rows = dpcomp::train::metrics::read(&metrics).unwrap();
        let packed_errors = dpcomp_lab::analysis::gradient_error::read(&dir).unwrap();
        assert!(!packed_rows.is_empty() && !packed_errors.is_empty());
        let packed_bytes: Vec<Vec<u8>> = run_log::LOGS
            .iter()
            .map(|name| std::fs::read(dir.join(format!("{name}.gz"))).unwrap())
            .collect();
        // Unpacked: the plain files hold the packed text, and read as the same rows.
        for name in run_log::LOGS {
            let plain = dir.join(name);
            run_log::unpack(&plain).unwrap();
            let text = std::fs::read_to_string(&plain).unwrap();
            let packed =
                run_log::read_packed(&committed.join(&cell.name).join(format!("{name}.gz")))
                    .unwrap()
                    .unwrap();
            assert_eq!(text, packed, "{} {name}", cell.name);
            assert!(!run_log::packed_path(&plain).exists());
        }
        assert_eq!(dpcomp::train::metrics::read(&metrics).unwrap(), packed_rows);
        let plain_errors = dpcomp_lab::analysis::gradient_error::read(&dir).unwrap();
        assert_eq!(
            serde_json::to_string(&plain_errors).unwrap(),
            serde_json::to_string(&packed_errors).unwrap()
        );
        assert_eq!(
            dpcomp_lab::grid::cell_state(&dir, &cell.config).unwrap(),
            dpcomp_lab::grid::CellState::Finished
        );
        // Packed again: the committed bytes (the gzip header holds no time or name).
        assert_eq!(run_log::pack_run(&dir).unwrap(), Packing::Packed(2));
        for (name, bytes) in run_log::LOGS.iter().zip(&packed_bytes) {
            assert_eq!(
                &std::fs::read(dir.join(format!("{name}.gz"))).unwrap(),
                bytes
            );
            assert!(!dir.join(name).exists());
        }
    }
}

/// A grid packs each cell it finishes; a packed cell is skipped while finished, and resumed
/// (unpacked, its rows kept, then packed again) when the profile asks for more epochs. A folder
/// that holds no finished run is left as it is by `pack_run`.
#[test]
fn a_grid_packs_finished_cells_and_resumes_packed_ones() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("packed.toml");
    let write = |epochs: usize| {
        std::fs::write(
            &file,
            format!(
                "name = \"packed\"\n[base]\ntask = \"surnames\"\ndevice = \"cpu\"\nlimit_train = 200\nlimit_test = 40\ndata_dir = {:?}\n[grid]\nseed = [0]\n[profiles.cpu]\nepochs = {epochs}\n",
                data.display().to_string()
            ),
        )
        .unwrap();
        dpcomp_lab::grid::Experiment::from_file(&file).unwrap()
    };
    let runs = dir.path().join("runs");
    let experiment = write(1);
    let rows = dpcomp_lab::grid::run(&experiment, "cpu", &[], &runs, &mut ()).unwrap();
    assert_eq!(rows.len(), 1);
    let cell = runs.join("packed/cpu/seed-0");
    assert!(cell.join("metrics.jsonl.gz").is_file());
    assert!(!cell.join("metrics.jsonl").exists());
    let first = dpcomp::train::metrics::read(&cell.join("metrics.jsonl")).unwrap();
    assert_eq!(first.len(), 1);
    let packed = std::fs::read(cell.join("metrics.jsonl.gz")).unwrap();
    let config = &experiment.cells("cpu", &[]).unwrap()[0].config;
    assert_eq!(
        dpcomp_lab::grid::cell_state(&cell, config).unwrap(),
        dpcomp_lab::grid::CellState::Finished
    );
    // Run again: skipped, its packed log untouched.
    let again = dpcomp_lab::grid::run(&experiment, "cpu", &[], &runs, &mut ()).unwrap();
    assert_eq!(again[0].final_accuracy, rows[0].final_accuracy);
    assert_eq!(
        std::fs::read(cell.join("metrics.jsonl.gz")).unwrap(),
        packed
    );

    // Two epochs: the packed cell resumes after its first, keeps that row, and is packed again.
    let longer = write(2);
    let rows = dpcomp_lab::grid::run(&longer, "cpu", &[], &runs, &mut ()).unwrap();
    assert_eq!(rows[0].epochs, 2);
    assert!(!cell.join("metrics.jsonl").exists());
    let history = dpcomp::train::metrics::read(&cell.join("metrics.jsonl")).unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0], first[0]);

    // An unfinished run folder is not packed; a finished one already packed packs nothing.
    let unfinished = dir.path().join("unfinished");
    std::fs::create_dir(&unfinished).unwrap();
    std::fs::copy(cell.join("config.toml"), unfinished.join("config.toml")).unwrap();
    run_log::unpack(&cell.join("metrics.jsonl")).unwrap();
    std::fs::copy(cell.join("metrics.jsonl"), unfinished.join("metrics.jsonl")).unwrap();
    assert_eq!(run_log::pack_run(&unfinished).unwrap(), Packing::Unfinished);
    assert!(unfinished.join("metrics.jsonl").is_file());
    let report = run_log::pack_below(dir.path()).unwrap();
    assert_eq!((report.finished, report.packed), (1, 1));
    assert!(unfinished.join("metrics.jsonl").is_file());
    assert!(cell.join("metrics.jsonl.gz").is_file() && !cell.join("metrics.jsonl").exists());
}

/// The targets of the inline links `[text](target)` of a Markdown page that name a PNG, outside
/// code blocks and spans, as paths relative to the repository.
fn shown_figures(page: &Path, root: &Path, out: &mut BTreeSet<String>) {
    let text = std::fs::read_to_string(page).unwrap();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].trim();
            if target.ends_with(".png") && !target.contains("://") {
                let path = page.parent().unwrap().join(target);
                let path = path
                    .canonicalize()
                    .unwrap_or_else(|e| panic!("{}: {target}: {e}", page.display()));
                let relative = path.strip_prefix(root).unwrap();
                out.insert(relative.to_string_lossy().replace('\\', "/"));
            }
            rest = &after[end..];
        }
    }
}

/// Every PNG a page links to is committed, and no other PNG under `experiments/` is: the
/// `.gitignore` ignores figures under `experiments/` except exactly the shown ones, and (where
/// the checkout is a git repository) git tracks no other.
#[test]
fn only_the_figures_a_page_shows_are_committed() {
    let root = repo().canonicalize().unwrap();
    let mut pages: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect();
    let mut folders = vec![root.join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut shown = BTreeSet::new();
    for page in &pages {
        shown_figures(page, &root, &mut shown);
    }
    assert!(shown.len() >= 10, "pages show only {shown:?}");
    let gitignore = std::fs::read_to_string(root.join(".gitignore")).unwrap();
    assert!(
        gitignore
            .lines()
            .any(|l| l.trim() == "/experiments/**/*.png"),
        ".gitignore does not ignore the figures under experiments/"
    );
    let kept: BTreeSet<String> = gitignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix("!/"))
        .filter(|l| l.starts_with("experiments/") && l.ends_with(".png"))
        .map(str::to_string)
        .collect();
    let unshown: Vec<&String> = kept.difference(&shown).collect();
    let missing: Vec<String> = shown
        .difference(&kept)
        .filter(|f| f.starts_with("experiments/"))
        .map(|f| format!("!/{f}"))
        .collect();
    assert!(
        unshown.is_empty(),
        ".gitignore keeps figures no page shows: {unshown:?}"
    );
    assert!(
        missing.is_empty(),
        "figures pages show but .gitignore ignores; add the lines {missing:?}"
    );
    let tracked = std::process::Command::new("git")
        .current_dir(&root)
        .args(["ls-files", "-z", "--", "experiments/*.png"])
        .output();
    if let Some(out) = tracked.ok().filter(|o| o.status.success()) {
        let tracked: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .split('\0')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect();
        let extra: Vec<&String> = tracked.iter().filter(|f| !shown.contains(*f)).collect();
        assert!(
            extra.is_empty(),
            "committed figures no page shows: {extra:?}"
        );
    }
}
