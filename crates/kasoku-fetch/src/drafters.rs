//! Drafters the project ships in its repository (`drafters/NAME/`), known by name: a DFlash
//! checkpoint trained for one known target, its files pinned by sha256. They are not
//! downloaded: a checkout holds them, and `--draft NAME` (or `auto` with their target named
//! by its known name) finds them there, checks them and loads them.

use std::path::{Path, PathBuf};

use crate::{hash_file, FetchError, Result};

/// One shipped drafter: where it lives in the repository and what its files hash to.
pub struct KnownDrafter {
    /// The name `--draft` accepts.
    pub name: &'static str,
    /// The known model (`KnownModel::name`) it was trained for.
    pub target: &'static str,
    /// One line for `kasoku fetch --list`.
    pub description: &'static str,
    /// `(file name, lowercase hex sha256)` of every file of its directory that is loaded.
    pub files: &'static [(&'static str, &'static str)],
}

/// Every drafter the repository ships.
pub const KNOWN_DRAFTERS: &[KnownDrafter] = &[KnownDrafter {
    name: "qwen2.5-coder-1.5b-dflash",
    target: "qwen2.5-coder-1.5b",
    description: "DFlash block drafter for Qwen2.5-Coder 1.5B Instruct (2 layers, block 16; \
                  kasoku's m format, 12.6 MiB; tools/dflash)",
    files: &[
        (
            "config.json",
            "2202a39bc501827b36ad9413b795afccf4c723a9f34007d97bf3400c6ea5b0aa",
        ),
        (
            "model.safetensors",
            "07506b381abf0b3def6a95252a4bd7b52aeb75a0039401d718abee7efb77e86c",
        ),
    ],
}];

/// The shipped drafter called `name`.
pub fn find_drafter(name: &str) -> Option<&'static KnownDrafter> {
    KNOWN_DRAFTERS.iter().find(|d| d.name == name)
}

/// The shipped drafter trained for the known model `target`, if any.
pub fn drafter_for(target: &str) -> Option<&'static KnownDrafter> {
    KNOWN_DRAFTERS.iter().find(|d| d.target == target)
}

/// The folder holding the shipped drafters: `$KASOKU_DRAFTERS` if set, else the `drafters`
/// folder of the checkout this binary was built from.
pub fn drafters_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KASOKU_DRAFTERS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters");
    dir.canonicalize().unwrap_or(dir)
}

/// The checked directory of `drafter`: every pinned file present with its hash.
pub fn locate_drafter(drafter: &KnownDrafter) -> Result<PathBuf> {
    locate_in(&drafters_dir(), drafter)
}

fn locate_in(root: &Path, drafter: &KnownDrafter) -> Result<PathBuf> {
    let dir = root.join(drafter.name);
    for (file, sha256) in drafter.files {
        let path = dir.join(file);
        if !path.is_file() {
            return Err(FetchError::Io {
                context: format!(
                    "the drafter {} is shipped in kasoku's repository (drafters/{}); \
                     {} is missing (set KASOKU_DRAFTERS to the folder that holds it, or pass \
                     --draft with its directory)",
                    drafter.name,
                    drafter.name,
                    path.display()
                ),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        let got = hash_file(&path)?;
        if got != *sha256 {
            return Err(FetchError::Hash {
                file: path.display().to_string(),
                expected: sha256.to_string(),
                got,
            });
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_drafter_targets_a_known_model() {
        for d in KNOWN_DRAFTERS {
            assert!(crate::find(d.target).is_some(), "{}", d.name);
            assert!(
                crate::find(d.name).is_none(),
                "{} is also a model name",
                d.name
            );
            assert_eq!(drafter_for(d.target).map(|f| f.name), Some(d.name));
        }
    }

    #[test]
    fn the_checkouts_drafters_match_their_pins() {
        for d in KNOWN_DRAFTERS {
            let dir = locate_drafter(d).unwrap_or_else(|e| panic!("{e}"));
            assert!(dir.join("config.json").is_file());
        }
    }

    #[test]
    fn a_changed_or_missing_file_is_a_clear_error() {
        let root = std::env::temp_dir().join(format!("kasoku-drafters-{}", std::process::id()));
        let dir = root.join("tiny");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), b"hello world").unwrap();
        let drafter = KnownDrafter {
            name: "tiny",
            target: "none",
            description: "",
            files: &[(
                "config.json",
                "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9",
            )],
        };
        assert_eq!(locate_in(&root, &drafter).unwrap(), dir);
        std::fs::write(dir.join("config.json"), b"hello there").unwrap();
        let err = locate_in(&root, &drafter).unwrap_err().to_string();
        assert!(err.contains("sha256 mismatch"), "{err}");
        std::fs::remove_file(dir.join("config.json")).unwrap();
        let err = locate_in(&root, &drafter).unwrap_err().to_string();
        assert!(
            err.contains("drafters/tiny") && err.contains("KASOKU_DRAFTERS"),
            "{err}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
