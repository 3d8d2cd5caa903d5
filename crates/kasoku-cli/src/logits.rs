//! `kasoku logits`: next-token logits at every input position, as one JSON object
//! `{"tokens": [...], "logits": [[...], ...]}`, computed by the normal batched forward pass.
//! This is how kasoku is compared with other engines. `--device` picks the CPU or a GPU.

use std::io::Write;

use anyhow::{bail, Result};
use kasoku::model::{Logits, Model};
use kasoku_cuda::Device;

pub fn logits(
    model: &str,
    tokens: &[u32],
    threads: Option<usize>,
    device: Option<Device>,
) -> Result<()> {
    if let Some(n) = threads {
        kasoku::kernels::threads::set_threads(n);
    }
    if tokens.is_empty() {
        bail!("--tokens needs at least one token id");
    }
    let path = crate::progress::resolve_model(model, true)?;
    // The GPU by default where one is usable and runs the model, else the CPU; an asked-for
    // GPU that cannot run it is an error.
    let (chosen, why) = kasoku_cuda::select_device(device)?;
    let gguf = path.extension().is_some_and(|e| e == "gguf");
    let on_gpu = match chosen {
        Device::Cuda(i) if gguf => match gpu_logits(i, &path, tokens) {
            Ok(r) => Some(r),
            Err(e) if device.is_none() => {
                eprintln!("device: cpu (the GPU cannot run this model: {e})");
                None
            }
            Err(e) => return Err(e),
        },
        Device::Cuda(_) if device.is_some() => {
            bail!(
                "--device cuda runs GGUF files; {} is not one",
                path.display()
            )
        }
        _ => {
            let reason = why.unwrap_or_else(|| "asked for".into());
            eprintln!("device: cpu ({reason})");
            None
        }
    };
    let (logits, vocab) = match on_gpu {
        Some(r) => r,
        None => {
            let model = Model::load(&path)?;
            let mut state = model.new_state(tokens.len() + 1);
            let logits = model.forward(&mut state, tokens, Logits::All)?;
            (logits, model.config.vocab)
        }
    };
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

/// Every position's logits on GPU `ordinal`, and the vocabulary size.
fn gpu_logits(ordinal: usize, path: &std::path::Path, tokens: &[u32]) -> Result<(Vec<f32>, usize)> {
    let gpu = kasoku_cuda::Gpu::open(ordinal)?;
    let m = kasoku_cuda::CudaModel::load(&gpu, path)?;
    eprintln!("device: cuda:{ordinal} ({})", gpu.name);
    let mut st = m.new_state(tokens.len() + 1)?;
    Ok((st.logits(&m, tokens)?, m.config.vocab))
}
