//! `DFlash`: a block drafter that reads the target's own hidden states (z-lab's DFlash layout;
//! research/speculative.md §1). A few Qwen3-style decoder layers with no embedding and no LM
//! head of their own (the target's are used) turn one block `[last token, MASK × (B−1)]` into
//! the marginals of the next `B − 1` tokens in one pass:
//!
//! ```text
//! context row of a committed token t:  c_t = hidden_norm(fc · [tap_1(t) | … | tap_n(t)])
//!     (tap_l = output of the target's decoder layer l, before the final norm)
//!     per layer: K_t = rope(k_norm(W_k c_t), t),  V_t = W_v c_t   — kept in the context cache
//! block at positions s … s+B−1:  h = embed([x_s, MASK, …, MASK])   (the target's table)
//!     per layer: x = input_norm(h)
//!                q = rope(q_norm(W_q x)),  k = rope(k_norm(W_k x)),  v = W_v x
//!                h += W_o · softmax(q [K_ctx; k]ᵀ / √d) [V_ctx; v]   no mask: every block row
//!                                                                    sees every context row
//!                                                                    and every block row
//!                h += mlp(post_norm(h))                              (SwiGLU)
//! logits of positions s+1 … s+B−1 = head(norm(h[1..B]))             (the target's head)
//! ```
//!
//! The checkpoint is a directory: `config.json` (`architectures: ["DFlashDraftModel"]`,
//! Qwen3 hyper-parameters, `block_size` at the top level or in `dflash_config`,
//! `dflash_config.{mask_token_id, target_layer_ids}`) and `model.safetensors` with `fc`,
//! `hidden_norm`, `norm` and `layers.N.{input_layernorm, post_attention_layernorm,
//! self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj}` (no prefix).
//! Loading is strict and checked against the target it will draft for.

use std::path::Path;

use serde_json::Value;

use crate::backend::{Activation, Backend, Cpu, MatMul};
use crate::format::{limits, Claims, HfCheckpoint, HfConfig, TensorSource};
use crate::kernels::attention::{attend, AttnArgs, AttnGeometry, KvHeads};
use crate::kernels::matmul::MatMulWeight;
use crate::kernels::rope::{Rope, RopeLayout, RopeScaling};
use crate::quant::DType;

use super::transformer::Model;
use super::{weights, ModelError, RmsNorm};

/// The architecture name a DFlash `config.json` carries.
pub const DFLASH_ARCHITECTURE: &str = "DFlashDraftModel";

/// Whether `path` is a DFlash checkpoint directory (its `config.json` names
/// [`DFLASH_ARCHITECTURE`]).
pub fn is_dflash_checkpoint(path: &Path) -> bool {
    path.is_dir()
        && HfConfig::load(path).is_ok_and(|c| {
            c.root()
                .get("architectures")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(DFLASH_ARCHITECTURE)))
        })
}

/// The hyper-parameters of a DFlash drafter.
#[derive(Clone, Debug, PartialEq)]
pub struct DFlashConfig {
    pub hidden: usize,
    pub intermediate: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    /// Tokens per block (the last token and `block_size − 1` masks).
    pub block_size: usize,
    /// The token id the masked block positions are embedded as.
    pub mask_token: u32,
    /// The target's decoder layers read, in the order their outputs are concatenated.
    pub taps: Vec<usize>,
    /// `vocab_size` and `num_target_layers` when the config states them (checked against
    /// the target).
    pub vocab: Option<usize>,
    pub target_layers: Option<usize>,
}

