//! One writer per run folder. `train`, every `grid` cell, `fl` and `convex` take an exclusive
//! lock on `<run>/.lock` before they write anything there, so two processes can never
//! interleave a run's logs or leave a `config.toml` that disagrees with its checkpoint.
//!
//! The lock is the operating system's advisory file lock (`File::try_lock`, flock on Unix), so
//! it dies with its process: a lock file left by a killed run is stale, detected as such (the
//! lock can be taken), reported, and replaced. The file holds the owner's pid, host and start
//! time for the error a second writer gets. It is removed when the lock is dropped.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside a run folder.
pub const LOCK_FILE: &str = ".lock";

/// An exclusive lock on a run folder, held until dropped.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

impl RunLock {
    /// Creates `run_dir` if needed and locks it, or says which process holds it. A lock that
    /// cannot be taken (a full disk) leaves nothing it created: not its lock file, not the
    /// folders it made.
    pub fn acquire(run_dir: &Path) -> Result<RunLock> {
        // The outermost folder this call creates, removed (with what it made inside) on failure.
        let first_made = run_dir
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
            .last()
            .map(Path::to_path_buf);
        let had_lock = run_dir.join(LOCK_FILE).exists();
        let locked = Self::lock(run_dir);
        if let Err(e) = &locked {
            if !matches!(e, Error::RunInUse { .. }) {
                if !had_lock {
                    let _ = std::fs::remove_file(run_dir.join(LOCK_FILE));
                }
                if let Some(top) = &first_made {
                    // Empty folders only, innermost first.
                    for dir in run_dir.ancestors() {
                        let _ = std::fs::remove_dir(dir);
                        if dir == top.as_path() {
                            break;
                        }
                    }
                }
            }
        }
        locked
    }

    fn lock(run_dir: &Path) -> Result<RunLock> {
        std::fs::create_dir_all(run_dir).map_err(|e| Error::io(run_dir, e))?;
        let path = run_dir.join(LOCK_FILE);
        // A lock file can be removed by its owner between our open and our lock; then we hold a
        // lock on a deleted file, so check that the path still names the file we locked.
        for _ in 0..8 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::RunInUse {
                        dir: run_dir.to_path_buf(),
                        owner: read_owner(&mut file),
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            }
            if !same_file(&file, &path) {
                continue;
            }
            let stale = read_owner(&mut file);
            if !stale.is_empty() {
                log::info!(
                    "{} held a stale lock ({stale}) whose process is gone; taking it over",
                    run_dir.display()
                );
            }
            let owner = format!(
                "pid {} on {} since {}",
                std::process::id(),
                hostname(),
                chrono_now()
            );
            file.set_len(0).map_err(|e| Error::io(&path, e))?;
            file.rewind().map_err(|e| Error::io(&path, e))?;
            file.write_all(owner.as_bytes())
                .and_then(|_| file.sync_all())
                .map_err(|e| Error::io(&path, e))?;
            return Ok(RunLock { file, path });
        }
        Err(Error::bad_value(
            "run folder",
            format!(
                "{}: its lock file kept changing under us; is another process starting there?",
                run_dir.display()
            ),
        ))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The owner of `run_dir`'s lock when another process holds it now (a stale lock file is not
/// held); takes nothing.
pub fn holder(run_dir: &Path) -> Option<String> {
    let path = run_dir.join(LOCK_FILE);
    let mut file = OpenOptions::new().read(true).write(true).open(path).ok()?;
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            None
        }
        Err(std::fs::TryLockError::WouldBlock) => Some(read_owner(&mut file)),
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Remove the file while still holding the lock (a process that opened it meanwhile sees
        // a different file at the path and retries), then release it.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

fn read_owner(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    text.trim().to_string()
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this host".to_string())
}

/// Seconds since the Unix epoch (enough to tell an old lock from a new one).
fn chrono_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("unix time {secs}")
}
