//! The framework and the lab build without the command line's crates (`cargo check -p dpcomp`,
//! run by hand when this test fails): clap may only appear behind their `cli` feature, anyhow
//! not at all outside the binary (`src/`). Checked on the sources, so that the
//! failure names the file; the test command also builds the lean core for real
//! (`tests/dependent-crate`, `default-features = false`).

use std::path::Path;

#[test]
fn clap_only_behind_the_cli_feature_and_anyhow_only_in_the_binary() {
    let files = crate::common::library_rust_files();
    assert!(files.len() > 50, "found only {} library files", files.len());
    let mut offending = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let clap = code.contains("clap") && !code.starts_with("#[cfg_attr(feature = \"cli\"");
            if clap || code.contains("anyhow") {
                offending.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "CLI crates in the library:\n{}",
        offending.join("\n")
    );
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/dpcomp/Cargo.toml"),
    )
    .unwrap();
    assert!(
        manifest.contains("cli = [\"dep:clap\"]") && manifest.contains("default = []"),
        "crates/dpcomp/Cargo.toml: the framework's default features are none, and `cli` adds clap alone"
    );
}
