//! Random-weight GGUF files of real models' shapes, for speed measurements where the real
//! files are too large to carry: every tensor has the shape and the per-tensor type llama.cpp's
//! quantizer gives the real file, filled with random valid blocks (small finite scales), so a
//! decode step reads the same bytes as with trained weights. Norm weights are 1, biases small.
//! Dense qwen2 shapes here; Qwen3.5 hybrid shapes in `synth/hybrid.rs`.

use std::path::Path;

use kasoku::format::{write_gguf, MetaValue};
use kasoku::quant::DType;

pub mod hybrid;
pub use hybrid::{HybridShape, QWEN35_2B};

/// A dense qwen2-family shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Has its own `output.weight` (else the head is the embedding).
    pub untied: bool,
}

/// Qwen2.5-Coder-1.5B (its GGUF carries output.weight).
pub const QWEN25_15B: Shape = Shape {
    name: "qwen2.5-coder-1.5b",
    hidden: 1536,
    layers: 28,
    heads: 12,
    kv_heads: 2,
    ffn: 8960,
    vocab: 151936,
    untied: true,
};
/// Qwen2.5-Coder-0.5B (its GGUF carries output.weight).
pub const QWEN25_05B: Shape = Shape {
    name: "qwen2.5-coder-0.5b",
    hidden: 896,
    layers: 24,
    heads: 14,
    kv_heads: 2,
    ffn: 4864,
    vocab: 151936,
    untied: true,
};

/// How matrices are typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// llama.cpp's Q4_K_M: Q4_K, with Q6_K for the head and some attn_v / ffn_down layers.
    Q4KM,
    /// Every matrix Q8_0.
    Q8_0,
    /// Every matrix F16.
    F16,
}

impl std::str::FromStr for Scheme {
    type Err = String;
    fn from_str(s: &str) -> Result<Scheme, String> {
        match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Ok(Scheme::Q4KM),
            "q8_0" => Ok(Scheme::Q8_0),
            "f16" => Ok(Scheme::F16),
            _ => Err(format!("unknown scheme {s} (q4_k_m, q8_0, f16)")),
        }
    }
}

/// llama.cpp's "more bits" layers of Q4_K_M (the first and last eighth, every third between).
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize) % 3 == 2
}

/// K-quant types fall back when the row is not a whole number of 256-value super-blocks.
fn fit(t: DType, cols: usize) -> DType {
    if cols.is_multiple_of(256) {
        return t;
    }
    match t {
        DType::Q4K => DType::Q5_0,
        DType::Q5K => DType::Q5_1,
        DType::Q6K => DType::Q8_0,
        other => other,
    }
}

/// Every tensor of `shape` under `scheme`: (name, type, shape outermost-first).
pub fn tensors(shape: &Shape, scheme: Scheme) -> Vec<(String, DType, Vec<usize>)> {
    let s = shape;
    let hd = s.hidden / s.heads;
    let (q, kv) = (s.heads * hd, s.kv_heads * hd);
    let base = |t: DType, cols| match scheme {
        Scheme::Q4KM => fit(t, cols),
        Scheme::Q8_0 => DType::Q8_0,
        Scheme::F16 => DType::F16,
    };
    let mut v = vec![(
        "token_embd.weight".to_string(),
        base(DType::Q4K, s.hidden),
        vec![s.vocab, s.hidden],
    )];
    for i in 0..s.layers {
        let more = if use_more_bits(i, s.layers) {
            DType::Q6K
        } else {
            DType::Q4K
        };
        let n = |p: &str| format!("blk.{i}.{p}");
        v.push((n("attn_norm.weight"), DType::F32, vec![s.hidden]));
        v.push((
            n("attn_q.weight"),
            base(DType::Q4K, s.hidden),
            vec![q, s.hidden],
        ));
        v.push((n("attn_q.bias"), DType::F32, vec![q]));
        v.push((
            n("attn_k.weight"),
            base(DType::Q4K, s.hidden),
            vec![kv, s.hidden],
        ));
        v.push((n("attn_k.bias"), DType::F32, vec![kv]));
        v.push((n("attn_v.weight"), base(more, s.hidden), vec![kv, s.hidden]));
        v.push((n("attn_v.bias"), DType::F32, vec![kv]));
        v.push((
            n("attn_output.weight"),
            base(DType::Q4K, q),
            vec![s.hidden, q],
        ));
        v.push((n("ffn_norm.weight"), DType::F32, vec![s.hidden]));
        v.push((
            n("ffn_gate.weight"),
            base(DType::Q4K, s.hidden),
            vec![s.ffn, s.hidden],
        ));
        v.push((
            n("ffn_up.weight"),
            base(DType::Q4K, s.hidden),
            vec![s.ffn, s.hidden],
        ));
        v.push((
            n("ffn_down.weight"),
            base(more, s.ffn),
            vec![s.hidden, s.ffn],
        ));
    }
    v.push(("output_norm.weight".into(), DType::F32, vec![s.hidden]));
    if s.untied {
        v.push((
            "output.weight".into(),
            base(DType::Q6K, s.hidden),
            vec![s.vocab, s.hidden],
        ));
    }
    v
}

