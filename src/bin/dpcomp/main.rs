//! The `dpcomp` command line: clap's parsing and anyhow's error context live here, not in the
//! library, which a program of one's own uses without either (`dpcomp::prelude`).

use clap::Parser;

mod cli;
mod commands;

fn main() {
    dpcomp::allocator::keep_freed_memory();
    let cli = cli::Cli::parse();
    if let Err(e) = cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
