//! `MtpHead`: Qwen3.5's built-in multi-token-prediction block, a one-layer drafter that reads
//! the target's final-normed hidden states (research/qwen35.md §8).
//!
//! ```text
//! e  = enorm(embed(x_{p+1}))          hh = hnorm(h_p)            (h_p: hidden of position p)
//! x  = eh_proj([e | hh])              embedding first, then hidden; [H, 2H]
//! x += attn(attn_norm(x))             gated full attention with its own KV cache
//! x += mlp(post_attention_norm(x))    dense SwiGLU
//! m  = shared_head_norm(x)            the hidden a chained step reads
//! logits = head(m)                    the trunk's LM head (and embedding above)
//! ```
//!
//! Tensors under GGUF names at the extra block `blk.{n_layers}` (`nextn.eh_proj`, `nextn.enorm`,
//! `nextn.hnorm`, `nextn.shared_head_norm`, and a trunk-style attention layer + MLP). HF
//! checkpoints keep `mtp.*` names; a renaming view ([`crate::format::hf_names::mtp_name`]) shows
//! them under the GGUF names, so the layer parts load with the trunk's own loaders. HF norms
//! are `(1 + w)` (`ModelConfig::norm_offset_one`); GGUF has the +1 folded in.
//!
//! Positions: MTP cache row `j` holds the pair (token `x_{j+1}`, hidden `h_j`) and is rotated at
//! position `j` (vLLM's convention: the hidden's position; RoPE is relative, so llama.cpp's
//! `j + 1` gives the same outputs).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::format::hf_names::mtp_name;
use crate::format::{Claims, RawTensor, SourceOrigin, TensorSource};
use crate::kernels::matmul::{matmul, MatMulWeight};
use crate::kernels::rope::Rope;

use super::config::{Arch, ModelConfig};
use super::mixer::{Attention, KvCache};
use super::mlp::Mlp;
use super::transformer::{Model, CHUNK};
use super::{weights, ModelError, RmsNorm};

/// The weights of the MTP block (one layer).
pub struct MtpHead {
    /// `nextn.eh_proj` (HF `mtp.fc`): `[hidden, 2 · hidden]`.
    pub eh_proj: MatMulWeight,
    /// `nextn.enorm` (HF `mtp.pre_fc_norm_embedding`).
    pub enorm: RmsNorm,
    /// `nextn.hnorm` (HF `mtp.pre_fc_norm_hidden`).
    pub hnorm: RmsNorm,
    pub attn_norm: RmsNorm,
    pub attn: Attention,
    /// `post_attention_norm` (HF `post_attention_layernorm`).
    pub ffn_norm: RmsNorm,
    pub mlp: Mlp,
    /// `nextn.shared_head_norm` (HF `mtp.norm`).
    pub out_norm: RmsNorm,
    hidden: usize,
}

impl MtpHead {
    /// Loads the MTP block of `source` (a model of `config`) if it has one: `Ok(None)` when the
    /// source has no `mtp.*` and no `blk.{n_layers}.*` tensors. Loading is strict over the MTP
    /// tensors: a missing, misshapen or unknown one is an error.
    pub fn load(
        config: &ModelConfig,
        source: &dyn TensorSource,
        rope: Arc<Rope>,
    ) -> Result<Option<MtpHead>, ModelError> {
        let view = MtpView::new(source, config);
        if view.names.is_empty() {
            return Ok(None);
        }
        let err = |e: ModelError| ModelError::Config {
            source_path: source.path().display().to_string(),
            reason: format!(
                "multi-token-prediction head (HF mtp.* = GGUF blk.{}.*): {e}",
                config.n_layers
            ),
        };
        if config.arch != Arch::Qwen35 {
            return Err(err(ModelError::Unsupported(format!(
                "an MTP block for {:?}",
                config.arch
            ))));
        }
        Self::load_view(config, &view, rope).map(Some).map_err(err)
    }

    fn load_view(
        config: &ModelConfig,
        view: &MtpView,
        rope: Arc<Rope>,
    ) -> Result<MtpHead, ModelError> {
        let n = config.n_layers;
        if view
            .names
            .keys()
            .any(|k| k.starts_with(&format!("blk.{}.", n + 1)))
        {
            return Err(ModelError::Unsupported(
                "more than one MTP layer (only mtp.layers.0 / blk.{n_layers} is supported)".into(),
            ));
        }
        let claims = Claims::new(view);
        let (h, eps) = (config.hidden, config.rms_eps);
        let norm = |part: &str| {
            RmsNorm::load(
                &claims,
                &format!("blk.{n}.{part}.weight"),
                h,
                eps,
                config.norm_offset_one,
            )
        };
        let head = MtpHead {
            eh_proj: weights::matrix(&claims, &format!("blk.{n}.nextn.eh_proj.weight"), h, 2 * h)?,
            enorm: norm("nextn.enorm")?,
            hnorm: norm("nextn.hnorm")?,
            attn_norm: norm("attn_norm")?,
            attn: Attention::load(&claims, n, config, rope)?,
            ffn_norm: norm("post_attention_norm")?,
            mlp: Mlp::load(&claims, n, h, config.ffn)?,
            out_norm: norm("nextn.shared_head_norm")?,
            hidden: h,
        };
        claims.finish()?;
        Ok(head)
    }

    /// An empty cache for the MTP attention layer.
    pub fn new_cache(&self) -> KvCache {
        self.attn.new_cache()
    }

