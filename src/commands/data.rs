//! `dpcomp data fetch`: download, verify and unpack a dataset's official archive.

use anyhow::Result;
use clap::Subcommand;
use dpcomp::data::{self, fetch};
use dpcomp::error::Error;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Download, verify (SHA-256) and unpack a dataset: names, cifar10, cifar100 or snli.
    Fetch {
        dataset: String,
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Replace an existing copy.
        #[arg(long)]
        force: bool,
        /// A mirror of the official archive (same file).
        #[arg(long)]
        url: Option<String>,
        /// The expected SHA-256 of the archive at --url.
        #[arg(long)]
        sha256: Option<String>,
    },
}

pub fn run(command: DataCommand) -> Result<()> {
    let DataCommand::Fetch {
        dataset,
        data_dir,
        force,
        url,
        sha256,
    } = command;
    let mut source = fetch::official_source(&dataset)?;
    if let Some(url) = url {
        source.url = url;
        source.sha256 = sha256;
    } else if sha256.is_some() {
        return Err(Error::bad_value("--sha256", "only meaningful with --url").into());
    }
    let dir = data::data_dir(data_dir.as_deref());
    let fetched = fetch::fetch(&source, &dir, force, true)?;
    println!(
        "{}: {} files in {} (archive SHA-256 {})",
        source.dataset,
        fetched.files,
        fetched.folder.display(),
        fetched.sha256
    );
    Ok(())
}