/// The qwen2 metadata of `shape`. No tokenizer (speed runs feed token ids): the model is
/// `none` with `vocab_size` entries, which llama.cpp loads as dummy tokens, so the same file
/// serves its llama-bench.
pub fn metadata(shape: &Shape) -> Vec<(String, MetaValue)> {
    let s = shape;
    let k = |x: &str| format!("qwen2.{x}");
    vec![
        (
            "general.architecture".into(),
            MetaValue::String("qwen2".into()),
        ),
        (
            "general.name".into(),
            MetaValue::String(format!("random-weight {}", s.name)),
        ),
        (k("context_length"), MetaValue::U32(32768)),
        (k("embedding_length"), MetaValue::U32(s.hidden as u32)),
        (k("block_count"), MetaValue::U32(s.layers as u32)),
        (k("feed_forward_length"), MetaValue::U32(s.ffn as u32)),
        (k("attention.head_count"), MetaValue::U32(s.heads as u32)),
        (
            k("attention.head_count_kv"),
            MetaValue::U32(s.kv_heads as u32),
        ),
        (k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6)),
        (k("rope.freq_base"), MetaValue::F32(1e6)),
        (k("vocab_size"), MetaValue::U32(s.vocab as u32)),
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("none".into()),
        ),
    ]
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
    }
}

/// `n` values of `dtype` with random contents whose scales are small finite numbers (`scale`
/// sets their size).
pub fn random_tensor(rng: &mut Rng, dtype: DType, n: usize, scale: f32) -> Vec<u8> {
    let bytes = dtype.bytes_for(n).expect("whole blocks");
    let mut v = vec![0u8; bytes];
    let h = |x: f32| half::f16::from_f32(x).to_le_bytes();
    match dtype {
        DType::F32 => {
            for c in v.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.sym() * scale).to_le_bytes());
            }
        }
        DType::F16 => {
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&h(rng.sym() * scale));
            }
        }
        DType::BF16 => {
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.sym() * scale).to_le_bytes());
            }
        }
        _ => {
            rng.fill(&mut v);
            let bb = dtype.block_bytes();
            // Quants: value range ~ 8 (4-bit) to 128 (8-bit); K-quant sub-scales up to 63.
            let d = match dtype {
                DType::Q8_0 => scale / 128.0,
                DType::Q4K | DType::Q5K => scale / (16.0 * 32.0),
                DType::Q6K => scale / (32.0 * 64.0),
                _ => scale / 8.0,
            };
            for b in v.chunks_exact_mut(bb) {
                let (dv, mv) = (h(d * (0.5 + 0.5 * rng.sym().abs())), h(d * rng.sym().abs()));
                match dtype {
                    DType::Q6K => b[208..210].copy_from_slice(&dv),
                    DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => {
                        b[0..2].copy_from_slice(&dv);
                        b[2..4].copy_from_slice(&mv);
                    }
                    _ => b[0..2].copy_from_slice(&dv),
                }
            }
        }
    }
    v
}

/// Writes the random-weight GGUF of `shape` under `scheme` to `path`; returns its tensors'
/// total bytes.
pub fn write(path: &Path, shape: &Shape, scheme: Scheme, seed: u64) -> Result<usize, String> {
    let mut rng = Rng(seed | 1);
    let mut data = Vec::new();
    for (name, dtype, dims) in tensors(shape, scheme) {
        let n: usize = dims.iter().product();
        let bytes = if name.ends_with("norm.weight") {
            (0..n).flat_map(|_| 1f32.to_le_bytes()).collect()
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

    fn bytes(shape: &Shape, scheme: Scheme) -> (usize, usize) {
        let t = tensors(shape, scheme);
        let all: usize = t
            .iter()
            .map(|(_, d, s)| d.bytes_for(s.iter().product()).unwrap())
            .sum();
        let embd = t.iter().find(|x| x.0 == "token_embd.weight").unwrap();
        (all, embd.1.bytes_for(embd.2.iter().product()).unwrap())
    }

    /// The per-tensor types reproduce llama.cpp's Q4_K_M files: the bytes a GPU reads per
    /// token (all tensors but the embedding) equal the anchor's measured files' to the byte
    /// (shared/research/gpu_anchor.md: 980,097,536 and 391,859,712).
    #[test]
    fn q4_k_m_types_match_the_real_files() {
        let (all, embd) = bytes(&QWEN25_15B, Scheme::Q4KM);
        assert_eq!(all - embd, 980_097_536);
        let (all, embd) = bytes(&QWEN25_05B, Scheme::Q4KM);
        assert_eq!(all - embd, 391_859_712);
    }

    #[test]
    fn random_blocks_dequantize_to_finite_small_values() {
        let mut rng = Rng(7);
        for d in DType::ALL {
            let n = 512;
            let b = random_tensor(&mut rng, d, n, 0.05);
            let mut out = vec![0f32; n];
            kasoku::quant::dequantize(d, &b, &mut out);
            assert!(out.iter().all(|v| v.is_finite() && v.abs() < 1.0), "{d}");
            assert!(out.iter().any(|v| *v != 0.0), "{d}");
        }
    }

    #[test]
    fn a_small_shape_writes_a_loadable_file() {
        let s = Shape {
            name: "t",
            hidden: 256,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 512,
            vocab: 300,
            untied: true,
        };
        let dir = std::env::temp_dir().join(format!("kasoku-synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        write(&p, &s, Scheme::Q4KM, 1).unwrap();
        let m = kasoku::model::Model::load(&p).unwrap();
        assert_eq!(m.config.hidden, 256);
        let dtype = |name: &str| {
            let mats = m.matrices();
            mats.iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, w)| w.dtype())
        };
        assert_eq!(dtype("blk.1.ffn_down.weight"), Some(DType::Q6K));
        assert_eq!(dtype("blk.0.ffn_down.weight"), Some(DType::Q4K));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
