//! LibTorch's random generator is global to the process, and the tests of one binary (every
//! module of `tests/<binary>/`) run in parallel threads: a test that seeds it
//! (`tch::manual_seed`, directly or through a helper of its module) and then draws must hold
//! `common::serial()`, or another test's draw can land in between and change its data from run
//! to run. CI failed on exactly that once (a families test counted elements in data its
//! compressor had never seen). This guard reads every test module and fails naming each test
//! that reaches a `manual_seed` without holding the lock; tests whose data are only their own
//! draws use `common::Draws` instead, which needs no lock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A top-level function of a test file: whether it is a `#[test]`, and its text.
struct Function {
    test: bool,
    body: String,
}

/// The top-level functions of a Rust file, by name: each runs from its `fn` line to the next
/// top-level `fn` (attributes and doc comments above a `fn` mark a test when one is `#[test]`).
fn functions(source: &str) -> BTreeMap<String, Function> {
    let lines: Vec<&str> = source.lines().collect();
    let name_of = |line: &str| -> Option<String> {
        let rest = line
            .strip_prefix("fn ")
            .or_else(|| line.strip_prefix("pub fn "))?;
        Some(
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect(),
        )
    };
    let starts: Vec<(usize, String)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, line)| name_of(line).map(|name| (i, name)))
        .collect();
    let mut found = BTreeMap::new();
    for (n, (start, name)) in starts.iter().enumerate() {
        let end = starts.get(n + 1).map_or(lines.len(), |(next, _)| *next);
        let test = lines[..*start]
            .iter()
            .rev()
            .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
            .any(|l| l.starts_with("#[test]"));
        let body = lines[*start..end].join("\n");
        found.insert(name.clone(), Function { test, body });
    }
    found
}

/// Whether `name` seeds LibTorch's generator, itself or through a function of the same file it
/// calls (`name(`), `visited` breaking cycles.
fn seeds(
    name: &str,
    functions: &BTreeMap<String, Function>,
    visited: &mut BTreeSet<String>,
) -> bool {
    if !visited.insert(name.to_string()) {
        return false;
    }
    let body = &functions[name].body;
    if body.contains("manual_seed") {
        return true;
    }
    functions
        .keys()
        .filter(|other| other.as_str() != name)
        .filter(|other| calls(body, other))
        .any(|other| seeds(other, functions, visited))
}

/// Whether `body` calls `name(` as a whole word.
fn calls(body: &str, name: &str) -> bool {
    let pattern = format!("{name}(");
    body.match_indices(&pattern).any(|(at, _)| {
        let before = body[..at].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The tests of `source` that reach a `manual_seed` without holding `serial()`.
fn unguarded(source: &str) -> Vec<String> {
    let functions = functions(source);
    functions
        .iter()
        .filter(|(_, f)| f.test && !f.body.contains("serial()"))
        .filter(|(name, _)| seeds(name, &functions, &mut BTreeSet::new()))
        .map(|(name, _)| name.clone())
        .collect()
}

/// The test modules under `dir`: every `.rs` file of the test binaries' folders, but the shared
/// helpers (`common/`), the dependent crate, and this file, whose own example (a string) is not
/// a test's code.
fn test_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !matches!(name.as_str(), "common" | "dependent-crate" | "fixtures") {
                test_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "seeded_tests_guard.rs" && name != "main.rs" {
            out.push(path);
        }
    }
}

#[test]
fn every_test_that_seeds_libtorchs_generator_holds_the_lock() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut offenders = Vec::new();
    let mut paths = Vec::new();
    test_files(&dir, &mut paths);
    let files = paths.len();
    for path in paths {
        let source = std::fs::read_to_string(&path).unwrap();
        for test in unguarded(&source) {
            offenders.push(format!("{}: {test}", path.display()));
        }
    }
    assert!(
        files > 30,
        "read only {files} test files in {}",
        dir.display()
    );
    assert!(
        offenders.is_empty(),
        "these tests seed LibTorch's global generator without holding common::serial() \
         (hold it, or draw their data from common::Draws):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_guard_finds_a_seed_reached_through_a_helper() {
    let source = r#"
fn update(seed: i64) -> Vec<f32> {
    tch::manual_seed(seed);
    vec![]
}

fn message_of(seed: i64) -> Vec<f32> {
    update(seed)
}

#[test]
fn unguarded_through_two_helpers() {
    let _ = message_of(1);
}

#[test]
fn guarded() {
    let _serial = common::serial();
    let _ = message_of(2);
}

#[test]
fn draws_its_own() {
    let _ = my_update(3);
}
"#;
    assert_eq!(unguarded(source), ["unguarded_through_two_helpers"]);
}
