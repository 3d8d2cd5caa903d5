//! Random-weight GGUFs of Qwen3.5 hybrid shapes (Gated DeltaNet layers with a gated attention
//! layer every `interval`), for measuring the GPU's hybrid path where the real file is not at
//! hand. Tensors carry the names and shapes llama.cpp's `qwen35` conversion gives (norms
//! folded to plain weights, `ssm_a = −exp(A_log)`); the per-tensor types approximate
//! llama.cpp's Q4_K_M (its K-quants for the large matrices, Q6_K on the "more bits" layers'
//! value-side matrices, Q8_0 for the per-head β/α projections), not checked against a real
//! file. Norm weights are 1; `ssm_a` is negative (decays below 1), so long runs stay finite.

use std::path::Path;

use kasoku::format::{write_gguf, MetaValue};
use kasoku::quant::DType;

use super::{fit, random_tensor, use_more_bits, Rng, Scheme};

/// A Qwen3.5 (dense MLP) hybrid shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridShape {
    pub name: &'static str,
    pub hidden: usize,
    pub layers: usize,
    /// Every `interval`-th layer (1-based) is a full attention layer, the rest Gated DeltaNet.
    pub interval: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Gated DeltaNet key heads, value heads, their sizes and the conv's taps.
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    pub conv: usize,
    pub untied: bool,
}

/// Qwen3.5-2B (shared/research/qwen35.md §1.3; tied embeddings).
pub const QWEN35_2B: HybridShape = HybridShape {
    name: "qwen3.5-2b",
    hidden: 2048,
    layers: 24,
    interval: 4,
    heads: 8,
    kv_heads: 2,
    head_dim: 256,
    rope_dim: 64,
    ffn: 6144,
    vocab: 248320,
    nk: 16,
    nv: 16,
    dk: 128,
    dv: 128,
    conv: 4,
    untied: false,
};

impl HybridShape {
    /// Whether layer `i` is a full attention layer.
    pub fn is_attention(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.interval)
    }
}

/// Every tensor of `shape` under `scheme`: (name, type, shape outermost-first).
pub fn tensors(shape: &HybridShape, scheme: Scheme) -> Vec<(String, DType, Vec<usize>)> {
    let s = shape;
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let (cd, vd) = (2 * s.nk * s.dk + s.nv * s.dv, s.nv * s.dv);
    let base = |t: DType, cols| match scheme {
        Scheme::Q4KM => fit(t, cols),
        Scheme::Q8_0 => DType::Q8_0,
        Scheme::F16 => DType::F16,
    };
    let small = match scheme {
        Scheme::F16 => DType::F16,
        _ => DType::Q8_0,
    };
    let mut v = vec![(
        "token_embd.weight".to_string(),
        base(DType::Q4K, h),
        vec![s.vocab, h],
    )];
    for i in 0..s.layers {
        let more = if use_more_bits(i, s.layers) {
            DType::Q6K
        } else {
            DType::Q4K
        };
        let n = |p: &str| format!("blk.{i}.{p}");
        v.push((n("attn_norm.weight"), DType::F32, vec![h]));
        if s.is_attention(i) {
            v.push((n("attn_q.weight"), base(DType::Q4K, h), vec![2 * q, h]));
            v.push((n("attn_k.weight"), base(DType::Q4K, h), vec![kv, h]));
            v.push((n("attn_v.weight"), base(more, h), vec![kv, h]));
            v.push((n("attn_output.weight"), base(DType::Q4K, q), vec![h, q]));
            v.push((n("attn_q_norm.weight"), DType::F32, vec![s.head_dim]));
            v.push((n("attn_k_norm.weight"), DType::F32, vec![s.head_dim]));
        } else {
            v.push((n("attn_qkv.weight"), base(DType::Q4K, h), vec![cd, h]));
            v.push((n("attn_gate.weight"), base(DType::Q4K, h), vec![vd, h]));
            v.push((n("ssm_beta.weight"), small, vec![s.nv, h]));
            v.push((n("ssm_alpha.weight"), small, vec![s.nv, h]));
            v.push((n("ssm_conv1d.weight"), DType::F32, vec![cd, s.conv]));
            v.push((n("ssm_dt.bias"), DType::F32, vec![s.nv]));
            v.push((n("ssm_a"), DType::F32, vec![s.nv]));
            v.push((n("ssm_norm.weight"), DType::F32, vec![s.dv]));
            v.push((n("ssm_out.weight"), base(more, vd), vec![h, vd]));
        }
        v.push((n("post_attention_norm.weight"), DType::F32, vec![h]));
        v.push((n("ffn_gate.weight"), base(DType::Q4K, h), vec![s.ffn, h]));
        v.push((n("ffn_up.weight"), base(DType::Q4K, h), vec![s.ffn, h]));
        v.push((n("ffn_down.weight"), base(more, s.ffn), vec![h, s.ffn]));
    }
    v.push(("output_norm.weight".into(), DType::F32, vec![h]));
    if s.untied {
        v.push((
            "output.weight".into(),
            base(DType::Q6K, h),
            vec![s.vocab, h],
        ));
    }
    v
}