impl DFlashConfig {
    /// Reads a DFlash `config.json`. Anything this runtime would compute differently from
    /// the checkpoint's authors (sliding-window or causal layers, scaled RoPE, biases,
    /// another activation) is refused.
    pub fn from_hf(cfg: &HfConfig) -> Result<DFlashConfig, String> {
        let fmt = |e: crate::format::FormatError| e.to_string();
        let root = cfg.root();
        let archs = root.get("architectures").and_then(Value::as_array);
        if !archs.is_some_and(|a| a.iter().any(|v| v.as_str() == Some(DFLASH_ARCHITECTURE))) {
            return Err(format!(
                "not a DFlash drafter (architectures must include '{DFLASH_ARCHITECTURE}')"
            ));
        }
        let dflash = match root.get("dflash_config") {
            Some(Value::Object(m)) => m,
            _ => return Err("missing object 'dflash_config'".into()),
        };
        // Every size below the bounds a checkpoint may declare, before anything is sized by it.
        let at_most = |field: &str, v: usize, max: usize| limits::bounded(field, v as u64, max);
        let hidden = at_most(
            "hidden_size",
            cfg.usize("hidden_size").map_err(fmt)?,
            limits::MAX_HIDDEN,
        )?;
        let n_heads = at_most(
            "num_attention_heads",
            cfg.usize("num_attention_heads").map_err(fmt)?,
            limits::MAX_HEADS,
        )?;
        let n_kv_heads = at_most(
            "num_key_value_heads",
            cfg.opt_usize("num_key_value_heads")
                .map_err(fmt)?
                .unwrap_or(n_heads),
            limits::MAX_HEADS,
        )?;
        if n_heads == 0 || hidden == 0 {
            return Err("hidden_size and num_attention_heads must be positive".into());
        }
        let head_dim = at_most(
            "head_dim",
            cfg.opt_usize("head_dim")
                .map_err(fmt)?
                .unwrap_or(hidden / n_heads),
            limits::MAX_HEAD_DIM,
        )?;
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(format!(
                "num_attention_heads ({n_heads}) is not a multiple of num_key_value_heads ({n_kv_heads})"
            ));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {head_dim} must be even and positive"));
        }
        let usize_of = |v: &Value, what: &str| -> Result<usize, String> {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("{what}: {v} is not a non-negative integer"))
        };
        let block_size = match dflash.get("block_size").filter(|v| !v.is_null()) {
            Some(v) => usize_of(v, "dflash_config.block_size")?,
            None => cfg.usize("block_size").map_err(fmt)?,
        };
        if !(2..=64).contains(&block_size) {
            return Err(format!("block_size {block_size} is outside 2..=64"));
        }
        let mask = dflash
            .get("mask_token_id")
            .ok_or("missing key 'dflash_config.mask_token_id'")?;
        let mask_token = u32::try_from(usize_of(mask, "dflash_config.mask_token_id")?)
            .map_err(|_| format!("mask_token_id {mask} does not fit a token id"))?;
        let taps = match dflash.get("target_layer_ids") {
            Some(Value::Array(ids)) if !ids.is_empty() => ids
                .iter()
                .map(|v| usize_of(v, "dflash_config.target_layer_ids"))
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err("missing non-empty list 'dflash_config.target_layer_ids'".into()),
        };
        at_most(
            "dflash_config.target_layer_ids (length)",
            taps.len(),
            limits::MAX_LAYERS,
        )?;
        if cfg.opt_bool("attention_bias").map_err(fmt)? == Some(true) {
            return Err("attention_bias: biased projections are not supported".into());
        }
        if let Some(act) = cfg.opt_str("hidden_act").map_err(fmt)? {
            if act != "silu" {
                return Err(format!("hidden_act '{act}' is not supported (silu only)"));
            }
        }
        let causal = dflash.get("causal").or_else(|| root.get("is_causal"));
        if causal.and_then(Value::as_bool) == Some(true) {
            return Err("causal draft blocks are not supported".into());
        }
        if let Some(Value::Array(kinds)) = root.get("layer_types") {
            if let Some(k) = kinds.iter().find(|k| k.as_str() != Some("full_attention")) {
                return Err(format!(
                    "layer type {k} is not supported (full_attention only)"
                ));
            }
        }
        if cfg.opt_bool("use_sliding_window").map_err(fmt)? == Some(true) {
            return Err("sliding-window attention is not supported".into());
        }
        let rope_theta = match cfg.opt_f64("rope_theta").map_err(fmt)? {
            Some(t) => t,
            None => root
                .get("rope_parameters")
                .and_then(|p| p.get("rope_theta"))
                .and_then(Value::as_f64)
                .ok_or("missing key 'rope_theta'")?,
        };
        if !(rope_theta.is_finite() && rope_theta > 1.0) {
            return Err(format!("rope_theta {rope_theta} is not usable"));
        }
        let scaled = |p: Option<&Value>| {
            p.and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
                .and_then(Value::as_str)
                .filter(|t| *t != "default")
                .map(str::to_string)
        };
        if let Some(t) = scaled(root.get("rope_scaling")).or(scaled(root.get("rope_parameters"))) {
            return Err(format!("RoPE scaling '{t}' is not supported"));
        }
        let rms_eps = cfg.opt_f64("rms_norm_eps").map_err(fmt)?.unwrap_or(1e-6) as f32;
        Ok(DFlashConfig {
            hidden,
            intermediate: at_most(
                "intermediate_size",
                cfg.usize("intermediate_size").map_err(fmt)?,
                limits::MAX_FFN,
            )?,
            n_layers: at_most(
                "num_hidden_layers",
                cfg.usize("num_hidden_layers").map_err(fmt)?,
                limits::MAX_LAYERS,
            )?,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_eps,
            rope_theta,
            block_size,
            mask_token,
            taps,
            vocab: cfg.opt_usize("vocab_size").map_err(fmt)?,
            target_layers: cfg.opt_usize("num_target_layers").map_err(fmt)?,
        })
    }

    /// Checks that a drafter of this configuration can draft for `target`.
    pub fn check_target(&self, target: &Model) -> Result<(), String> {
        let t = &target.config;
        if target.embedding.dim != t.hidden {
            return Err(format!(
                "hidden size {} does not match the target's {}",
                self.hidden, target.embedding.dim
            ));
        }
        self.check_shape(t.hidden, t.n_layers, t.vocab, target.embedding.vocab)
    }

    /// Checks that a drafter of this configuration can draft for a target of `hidden` width,
    /// `n_layers` decoder layers, a vocabulary of `vocab` and an embedding of `embed_rows`
    /// rows (wherever the target runs).
    pub fn check_shape(
        &self,
        hidden: usize,
        n_layers: usize,
        vocab: usize,
        embed_rows: usize,
    ) -> Result<(), String> {
        if self.hidden != hidden {
            return Err(format!(
                "hidden size {} does not match the target's {hidden}",
                self.hidden
            ));
        }
        if let Some(&l) = self.taps.iter().find(|&&l| l >= n_layers) {
            return Err(format!(
                "target layer {l} (dflash_config.target_layer_ids) is beyond the target's {n_layers} layers"
            ));
        }
        if let Some(n) = self.target_layers.filter(|&n| n != n_layers) {
            return Err(format!(
                "num_target_layers {n} does not match the target's {n_layers} layers"
            ));
        }
        if let Some(v) = self.vocab.filter(|&v| v != vocab) {
            return Err(format!(
                "vocab_size {v} does not match the target's vocabulary of {vocab}"
            ));
        }
        if self.mask_token as usize >= embed_rows {
            return Err(format!(
                "mask_token_id {} is outside the target's embedding of {embed_rows} rows",
                self.mask_token
            ));
        }
        Ok(())
    }
}

