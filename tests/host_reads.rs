//! Issue 37: the library reads tensor values only through `dpcomp::host`, which counts every
//! read on the calling thread, so that a count of a training step's reads is complete.

use std::path::{Path, PathBuf};

// ---- The guard: every read in `src/` goes through `dpcomp::host`. ----

/// What reads a tensor's value to the host or has a data-dependent size, and what to call
/// instead.
const DIRECT: [(&str, &str); 14] = [
    ("double_value(", "host::f64_scalar / host::f64_at"),
    ("int64_value(", "host::i64_scalar"),
    ("f64_value(", "host::f64_scalar"),
    ("copy_data", "host::to_bytes"),
    (".equal(", "host::equal"),
    (
        ".allclose(",
        "host::equal or a tolerance read through host::f64_scalar",
    ),
    (".is_nonzero(", "host::bool_scalar"),
    (".nonzero(", "host::nonzero"),
    (".nonzero_numpy(", "host::nonzero"),
    (".argwhere(", "host::nonzero"),
    (
        "where_(",
        "host::nonzero (the one-argument where is nonzero)",
    ),
    (".masked_select(", "host::masked_select"),
    (".unique", "a host function of its own in src/host.rs"),
    (
        ".repeat_interleave",
        "a host function of its own in src/host.rs",
    ),
];

/// The offending call in one line of code, and what to use instead; `None` when the line reads
/// nothing directly. `T::try_from(..)` is a tensor read when T is `Vec`, `bool` or a float, or
/// an integer converted from a reference (`i64::try_from(&t)`; `u32::try_from(n)` is not).
fn direct_read(code: &str) -> Option<(&'static str, &'static str)> {
    if let Some(found) = DIRECT.iter().find(|(pattern, _)| code.contains(pattern)) {
        return Some(*found);
    }
    let mut rest = code;
    while let Some(at) = rest.find("::try_from(") {
        let target = rest[..at]
            .rsplit(|c: char| !(c.is_alphanumeric() || "_<>:".contains(c)))
            .next()
            .unwrap_or("");
        let argument = &rest[at + "::try_from(".len()..];
        let by_reference = argument.starts_with('&');
        let integer = ["i64", "i32", "i16", "i8", "u8"].contains(&target);
        if target.starts_with("Vec")
            || ["bool", "f64", "f32", "half"].contains(&target)
            || (integer && by_reference)
        {
            return Some(("T::try_from(&tensor)", "host::to_vec_* or host::*_scalar"));
        }
        rest = argument;
    }
    None
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_guard_knows_a_read_from_other_conversions() {
    for read in [
        "let x = t.double_value(&[]);",
        "let n = t.sum(Kind::Int64).int64_value(&[]);",
        "let v = Vec::<f32>::try_from(&flat)?;",
        "let v: Vec<i64> = Vec::try_from(&t)?;",
        "let b = bool::try_from(t.isfinite().all());",
        "let x = f64::try_from(t)?;",
        "let n = i64::try_from(&count)?;",
        "let i = mask.nonzero();",
        "let i = Tensor::where_(&mask);",
        "let kept = x.masked_select(&mask);",
        "p.copy_data_u8(&mut bytes, n);",
        "assert!(a.equal(&b));",
        "let (values, _, _) = x.unique_dim(0, true, false, false);",
    ] {
        assert!(direct_read(read).is_some(), "not caught: {read}");
    }
    for fine in [
        "let n = u32::try_from(bytes.len()).map_err(bad)?;",
        "let step = i64::try_from(step).unwrap();",
        "let c = Count::try_from(bytes.len());",
        "let x = crate::host::f64_scalar(&t.sum(Kind::Double));",
        "let v = host::to_vec_f32(&flat)?;",
        "let y = x.where_self(&mask, &z);",
        "let t = toml::Value::try_from(self);",
    ] {
        assert_eq!(direct_read(fine), None, "wrongly caught: {fine}");
    }
}

/// Every `.rs` file under `src/` but `src/host.rs` and the application (`src/bin/`) reads
/// tensor values only through `dpcomp::host`, so that the count of `host::reads` is complete.
/// Comment lines (and the documentation's examples in them) are not code of the library.
#[test]
fn every_read_in_the_library_goes_through_the_host_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 50, "found only {} library files", files.len());
    let host = src.join("host.rs");
    let mut offending = Vec::new();
    for file in files.iter().filter(|f| **f != host) {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if let Some((pattern, instead)) = direct_read(code) {
                offending.push(format!(
                    "{}:{}: {pattern} (use {instead}): {}",
                    file.strip_prefix(env!("CARGO_MANIFEST_DIR"))
                        .unwrap()
                        .display(),
                    i + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "tensor values read outside dpcomp::host:\n{}",
        offending.join("\n")
    );
}