/// The `qwen35` metadata of `shape` (no tokenizer: speed runs feed token ids).
pub fn metadata(shape: &HybridShape) -> Vec<(String, MetaValue)> {
    let s = shape;
    let k = |x: &str| format!("qwen35.{x}");
    let u = |x: usize| MetaValue::U32(x as u32);
    vec![
        (
            "general.architecture".into(),
            MetaValue::String("qwen35".into()),
        ),
        (
            "general.name".into(),
            MetaValue::String(format!("random-weight {}", s.name)),
        ),
        (k("context_length"), u(262144)),
        (k("embedding_length"), u(s.hidden)),
        (k("block_count"), u(s.layers)),
        (k("feed_forward_length"), u(s.ffn)),
        (k("attention.head_count"), u(s.heads)),
        (k("attention.head_count_kv"), u(s.kv_heads)),
        (k("attention.key_length"), u(s.head_dim)),
        (k("attention.value_length"), u(s.head_dim)),
        (k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6)),
        (k("rope.freq_base"), MetaValue::F32(1e7)),
        (k("rope.dimension_count"), u(s.rope_dim)),
        (k("full_attention_interval"), u(s.interval)),
        (k("ssm.conv_kernel"), u(s.conv)),
        (k("ssm.state_size"), u(s.dk)),
        (k("ssm.group_count"), u(s.nk)),
        (k("ssm.time_step_rank"), u(s.nv)),
        (k("ssm.inner_size"), u(s.nv * s.dv)),
        (k("vocab_size"), u(s.vocab)),
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("none".into()),
        ),
    ]
}

/// Writes the random-weight GGUF of `shape` under `scheme` to `path`; returns its tensors'
/// total bytes.
pub fn write(path: &Path, shape: &HybridShape, scheme: Scheme, seed: u64) -> Result<usize, String> {
    let mut rng = Rng(seed | 1);
    let mut data = Vec::new();
    for (name, dtype, dims) in tensors(shape, scheme) {
        let n: usize = dims.iter().product();
        let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let bytes = if name.ends_with("norm.weight") {
            f32s(vec![1.0; n])
        } else if name.ends_with("ssm_a") {
            // −exp(A_log) with A_log around 0: rates in (−2.7, −0.4).
            f32s((0..n).map(|_| -(rng.sym()).exp()).collect())
        } else {
            random_tensor(&mut rng, dtype, n, 0.05)
        };
        data.push((name, dtype, dims, bytes));
    }
    let total = data.iter().map(|t| t.3.len()).sum();
    write_gguf(path, &metadata(shape), &data).map_err(|e| e.to_string())?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_hybrid_shape_writes_a_file_the_cpu_engine_loads() {
        let s = HybridShape {
            name: "t",
            hidden: 128,
            layers: 4,
            interval: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            rope_dim: 16,
            ffn: 256,
            vocab: 300,
            nk: 2,
            nv: 4,
            dk: 32,
            dv: 32,
            conv: 4,
            untied: false,
        };
        let dir = std::env::temp_dir().join(format!("kasoku-synth-hybrid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        write(&p, &s, Scheme::Q8_0, 1).unwrap();
        let m = kasoku::model::Model::load(&p).unwrap();
        let c = &m.config;
        assert_eq!(c.arch, kasoku::model::Arch::Qwen35);
        assert_eq!((c.linear_num_value_heads, c.linear_value_head_dim), (4, 32));
        use kasoku::model::LayerKind::{Attention, GatedDeltaNet};
        assert_eq!(
            c.layer_kinds,
            vec![GatedDeltaNet, GatedDeltaNet, GatedDeltaNet, Attention]
        );
        crate::model::check_config(c).unwrap();
        // Decoding stays finite.
        let mut st = m.new_state(64);
        let l = m
            .forward(&mut st, &[1, 2, 3, 4, 5], kasoku::model::Logits::Last)
            .unwrap();
        assert!(l.iter().all(|v| v.is_finite()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The 2B shape's bytes per token: its trunk's matrices and the tied head.
    #[test]
    fn the_2b_shape_has_its_parameter_count() {
        let t = tensors(&QWEN35_2B, Scheme::F16);
        let params: usize = t.iter().map(|(_, _, d)| d.iter().product::<usize>()).sum();
        // 0.51 B embedding + 18 GDN and 6 attention layers ≈ 1.88 B parameters.
        assert!((1.8e9..2.0e9).contains(&(params as f64)), "{params}");
    }
}
