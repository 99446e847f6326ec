//! The `dpcomp` command line: clap's parsing and anyhow's error context live here, not in the
//! library, which a program of one's own uses without either (`dpcomp::prelude`).

use clap::Parser;

mod cli;
mod commands;
mod errors;

/// The library's warnings and notes (`log::warn!`, `log::info!`) on stderr, as `warning: ...` and
/// `note: ...`; debug and trace messages are not shown.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let prefix = match record.level() {
                log::Level::Error => "error",
                log::Level::Warn => "warning",
                _ => "note",
            };
            let args = process_args();
            let text = errors::render_message(&record.args().to_string(), &args);
            eprintln!("{prefix}: {text}");
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

/// The process's arguments as text for naming flags in messages; an argument that is not UTF-8
/// (a path) is shown lossily rather than panicking while an error about it is reported.
fn process_args() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn main() {
    dpcomp::allocator::keep_freed_memory();
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let cli = cli::Cli::parse();
    if let Err(e) = cli::run(cli) {
        let args = process_args();
        eprintln!("error: {}", errors::render(&e, &args));
        std::process::exit(1);
    }
}
