//! What a model will take in memory once loaded, estimated from its checkpoint before anything
//! is packed (tensor shapes and types only): the packed weight matrices, the vectors kept as f32,
//! the KV cache bytes per token and the scratch of one pass. The engine checks these against the
//! memory available (`engine::context`) so that a model that cannot fit is refused with the
//! numbers instead of being killed halfway through packing.
//!
//! The embedding stays in the checkpoint's memory map (page cache, which the kernel can reclaim
//! and `MemAvailable` counts as available), so it costs nothing here unless the head reuses it,
//! which packs a copy.

use std::path::Path;

use crate::format::{Checkpoint, TensorSource};
use crate::quant::kasoku::TensorSpec;
use crate::quant::{requantize, Target};

use super::mixer::KvType;
use super::run::CHUNK;
use super::{LayerKind, ModelConfig, ModelError};

/// Rows a verification pass may ask logits for, at most (tree budgets are far below).
const LOGIT_ROWS: usize = 64;
/// Matrices are packed in groups of this many rows (a partial group is padded).
const ROW_GROUP: usize = 8;

/// A model's memory needs, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The packed matrices and f32 vectors the model allocates as it loads.
    pub weight_bytes: u64,
    /// One pass's activations at the largest batch (a prefill chunk) and its logits.
    pub scratch_bytes: u64,
    /// KV cache bytes per token of one sequence.
    pub kv_bytes_per_token: usize,
    /// The model's own context length.
    pub max_context: usize,
}

impl Footprint {
    /// The footprint of the checkpoint at `path` (GGUF file or Hugging Face directory), its
    /// matrices heavier than `matrix_format` requantized to it as [`super::Model::load_with`]
    /// does, its KV cache stored as `kv_type`. Reads metadata and tensor headers only.
    pub fn of_path(
        path: impl AsRef<Path>,
        matrix_format: Option<Target>,
        kv_type: KvType,
    ) -> Result<Footprint, ModelError> {
        let ckpt = Checkpoint::open(path)?;
        let config = ModelConfig::of_checkpoint(&ckpt)?;
        Ok(Footprint::of(
            &config,
            ckpt.tensors(),
            matrix_format,
            kv_type,
        ))
    }

    /// The footprint of `config` with the tensors of `source`.
    pub fn of(
        config: &ModelConfig,
        source: &dyn TensorSource,
        matrix_format: Option<Target>,
        kv_type: KvType,
    ) -> Footprint {
        let tied = source.get("output.weight").is_none();
        let mut weights = 0u64;
        let mut mtp_layer = false;
        // A kasoku-format matrix as packed: rows padded to the packing group.
        let kasoku_bytes = |spec: TensorSpec| {
            TensorSpec {
                rows: spec.rows.div_ceil(ROW_GROUP) * ROW_GROUP,
                ..spec
            }
            .total_bytes() as u64
        };
        for name in source.names() {
            if let Some(q) = source.quantized(&name) {
                weights = weights.saturating_add(kasoku_bytes(q.spec));
                continue;
            }
            let Some(t) = source.get(&name) else { continue };
            mtp_layer |=
                name.starts_with(&format!("blk.{}.", config.n_layers)) || name.starts_with("mtp.");
            let values: u64 = t.shape.iter().map(|&d| d as u64).product();
            let bytes = match t.shape[..] {
                // The embedding stays mapped; a tied head packs a copy of it.
                _ if name == "token_embd.weight" && !tied => 0,
                [rows, cols] => {
                    let recipe = match matrix_format {
                        Some(Target::Kasoku(r)) => r.spec_for(&name, rows, cols),
                        _ => None,
                    };
                    let head = (name == "token_embd.weight" && tied)
                        .then(|| match matrix_format {
                            Some(Target::Kasoku(r)) => r.spec_for("output.weight", rows, cols),
                            _ => None,
                        })
                        .flatten();
                    if let Some(spec) = recipe.or(head) {
                        weights = weights.saturating_add(kasoku_bytes(spec));
                        continue;
                    }
                    let dtype = matrix_format
                        .and_then(Target::gguf)
                        .filter(|&to| requantize::worth_it(t.dtype, to, cols))
                        .unwrap_or(t.dtype);
                    let padded = rows.div_ceil(ROW_GROUP) * ROW_GROUP;
                    dtype
                        .bytes_for(cols)
                        .map_or(values * 4, |row| (row as u64) * padded as u64)
                }
                _ => values * 4,
            };
            weights = weights.saturating_add(bytes);
        }
        let attention_layers = config.count(LayerKind::Attention) + usize::from(mtp_layer);
        let kv_row = kv_type
            .row_bytes(config.head_dim)
            .unwrap_or(config.head_dim * 4);
        Footprint {
            weight_bytes: weights,
            scratch_bytes: scratch_bytes(config),
            kv_bytes_per_token: attention_layers * 2 * config.n_kv_heads * kv_row,
            max_context: config.max_context,
        }
    }
}

/// The largest pass's scratch: a prefill chunk's residual stream, norms and deltas, q/k/v
/// (with Qwen3.5's gate), the MLP's gate and up rows and, for verification, logits of up to
/// [`LOGIT_ROWS`] rows; all f32.
pub fn scratch_bytes(config: &ModelConfig) -> u64 {
    let q = config.n_heads * config.head_dim * if config.attn_output_gate { 2 } else { 1 };
    let kv = 2 * config.n_kv_heads * config.head_dim;
    let linear = 2 * config.linear_num_key_heads * config.linear_key_head_dim
        + 2 * config.linear_num_value_heads * config.linear_value_head_dim;
    let per_row = 4 * config.hidden + q + kv.max(linear) + 3 * config.ffn;
    4 * (CHUNK * per_row + LOGIT_ROWS * config.vocab) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;

    #[test]
    fn kv_bytes_agree_with_the_loaded_models() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        for rel in ["llama/tiny", "qwen2/tiny", "qwen3/tiny", "qwen3_5/tiny"] {
            for path in [root.join(rel).join("model-f32.gguf"), root.join(rel)] {
                for kv in [KvType::F32, KvType::F16] {
                    let f = Footprint::of_path(&path, None, kv).unwrap();
                    let mut model = Model::load(&path).unwrap();
                    model.set_kv_type(kv).unwrap();
                    assert_eq!(f.kv_bytes_per_token, model.kv_bytes_per_token(), "{rel}");
                    assert_eq!(f.max_context, model.config.max_context);
                    assert!(f.weight_bytes > 0 && f.scratch_bytes > 0);
                }
            }
        }
    }
}
