//! Test helpers: an in-memory tensor source and tiny random-weight models of each family,
//! plus an independent f64 reference forward pass for the dense families to check against.

use std::path::{Path, PathBuf};

use crate::format::{RawTensor, TensorBytes, TensorSource};
use crate::quant::DType;

use super::config::{Arch, LayerKind, ModelConfig, RopeLayout, RopeScaling, SourceKind};

/// Tensors held in memory, under GGUF names.
pub struct MemSource {
    pub path: PathBuf,
    pub tensors: Vec<RawTensor>,
}

impl MemSource {
    pub fn new() -> MemSource {
        MemSource {
            path: PathBuf::from("<memory>"),
            tensors: Vec::new(),
        }
    }

    pub fn add_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors.push(RawTensor {
            name: name.into(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            data: TensorBytes::from_vec(bytes),
        });
    }

    /// The f32 values of a tensor (F32 tensors only).
    pub fn f32(&self, name: &str) -> Option<Vec<f64>> {
        let t = self.tensors.iter().find(|t| t.name == name)?;
        assert_eq!(t.dtype, DType::F32);
        Some(
            t.data
                .as_slice()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
        )
    }
}

impl TensorSource for MemSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }
    fn get(&self, name: &str) -> Option<RawTensor> {
        self.tensors.iter().find(|t| t.name == name).cloned()
    }
}

pub use crate::test_util::Rng;

/// A tiny config of `arch` with only attention layers (Qwen35 here exercises the gated
/// attention, partial RoPE and (1 + w) norms without Gated DeltaNet).
pub fn tiny_config(arch: Arch, source: SourceKind) -> ModelConfig {
    let head_dim = if arch == Arch::Qwen3 { 16 } else { 8 };
    ModelConfig {
        arch,
        source,
        hidden: 32,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim,
        ffn: 48,
        vocab: 61,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope_dim: if arch == Arch::Qwen35 {
            head_dim / 2
        } else {
            head_dim
        },
        rope_layout: if arch == Arch::Llama && source == SourceKind::Gguf {
            RopeLayout::Interleaved
        } else {
            RopeLayout::Neox
        },
        rope_scaling: RopeScaling::None,
        tied_embeddings: arch != Arch::Qwen2,
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen35),
        attn_output_gate: arch == Arch::Qwen35,
        norm_offset_one: arch == Arch::Qwen35 && source == SourceKind::Hf,
        layer_kinds: vec![LayerKind::Attention; 2],
        linear_num_key_heads: 0,
        linear_num_value_heads: 0,
        linear_key_head_dim: 0,
        linear_value_head_dim: 0,
        linear_conv_kernel_dim: 0,
        max_context: 512,
    }
}

/// [`tiny_config`] made wide enough for kasoku's formats (their groups of 64 and rotation
/// blocks of 32 need columns of 64 and 128: hidden 64, ffn 128, heads of 16).
pub fn kasoku_sized_config(arch: Arch, source: SourceKind) -> ModelConfig {
    let mut cfg = tiny_config(arch, source);
    cfg.hidden = 64;
    cfg.ffn = 128;
    cfg.head_dim = 16;
    cfg.rope_dim = 16;
    cfg
}

/// Random weights (every parameter, norms included) for an attention-only `cfg`.
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> MemSource {
    let mut rng = Rng::new(seed);
    let mut src = MemSource::new();
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let q_dim = cfg.n_heads * hd;
    let kv_dim = cfg.n_kv_heads * hd;
    let q_rows = if cfg.attn_output_gate {
        2 * q_dim
    } else {
        q_dim
    };
    let norm = |rng: &mut Rng, n: usize| -> Vec<f32> {
        // (1 + w) checkpoints store values near 0, plain ones near 1.
        let base = if cfg.norm_offset_one { 0.0 } else { 1.0 };
        (0..n).map(|_| base + 0.2 * rng.next()).collect()
    };
    let mat = |src: &mut MemSource, rng: &mut Rng, name: &str, r: usize, c: usize| {
        src.add_f32(name, &[r, c], &rng.vec(r * c, 0.3));
    };
    mat(&mut src, &mut rng, "token_embd.weight", cfg.vocab, h);
    let ffn_norm = if cfg.arch == Arch::Qwen35 {
        "post_attention_norm"
    } else {
        "ffn_norm"
    };
    for i in 0..cfg.n_layers {
        let v = norm(&mut rng, h);
        src.add_f32(&format!("blk.{i}.attn_norm.weight"), &[h], &v);
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.attn_q.weight"),
            q_rows,
            h,
        );
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.attn_k.weight"),
            kv_dim,
            h,
        );
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.attn_v.weight"),
            kv_dim,
            h,
        );
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.attn_output.weight"),
            h,
            q_dim,
        );
        if cfg.qkv_bias {
            for (p, n) in [("q", q_rows), ("k", kv_dim), ("v", kv_dim)] {
                let b = rng.vec(n, 0.3);
                src.add_f32(&format!("blk.{i}.attn_{p}.bias"), &[n], &b);
            }
        }
        if cfg.qk_norm {
            for p in ["q", "k"] {
                let v = norm(&mut rng, hd);
                src.add_f32(&format!("blk.{i}.attn_{p}_norm.weight"), &[hd], &v);
            }
        }
        let v = norm(&mut rng, h);
        src.add_f32(&format!("blk.{i}.{ffn_norm}.weight"), &[h], &v);
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.ffn_gate.weight"),
            cfg.ffn,
            h,
        );
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.ffn_up.weight"),
            cfg.ffn,
            h,
        );
        mat(
            &mut src,
            &mut rng,
            &format!("blk.{i}.ffn_down.weight"),
            h,
            cfg.ffn,
        );
    }
    let v = norm(&mut rng, h);
    src.add_f32("output_norm.weight", &[h], &v);
    if !cfg.tied_embeddings {
        mat(&mut src, &mut rng, "output.weight", cfg.vocab, h);
    }
    src
}

