//! The documentation's relative links resolve: every `[text](path)` in README.md, CHANGELOG.md,
//! CONTRIBUTING.md and docs/**/*.md that is not a web address or an anchor names a file or
//! folder of the repository (an `#anchor` after the path is not checked), and none names a path
//! outside the repository. And the README stays a page a newcomer reads in minutes: at most 250
//! lines.

use std::path::{Path, PathBuf};

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The targets of the inline links `[text](target)` of `text`, outside code blocks and spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        // Drop code spans: a link inside backticks is not a link.
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
            targets.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_documentation_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect();
    markdown_files(&root.join("docs"), &mut files);
    assert!(files.len() > 10, "found only {} documents", files.len());
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let path = target.split('#').next().unwrap();
            let resolved = file.parent().unwrap().join(path);
            checked += 1;
            if !resolved.exists() {
                broken.push(format!(
                    "{}: ({target}) does not resolve",
                    file.strip_prefix(root).unwrap().display()
                ));
            } else if !resolved
                .canonicalize()
                .unwrap()
                .starts_with(root.canonicalize().unwrap())
            {
                broken.push(format!(
                    "{}: ({target}) leaves the repository",
                    file.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links checked");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_link_finder_sees_links_but_not_code() {
    let text = "see [a](docs/a.md) and `[b](not/this)`\n```\n[c](nor/this)\n```\n[d](x.md#part)";
    assert_eq!(link_targets(text), vec!["docs/a.md", "x.md#part"]);
}

#[test]
fn the_readme_is_short() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: at most 250 (details go to docs/)"
    );
}

/// No document names a path outside the repository (the project machines' `../shared/...`
/// folders, a home or work directory): data are found through `DPCOMP_DATA` (data/README.md)
/// and papers are cited by authors, title and year.
#[test]
fn the_documents_name_no_path_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
        .iter()
        .map(|f| root.join(f))
        .chain([root.join("data/README.md")])
        .filter(|p| p.exists())
        .collect();
    markdown_files(&root.join("docs"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for outside in ["../shared", "/work/", "/home/", "/root/", "/Users/"] {
                if line.contains(outside) {
                    found.push(format!(
                        "{}:{}: {outside}",
                        file.strip_prefix(root).unwrap().display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "paths outside the repository:\n{}",
        found.join("\n")
    );
}
