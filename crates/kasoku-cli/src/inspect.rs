//! `kasoku inspect`: what a checkpoint holds — architecture and hyper-parameters, tensor types
//! and sizes, tokenizer and chat-template summary.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kasoku::format::checkpoint::GGUF_META;
use kasoku::format::gguf::GgufFile;
use kasoku::format::safetensors::HfCheckpoint;
use kasoku::format::Checkpoint;
use kasoku::format::TensorSource;
use kasoku::model::ModelConfig;

pub fn inspect(path: &Path, list_tensors: bool) -> Result<()> {
    if path.is_dir() && path.join(GGUF_META).exists() {
        // Written by `kasoku quantize` from a GGUF file: its metadata beside GGUF-named weights.
        let ckpt = Checkpoint::open(path)?;
        println!(
            "kasoku checkpoint {} (GGUF metadata in {GGUF_META})",
            path.display()
        );
        match ModelConfig::of_checkpoint(&ckpt) {
            Ok(cfg) => print_config(&cfg),
            Err(e) => println!("config: {e}"),
        }
        print_tensors(ckpt.tensors(), list_tensors);
        return Ok(());
    }
    if path.is_dir() {
        let ckpt = HfCheckpoint::open(path)?;
        println!("Hugging Face directory {}", path.display());
        println!("model_type: {}", ckpt.config().model_type());
        match ModelConfig::from_hf(ckpt.config()) {
            Ok(cfg) => print_config(&cfg),
            Err(e) => println!("config: {e}"),
        }
        print_tensors(&ckpt, list_tensors);
        if !ckpt.skipped().is_empty() {
            println!(
                "skipped (not part of the text model): {} tensors",
                ckpt.skipped().len()
            );
        }
        for file in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "generation_config.json",
        ] {
            let present = path.join(file).exists();
            println!("{file}: {}", if present { "present" } else { "absent" });
        }
        return Ok(());
    }
    let file = GgufFile::open(path)?;
    println!("GGUF v{} {}", file.version(), path.display());
    println!("architecture: {}", file.architecture().unwrap_or("(none)"));
    if let Some(name) = file.get_str("general.name") {
        println!("name: {name}");
    }
    match ModelConfig::from_gguf(&file) {
        Ok(cfg) => print_config(&cfg),
        Err(e) => println!("config: {e}"),
    }
    print_tensors(&file, list_tensors);
    let tokens = file
        .get_array("tokenizer.ggml.tokens")
        .map(|a| a.len())
        .unwrap_or(0);
    let merges = file
        .get_array("tokenizer.ggml.merges")
        .map(|a| a.len())
        .unwrap_or(0);
    println!(
        "tokenizer: model {} pre {} | {tokens} tokens, {merges} merges | bos {} eos {} add_bos {}",
        file.get_str("tokenizer.ggml.model").unwrap_or("?"),
        file.get_str("tokenizer.ggml.pre").unwrap_or("-"),
        opt(file.get_u64("tokenizer.ggml.bos_token_id")),
        opt(file.get_u64("tokenizer.ggml.eos_token_id")),
        file.get_bool("tokenizer.ggml.add_bos_token")
            .map(|b| b.to_string())
            .unwrap_or("-".into()),
    );
    match file.get_str("tokenizer.chat_template") {
        Some(t) => println!(
            "chat template: {} characters, {} lines",
            t.len(),
            t.lines().count()
        ),
        None => println!("chat template: none"),
    }
    Ok(())
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or("-".into())
}

fn print_config(cfg: &ModelConfig) {
    println!(
        "{:?}: {} layers, hidden {}, ffn {}, heads {} q / {} kv × {}, vocab {}, rope θ {} over {} dims ({:?}), rms eps {:e}, tied embeddings {}, max context {}",
        cfg.arch,
        cfg.n_layers,
        cfg.hidden,
        cfg.ffn,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.vocab,
        cfg.rope_theta,
        cfg.rope_dim,
        cfg.rope_layout,
        cfg.rms_eps,
        cfg.tied_embeddings,
        cfg.max_context
    );
    let gdn = cfg
        .layer_kinds
        .iter()
        .filter(|k| format!("{k:?}").contains("Gated"))
        .count();
    if gdn > 0 {
        println!(
            "hybrid: {gdn} Gated DeltaNet layers of {} ({} key heads × {}, {} value heads × {}, conv {})",
            cfg.n_layers,
            cfg.linear_num_key_heads,
            cfg.linear_key_head_dim,
            cfg.linear_num_value_heads,
            cfg.linear_value_head_dim,
            cfg.linear_conv_kernel_dim
        );
    }
}

fn print_tensors(source: &dyn TensorSource, list: bool) {
    let mut by_type: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let names = source.names();
    for name in &names {
        if let Some(q) = source.quantized(name) {
            // Format and grouping, and whether rotated (the seeds differ matrix by matrix).
            let spec = q.spec.to_string();
            let grid = spec.split(' ').next().unwrap_or("?");
            let rot = q
                .spec
                .rotation
                .map_or("unrotated".into(), |r| format!("rot{}", r.block));
            let e = by_type.entry(format!("{grid} {rot}")).or_default();
            let kind = spec;
            let v = q.view();
            e.0 += 1;
            e.1 += q.spec.rows * q.spec.cols;
            e.2 += v.codes.len() + v.scales.len() + v.zeros.len();
            if list {
                println!("  {:<48} {kind} {:?}", q.name, [q.spec.rows, q.spec.cols]);
            }
        }
        if let Some(t) = source.get(name) {
            let e = by_type.entry(t.dtype.name().to_string()).or_default();
            e.0 += 1;
            e.1 += t.numel();
            e.2 += t.data.len();
            if list {
                println!("  {:<48} {:<6} {:?}", t.name, t.dtype.name(), t.shape);
            }
        }
    }
    let total: usize = by_type.values().map(|v| v.2).sum();
    let params: usize = by_type.values().map(|v| v.1).sum();
    println!(
        "tensors: {} ({:.1} M parameters, {:.1} MiB)",
        names.len(),
        params as f64 / 1e6,
        total as f64 / 1048576.0
    );
    for (ty, (count, numel, bytes)) in by_type {
        println!(
            "  {ty:<6} {count:>4} tensors {:>9.1} M values {:>8.1} MiB ({:.2} bits/value)",
            numel as f64 / 1e6,
            bytes as f64 / 1048576.0,
            bytes as f64 * 8.0 / numel.max(1) as f64
        );
    }
}