/// One draft layer.
struct DraftLayer {
    input_norm: RmsNorm,
    q: MatMulWeight,
    k: MatMulWeight,
    v: MatMulWeight,
    o: MatMulWeight,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_norm: RmsNorm,
    gate: MatMulWeight,
    up: MatMulWeight,
    down: MatMulWeight,
}

/// What one block pass drafts.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    /// The last sampled token (not yet in the target's state), the block's first row.
    pub root: u32,
    /// The root's position.
    pub pos: usize,
    /// Block rows after the root to score (positions `pos + 1 ..= pos + rows`; fewer than
    /// the block size).
    pub rows: usize,
    /// The LM head to score them with: the target's, or its first rows.
    pub head: &'a MatMulWeight,
}

/// A loaded DFlash drafter (weights only; share it between sessions). Its per-sequence state
/// is a [`DFlashContext`].
pub struct DFlash {
    pub config: DFlashConfig,
    fc: MatMulWeight,
    hidden_norm: RmsNorm,
    norm: RmsNorm,
    layers: Vec<DraftLayer>,
    rope: Rope,
}

/// The context a DFlash drafter attends to: per layer and KV head, the keys and values of the
/// committed tokens it was given features for (`[row][head_dim]`, contiguous per head, as the
/// attention kernel reads them). The rows need not cover every position: a row's position is
/// already in its rotated key, and no mask depends on it.
pub struct DFlashContext {
    keys: Vec<Vec<Vec<f32>>>,
    values: Vec<Vec<Vec<f32>>>,
    /// Each row's position.
    positions: Vec<usize>,
}

impl DFlashContext {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Each row's position, in the order the rows were added.
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.len() {
            return;
        }
        let per = |v: &mut Vec<f32>, hd: usize| v.truncate(rows * hd);
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for head in layer.iter_mut() {
                let hd = head.len() / self.positions.len();
                per(head, hd);
            }
        }
        self.positions.truncate(rows);
    }

    /// Bytes held by the rows.
    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .flatten()
            .map(|h| h.len() * 4)
            .sum()
    }
}

impl DFlash {
    /// Loads the checkpoint directory `path` for `target`; matrices stored in formats heavier
    /// than `matrix_format` are requantized to it (a drafter only guesses).
    pub fn load(
        path: &Path,
        target: &Model,
        matrix_format: Option<DType>,
    ) -> Result<DFlash, ModelError> {
        let ckpt = HfCheckpoint::open(path)?;
        let config = DFlashConfig::from_hf(ckpt.config()).map_err(|reason| ModelError::Config {
            source_path: path.display().to_string(),
            reason: format!("DFlash drafter: {reason}"),
        })?;
        DFlash::from_source(config, &ckpt, target, matrix_format)
    }

