//! User-facing text explains the code as it is; its history lives in git and CHANGELOG.md. The
//! source (its doc comments become the crate documentation and the command line's help), the
//! guide, the results pages, the README and the examples must not point at an issue tracker:
//! no "issue 35", "(issues 4 and 5)", "issue #12", "issue-3" (also when the number wraps onto
//! the next line), and no "the issue" / "the issue's". The same holds for the help of every
//! command and subcommand of the `dpcomp` binary. A failure names each file:line (or the help
//! command) and the text; say what the code does and why instead (the paper, the equation, the
//! measurement), and leave the history pointer to the CHANGELOG.

use std::path::{Path, PathBuf};

use crate::common;
/// The places whose text a user reads, relative to the repository root.
const USER_TEXT: [&str; 6] = [
    "src",
    "crates",
    "docs/guide",
    "docs/results",
    "README.md",
    "examples",
];

/// Whether `b` can be part of a word (so that "tissue 3" and "issued 3" are not references).
fn word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Byte offsets where the word `word` starts in `lower` (already ASCII-lower-cased): preceded
/// by a non-word byte or the start, whatever follows.
fn word_starts<'a>(lower: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    let bytes = lower.as_bytes();
    lower
        .match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| at == 0 || !word_byte(bytes[at - 1]))
}

/// Where "issue" or "issues" ends as a whole word at `at`, if it does.
fn issue_word_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut end = at + "issue".len();
    if bytes.get(end) == Some(&b's') {
        end += 1;
    }
    match bytes.get(end) {
        Some(&b) if word_byte(b) => None,
        _ => Some(end),
    }
}

/// What in one line refers to an issue: "issue N" / "issues N" / "issue #N" / "issue-N", and
/// "the issue" / "the issue's" (not "the issues", not "tissue", not "issued").
fn references_in_line(line: &str) -> Vec<&'static str> {
    let lower = line.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut found = Vec::new();
    for at in word_starts(&lower, "issue") {
        let Some(mut end) = issue_word_end(bytes, at) else {
            continue;
        };
        let separated = end;
        while end < bytes.len() && matches!(bytes[end], b' ' | b'-' | b'#') {
            end += 1;
        }
        if end > separated && bytes.get(end).is_some_and(u8::is_ascii_digit) {
            found.push("an issue number");
        }
    }
    for at in word_starts(&lower, "the issue") {
        let end = at + "the issue".len();
        if !bytes.get(end).is_some_and(|&b| word_byte(b)) {
            found.push("\"the issue\"");
        }
    }
    found
}

/// Whether `line` ends with the word "issue" or "issues" and `next` (past indentation and
/// comment markers) starts with its number: "(issue\n//! 17)".
fn number_wraps(line: &str, next: &str) -> bool {
    let lower = line.trim_end().to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let ends_with_issue =
        word_starts(&lower, "issue").any(|at| issue_word_end(bytes, at) == Some(bytes.len()));
    let rest = next
        .trim_start()
        .trim_start_matches(['/', '!', '*', '#', '>', '-'])
        .trim_start();
    ends_with_issue && rest.starts_with(|c: char| c.is_ascii_digit())
}

/// Every reference in `text`, as (1-based line, what, the line).
fn references(text: &str) -> Vec<(usize, &'static str, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        for what in references_in_line(line) {
            found.push((i + 1, what, line.trim().to_string()));
        }
        if lines
            .get(i + 1)
            .is_some_and(|next| number_wraps(line, next))
        {
            let next = lines[i + 1].trim();
            found.push((
                i + 1,
                "an issue number",
                format!("{} / {next}", line.trim()),
            ));
        }
    }
    found
}

fn text_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for entry in entries {
            text_files(&entry, out);
        }
    } else if path.is_file() {
        out.push(path.to_path_buf());
    }
}

#[test]
fn the_matcher_knows_a_reference_from_ordinary_words() {
    for line in [
        "//! Every read counted (issue 37).",
        "Issues 4, 5, 13 and 38. [Results index](README.md).",
        "see issue #12",
        "(`examples` in the issue-3 note)",
        "Also accepted as `prv`, the name the issue uses",
        "the issue's settings",
        "ISSUE 40's families",
    ] {
        assert!(!references_in_line(line).is_empty(), "missed: {line}");
    }
    for line in [
        "as tch issues it to the device",
        "a tissue 3 mm thick",
        "issued 3 warnings",
        "the issues with a fused kernel",
        "an issue of memory, not of time",
        "`#[derive(Debug)]` and rank #0",
    ] {
        assert!(references_in_line(line).is_empty(), "false alarm: {line}");
    }
    assert!(number_wraps(
        "//! combine their updates into one (issue",
        "//! 17). Every worker"
    ));
    assert!(!number_wraps("is not an issue", "of memory"));
    assert!(!number_wraps("a tissue", "3 mm thick"));
    assert_eq!(references("one\n/// (issue\n/// 17)\n")[0].0, 2);
}

#[test]
fn user_text_names_no_issue() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for place in USER_TEXT {
        let path = root.join(place);
        assert!(path.exists(), "{place} is gone: update USER_TEXT");
        text_files(&path, &mut files);
    }
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not UTF-8 text (figures)
        };
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (line, what, text) in references(&text) {
            found.push(format!("{name}:{line}: {what}: {text}"));
        }
    }
    assert!(
        found.is_empty(),
        "user-facing text points at the issue tracker ({} places); say what the code does and \
         why instead, and leave the history to git and CHANGELOG.md:\n  {}",
        found.len(),
        found.join("\n  ")
    );
}

mod help {
    use super::common::{help, subcommands};
    use super::references;

    #[test]
    fn no_help_text_names_an_issue() {
        let mut pending = vec![Vec::<String>::new()];
        let mut commands = 0;
        let mut found = Vec::new();
        while let Some(command) = pending.pop() {
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            let text = help(&args);
            commands += 1;
            let shown = format!("dpcomp {} --help", command.join(" ")).replace("  ", " ");
            for (line, what, text) in references(&text) {
                found.push(format!("`{shown}` line {line}: {what}: {text}"));
            }
            for sub in subcommands(&text) {
                let mut deeper = command.clone();
                deeper.push(sub);
                pending.push(deeper);
            }
        }
        assert!(
            commands > 10,
            "only {commands} help texts found: is the parsing stale?"
        );
        assert!(
            found.is_empty(),
            "the help points at the issue tracker ({} places); the text comes from the doc \
             comments on the clap structs (crates/dpcomp/src/config.rs, src/**):\n  {}",
            found.len(),
            found.join("\n  ")
        );
    }
}
