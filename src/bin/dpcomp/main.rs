//! The `dpcomp` command line: clap's parsing and anyhow's error context live here, not in the
//! library, which a program of one's own uses without either (`dpcomp::prelude`).

use clap::Parser;

mod cli;
mod commands;
mod errors;

fn main() {
    dpcomp::allocator::keep_freed_memory();
    let cli = cli::Cli::parse();
    if let Err(e) = cli::run(cli) {
        let args: Vec<String> = std::env::args().collect();
        eprintln!("error: {}", errors::render(&e, &args));
        std::process::exit(1);
    }
}