    /// Builds the drafter from `source` (tensors under their DFlash names), claiming every
    /// tensor, after checking `config` against `target`.
    pub fn from_source(
        config: DFlashConfig,
        source: &dyn TensorSource,
        target: &Model,
        matrix_format: Option<DType>,
    ) -> Result<DFlash, ModelError> {
        let path = source.path().display().to_string();
        config
            .check_target(target)
            .map_err(|reason| ModelError::Config {
                source_path: path.clone(),
                reason: format!("DFlash drafter for this target: {reason}"),
            })?;
        let claims =
            Claims::new(source).with_matrix_format(matrix_format.map(crate::quant::Target::from));
        let c = &config;
        let (h, hd, eps) = (c.hidden, c.head_dim, c.rms_eps);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let norm = |name: &str, dim: usize| RmsNorm::load(&Cpu, &claims, name, dim, eps, false);
        let mut layers = Vec::new();
        for i in 0..c.n_layers {
            let n = |part: &str| format!("layers.{i}.{part}.weight");
            let m = |part: &str, rows, cols| weights::matrix(&Cpu, &claims, &n(part), rows, cols);
            layers.push(DraftLayer {
                input_norm: norm(&n("input_layernorm"), h)?,
                q: m("self_attn.q_proj", qd, h)?,
                k: m("self_attn.k_proj", kvd, h)?,
                v: m("self_attn.v_proj", kvd, h)?,
                o: m("self_attn.o_proj", h, qd)?,
                q_norm: norm(&n("self_attn.q_norm"), hd)?,
                k_norm: norm(&n("self_attn.k_norm"), hd)?,
                post_norm: norm(&n("post_attention_layernorm"), h)?,
                gate: m("mlp.gate_proj", c.intermediate, h)?,
                up: m("mlp.up_proj", c.intermediate, h)?,
                down: m("mlp.down_proj", h, c.intermediate)?,
            });
        }
        let net = DFlash {
            fc: weights::matrix(&Cpu, &claims, "fc.weight", h, c.taps.len() * h)?,
            hidden_norm: norm("hidden_norm.weight", h)?,
            norm: norm("norm.weight", h)?,
            layers,
            rope: Rope::new(
                hd,
                hd,
                c.rope_theta,
                RopeLayout::Neox,
                &RopeScaling::None,
                None,
            ),
            config,
        };
        claims.finish()?;
        Ok(net)
    }

    /// An empty context.
    pub fn new_context(&self) -> DFlashContext {
        let c = &self.config;
        let heads = || vec![vec![Vec::new(); c.n_kv_heads]; c.n_layers];
        DFlashContext {
            keys: heads(),
            values: heads(),
            positions: Vec::new(),
        }
    }

    /// Values of one token's features: the concatenated outputs of the tapped layers.
    pub fn feature_width(&self) -> usize {
        self.config.taps.len() * self.config.hidden
    }

    /// Bytes of context one committed token adds (keys and values of every layer, f32).
    pub fn context_bytes_per_token(&self) -> usize {
        let c = &self.config;
        c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4
    }