    /// Runs `n = tokens.len()` rows. Row `i` pairs `tokens[i]` with `hidden` row `i` (`n × H`):
    /// the target's final-normed hidden state of the position before `tokens[i]`, or for a
    /// chained step the MTP's own previous output hidden. The rows are appended to `cache` and
    /// rotated at positions `pos0..pos0 + n`, where `pos0` must equal `cache.len()`: the position
    /// of the hidden row (so `tokens[i]` sits at `pos0 + i + 1`). Returns `(m, logits)`: the
    /// hidden rows to chain from (`n × H`, after the MTP's output norm) and the logits
    /// (`n × vocab`, the trunk's head) for the token after each row's token.
    ///
    /// Bad input (token out of range, wrong lengths, `pos0` not the cache length, a foreign
    /// cache) is an error and leaves the cache untouched. `KvCache::truncate` drops rejected rows.
    pub fn forward(
        &self,
        model: &Model,
        cache: &mut KvCache,
        tokens: &[u32],
        hidden: &[f32],
        pos0: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let (h, n) = (self.hidden, tokens.len());
        let vocab = model.config.vocab;
        if model.config.hidden != h || model.embedding.dim != h {
            return Err(ModelError::StateMismatch(format!(
                "MTP head of width {h} given a model of width {}",
                model.config.hidden
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { token: bad, vocab });
        }
        if hidden.len() != n * h {
            return Err(ModelError::StateMismatch(format!(
                "MTP: {} hidden values for {n} tokens of width {h}",
                hidden.len()
            )));
        }
        if cache.kv_dim() != self.attn.kv_dim() {
            return Err(ModelError::StateMismatch(format!(
                "MTP: cache rows of {} values, the layer needs {}",
                cache.kv_dim(),
                self.attn.kv_dim()
            )));
        }
        if pos0 != cache.len() {
            return Err(ModelError::StateMismatch(format!(
                "MTP: rows start at position {pos0} but the cache holds {} positions",
                cache.len()
            )));
        }
        let mut m_out = Vec::with_capacity(n * h);
        let mut logits = Vec::with_capacity(n * vocab);
        for (toks, hid) in tokens.chunks(CHUNK).zip(hidden.chunks(CHUNK * h)) {
            let m = self.chunk(model, cache, toks, hid);
            logits.extend(model.head_logits(&m));
            m_out.extend(m);
        }
        Ok((m_out, logits))
    }

    /// One chunk of rows: returns the normed output hidden rows.
    fn chunk(
        &self,
        model: &Model,
        cache: &mut KvCache,
        tokens: &[u32],
        hidden: &[f32],
    ) -> Vec<f32> {
        let (h, n) = (self.hidden, tokens.len());
        let mut emb = vec![0f32; n * h];
        model.embedding.lookup(tokens, &mut emb);
        let mut e = vec![0f32; n * h];
        self.enorm.forward(&emb, &mut e);
        let mut hh = vec![0f32; n * h];
        self.hnorm.forward(hidden, &mut hh);
        let mut cat = vec![0f32; n * 2 * h];
        for ((row, e), hh) in cat
            .chunks_exact_mut(2 * h)
            .zip(e.chunks_exact(h))
            .zip(hh.chunks_exact(h))
        {
            row[..h].copy_from_slice(e);
            row[h..].copy_from_slice(hh);
        }
        let mut x = vec![0f32; n * h];
        matmul(&self.eh_proj, &cat, n, &mut x);

        let mut normed = vec![0f32; n * h];
        let mut delta = vec![0f32; n * h];
        self.attn_norm.forward(&x, &mut normed);
        self.attn.forward(cache, &normed, n, &mut delta);
        x.iter_mut().zip(&delta).for_each(|(a, d)| *a += d);
        self.ffn_norm.forward(&x, &mut normed);
        self.mlp.forward(&normed, n, &mut delta);
        x.iter_mut().zip(&delta).for_each(|(a, d)| *a += d);
        self.out_norm.forward(&x, &mut normed);
        normed
    }
}

/// The MTP tensors of a source under GGUF names: `blk.{n_layers}.*` (and beyond) as they are,
/// `mtp.*` renamed by [`mtp_name`] (names it does not know keep their spelling, so strict
/// claiming reports them).
struct MtpView<'a> {
    source: &'a dyn TensorSource,
    /// GGUF-style name → the source's name.
    names: BTreeMap<String, String>,
}

impl<'a> MtpView<'a> {
    fn new(source: &'a dyn TensorSource, config: &ModelConfig) -> MtpView<'a> {
        let model_type = match config.arch {
            Arch::Qwen35 => "qwen3_5",
            _ => "",
        };
        let mut names = BTreeMap::new();
        for name in source.names() {
            if name.starts_with("mtp.") {
                let gguf = mtp_name(model_type, &name, config.n_layers);
                names.insert(gguf.unwrap_or_else(|| name.clone()), name);
            } else if is_past_trunk(&name, config.n_layers) {
                names.insert(name.clone(), name);
            }
        }
        MtpView { source, names }
    }
}

/// `blk.N.*` with `N >= n_layers`.
fn is_past_trunk(name: &str, n_layers: usize) -> bool {
    name.strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(i, _)| i.parse::<usize>().ok())
        .is_some_and(|i| i >= n_layers)
}

impl TensorSource for MtpView<'_> {
    fn path(&self) -> &Path {
        self.source.path()
    }
    fn names(&self) -> Vec<String> {
        self.names.keys().cloned().collect()
    }
    fn get(&self, name: &str) -> Option<RawTensor> {
        let t = self.source.get(self.names.get(name)?)?;
        Some(RawTensor {
            name: name.to_string(),
            ..t
        })
    }
    fn origin(&self) -> SourceOrigin {
        self.source.origin()
    }
}
