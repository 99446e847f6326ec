//! How the command line shows the library's errors. The library names the field that was wrong
//! (`TrainConfig`'s and the settings structs' names) and writes fields it mentions in backticks;
//! here each such field becomes the flag that sets it in the command being run, so a user of the
//! command line reads `--local-lr: ...` where a user of the library reads
//! `local.learning_rate: ...`.

use clap::CommandFactory;
use std::collections::HashMap;

/// Library fields whose flag is not their own name: (field, the clap argument's id).
const FIELD_TO_ARGUMENT: &[(&str, &str)] = &[
    ("local.learning_rate", "local_lr"),
    ("local.steps", "local_steps"),
    ("local.batch", "local_batch"),
    ("server_learning_rate", "server_lr"),
    ("privacy.clip", "clip"),
    ("partition", "non_iid"),
    ("run_dir", "out"),
];

/// The flag that sets the library's `field` in the subcommand whose `flags` are given.
fn flag_of(field: &str, flags: &HashMap<String, String>) -> Option<String> {
    // A training setting's dotted field (`privacy.noise_multiplier`) is set by the flag of its
    // flat key (`--noise-multiplier`).
    let id = FIELD_TO_ARGUMENT
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, id)| *id)
        .or_else(|| dpcomp::config::flat_key(field))
        .unwrap_or(field);
    flags.get(id).map(|long| format!("--{long}"))
}

/// The error's chain as one line (anyhow's `{:#}`), with library fields shown as the flags of
/// the subcommand named in `args` (the process's arguments).
pub fn render(error: &anyhow::Error, args: &[String]) -> String {
    let flags = flags_of_subcommand(args);
    let flag = |field: &str| flag_of(field, &flags);
    let fields = |text: &str| -> String {
        text.split('/')
            .map(|f| flag(f).unwrap_or_else(|| f.to_string()))
            .collect::<Vec<_>>()
            .join("/")
    };
    error
        .chain()
        .map(|cause| match cause.downcast_ref::<dpcomp::Error>() {
            Some(dpcomp::Error::BadValue { field, what }) => {
                format!("{}: {}", fields(field), backticked_as_flags(what, &flag))
            }
            _ => backticked_as_flags(&cause.to_string(), &flag),
        })
        .collect::<Vec<_>>()
        .join(": ")
}

/// A library warning or note with the fields it names in backticks shown as flags, as `render`
/// shows an error's.
pub fn render_message(text: &str, args: &[String]) -> String {
    let flags = flags_of_subcommand(args);
    backticked_as_flags(text, &|field: &str| flag_of(field, &flags))
}

/// `text` with every `field` in backticks that is a flag replaced by that flag; other
/// backticked words (a command to run, a field without a flag) stay as they are.
fn backticked_as_flags(text: &str, flag: &impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut parts = text.split('`');
    out.push_str(parts.next().unwrap_or_default());
    let rest: Vec<&str> = parts.collect();
    // Pieces alternate inside / outside backticks; an unmatched last backtick stays literal.
    let mut i = 0;
    while i < rest.len() {
        let inside = rest[i];
        let closed = i + 1 < rest.len();
        match (closed, flag(inside)) {
            (true, Some(f)) => out.push_str(&f),
            (true, None) => out.push_str(&format!("`{inside}`")),
            (false, _) => out.push_str(&format!("`{inside}")),
        }
        if closed {
            out.push_str(rest[i + 1]);
        }
        i += 2;
    }
    out
}

/// The long flags (by argument id) of the deepest subcommand that `args` names.
fn flags_of_subcommand(args: &[String]) -> HashMap<String, String> {
    let mut command = crate::cli::Cli::command();
    for arg in args.iter().skip(1) {
        match command.find_subcommand(arg) {
            Some(sub) => command = sub.clone(),
            None if arg.starts_with('-') => continue,
            None => break,
        }
    }
    command
        .get_arguments()
        .filter_map(|a| Some((a.get_id().to_string(), a.get_long()?.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn library_fields_become_the_subcommands_flags() {
        let fl = args("dpcomp fl --scheme cs");
        let e = anyhow::Error::from(dpcomp::Error::bad_value(
            "local.learning_rate",
            "0: expected positive; lower `server_learning_rate`",
        ));
        assert_eq!(
            render(&e, &fl),
            "--local-lr: 0: expected positive; lower --server-lr"
        );
        let train = args("dpcomp train --task surnames");
        let e = anyhow::Error::from(dpcomp::Error::bad_value(
            "clipping",
            "needs `noise_multiplier`; see `dpcomp data fetch` and `nothing_here`",
        ))
        .context("resuming runs/x");
        assert_eq!(
            render(&e, &train),
            "resuming runs/x: --clipping: needs --noise-multiplier; see `dpcomp data fetch` and `nothing_here`"
        );
        // A field the command has no flag for keeps its library name; "a/b" maps each part.
        let eps = args("dpcomp epsilon --steps 0");
        let e = anyhow::Error::from(dpcomp::Error::bad_value("epsilon/delta", "x"));
        assert_eq!(render(&e, &eps), "epsilon/--delta: x");
        let e = anyhow::Error::from(dpcomp::Error::bad_value("steps", "unclosed `steps"));
        assert_eq!(render(&e, &eps), "--steps: unclosed `steps");
        // Training settings are named by section; each shows as its flag.
        let e = anyhow::Error::from(dpcomp::Error::bad_value(
            "privacy.clipping",
            "needs `privacy.noise_multiplier`; `optimizer.kind` adam",
        ));
        assert_eq!(
            render(&e, &train),
            "--clipping: needs --noise-multiplier; --optimizer adam"
        );
        let e = anyhow::Error::from(dpcomp::Error::bad_value(
            "data.limit_train/data.limit_test",
            "0",
        ));
        assert_eq!(render(&e, &train), "--limit-train/--limit-test: 0");
        let e = anyhow::Error::from(dpcomp::Error::bad_value("compression.options", "x"));
        assert_eq!(render(&e, &train), "--compressor-option: x");
        // A renamed flag: compressor_options is --compressor-option.
        let e = anyhow::Error::from(dpcomp::Error::bad_value("compressor_options", "x"));
        assert_eq!(render(&e, &train), "--compressor-option: x");
    }
}
