//! Every CSV table under `experiments/` (the committed results, and any table kept in a run
//! folder) parses as CSV with one field per header column in every row: a compressor label that holds
//! commas must be quoted, not split.

use std::path::{Path, PathBuf};

/// The `*.csv` files below `dir`, sorted.
fn csv_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "csv") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// What is wrong with the table at `path`, if anything.
fn malformed(path: &Path) -> Option<String> {
    let mut reader = match csv::ReaderBuilder::new().flexible(true).from_path(path) {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    let columns = match reader.headers() {
        Ok(h) if !h.is_empty() => h.len(),
        Ok(_) => return Some("no header".to_string()),
        Err(e) => return Some(e.to_string()),
    };
    for (i, record) in reader.records().enumerate() {
        match record {
            Ok(r) if r.len() == columns => {}
            Ok(r) => {
                return Some(format!(
                    "record {}: {} fields under a {columns}-field header",
                    i + 1,
                    r.len()
                ))
            }
            Err(e) => return Some(e.to_string()),
        }
    }
    None
}

#[test]
fn every_committed_table_has_one_field_per_header_column() {
    let experiments = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let files = csv_files(&experiments);
    // The tables whose compressor labels hold commas are among those checked.
    for table in [
        "results/surnames_denoise.full.csv",
        "results/surnames_denoise-full/gradient_error.csv",
        "results/cifar10_dgc_conventions.cpu.csv",
        "results/audit_surnames.cpu.csv",
    ] {
        assert!(files.contains(&experiments.join(table)), "{table} missing");
    }
    let bad: Vec<String> = files
        .iter()
        .filter_map(|f| malformed(f).map(|what| format!("{}: {what}", f.display())))
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {} tables are malformed:\n{}",
        bad.len(),
        files.len(),
        bad.join("\n")
    );
}
