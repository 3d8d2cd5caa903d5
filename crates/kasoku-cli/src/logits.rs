//! `kasoku logits`: next-token logits at every input position, as one JSON object
//! `{"tokens": [...], "logits": [[...], ...]}`, computed by the normal batched forward pass.
//! This is how kasoku is compared with other engines.

use std::io::Write;

use anyhow::{bail, Result};
use kasoku::model::{Logits, Model};

pub fn logits(model: &str, tokens: &[u32], threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        kasoku::kernels::threads::set_threads(n);
    }
    if tokens.is_empty() {
        bail!("--tokens needs at least one token id");
    }
    let path = crate::progress::resolve_model(model, true)?;
    let model = Model::load(&path)?;
    let mut state = model.new_state(tokens.len() + 1);
    let logits = model.forward(&mut state, tokens, Logits::All)?;
    let vocab = model.config.vocab;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    write!(
        out,
        "{{\"tokens\": {}, \"logits\": [",
        serde_json::to_string(tokens)?
    )?;
    for (i, row) in logits.chunks(vocab).enumerate() {
        if i > 0 {
            write!(out, ", ")?;
        }
        write!(out, "[")?;
        for (j, v) in row.iter().enumerate() {
            if j > 0 {
                write!(out, ",")?;
            }
            // Shortest representation that reads back to the same f32.
            write!(out, "{v:?}")?;
        }
        write!(out, "]")?;
    }
    writeln!(out, "]}}")?;
    Ok(())
}
