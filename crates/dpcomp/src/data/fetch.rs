//! `dpcomp data fetch <dataset>`: downloads an official archive, verifies its SHA-256, and unpacks
//! the dataset's folder into the data directory. Nothing is left half-written: the download goes
//! to a `.part` file, unpacking to a temporary folder that is renamed into place only when
//! everything succeeded, and both are removed on any error.

use crate::error::{Error, Result};
use crate::progress_bar::Bar;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// The archive format of a download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    /// A gzipped tar file (`.tar.gz`).
    TarGz,
    /// A zip file.
    Zip,
}

/// Where a dataset comes from and which part of the archive is the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The name `dpcomp data fetch` takes (`names`, `cifar10`, `cifar100`, `snli`).
    pub dataset: String,
    /// Where the archive is downloaded from.
    pub url: String,
    /// Expected SHA-256 (lower-case hex). `None` only where no checksum is published for the
    /// archive; the computed one is then printed so that it can be pinned.
    pub sha256: Option<String>,
    /// How the archive is unpacked.
    pub kind: ArchiveKind,
    /// Entries under this path inside the archive are the dataset...
    pub prefix: String,
    /// ...and are written under this folder of the data directory.
    pub folder: String,
}

/// The official archives. CIFAR's and SNLI's checksums are the ones TensorFlow Datasets pins.
/// The PyTorch tutorial's `data.zip` (Surnames) has no published checksum and was re-packed
/// upstream (24 junk lines removed), so its SHA-256 is reported, not checked.
pub fn official_sources() -> Vec<Source> {
    let source =
        |dataset: &str, url: &str, sha256: Option<&str>, kind, prefix: &str, folder: &str| Source {
            dataset: dataset.into(),
            url: url.into(),
            sha256: sha256.map(String::from),
            kind,
            prefix: prefix.into(),
            folder: folder.into(),
        };
    vec![
        source(
            "names",
            "https://download.pytorch.org/tutorial/data.zip",
            None,
            ArchiveKind::Zip,
            "data/names/",
            "names",
        ),
        source(
            "cifar10",
            "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
            Some("c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"),
            ArchiveKind::TarGz,
            "cifar-10-batches-bin/",
            "cifar-10-batches-bin",
        ),
        source(
            "cifar100",
            "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
            Some("58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec"),
            ArchiveKind::TarGz,
            "cifar-100-binary/",
            "cifar-100-binary",
        ),
        source(
            "snli",
            "https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
            Some("afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e"),
            ArchiveKind::Zip,
            "snli_1.0/",
            "snli_1.0",
        ),
    ]
}

/// The official source of `dataset` (one of `official_sources`' names); another name is an
/// [`Error::BadValue`] listing them.
pub fn official_source(dataset: &str) -> Result<Source> {
    let sources = official_sources();
    let names: Vec<&str> = sources.iter().map(|s| s.dataset.as_str()).collect();
    let wanted = names.join(", ");
    sources
        .into_iter()
        .find(|s| s.dataset == dataset)
        .ok_or_else(|| {
            Error::bad_value("dataset", format!("{dataset:?}: expected one of {wanted}"))
        })
}

/// What a finished fetch did.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The dataset's folder, `data_dir/<Source::folder>`.
    pub folder: PathBuf,
    /// The archive's SHA-256 as computed (lower-case hex).
    pub sha256: String,
    /// How many files were unpacked into `folder`.
    pub files: usize,
}

/// Downloads, verifies and unpacks `source` into `data_dir/<folder>`. An existing folder is an
/// error unless `force`, which replaces it only after the new copy is complete.
pub fn fetch(source: &Source, data_dir: &Path, force: bool, progress: bool) -> Result<Fetched> {
    let target = data_dir.join(&source.folder);
    if target.exists() && !force {
        return Err(Error::Fetch(format!(
            "{} already exists; fetch with `force` to replace it",
            target.display()
        )));
    }
    std::fs::create_dir_all(data_dir).map_err(|e| Error::io(data_dir, e))?;
    let file_name = source.url.rsplit('/').next().unwrap_or("download");
    let part = data_dir.join(format!(".{file_name}.part"));
    let result = download(&source.url, &part, progress).and_then(|sha256| {
        if let Some(expected) = &source.sha256 {
            if !expected.eq_ignore_ascii_case(&sha256) {
                return Err(Error::Fetch(format!(
                    "{}: SHA-256 is {sha256}, expected {expected}: the download is corrupted or \
                     not the official archive; nothing was written",
                    source.url
                )));
            }
        }
        let staging = data_dir.join(format!(".{}.tmp", source.folder));
        let _ = std::fs::remove_dir_all(&staging);
        let unpacked = unpack(source, &part, &staging).and_then(|files| {
            if target.exists() {
                std::fs::remove_dir_all(&target).map_err(|e| Error::io(&target, e))?;
            }
            std::fs::rename(&staging, &target).map_err(|e| Error::io(&staging, e))?;
            Ok(files)
        });
        if unpacked.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        Ok(Fetched {
            folder: target.clone(),
            sha256,
            files: unpacked?,
        })
    });
    let _ = std::fs::remove_file(&part);
    result
}