    /// Bytes of the drafter's packed weights.
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|w| w.size_bytes())
                    .sum::<usize>()
            })
            .sum();
        l + self.fc.size_bytes()
    }

    /// Projects the features of committed tokens (`positions.len()` rows of
    /// [`DFlash::feature_width`] values) into context rows at those positions.
    pub fn append_context(
        &self,
        ctx: &mut DFlashContext,
        features: &[f32],
        positions: &[usize],
    ) -> Result<(), ModelError> {
        let (c, n) = (&self.config, positions.len());
        if features.len() != n * self.feature_width() {
            return Err(ModelError::StateMismatch(format!(
                "DFlash: {} feature values for {n} tokens of {} values",
                features.len(),
                self.feature_width()
            )));
        }
        if ctx.keys.len() != c.n_layers || ctx.keys.first().map(Vec::len) != Some(c.n_kv_heads) {
            return Err(ModelError::StateMismatch(
                "DFlash: a context made by another drafter".into(),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let (h, hd) = (c.hidden, c.head_dim);
        let kvd = c.n_kv_heads * hd;
        let mut proj = vec![0f32; n * h];
        Cpu.matmul(MatMul {
            w: &self.fc,
            x: features,
            n,
            y: &mut proj,
        });
        let mut cn = vec![0f32; n * h];
        self.hidden_norm.forward(&Cpu, &proj, &mut cn);
        let (mut k, mut v) = (vec![0f32; n * kvd], vec![0f32; n * kvd]);
        for (li, layer) in self.layers.iter().enumerate() {
            self.kv_rows(layer, &cn, n, positions, &mut k, &mut v);
            push_rows(&mut ctx.keys[li], &k, hd);
            push_rows(&mut ctx.values[li], &v, hd);
        }
        ctx.positions.extend_from_slice(positions);
        Ok(())
    }

    /// Rotated, normed keys and values of `n` rows of `x` for `layer`.
    fn kv_rows(
        &self,
        layer: &DraftLayer,
        x: &[f32],
        n: usize,
        positions: &[usize],
        k: &mut [f32],
        v: &mut [f32],
    ) {
        Cpu.matmul(MatMul {
            w: &layer.k,
            x,
            n,
            y: k,
        });
        Cpu.matmul(MatMul {
            w: &layer.v,
            x,
            n,
            y: v,
        });
        layer.k_norm.forward_inplace(&Cpu, k);
        self.rope.apply(k, self.config.n_kv_heads, positions);
    }

    /// One block pass (see [`Block`]): writes the logits of block rows `1..=block.rows` into
    /// `logits`, `rows × head.rows` values. The context is left as it was.
    pub fn draft(
        &self,
        target: &Model,
        ctx: &mut DFlashContext,
        block: Block,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let Block {
            root,
            pos,
            rows,
            head,
        } = block;
        let c = &self.config;
        let b = c.block_size;
        let (h, hd) = (c.hidden, c.head_dim);
        if root as usize >= target.embedding.vocab {
            return Err(ModelError::TokenOutOfRange {
                token: root,
                vocab: target.embedding.vocab,
            });
        }
        if rows >= b || target.embedding.dim != h || head.cols != h {
            return Err(ModelError::StateMismatch(format!(
                "DFlash: {rows} rows asked of a block of {b}, or a target of another width"
            )));
        }
        if ctx.keys.len() != c.n_layers || ctx.keys.first().map(Vec::len) != Some(c.n_kv_heads) {
            return Err(ModelError::StateMismatch(
                "DFlash: a context made by another drafter".into(),
            ));
        }
        let mut block = vec![c.mask_token; b];
        block[0] = root;
        let positions: Vec<usize> = (pos..pos + b).collect();
        let mut x = vec![0f32; b * h];
        target.embedding.lookup(&Cpu, &block, &mut x);

        let (qd, kvd, g) = (c.n_heads * hd, c.n_kv_heads * hd, c.n_heads / c.n_kv_heads);
        let past = ctx.len();
        let mut normed = vec![0f32; b * h];
        let mut q = vec![0f32; b * qd];
        let mut qf = vec![0f32; b * qd];
        let mut att = vec![0f32; b * qd];
        let (mut k, mut v) = (vec![0f32; b * kvd], vec![0f32; b * kvd]);
        let mut d = vec![0f32; b * h];
        let mut gate = vec![0f32; b * c.intermediate];
        let mut up = vec![0f32; b * c.intermediate];
        // The block's rows all see the same keys (context and block), so the block attends as
        // one query row whose heads are the block's (row, head) pairs, grouped by KV head.
        let geo = AttnGeometry {
            n_heads: b * c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
        };
        let fold = |r: usize, head: usize| ((head / g) * b * g + r * g + head % g) * hd;
        for (li, layer) in self.layers.iter().enumerate() {
            layer.input_norm.forward(&Cpu, &x, &mut normed);
            Cpu.matmul(MatMul {
                w: &layer.q,
                x: &normed,
                n: b,
                y: &mut q,
            });
            layer.q_norm.forward_inplace(&Cpu, &mut q);
            self.rope.apply(&mut q, c.n_heads, &positions);
            self.kv_rows(layer, &normed, b, &positions, &mut k, &mut v);
            for r in 0..b {
                for head in 0..c.n_heads {
                    let from = (r * c.n_heads + head) * hd;
                    let to = fold(r, head);
                    qf[to..to + hd].copy_from_slice(&q[from..from + hd]);
                }
            }
            push_rows(&mut ctx.keys[li], &k, hd);
            push_rows(&mut ctx.values[li], &v, hd);
            {
                let keys: Vec<&[f32]> = ctx.keys[li].iter().map(Vec::as_slice).collect();
                let values: Vec<&[f32]> = ctx.values[li].iter().map(Vec::as_slice).collect();
                let args = AttnArgs {
                    geo,
                    q: &qf,
                    keys: KvHeads::F32(&keys),
                    values: KvHeads::F32(&values),
                    past: past + b - 1,
                    scale: 1.0 / (hd as f32).sqrt(),
                    tree: None,
                };
                attend(&args, &mut q);
            }
            for heads in ctx.keys[li].iter_mut().chain(ctx.values[li].iter_mut()) {
                heads.truncate(past * hd);
            }
            for r in 0..b {
                for head in 0..c.n_heads {
                    let from = fold(r, head);
                    let to = (r * c.n_heads + head) * hd;
                    att[to..to + hd].copy_from_slice(&q[from..from + hd]);
                }
            }
            Cpu.matmul(MatMul {
                w: &layer.o,
                x: &att,
                n: b,
                y: &mut d,
            });
            Cpu.activation(Activation::Add { x: &mut x, d: &d });
            layer.post_norm.forward(&Cpu, &x, &mut normed);
            Cpu.matmul(MatMul {
                w: &layer.gate,
                x: &normed,
                n: b,
                y: &mut gate,
            });
            Cpu.matmul(MatMul {
                w: &layer.up,
                x: &normed,
                n: b,
                y: &mut up,
            });
            Cpu.activation(Activation::SwiGlu {
                gate: &mut gate,
                up: &up,
            });
            Cpu.matmul(MatMul {
                w: &layer.down,
                x: &gate,
                n: b,
                y: &mut d,
            });
            Cpu.activation(Activation::Add { x: &mut x, d: &d });
        }
        let out = &mut normed[..rows * h];
        self.norm.forward(&Cpu, &x[h..(rows + 1) * h], out);
        logits.clear();
        logits.resize(rows * head.rows, 0.0);
        Cpu.matmul(MatMul {
            w: head,
            x: out,
            n: rows,
            y: logits,
        });
        Ok(())
    }
}

/// Appends rows of `heads × hd` values to per-head row lists.
fn push_rows(dst: &mut [Vec<f32>], rows: &[f32], hd: usize) {
    let heads = dst.len();
    for row in rows.chunks_exact(heads * hd) {
        for (head, part) in dst.iter_mut().zip(row.chunks_exact(hd)) {
            head.extend_from_slice(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_util::ScratchDir;
    use crate::model::golden::fixture_dir;
    use crate::model::testing::{rel_diff, MemSource};

    const TOL: f64 = 1e-5;

    /// `reference.json` of `qwen2/tiny_dflash` (tools/make_dflash_fixture.py).
    struct Reference {
        tokens: Vec<u32>,
        features: Vec<f64>,
        /// (context rows, root, logits of rows 1..B).
        cycles: Vec<(usize, u32, Vec<f64>)>,
    }

    fn reference() -> Reference {
        let text = std::fs::read_to_string(fixture_dir("qwen2/tiny_dflash/reference.json"))
            .expect("read reference.json");
        let v: Value = serde_json::from_str(&text).unwrap();
        let mat = |x: &Value| -> Vec<f64> {
            x.as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect()
        };
        Reference {
            tokens: v["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
            features: mat(&v["features"]),
            cycles: v["cycles"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["context"].as_u64().unwrap() as usize,
                        c["root"].as_u64().unwrap() as u32,
                        mat(&c["logits"]),
                    )
                })
                .collect(),
        }
    }

    fn drafter_dir() -> std::path::PathBuf {
        fixture_dir("qwen2/tiny_dflash")
    }

    /// The drafter's marginals from kasoku's own target features, cycle by cycle with an
    /// incrementally grown context, against the PyTorch reference; from the target's HF
    /// checkpoint and from its GGUF conversion.
    #[test]
    fn marginals_match_the_pytorch_reference() {
        let r = reference();
        assert!(is_dflash_checkpoint(&drafter_dir()));
        for target_path in [
            fixture_dir("qwen2/tiny"),
            fixture_dir("qwen2/tiny/model-f32.gguf"),
        ] {
            let what = target_path.display().to_string();
            let target = Model::load(&target_path).unwrap();
            let net = DFlash::load(&drafter_dir(), &target, None).unwrap();
            assert_eq!(net.config.taps, vec![1, 0]);
            assert_eq!(net.config.block_size, 8);
            let mut st = target.new_state(64);
            let (_, feats) = target
                .forward_taps(&mut st, &r.tokens, &net.config.taps)
                .unwrap();
            let d = rel_diff(&feats, &r.features);
            assert!(d < TOL, "{what}: target features differ by {d:e}");

            let width = net.feature_width();
            let mut ctx = net.new_context();
            let mut logits = Vec::new();
            let vocab = target.config.vocab;
            for (n_ctx, root, want) in &r.cycles {
                let from = ctx.len();
                let pos: Vec<usize> = (from..*n_ctx).collect();
                net.append_context(&mut ctx, &feats[from * width..n_ctx * width], &pos)
                    .unwrap();
                let rows = net.config.block_size - 1;
                let block = Block {
                    root: *root,
                    pos: *n_ctx,
                    rows,
                    head: &target.head,
                };
                net.draft(&target, &mut ctx, block, &mut logits).unwrap();
                assert_eq!(ctx.len(), *n_ctx, "the block's rows are not kept");
                let d = rel_diff(&logits, want);
                assert!(d < TOL, "{what}: cycle at {n_ctx}: logits differ by {d:e}");
                eprintln!("{what}: DFlash marginals at {n_ctx} vs reference: {d:.2e}");

                // Fewer rows, from a reduced head: the same numbers, cut.
                let small = target.head.first_rows(40);
                let block = Block {
                    rows: 3,
                    head: &small,
                    ..block
                };
                net.draft(&target, &mut ctx, block, &mut logits).unwrap();
                let cut: Vec<f64> = (0..3)
                    .flat_map(|i| want[i * vocab..i * vocab + 40].iter().copied())
                    .collect();
                assert!(rel_diff(&logits, &cut) < TOL);
            }
            // Dropping rows and appending them again gives the same context.
            let before = logits.clone();
            ctx.truncate(5);
            let pos: Vec<usize> = (5..12).collect();
            net.append_context(&mut ctx, &feats[5 * width..12 * width], &pos)
                .unwrap();
            let small = target.head.first_rows(40);
            let last = r.cycles.last().unwrap();
            let block = Block {
                root: last.1,
                pos: last.0,
                rows: 3,
                head: &small,
            };
            net.draft(&target, &mut ctx, block, &mut logits).unwrap();
            assert_eq!(logits, before);
        }
    }

    /// A copy of the fixture with `edit` applied to its config.json.
    fn with_config(edit: impl Fn(&mut serde_json::Map<String, Value>)) -> ScratchDir {
        let dir = ScratchDir::new("dflash");
        let text = std::fs::read_to_string(drafter_dir().join("config.json")).unwrap();
        let mut cfg: Value = serde_json::from_str(&text).unwrap();
        edit(cfg.as_object_mut().unwrap());
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        std::fs::copy(
            drafter_dir().join("model.safetensors"),
            dir.join("model.safetensors"),
        )
        .unwrap();
        dir
    }

    fn load_err(dir: &Path, target: &Model) -> String {
        match DFlash::load(dir, target, None) {
            Ok(_) => panic!("loading {} must fail", dir.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_drafter_in_kasokus_own_formats_drafts_near_the_reference() {
        use crate::format::kasoku_write::{write_quantized, Naming};
        use crate::quant::kasoku::{Recipe, Scheme};
        // The fixture quantized as `kasoku quantize DIR OUT --format l` does it.
        let r = reference();
        let ckpt = HfCheckpoint::open(drafter_dir()).unwrap();
        let dir = ScratchDir::new("dflash-l");
        let report = write_quantized(
            &ckpt,
            Naming::Hf(&ckpt),
            Recipe::new(Scheme::L),
            &dir.join("model.safetensors"),
            &mut |_, _, _| {},
        )
        .unwrap();
        // fc, q, k, v, gate and up of both layers (o and down are 32 and 96 wide: kept).
        assert_eq!(report.quantized, 11);
        std::fs::copy(drafter_dir().join("config.json"), dir.join("config.json")).unwrap();
        let target = Model::load(fixture_dir("qwen2/tiny")).unwrap();
        let net = DFlash::load(dir.path(), &target, None).unwrap();
        let mut st = target.new_state(64);
        let (_, feats) = target
            .forward_taps(&mut st, &r.tokens, &net.config.taps)
            .unwrap();
        let width = net.feature_width();
        let mut ctx = net.new_context();
        let mut logits = Vec::new();
        let (n_ctx, root, want) = &r.cycles[0];
        let pos: Vec<usize> = (0..*n_ctx).collect();
        net.append_context(&mut ctx, &feats[..n_ctx * width], &pos)
            .unwrap();
        let block = Block {
            root: *root,
            pos: *n_ctx,
            rows: net.config.block_size - 1,
            head: &target.head,
        };
        net.draft(&target, &mut ctx, block, &mut logits).unwrap();
        let d = rel_diff(&logits, want);
        eprintln!("8-bit drafter's marginals vs the reference: {d:.2e}");
        assert!(
            d > TOL && d < 0.05,
            "8-bit drafter's marginals differ by {d:e}"
        );
    }

    #[test]
    fn bad_checkpoints_are_clear_errors() {
        let target = Model::load(fixture_dir("qwen2/tiny")).unwrap();
        let set = |key: &'static str, v: Value| {
            move |c: &mut serde_json::Map<String, Value>| {
                c.insert(key.into(), v.clone());
            }
        };
        let dflash = |key: &'static str, v: Value| {
            move |c: &mut serde_json::Map<String, Value>| {
                c["dflash_config"][key] = v.clone();
            }
        };
        let cases: Vec<(&str, ScratchDir)> =
            vec![
            (
                "hidden size 32 does not match the target's 64",
                with_config(set("hidden_size", 32.into())),
            ),
            (
                "target layer 2 (dflash_config.target_layer_ids) is beyond the target's 2 layers",
                with_config(dflash("target_layer_ids", serde_json::json!([0, 2]))),
            ),
            (
                "mask_token_id 384 is outside the target's embedding of 384 rows",
                with_config(dflash("mask_token_id", 384.into())),
            ),
            (
                "num_target_layers 3 does not match",
                with_config(set("num_target_layers", 3.into())),
            ),
            (
                "vocab_size 1000 does not match",
                with_config(set("vocab_size", 1000.into())),
            ),
            (
                "missing key 'dflash_config.mask_token_id'",
                with_config(|c| {
                    c["dflash_config"].as_object_mut().unwrap().remove("mask_token_id");
                }),
            ),
            (
                "missing object 'dflash_config'",
                with_config(|c| {
                    c.remove("dflash_config");
                }),
            ),
            (
                "architectures must include 'DFlashDraftModel'",
                with_config(set("architectures", serde_json::json!(["Qwen3ForCausalLM"]))),
            ),
            (
                "layer type \"sliding_attention\" is not supported",
                with_config(set(
                    "layer_types",
                    serde_json::json!(["full_attention", "sliding_attention"]),
                )),
            ),
            (
                "RoPE scaling 'yarn' is not supported",
                with_config(set("rope_scaling", serde_json::json!({"rope_type": "yarn"}))),
            ),
            (
                "block_size 1 is outside",
                with_config(dflash("block_size", 1.into())),
            ),
            (
                "'num_hidden_layers' = 1099511627776 is above the limit",
                with_config(set("num_hidden_layers", (1u64 << 40).into())),
            ),
            (
                "'intermediate_size' = 1099511627776 is above the limit",
                with_config(set("intermediate_size", (1u64 << 40).into())),
            ),
            (
                "'num_key_value_heads' = 4096 is above the limit",
                with_config(set("num_key_value_heads", 4096.into())),
            ),
        ];
        for (want, dir) in cases {
            let e = load_err(dir.path(), &target);
            assert!(e.contains(want), "want '{want}', got: {e}");
            assert!(e.contains("DFlash"), "{e}");
        }
        // A checkpoint that is not a DFlash drafter is not taken for one.
        assert!(!is_dflash_checkpoint(&fixture_dir("qwen2/tiny")));
        let bad = with_config(set("architectures", serde_json::json!(["X"])));
        assert!(!is_dflash_checkpoint(bad.path()));
    }

    /// Every tensor of the fixture in memory, under its names.
    fn tensors() -> (DFlashConfig, MemSource) {
        let ckpt = HfCheckpoint::open(drafter_dir()).unwrap();
        let mut mem = MemSource::new();
        mem.tensors = ckpt.names().iter().map(|n| ckpt.get(n).unwrap()).collect();
        (DFlashConfig::from_hf(ckpt.config()).unwrap(), mem)
    }

    #[test]
    fn missing_misshapen_or_unknown_tensors_are_clear_errors() {
        let target = Model::load(fixture_dir("qwen2/tiny")).unwrap();
        let (cfg, base) = tensors();
        let err = |src: &MemSource| match DFlash::from_source(cfg.clone(), src, &target, None) {
            Ok(_) => panic!("loading must fail"),
            Err(e) => e.to_string(),
        };
        assert!(DFlash::from_source(cfg.clone(), &base, &target, None).is_ok());
        for name in [
            "fc.weight",
            "hidden_norm.weight",
            "norm.weight",
            "layers.1.self_attn.k_norm.weight",
            "layers.0.mlp.down_proj.weight",
        ] {
            let mut src = tensors().1;
            src.tensors.retain(|t| t.name != name);
            let e = err(&src);
            assert!(e.contains(name) && e.contains("missing"), "{name}: {e}");
        }
        let mut src = tensors().1;
        let t = src
            .tensors
            .iter_mut()
            .find(|t| t.name == "fc.weight")
            .unwrap();
        t.shape = vec![t.shape[1], t.shape[0]];
        assert!(err(&src).contains("fc.weight"));
        let mut src = tensors().1;
        src.add_f32("layers.2.input_layernorm.weight", &[2], &[1.0, 2.0]);
        assert!(err(&src).contains("layers.2.input_layernorm.weight"));
        // A GGUF-named or prefixed copy is not the published layout.
        let mut src = tensors().1;
        src.tensors[0].name = format!("model.{}", src.tensors[0].name);
        assert!(err(&src).contains("missing"));
    }

    #[test]
    fn bad_input_is_an_error_and_leaves_the_context_alone() {
        let target = Model::load(fixture_dir("qwen2/tiny")).unwrap();
        let net = DFlash::load(&drafter_dir(), &target, None).unwrap();
        let w = net.feature_width();
        let mut ctx = net.new_context();
        net.append_context(&mut ctx, &vec![0.5; 2 * w], &[0, 1])
            .unwrap();
        let mut logits = Vec::new();
        let e = net.append_context(&mut ctx, &vec![0.5; w], &[2, 3]);
        assert!(e.unwrap_err().to_string().contains("feature values"));
        let block = |root, pos, rows| Block {
            root,
            pos,
            rows,
            head: &target.head,
        };
        let e = net.draft(&target, &mut ctx, block(384, 2, 3), &mut logits);
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
        let e = net.draft(&target, &mut ctx, block(5, 2, 8), &mut logits);
        assert!(e.unwrap_err().to_string().contains("rows asked"));
        assert_eq!(ctx.len(), 2);
        // An empty context drafts from the block alone.
        let mut empty = net.new_context();
        net.draft(&target, &mut empty, block(5, 0, 7), &mut logits)
            .unwrap();
        assert_eq!(logits.len(), 7 * target.config.vocab);
        assert!(logits.iter().all(|x| x.is_finite()));
    }
}
