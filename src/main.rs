use clap::Parser;

fn main() {
    dpcomp::allocator::keep_freed_memory();
    let cli = dpcomp::cli::Cli::parse();
    if let Err(e) = dpcomp::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
