//! `dpcomp data fetch` against a small HTTP server on 127.0.0.1 that serves fixture archives.

use dpcomp::data::fetch::{fetch, ArchiveKind, Source};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

/// Serves `body` at every path for `requests` requests; returns the base URL.
fn serve(body: Vec<u8>, requests: usize) -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    std::thread::spawn(move || {
        for _ in 0..requests {
            let Ok(request) = server.recv() else { return };
            let response = if request.url().contains("missing") {
                tiny_http::Response::from_data(Vec::new()).with_status_code(404)
            } else {
                tiny_http::Response::from_data(body.clone())
            };
            let _ = request.respond(response);
        }
    });
    format!("http://127.0.0.1:{port}")
}

fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    for (name, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

fn zip_bytes(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in files {
        writer
            .start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        writer.write_all(data).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn source(
    url: String,
    sha256: Option<String>,
    kind: ArchiveKind,
    prefix: &str,
    folder: &str,
) -> Source {
    Source {
        dataset: "fixture".into(),
        url,
        sha256,
        kind,
        prefix: prefix.into(),
        folder: folder.into(),
    }
}

/// Fetches `src` expecting failure; checks that nothing (download, partial folder) stays behind
/// and returns the error text.
fn fails_cleanly(src: &Source, data: &Path) -> String {
    let err = fetch(src, data, false, false).unwrap_err().to_string();
    assert!(listing(data).is_empty(), "left behind: {:?}", listing(data));
    err
}

/// Every entry of `dir`, to check that nothing half-written stays behind.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fetch_verifies_and_unpacks_only_the_dataset_folder() {
    let archive = tar_gz(&[
        ("cifar-10-batches-bin/data_batch_1.bin", b"abc"),
        ("cifar-10-batches-bin/batches.meta.txt", b"cat\ndog\n"),
        ("other/readme.txt", b"not ours"),
    ]);
    let url = serve(archive.clone(), 1);
    let data = tempfile::tempdir().unwrap();
    let src = source(
        format!("{url}/cifar-10-binary.tar.gz"),
        Some(sha256_hex(&archive)),
        ArchiveKind::TarGz,
        "cifar-10-batches-bin/",
        "cifar-10-batches-bin",
    );
    let fetched = fetch(&src, data.path(), false, false).unwrap();
    assert_eq!(fetched.files, 2);
    assert_eq!(fetched.sha256, sha256_hex(&archive));
    let dir = data.path().join("cifar-10-batches-bin");
    assert_eq!(std::fs::read(dir.join("data_batch_1.bin")).unwrap(), b"abc");
    assert_eq!(
        std::fs::read_to_string(dir.join("batches.meta.txt")).unwrap(),
        "cat\ndog\n"
    );
    assert_eq!(listing(data.path()), vec!["cifar-10-batches-bin"]);

    // A second fetch without --force refuses and leaves the copy alone.
    let err = fetch(&src, data.path(), false, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("already exists") && err.contains("`force`"),
        "{err}"
    );
    assert_eq!(std::fs::read(dir.join("data_batch_1.bin")).unwrap(), b"abc");
}

#[test]
fn corrupted_download_is_rejected_and_nothing_is_written() {
    let archive = zip_bytes(&[
        ("snli_1.0/snli_1.0_dev.jsonl", b"{}\n"),
        ("__MACOSX/._x", b"junk"),
    ]);
    let expected = sha256_hex(&archive);
    let mut corrupted = archive.clone();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0xff;
    let url = serve(corrupted, 1);
    let data = tempfile::tempdir().unwrap();
    let src = source(
        format!("{url}/snli_1.0.zip"),
        Some(expected.clone()),
        ArchiveKind::Zip,
        "snli_1.0/",
        "snli_1.0",
    );
    let err = fails_cleanly(&src, data.path());
    assert!(
        err.contains("SHA-256") && err.contains(&expected) && err.contains("nothing was written"),
        "{err}"
    );
}

#[test]
fn unverifiable_broken_archive_leaves_nothing_half_written() {
    // No published checksum (as for the tutorial's data.zip): a broken archive must still fail
    // cleanly, with neither the download nor a partial folder left.
    let archive = zip_bytes(&[
        ("data/names/English.txt", b"Smith\n"),
        ("data/names/French.txt", b"Dupont\n"),
    ]);
    let truncated = archive[..archive.len() - 30].to_vec();
    let url = serve(truncated, 1);
    let data = tempfile::tempdir().unwrap();
    let src = source(
        format!("{url}/data.zip"),
        None,
        ArchiveKind::Zip,
        "data/names/",
        "names",
    );
    let err = fails_cleanly(&src, data.path());
    assert!(
        err.contains("data.zip") && err.contains("not a valid .zip"),
        "{err}"
    );

    // The intact archive unpacks the names folder only.
    let url = serve(archive, 1);
    let src = source(
        format!("{url}/data.zip"),
        None,
        ArchiveKind::Zip,
        "data/names/",
        "names",
    );
    let fetched = fetch(&src, data.path(), false, false).unwrap();
    assert_eq!(fetched.files, 2);
    assert_eq!(
        std::fs::read_to_string(data.path().join("names/French.txt")).unwrap(),
        "Dupont\n"
    );
}

#[test]
fn http_errors_and_path_traversal_are_clear() {
    let url = serve(Vec::new(), 1);
    let data = tempfile::tempdir().unwrap();
    let src = source(
        format!("{url}/missing.tar.gz"),
        None,
        ArchiveKind::TarGz,
        "x/",
        "x",
    );
    let err = fails_cleanly(&src, data.path());
    assert!(err.contains("HTTP status 404"), "{err}");

    let mut raw = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    // Written by hand: tar's append_data refuses `..` itself.
    header.as_gnu_mut().unwrap().name[..10].copy_from_slice(b"x/../evil\0");
    header.set_cksum();
    raw.append(&header, &b"!"[..]).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw.into_inner().unwrap()).unwrap();
    let url = serve(gz.finish().unwrap(), 1);
    let src = source(
        format!("{url}/evil.tar.gz"),
        None,
        ArchiveKind::TarGz,
        "x/",
        "x",
    );
    let err = fails_cleanly(&src, data.path());
    assert!(err.contains("escapes its folder"), "{err}");
}

#[test]
fn official_sources_pin_checksums() {
    for name in ["cifar10", "cifar100", "snli"] {
        let s = dpcomp::data::fetch::official_source(name).unwrap();
        assert_eq!(s.sha256.as_ref().map(|h| h.len()), Some(64), "{name}");
        assert!(s.url.starts_with("https://"));
    }
    let err = dpcomp::data::fetch::official_source("mnist")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected one of names, cifar10, cifar100, snli"),
        "{err}"
    );
}