/// Streams `url` into `dest`, returning the SHA-256 of what was received.
fn download(url: &str, dest: &Path, progress: bool) -> Result<String> {
    let response = ureq::get(url).call().map_err(|e| match e {
        ureq::Error::Status(code, _) => Error::Fetch(format!("{url}: HTTP status {code}")),
        other => Error::Fetch(format!("{url}: {other}")),
    })?;
    let length: Option<u64> = response
        .header("Content-Length")
        .and_then(|v| v.parse().ok());
    let bar = Bar::new(
        progress,
        length.unwrap_or(0),
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        "progress",
    )?;
    bar.set_message(url.rsplit('/').next().unwrap_or(url).to_string());
    let mut reader = response.into_reader();
    let mut file = std::fs::File::create(dest).map_err(|e| Error::io(dest, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut received: u64 = 0;
    loop {
        let n = reader.read(&mut buffer).map_err(|e| {
            Error::Fetch(format!(
                "{url}: connection broke after {received} bytes: {e}"
            ))
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        file.write_all(&buffer[..n])
            .map_err(|e| Error::io(dest, e))?;
        received += n as u64;
        bar.set_position(received);
    }
    bar.finish_and_clear();
    if let Some(expected) = length {
        if received != expected {
            return Err(Error::Fetch(format!(
                "{url}: received {received} bytes, the server announced {expected}"
            )));
        }
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The path of an archive entry relative to the dataset's folder, or `None` when the entry is
/// outside `prefix`. Entries that would escape the folder (`..`, absolute paths) are errors.
fn relative_entry(archive: &Path, name: &str, prefix: &str) -> Result<Option<PathBuf>> {
    let Some(rest) = name.strip_prefix(prefix) else {
        return Ok(None);
    };
    let rel = PathBuf::from(rest);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::bad_file(
            archive,
            format!("entry {name:?} escapes its folder"),
        ));
    }
    Ok((!rest.is_empty()).then_some(rel))
}

fn write_entry(dest: &Path, reader: &mut dyn Read, archive: &Path, name: &str) -> Result<()> {
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let mut out = std::fs::File::create(dest).map_err(|e| Error::io(dest, e))?;
    std::io::copy(reader, &mut out)
        .map_err(|e| Error::bad_file(archive, format!("entry {name:?} is corrupted: {e}")))?;
    Ok(())
}

/// Writes the entries under `source.prefix` into `staging`; returns how many files it wrote.
fn unpack(source: &Source, archive: &Path, staging: &Path) -> Result<usize> {
    std::fs::create_dir_all(staging).map_err(|e| Error::io(staging, e))?;
    let mut files = 0;
    match source.kind {
        ArchiveKind::TarGz => {
            let file = std::fs::File::open(archive).map_err(|e| Error::io(archive, e))?;
            let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
            let bad =
                |e: std::io::Error| Error::bad_file(archive, format!("not a valid .tar.gz: {e}"));
            for entry in tar.entries().map_err(bad)? {
                let mut entry = entry.map_err(bad)?;
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let name = entry.path().map_err(bad)?.to_string_lossy().into_owned();
                if let Some(rel) = relative_entry(archive, &name, &source.prefix)? {
                    write_entry(&staging.join(rel), &mut entry, archive, &name)?;
                    files += 1;
                }
            }
        }
        ArchiveKind::Zip => {
            let file = std::fs::File::open(archive).map_err(|e| Error::io(archive, e))?;
            let bad = |e: zip::result::ZipError| {
                Error::bad_file(archive, format!("not a valid .zip: {e}"))
            };
            let mut zip = zip::ZipArchive::new(file).map_err(bad)?;
            for i in 0..zip.len() {
                let mut entry = zip.by_index(i).map_err(bad)?;
                if !entry.is_file() {
                    continue;
                }
                let name = entry.name().to_string();
                if let Some(rel) = relative_entry(archive, &name, &source.prefix)? {
                    write_entry(&staging.join(rel), &mut entry, archive, &name)?;
                    files += 1;
                }
            }
        }
    }
    if files == 0 {
        return Err(Error::bad_file(
            archive,
            format!("no files under {:?} in the archive", source.prefix),
        ));
    }
    Ok(files)
}
