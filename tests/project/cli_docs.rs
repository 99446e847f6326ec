//! docs/guide/cli.md documents every command of the binary with exactly its flags. For every
//! command and subcommand that `dpcomp --help` lists (found recursively, so a new command needs
//! its own heading), the flags (`--xxx`) in `dpcomp <command> --help` must appear in the page
//! under that command's heading (`## dpcomp <command>`, `### dpcomp <command> <subcommand>`),
//! and every flag the page names there must be one the help names. When this fails, regenerate
//! the page: `bash scripts/cli-docs.sh target/release/dpcomp > docs/guide/cli.md` (and add a
//! sentence for a new command in the script).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common;
use common::{help, subcommands};

/// Every `--flag` token in a text: two dashes, then a lower-case letter or digit, then letters,
/// digits and dashes (so `-->` arrows and `--` alone are not flags).
fn flags(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-'
            && bytes[i + 1] == b'-'
            && (i == 0 || !(bytes[i - 1] == b'-' || bytes[i - 1].is_ascii_alphanumeric()))
            && (bytes[i + 2].is_ascii_lowercase() || bytes[i + 2].is_ascii_digit());
        if starts {
            let mut end = i + 2;
            while end < bytes.len()
                && (bytes[end].is_ascii_lowercase()
                    || bytes[end].is_ascii_digit()
                    || bytes[end] == b'-')
            {
                end += 1;
            }
            let flag = text[i..end].trim_end_matches('-');
            found.insert(flag.to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    found
}

/// The page's sections by command: a heading whose text is `dpcomp ...` (backticks allowed)
/// opens one, and it runs to the next command heading.
fn sections(page: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in page.lines() {
        let heading = line.starts_with('#').then(|| {
            line.trim_start_matches('#')
                .trim()
                .trim_matches('`')
                .trim()
                .to_string()
        });
        match heading {
            Some(title) if title == "dpcomp" || title.starts_with("dpcomp ") => {
                if let Some((name, text)) = current.take() {
                    sections.insert(name, text);
                }
                current = Some((title, String::new()));
            }
            _ => {
                if let Some((_, text)) = current.as_mut() {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
    }
    if let Some((name, text)) = current {
        sections.insert(name, text);
    }
    sections
}

#[test]
fn the_cli_page_has_every_command_with_exactly_its_flags() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide/cli.md");
    let page = std::fs::read_to_string(&path).expect("docs/guide/cli.md exists");
    let sections = sections(&page);
    let fix = "regenerate it: bash scripts/cli-docs.sh target/release/dpcomp > docs/guide/cli.md";

    // Every command, depth first: [], [train], ..., [bench], [bench, dp], ...
    let mut commands: Vec<Vec<String>> = vec![Vec::new()];
    let mut checked = Vec::new();
    let mut problems = Vec::new();
    while let Some(command) = commands.pop() {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let text = help(&args);
        for sub in subcommands(&text).into_iter().rev() {
            let mut child = command.clone();
            child.push(sub);
            commands.push(child);
        }
        let name = if command.is_empty() {
            "dpcomp".to_string()
        } else {
            format!("dpcomp {}", command.join(" "))
        };
        let Some(section) = sections.get(&name) else {
            problems.push(format!(
                "`{name}` has no heading `## {name}` (or `### {name}`) in docs/guide/cli.md"
            ));
            continue;
        };
        let in_help = flags(&text);
        let in_page = flags(section);
        for flag in in_help.difference(&in_page) {
            problems.push(format!(
                "`{name} --help` has {flag}, which docs/guide/cli.md does not mention under `{name}`"
            ));
        }
        for flag in in_page.difference(&in_help) {
            problems.push(format!(
                "docs/guide/cli.md names {flag} under `{name}`, which `{name} --help` does not have"
            ));
        }
        checked.push(name);
    }
    for title in sections.keys() {
        if !checked.contains(title) {
            problems.push(format!(
                "docs/guide/cli.md has a section `{title}`, which is not a command of the binary"
            ));
        }
    }
    assert!(
        checked.len() >= 20,
        "found only {} commands: {checked:?}",
        checked.len()
    );
    assert!(
        problems.is_empty(),
        "docs/guide/cli.md differs from the binary's help ({fix}):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn flags_are_read_as_written() {
    let text =
        "  -h, --help  Print help\n      --rate <RATE>  see --compressor-option; a --> b, --\n";
    let found: Vec<String> = flags(text).into_iter().collect();
    assert_eq!(found, ["--compressor-option", "--help", "--rate"]);
    let page =
        "# intro --nothing\n## dpcomp\n--a1\n## `dpcomp bench`\n--b\n### dpcomp bench dp\n--c\n";
    let sections = sections(page);
    assert_eq!(sections.len(), 3);
    assert_eq!(sections["dpcomp bench"], "--b\n");
    assert_eq!(sections["dpcomp bench dp"], "--c\n");
}

/// `dpcomp train --help` lists, after each compressor's name, every option key that compressor
/// accepts (`CompressorKind::keys`, which the parser checks against): a key added to a
/// compressor without its help fails here.
#[test]
fn the_compressor_option_help_names_every_compressors_keys() {
    use dpcomp::compress::CompressorKind;
    let help = help(&["train"]);
    // The --compressor-option paragraph, its wrapped lines joined.
    let paragraph: String = help
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("--compressor-option"))
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    let words: Vec<&str> = paragraph.split_whitespace().collect();
    for kind in CompressorKind::ALL {
        let label = format!("{}:", kind.name());
        let Some(start) = words.iter().position(|w| *w == label) else {
            assert!(
                kind.keys().is_empty(),
                "{kind} takes {:?} but the help does not name it: {paragraph}",
                kind.keys()
            );
            continue;
        };
        // Its keys run to the sentence's end (a word ending in '.').
        let end = start
            + words[start..]
                .iter()
                .position(|w| w.ends_with('.'))
                .unwrap();
        let listed: BTreeSet<&str> = words[start + 1..=end]
            .iter()
            .filter(|w| !w.starts_with('('))
            .map(|w| w.trim_end_matches([',', '.']))
            .collect();
        let accepted: BTreeSet<&str> = kind.keys().iter().copied().collect();
        assert_eq!(listed, accepted, "{kind}: the help lists {listed:?}");
    }
}
