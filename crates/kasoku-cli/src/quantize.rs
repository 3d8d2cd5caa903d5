//! `kasoku quantize IN OUT --format m|l|mixed`: converts a Hugging Face directory (F32, F16 or
//! BF16 safetensors) or a GGUF file to kasoku's own formats (`kasoku::quant::kasoku`), written
//! as a directory every kasoku command loads:
//! - from a Hugging Face directory: `model.safetensors` under the same names, beside copies of
//!   the directory's other files (config, tokenizer, chat template, generation defaults);
//! - from a GGUF file: `model.safetensors` under GGUF names, beside `kasoku.gguf`, the GGUF's
//!   metadata (configuration, tokenizer, template) without its tensors. A GGUF's matrices
//!   are usually quantized already: they are dequantized first, and a warning says that
//!   quantizing them again compounds the error.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use kasoku::format::checkpoint::GGUF_META;
use kasoku::format::kasoku_write::{write_quantized, Naming, WriteReport};
use kasoku::format::{write_gguf, Checkpoint, GgufFile, MetaValue};
use kasoku::quant::kasoku::{m4, Recipe, Scheme};

#[derive(Args, Debug, Clone)]
pub struct QuantizeArgs {
    /// GGUF file, Hugging Face directory, or a known model name.
    pub input: String,
    /// The directory to write (created; must not exist or be empty).
    pub output: PathBuf,
    /// m (4-bit, zero points), l (8-bit) or mixed (m, with attn_v and ffn_down in l).
    /// The head is l in every scheme (and so is the embedding when it is the head).
    #[arg(long, value_parser = parse_scheme)]
    pub format: Scheme,
    /// Columns per scale of m: 32, 64 or 128.
    #[arg(long, default_value_t = m4::DEFAULT_GROUP)]
    pub group: usize,
    /// Skip the randomized Hadamard rotation (for comparison).
    #[arg(long)]
    pub no_rotate: bool,
    /// Compute threads for quantizing (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Parses `m`, `l` or `mixed`.
pub fn parse_scheme(s: &str) -> Result<Scheme, String> {
    Scheme::from_name(s).ok_or_else(|| format!("'{s}' is not m, l or mixed"))
}

pub fn quantize(args: &QuantizeArgs) -> Result<()> {
    if !m4::GROUPS.contains(&args.group) {
        bail!("--group {} is not one of {:?}", args.group, m4::GROUPS);
    }
    if let Some(n) = args.threads {
        kasoku::kernels::threads::set_threads(n);
    }
    let recipe = Recipe {
        scheme: args.format,
        rotate: !args.no_rotate,
        m_group: args.group,
    };
    let input = crate::progress::resolve_model(&args.input, false)?;
    let out = &args.output;
    if out.exists()
        && std::fs::read_dir(out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!("{} exists and is not an empty directory", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let ckpt = Checkpoint::open(&input).with_context(|| format!("opening {}", input.display()))?;
    let weights = out.join("model.safetensors");
    let report = match &ckpt {
        Checkpoint::GgufMeta { .. } => {
            bail!(
                "{} is already a kasoku checkpoint; quantize its source",
                input.display()
            )
        }
        Checkpoint::Hf(hf) => {
            copy_side_files(&input, out)?;
            write(&ckpt, Naming::Hf(hf), recipe, &weights)?
        }
        Checkpoint::Gguf(file) => {
            write_metadata(file, &out.join(GGUF_META))?;
            write(&ckpt, Naming::Gguf, recipe, &weights)?
        }
    };
    if report.dequantized > 0 {
        eprintln!(
            "warning: {} of the {} tensors of {} were stored in GGUF block formats; they were \
             dequantized first, and quantizing them again compounds their error (quantize an \
             unquantized checkpoint where one exists)",
            report.dequantized,
            report.tensors,
            input.display()
        );
    }
    println!(
        "wrote {} ({:.1} MiB): {} of {} tensors quantized ({}), {:.3} bits per weight over the \
         quantized matrices",
        out.display(),
        report.file_bytes as f64 / (1 << 20) as f64,
        report.quantized,
        report.tensors,
        recipe_text(&recipe),
        report.bits_per_weight()
    );
    Ok(())
}

fn recipe_text(r: &Recipe) -> String {
    format!(
        "{}{}{}",
        r.scheme.name(),
        if r.scheme == Scheme::L {
            String::new()
        } else {
            format!(", m groups of {}", r.m_group)
        },
        if r.rotate { ", rotated" } else { ", unrotated" }
    )
}

/// Writes the weights with a progress bar.
fn write(ckpt: &Checkpoint, naming: Naming, recipe: Recipe, path: &Path) -> Result<WriteReport> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "quantizing [{bar:30}] {pos}/{len} tensors {elapsed_precise} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = write_quantized(
        ckpt.tensors(),
        naming,
        recipe,
        path,
        &mut |done, total, name| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(name.to_string());
        },
    );
    bar.finish_and_clear();
    report.with_context(|| format!("writing {}", path.display()))
}

/// Copies every file of a Hugging Face directory but its weights.
fn copy_side_files(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let n = name.to_string_lossy();
        let weights = n.ends_with(".safetensors")
            || n == "model.safetensors.index.json"
            || n.ends_with(".bin")
            || n.ends_with(".pt")
            || n.ends_with(".gguf");
        if weights || !entry.file_type()?.is_file() {
            continue;
        }
        std::fs::copy(entry.path(), to.join(&name))
            .with_context(|| format!("copying {}", entry.path().display()))?;
    }
    Ok(())
}

/// Writes a GGUF file with `file`'s metadata and no tensors.
fn write_metadata(file: &GgufFile, path: &Path) -> Result<()> {
    let meta: Vec<(&String, MetaValue)> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let none: [(&str, kasoku::quant::DType, [usize; 0], [u8; 0]); 0] = [];
    write_gguf(path, &meta, &none).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