/// Straightforward f64 forward pass over a whole sequence from position 0, written from the
/// model equations (not from kasoku's code): returns `tokens.len() × vocab` logits.
pub fn reference_forward(cfg: &ModelConfig, src: &MemSource, tokens: &[u32]) -> Vec<f64> {
    let w = |name: &str| {
        src.f32(name)
            .unwrap_or_else(|| panic!("reference: missing {name}"))
    };
    let (h, hd, nh, nkv) = (cfg.hidden, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads);
    let t = tokens.len();
    let eps = cfg.rms_eps as f64;
    let rms = |x: &[f64], g: &[f64]| -> Vec<f64> {
        let d = g.len();
        let mut out = Vec::with_capacity(x.len());
        for r in x.chunks(d) {
            let s = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
            let off = if cfg.norm_offset_one { 1.0 } else { 0.0 };
            out.extend(r.iter().zip(g).map(|(v, g)| v * s * (g + off)));
        }
        out
    };
    // x (rows × cols) · W (out × cols)ᵀ
    let lin = |x: &[f64], wt: &[f64], cols: usize| -> Vec<f64> {
        let out_dim = wt.len() / cols;
        let mut y = Vec::with_capacity(x.len() / cols * out_dim);
        for r in x.chunks(cols) {
            for o in 0..out_dim {
                y.push(
                    r.iter()
                        .zip(&wt[o * cols..(o + 1) * cols])
                        .map(|(a, b)| a * b)
                        .sum(),
                );
            }
        }
        y
    };
    let rope = |v: &mut [f64], pos: usize| {
        let rd = cfg.rope_dim;
        for head in v.chunks_mut(hd) {
            let orig = head.to_vec();
            for i in 0..rd / 2 {
                let angle = pos as f64 * cfg.rope_theta.powf(-(2.0 * i as f64) / rd as f64);
                let (s, c) = angle.sin_cos();
                let (a, b) = match cfg.rope_layout {
                    RopeLayout::Neox => (i, i + rd / 2),
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                };
                head[a] = orig[a] * c - orig[b] * s;
                head[b] = orig[b] * c + orig[a] * s;
            }
        }
    };
    let emb = w("token_embd.weight");
    let mut x: Vec<f64> = tokens
        .iter()
        .flat_map(|&id| emb[id as usize * h..(id as usize + 1) * h].to_vec())
        .collect();
    let ffn_norm = if cfg.arch == Arch::Qwen35 {
        "post_attention_norm"
    } else {
        "ffn_norm"
    };
    for l in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        let xn = rms(&x, &w(&p("attn_norm.weight")));
        let mut q_raw = lin(&xn, &w(&p("attn_q.weight")), h);
        let mut k = lin(&xn, &w(&p("attn_k.weight")), h);
        let mut v = lin(&xn, &w(&p("attn_v.weight")), h);
        if cfg.qkv_bias {
            for (buf, name) in [
                (&mut q_raw, "attn_q.bias"),
                (&mut k, "attn_k.bias"),
                (&mut v, "attn_v.bias"),
            ] {
                let b = w(&p(name));
                for (i, y) in buf.iter_mut().enumerate() {
                    *y += b[i % b.len()];
                }
            }
        }
        let (mut q, gate) = if cfg.attn_output_gate {
            let mut q = Vec::new();
            let mut g = Vec::new();
            for pair in q_raw.chunks(2 * hd) {
                q.extend_from_slice(&pair[..hd]);
                g.extend_from_slice(&pair[hd..]);
            }
            (q, Some(g))
        } else {
            (q_raw, None)
        };
        if cfg.qk_norm {
            q = rms(&q, &w(&p("attn_q_norm.weight")));
            k = rms(&k, &w(&p("attn_k_norm.weight")));
        }
        for pos in 0..t {
            rope(&mut q[pos * nh * hd..(pos + 1) * nh * hd], pos);
            rope(&mut k[pos * nkv * hd..(pos + 1) * nkv * hd], pos);
        }
        let mut att = vec![0f64; t * nh * hd];
        for i in 0..t {
            for head in 0..nh {
                let kh = head / (nh / nkv);
                let qv = &q[(i * nh + head) * hd..][..hd];
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kv = &k[(j * nkv + kh) * hd..][..hd];
                        qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let pj = (s - m).exp() / z;
                    for d in 0..hd {
                        att[(i * nh + head) * hd + d] += pj * v[(j * nkv + kh) * hd + d];
                    }
                }
            }
        }
        if let Some(g) = gate {
            for (a, g) in att.iter_mut().zip(&g) {
                *a *= 1.0 / (1.0 + (-g).exp());
            }
        }
        let o = lin(&att, &w(&p("attn_output.weight")), nh * hd);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let xn = rms(&x, &w(&p(&format!("{ffn_norm}.weight"))));
        let g = lin(&xn, &w(&p("ffn_gate.weight")), h);
        let u = lin(&xn, &w(&p("ffn_up.weight")), h);
        let act: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let d = lin(&act, &w(&p("ffn_down.weight")), cfg.ffn);
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
    }
    let xn = rms(&x, &w("output_norm.weight"));
    let head = src.f32("output.weight").unwrap_or(emb);
    lin(&xn, &head, h)
}

/// Largest |a - b| over the largest |b| (a scale-free closeness measure for logits).
pub fn rel_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "rel_diff: lengths differ");
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()))
        / scale
}
