//! `ModelConfig`: everything about a model's shape and math that is not a tensor, read from
//! GGUF metadata ([`ModelConfig::from_gguf`]) or a Hugging Face config.json
//! ([`ModelConfig::from_hf`]), and checked for consistency before any weight is touched.
//!
//! Conventions that differ between the two sources are made explicit here, so that the
//! layers never ask where their weights came from: the RoPE pair layout (GGUF llama permutes
//! Q/K rows to interleaved pairs) and Qwen3.5's `(1 + w)` norms (GGUF folds the +1 in).

use crate::format::gguf::GgufFile;
use crate::format::hf_config::HfConfig;
use crate::format::{limits, Checkpoint, TensorSource};
pub use crate::kernels::rope::{RopeLayout, RopeScaling};

use super::ModelError;

/// Model families kasoku runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, Mistral (dense, plain attention).
    Llama,
    /// Qwen2 / Qwen2.5: QKV bias.
    Qwen2,
    /// Qwen3 dense: per-head q/k RMSNorm.
    Qwen3,
    /// Qwen3.5 hybrid: Gated DeltaNet layers + gated full attention with partial RoPE.
    Qwen35,
}

/// Where the weights come from (some tensors are stored differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Gguf,
    Hf,
}

/// The token mixer of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Attention,
    GatedDeltaNet,
}

/// Shape and math of a model. Dimensions are counts of values, not bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub source: SourceKind,
    pub hidden: usize,
    pub n_layers: usize,
    /// Query heads of the attention layers.
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Per attention head (explicit in Qwen3/Qwen3.5; never assume hidden / n_heads).
    pub head_dim: usize,
    /// MLP inner size.
    pub ffn: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    /// Rotated dims at the start of each head (head_dim · partial_rotary_factor).
    pub rope_dim: usize,
    pub rope_layout: RopeLayout,
    pub rope_scaling: RopeScaling,
    /// No `output.weight`: the head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// Q, K and V projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k after projection, before RoPE (Qwen3, Qwen3.5).
    pub qk_norm: bool,
    /// Qwen3.5 gated attention: q projection yields [query | gate] per head.
    pub attn_output_gate: bool,
    /// Norm weights are stored as `w` for `(1 + w)` (HF Qwen3.5); the loader adds 1.
    pub norm_offset_one: bool,
    /// The mixer of each layer (`n_layers` entries).
    pub layer_kinds: Vec<LayerKind>,
    /// Gated DeltaNet dims (0 for models without GDN layers).
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    /// Context length the model was trained for.
    pub max_context: usize,
}

impl ModelConfig {
    /// Reads the configuration from a GGUF file's metadata (`{arch}.*` keys).
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_gguf_with(file, file)
    }

    /// The configuration of any open checkpoint (`format::Checkpoint`).
    pub fn of_checkpoint(ckpt: &Checkpoint) -> Result<ModelConfig, ModelError> {
        match ckpt {
            Checkpoint::Gguf(f) => ModelConfig::from_gguf(f),
            Checkpoint::Hf(c) => ModelConfig::from_hf(c.config()),
            Checkpoint::GgufMeta { meta, tensors } => ModelConfig::from_gguf_with(meta, tensors),
        }
    }

    /// [`ModelConfig::from_gguf`] with the tensors in `tensors` (the GGUF's own, or those of a
    /// checkpoint that `kasoku quantize` wrote beside the GGUF's metadata): what the
    /// configuration learns from tensors (vocabulary, tied head, biases, RoPE factors) comes
    /// from there.
    pub fn from_gguf_with(
        file: &GgufFile,
        tensors: &dyn TensorSource,
    ) -> Result<ModelConfig, ModelError> {
        let shape_of = |name: &str| -> Option<Vec<usize>> {
            match tensors.get(name) {
                Some(t) => Some(t.shape),
                None => tensors
                    .quantized(name)
                    .map(|q| vec![q.spec.rows, q.spec.cols]),
            }
        };
        let path = file.path().display().to_string();
        let bad = |reason: String| ModelError::Config {
            source_path: path.clone(),
            reason,
        };
        let arch_name = file
            .architecture()
            .ok_or_else(|| bad("missing key 'general.architecture'".into()))?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen35" => Arch::Qwen35,
            other => {
                return Err(ModelError::UnsupportedArch {
                    source_path: path.clone(),
                    arch: other.into(),
                })
            }
        };
        let key = |s: &str| format!("{arch_name}.{s}");
        // Every size is bounded as it is read, before anything is allocated from it.
        let dim = |s: &str, v: u64, max: usize| limits::bounded(&key(s), v, max).map_err(bad);
        let req = |s: &str, max: usize| -> Result<usize, ModelError> {
            dim(s, file.require_u64(&key(s))?, max)
        };
        let opt = |s: &str, max: usize| -> Result<Option<usize>, ModelError> {
            match file.get(&key(s)) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) => dim(s, n, max).map(Some),
                    None => Err(bad(format!(
                        "'{}' is {v:?}, expected a non-negative integer",
                        key(s)
                    ))),
                },
            }
        };
        if let Some(n) = opt("expert_count", usize::MAX)?.filter(|&n| n > 0) {
            return Err(ModelError::Unsupported(format!(
                "{path}: '{}' = {n}: mixture-of-experts models",
                key("expert_count")
            )));
        }

        let hidden = req("embedding_length", limits::MAX_HIDDEN)?;
        // Qwen3.5 GGUFs converted with their multi-token-prediction block count it in
        // block_count (stored as the extra block blk.{n_layers}); the trunk is the rest.
        let block_count = req("block_count", limits::MAX_LAYERS)?;
        let nextn = opt("nextn_predict_layers", limits::MAX_LAYERS)?.unwrap_or(0);
        if nextn >= block_count {
            return Err(bad(format!(
                "'{}' = {nextn} leaves no trunk layers of '{}' = {block_count}",
                key("nextn_predict_layers"),
                key("block_count")
            )));
        }
        let n_layers = block_count - nextn;
        let n_heads = req("attention.head_count", limits::MAX_HEADS)?;
        // head_count_kv is a scalar, or (some hybrid converters) one value per layer with 0
        // for layers without attention.
        let kv_key = key("attention.head_count_kv");
        let (n_kv_heads, kv_per_layer) = match file.get(&kv_key) {
            None => (n_heads, None),
            Some(v) => match (v.as_u64(), v.as_array()) {
                (Some(n), _) => (dim("attention.head_count_kv", n, limits::MAX_HEADS)?, None),
                (None, Some(items)) => {
                    let per = items
                        .iter()
                        .map(|i| {
                            let n = i
                                .as_u64()
                                .ok_or_else(|| bad(format!("'{kv_key}' holds non-integers")))?;
                            dim("attention.head_count_kv", n, limits::MAX_HEADS)
                        })
                        .collect::<Result<Vec<usize>, ModelError>>()?;
                    let max = per.iter().copied().max().unwrap_or(0);
                    // Layers with attention all have the same count (0 marks the others).
                    if per
                        .iter()
                        .any(|&n| n != max && (n != 0 || arch != Arch::Qwen35))
                    {
                        return Err(ModelError::Unsupported(format!(
                            "{path}: '{kv_key}' = {per:?}: attention layers with different \
                             key/value head counts"
                        )));
                    }
                    (max, Some(per))
                }
                _ => {
                    return Err(bad(format!(
                        "'{kv_key}' is {v:?}, expected an integer or an array"
                    )))
                }
            },
        };
        let head_dim = opt("attention.key_length", limits::MAX_HEAD_DIM)?
            .unwrap_or(hidden.checked_div(n_heads).unwrap_or(0));
        if let Some(v) = opt("attention.value_length", limits::MAX_HEAD_DIM)? {
            if v != head_dim {
                return Err(ModelError::Unsupported(format!(
                    "{path}: '{}' = {v} differs from the key length {head_dim}",
                    key("attention.value_length")
                )));
            }
        }
        let ffn = req("feed_forward_length", limits::MAX_FFN)?;
        let rms_eps = file.require_f64(&key("attention.layer_norm_rms_epsilon"))? as f32;
        let rope_theta = match file.get(&key("rope.freq_base")) {
            None => 10000.0,
            Some(v) => v.as_f64().ok_or_else(|| {
                bad(format!(
                    "'{}' is {v:?}, expected a number",
                    key("rope.freq_base")
                ))
            })?,
        };
        let rope_dim = opt("rope.dimension_count", limits::MAX_HEAD_DIM)?.unwrap_or(head_dim);
        let scaling_key = key("rope.scaling.type");
        let scaling_type = match file.get(&scaling_key) {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| {
                bad(format!(
                    "'{scaling_key}' is a {}, expected a string",
                    v.type_name()
                ))
            })?),
        };
        let rope_scaling = match scaling_type {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: file.require_f64(&key("rope.scaling.factor"))?,
            },
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "{path}: '{scaling_key}' = '{other}'"
                )))
            }
        };
        let vocab = match shape_of("token_embd.weight") {
            Some(shape) if shape.len() == 2 => {
                if shape[1] != hidden {
                    return Err(bad(format!(
                        "'{}' = {hidden}, but token_embd.weight has rows of {}",
                        key("embedding_length"),
                        shape[1]
                    )));
                }
                limits::bounded("token_embd.weight rows", shape[0] as u64, limits::MAX_VOCAB)
                    .map_err(bad)?
            }
            _ => match opt("vocab_size", limits::MAX_VOCAB)? {
                Some(v) => v,
                None => {
                    let n = file.get_array("tokenizer.ggml.tokens").map(|a| a.len()).ok_or_else(|| {
                        bad("no vocabulary size: no token_embd.weight, 'vocab_size' or 'tokenizer.ggml.tokens'".into())
                    })?;
                    limits::bounded("tokenizer.ggml.tokens", n as u64, limits::MAX_VOCAB)
                        .map_err(bad)?
                }
            },
        };
        let max_context = req("context_length", limits::MAX_CONTEXT)?;
        if let Some(window) = opt("attention.sliding_window", usize::MAX)? {
            if window > 0 && window < max_context {
                return Err(ModelError::Unsupported(format!(
                    "{path}: '{}' = {window}: sliding-window attention",
                    key("attention.sliding_window")
                )));
            }
        }
        // Llama 3 GGUFs carry their RoPE scaling as frequency divisors: each must be a finite
        // positive number (a 0 turns every logit into NaN).
        if let Some(t) = tensors.get("rope_freqs.weight") {
            let n: usize = t.shape.iter().product();
            if n > limits::MAX_HEAD_DIM / 2 {
                return Err(bad(format!(
                    "rope_freqs.weight has {n} values (one per rotated pair: at most {})",
                    limits::MAX_HEAD_DIM / 2
                )));
            }
            let factors = super::weights::to_f32(&t.name, t.dtype, t.data.as_slice(), n)?;
            if let Some(bad_factor) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(bad(format!(
                    "rope_freqs.weight holds {bad_factor}: frequency factors must be finite and \
                     positive"
                )));
            }
        }
        let tied_embeddings = shape_of("output.weight").is_none();
        let qkv_bias =
            arch == Arch::Qwen2 || tensors.names().iter().any(|n| n.ends_with(".attn_q.bias"));

        let mut layer_kinds = vec![LayerKind::Attention; n_layers];
        let (mut lnk, mut lnv, mut ldk, mut ldv, mut lconv) = (0, 0, 0, 0, 0);
        if arch == Arch::Qwen35 {
            let recurrent_key = key("attention.recurrent_layers");
            if let Some(v) = file.get(&recurrent_key) {
                let flags: Option<Vec<bool>> = v.as_array().and_then(|a| {
                    a.iter()
                        .map(|x| x.as_bool().or_else(|| x.as_u64().map(|n| n != 0)))
                        .collect()
                });
                let flags = flags.ok_or_else(|| {
                    bad(format!(
                        "'{recurrent_key}' is {v:?}, expected an array of booleans"
                    ))
                })?;
                if flags.len() != n_layers && flags.len() != block_count {
                    return Err(bad(format!(
                        "'{recurrent_key}' has {} entries for {n_layers} layers",
                        flags.len()
                    )));
                }
                for (k, &rec) in layer_kinds.iter_mut().zip(&flags) {
                    *k = if rec {
                        LayerKind::GatedDeltaNet
                    } else {
                        LayerKind::Attention
                    };
                }
            } else if let Some(per) = &kv_per_layer {
                if per.len() != n_layers && per.len() != block_count {
                    return Err(bad(format!(
                        "'{kv_key}' has {} entries for {n_layers} layers",
                        per.len()
                    )));
                }
                for (k, &kv) in layer_kinds.iter_mut().zip(per) {
                    *k = if kv == 0 {
                        LayerKind::GatedDeltaNet
                    } else {
                        LayerKind::Attention
                    };
                }
            } else {
                let interval = opt("full_attention_interval", limits::MAX_LAYERS)?.unwrap_or(4);
                layer_kinds = kinds_from_interval(n_layers, interval).map_err(bad)?;
            }
            lconv = req("ssm.conv_kernel", limits::MAX_CONV_KERNEL)?;
            ldk = req("ssm.state_size", limits::MAX_HEAD_DIM)?;
            lnk = req("ssm.group_count", limits::MAX_HEADS)?;
            lnv = req("ssm.time_step_rank", limits::MAX_HEADS)?;
            let inner = req("ssm.inner_size", limits::MAX_HEADS * limits::MAX_HEAD_DIM)?;
            if lnv == 0 || !inner.is_multiple_of(lnv) {
                return Err(bad(format!(
                    "'{}' = {inner} is not a multiple of '{}' = {lnv}",
                    key("ssm.inner_size"),
                    key("ssm.time_step_rank")
                )));
            }
            ldv = inner / lnv;
        }

        let cfg = ModelConfig {
            arch,
            source: SourceKind::Gguf,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn,
            vocab,
            rms_eps,
            rope_theta,
            rope_dim,
            rope_layout: if arch == Arch::Llama {
                RopeLayout::Interleaved
            } else {
                RopeLayout::Neox
            },
            rope_scaling,
            tied_embeddings,
            qkv_bias,
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen35),
            attn_output_gate: arch == Arch::Qwen35,
            norm_offset_one: false,
            layer_kinds,
            linear_num_key_heads: lnk,
            linear_num_value_heads: lnv,
            linear_key_head_dim: ldk,
            linear_value_head_dim: ldv,
            linear_conv_kernel_dim: lconv,
            max_context,
        };
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Reads the configuration from a Hugging Face `config.json` (text fields of
    /// vision-language checkpoints come from `text_config`). RoPE parameters are read from
    /// `rope_parameters` (transformers 5) or `rope_theta` / `rope_scaling` (older files).
    pub fn from_hf(hf: &HfConfig) -> Result<ModelConfig, ModelError> {
        let path = hf.path().display().to_string();
        let bad = |reason: String| ModelError::Config {
            source_path: path.clone(),
            reason,
        };
        let arch = match hf.model_type() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3_5" => Arch::Qwen35,
            other => {
                return Err(ModelError::UnsupportedArch {
                    source_path: path.clone(),
                    arch: other.into(),
                })
            }
        };
        // Every size is bounded as it is read, before anything is allocated from it.
        let opt_dim = |key: &str, max: usize| -> Result<Option<usize>, ModelError> {
            match hf.opt_usize(key)? {
                None => Ok(None),
                Some(v) => limits::bounded(key, v as u64, max).map(Some).map_err(bad),
            }
        };
        let dim = |key: &str, max: usize| -> Result<usize, ModelError> {
            limits::bounded(key, hf.usize(key)? as u64, max).map_err(bad)
        };
        let hidden = dim("hidden_size", limits::MAX_HIDDEN)?;
        let n_layers = dim("num_hidden_layers", limits::MAX_LAYERS)?;
        let n_heads = dim("num_attention_heads", limits::MAX_HEADS)?;
        let n_kv_heads = opt_dim("num_key_value_heads", limits::MAX_HEADS)?.unwrap_or(n_heads);
        let head_dim = match opt_dim("head_dim", limits::MAX_HEAD_DIM)? {
            Some(d) => d,
            None => hidden.checked_div(n_heads).unwrap_or(0),
        };
        let max_context = opt_dim("max_position_embeddings", limits::MAX_CONTEXT)?.unwrap_or(4096);
        if hf.opt_bool("mlp_bias")? == Some(true) {
            return Err(ModelError::Unsupported(format!(
                "{path}: 'mlp_bias' = true"
            )));
        }
        check_hf_unsupported(hf, arch, max_context)?;

        // rope_parameters (transformers 5) or rope_scaling (older); keys inside either.
        let rope_obj = hf
            .value("rope_parameters")
            .or_else(|| hf.value("rope_scaling"))
            .and_then(|v| v.as_object());
        let rope_num = |key: &str| -> Result<Option<f64>, ModelError> {
            match rope_obj.and_then(|o| o.get(key)).filter(|v| !v.is_null()) {
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    bad(format!("rope parameter '{key}' is {v}, expected a number"))
                }),
                None => Ok(None),
            }
        };
        let rope_theta = match rope_num("rope_theta")? {
            Some(t) => t,
            None => hf.opt_f64("rope_theta")?.unwrap_or(10000.0),
        };
        let default_partial = if arch == Arch::Qwen35 { 0.25 } else { 1.0 };
        let partial = match rope_num("partial_rotary_factor")? {
            Some(p) => p,
            None => hf
                .opt_f64("partial_rotary_factor")?
                .unwrap_or(default_partial),
        };
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(bad(format!(
                "partial_rotary_factor {partial} is not in (0, 1]"
            )));
        }
        let rope_dim = (head_dim as f64 * partial) as usize;
        let rope_type = rope_obj
            .and_then(|o| o.get("rope_type").or_else(|| o.get("type")))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let need = |key: &str| -> Result<f64, ModelError> {
            rope_num(key)?.ok_or_else(|| bad(format!("rope type '{rope_type}' needs '{key}'")))
        };
        let rope_scaling = match rope_type {
            // M-RoPE on text-only input is plain RoPE (all three position streams are equal).
            "default" | "mrope" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: need("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position: need("original_max_position_embeddings")?,
            },
            other => {
                return Err(ModelError::Unsupported(format!(
                    "{path}: rope type '{other}'"
                )))
            }
        };

        let mut layer_kinds = vec![LayerKind::Attention; n_layers];
        let (mut lnk, mut lnv, mut ldk, mut ldv, mut lconv) = (0, 0, 0, 0, 0);
        if arch == Arch::Qwen35 {
            layer_kinds = match hf.value("layer_types") {
                Some(v) => {
                    let items = v
                        .as_array()
                        .ok_or_else(|| bad(format!("'layer_types' is {v}, expected a list")))?;
                    let kinds: Result<Vec<LayerKind>, ModelError> = items
                        .iter()
                        .map(|t| match t.as_str() {
                            Some("full_attention") => Ok(LayerKind::Attention),
                            Some("linear_attention") => Ok(LayerKind::GatedDeltaNet),
                            _ => Err(bad(format!("'layer_types' has unknown entry {t}"))),
                        })
                        .collect();
                    kinds?
                }
                None => {
                    let interval =
                        opt_dim("full_attention_interval", limits::MAX_LAYERS)?.unwrap_or(4);
                    kinds_from_interval(n_layers, interval).map_err(bad)?
                }
            };
            lnk = dim("linear_num_key_heads", limits::MAX_HEADS)?;
            lnv = dim("linear_num_value_heads", limits::MAX_HEADS)?;
            ldk = dim("linear_key_head_dim", limits::MAX_HEAD_DIM)?;
            ldv = dim("linear_value_head_dim", limits::MAX_HEAD_DIM)?;
            lconv = dim("linear_conv_kernel_dim", limits::MAX_CONV_KERNEL)?;
        }

        let cfg = ModelConfig {
            arch,
            source: SourceKind::Hf,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: dim("intermediate_size", limits::MAX_FFN)?,
            vocab: dim("vocab_size", limits::MAX_VOCAB)?,
            rms_eps: hf.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_dim,
            rope_layout: RopeLayout::Neox,
            rope_scaling,
            tied_embeddings: hf.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            // Qwen2's q/k/v projections always carry a bias in transformers.
            qkv_bias: arch == Arch::Qwen2 || hf.opt_bool("attention_bias")?.unwrap_or(false),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen35),
            attn_output_gate: arch == Arch::Qwen35
                && hf.opt_bool("attn_output_gate")?.unwrap_or(true),
            norm_offset_one: arch == Arch::Qwen35,
            layer_kinds,
            linear_num_key_heads: lnk,
            linear_num_value_heads: lnv,
            linear_key_head_dim: ldk,
            linear_value_head_dim: ldv,
            linear_conv_kernel_dim: lconv,
            max_context,
        };
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Number of layers of each kind.
    pub fn count(&self, kind: LayerKind) -> usize {
        self.layer_kinds.iter().filter(|&&k| k == kind).count()
    }

    /// Checks that the dimensions fit together; the error says which do not.
    pub fn validate(&self) -> Result<(), String> {
        let nonzero = [
            ("hidden size", self.hidden),
            ("layer count", self.n_layers),
            ("vocabulary size", self.vocab),
            ("feed-forward size", self.ffn),
        ];
        for (what, v) in nonzero {
            if v == 0 {
                return Err(format!("{what} is 0"));
            }
        }
        // The same limits the readers apply, for configurations built any other way.
        let bounded = [
            ("hidden size", self.hidden, limits::MAX_HIDDEN),
            ("layer count", self.n_layers, limits::MAX_LAYERS),
            ("attention heads", self.n_heads, limits::MAX_HEADS),
            ("kv heads", self.n_kv_heads, limits::MAX_HEADS),
            ("head dim", self.head_dim, limits::MAX_HEAD_DIM),
            ("feed-forward size", self.ffn, limits::MAX_FFN),
            ("vocabulary size", self.vocab, limits::MAX_VOCAB),
            ("context length", self.max_context, limits::MAX_CONTEXT),
            (
                "linear key heads",
                self.linear_num_key_heads,
                limits::MAX_HEADS,
            ),
            (
                "linear value heads",
                self.linear_num_value_heads,
                limits::MAX_HEADS,
            ),
            (
                "linear key head dim",
                self.linear_key_head_dim,
                limits::MAX_HEAD_DIM,
            ),
            (
                "linear value head dim",
                self.linear_value_head_dim,
                limits::MAX_HEAD_DIM,
            ),
            (
                "conv kernel",
                self.linear_conv_kernel_dim,
                limits::MAX_CONV_KERNEL,
            ),
        ];
        for (what, v, max) in bounded {
            if v > max {
                return Err(format!("{what} {v} is above the limit of {max}"));
            }
        }
        if self.max_context == 0 {
            return Err("context length is 0".into());
        }
        if self.layer_kinds.len() != self.n_layers {
            return Err(format!(
                "{} layer kinds for {} layers",
                self.layer_kinds.len(),
                self.n_layers
            ));
        }
        if self.count(LayerKind::Attention) > 0 {
            if self.n_heads == 0 || self.n_kv_heads == 0 || self.head_dim == 0 {
                return Err(format!(
                    "attention heads {}, kv heads {}, head dim {}: none may be 0",
                    self.n_heads, self.n_kv_heads, self.head_dim
                ));
            }
            if !self.n_heads.is_multiple_of(self.n_kv_heads) {
                return Err(format!(
                    "{} heads is not a multiple of {} kv heads",
                    self.n_heads, self.n_kv_heads
                ));
            }
        }
        // Checked even without attention layers: the RoPE table is built regardless.
        if !self.rope_dim.is_multiple_of(2) || self.rope_dim > self.head_dim {
            return Err(format!(
                "rotary dims {} must be even and at most head dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if self.count(LayerKind::GatedDeltaNet) > 0 {
            let dims = [
                self.linear_num_key_heads,
                self.linear_num_value_heads,
                self.linear_key_head_dim,
                self.linear_value_head_dim,
                self.linear_conv_kernel_dim,
            ];
            if dims.contains(&0) {
                return Err(format!(
                    "Gated DeltaNet dims (nk, nv, dk, dv, conv) = {dims:?}: none may be 0"
                ));
            }
            if !self
                .linear_num_value_heads
                .is_multiple_of(self.linear_num_key_heads)
            {
                return Err(format!(
                    "linear value heads {} is not a multiple of linear key heads {}",
                    self.linear_num_value_heads, self.linear_num_key_heads
                ));
            }
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.rms_eps as f64) || !positive(self.rope_theta) {
            return Err(format!(
                "rms eps {} and rope theta {} must be finite and positive",
                self.rms_eps, self.rope_theta
            ));
        }
        validate_rope_scaling(&self.rope_scaling)
    }
}

/// RoPE scaling parameters that give finite frequencies (a factor of 0 divides every
/// frequency by zero: all-NaN logits), with the constraints transformers checks for llama3.
fn validate_rope_scaling(scaling: &RopeScaling) -> Result<(), String> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    match *scaling {
        RopeScaling::None => Ok(()),
        RopeScaling::Linear { factor } if positive(factor) => Ok(()),
        RopeScaling::Linear { factor } => Err(format!(
            "linear rope scaling factor {factor} must be finite and positive"
        )),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => {
            if !positive(factor) || !positive(low_freq_factor) || !positive(original_max_position) {
                return Err(format!(
                    "llama3 rope scaling: factor {factor}, low_freq_factor {low_freq_factor} and \
                     original_max_position_embeddings {original_max_position} must be finite and \
                     positive"
                ));
            }
            if !(high_freq_factor.is_finite() && high_freq_factor > low_freq_factor) {
                return Err(format!(
                    "llama3 rope scaling: high_freq_factor {high_freq_factor} must be finite and \
                     above low_freq_factor {low_freq_factor}"
                ));
            }
            Ok(())
        }
    }
}

/// Refuses, by name, the config.json settings that would make transformers compute another
/// function than the one kasoku implements (instead of silently running a different model).
fn check_hf_unsupported(hf: &HfConfig, arch: Arch, max_context: usize) -> Result<(), ModelError> {
    let refuse = |what: String| {
        Err(ModelError::Unsupported(format!(
            "{}: {what}",
            hf.path().display()
        )))
    };
    // Every family kasoku runs uses SiLU (SwiGLU) in its MLP.
    if let Some(act) = hf.opt_str("hidden_act")? {
        if act != "silu" {
            return refuse(format!(
                "'hidden_act' = '{act}' (kasoku's MLP is SiLU-gated)"
            ));
        }
    }
    // Sliding-window attention: transformers' Mistral applies `sliding_window` whenever it is
    // set, the Qwen families only with `use_sliding_window`; Llama ignores the key. A window
    // at least as long as the context changes nothing.
    let window_applies = match arch {
        Arch::Llama => hf.model_type() == "mistral",
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen35 => {
            hf.opt_bool("use_sliding_window")? == Some(true)
        }
    };
    if window_applies {
        if let Some(window) = hf.opt_usize("sliding_window")? {
            if window < max_context {
                return refuse(format!(
                    "'sliding_window' = {window} (sliding-window attention) with a context of \
                     {max_context}"
                ));
            }
        }
    }
    // Per-layer attention types (transformers >= 4.53 writes them): Qwen3.5 reads its own;
    // for the others, every layer must be full attention.
    if arch != Arch::Qwen35 {
        if let Some(types) = hf.value("layer_types") {
            let items = types.as_array().map(Vec::as_slice).unwrap_or_default();
            if let Some(other) = items.iter().find(|t| t.as_str() != Some("full_attention")) {
                return refuse(format!("'layer_types' has {other} (only full_attention)"));
            }
            if !types.is_array() {
                return refuse(format!("'layer_types' is {types}, expected a list"));
            }
        }
    }
    Ok(())
}

/// Qwen3.5's default layout: layer `i` is full attention iff `(i + 1) % interval == 0`.
fn kinds_from_interval(n_layers: usize, interval: usize) -> Result<Vec<LayerKind>, String> {
    if interval == 0 {
        return Err("full_attention_interval is 0".into());
    }
    Ok((0..n_layers)
        .map(|i| {
            if (i + 1) % interval == 0 {
                LayerKind::Attention
            } else {
                LayerKind::GatedDeltaNet
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::golden::fixture_dir;

    fn gguf_config(rel: &str) -> ModelConfig {
        let file = GgufFile::open(fixture_dir(rel).join("model-f32.gguf")).unwrap();
        ModelConfig::from_gguf(&file).unwrap()
    }

    // Expected values below are from each fixture's config.json (written by transformers).

    #[test]
    fn llama_gguf() {
        let c = gguf_config("llama/tiny");
        assert_eq!((c.arch, c.source), (Arch::Llama, SourceKind::Gguf));
        assert_eq!(
            (
                c.hidden,
                c.n_layers,
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
                c.ffn,
                c.vocab
            ),
            (64, 2, 4, 2, 16, 128, 384)
        );
        assert_eq!(
            (c.rms_eps, c.rope_theta, c.rope_dim, c.max_context),
            (1e-5, 10000.0, 16, 256)
        );
        assert_eq!(c.rope_layout, RopeLayout::Interleaved);
        assert!(
            !c.tied_embeddings
                && !c.qkv_bias
                && !c.qk_norm
                && !c.attn_output_gate
                && !c.norm_offset_one
        );
        assert_eq!(c.layer_kinds, vec![LayerKind::Attention; 2]);
    }

    #[test]
    fn qwen2_and_qwen3_gguf() {
        let c = gguf_config("qwen2/tiny");
        assert_eq!(c.arch, Arch::Qwen2);
        assert!(c.qkv_bias && c.tied_embeddings && !c.qk_norm);
        assert_eq!((c.rope_layout, c.rope_theta), (RopeLayout::Neox, 1e6));
        let c = gguf_config("qwen3/tiny");
        assert_eq!(c.arch, Arch::Qwen3);
        assert!(c.qk_norm && !c.qkv_bias);
        assert_eq!((c.hidden, c.n_heads, c.head_dim), (64, 4, 32));
    }

    #[test]
    fn qwen35_gguf_layer_kinds_and_gdn_dims() {
        use LayerKind::{Attention as A, GatedDeltaNet as G};
        let c = gguf_config("qwen3_5/tiny");
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture_dir("qwen3_5/tiny/config.json")).unwrap(),
        )
        .unwrap();
        let u = |k: &str| json[k].as_u64().unwrap() as usize;
        assert_eq!(c.arch, Arch::Qwen35);
        assert_eq!(c.layer_kinds, vec![G, G, G, A]);
        assert_eq!(
            (c.head_dim, c.rope_dim, c.rope_layout),
            (u("head_dim"), u("head_dim") / 4, RopeLayout::Neox)
        );
        assert!(c.attn_output_gate && c.qk_norm && !c.norm_offset_one && c.tied_embeddings);
        let gdn = (
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
            c.linear_conv_kernel_dim,
        );
        let want = (
            u("linear_num_key_heads"),
            u("linear_num_value_heads"),
            u("linear_key_head_dim"),
            u("linear_value_head_dim"),
            u("linear_conv_kernel_dim"),
        );
        assert_eq!(gdn, want);
        assert_eq!(c.rms_eps, 1e-6);
    }

    /// `layer_types` [linear, full, linear] (not the every-4th default), VL-nested
    /// `text_config`, partial rotary 0.5.
    #[test]
    fn qwen35_hf_vl_config() {
        use LayerKind::{Attention as A, GatedDeltaNet as G};
        let c =
            ModelConfig::from_hf(&HfConfig::load(fixture_dir("qwen3_5/tiny_vl")).unwrap()).unwrap();
        assert_eq!(c.layer_kinds, vec![G, A, G]);
        assert_eq!(
            (c.head_dim, c.rope_dim, c.linear_num_value_heads),
            (32, 16, 6)
        );
        assert!(!c.tied_embeddings && c.norm_offset_one);
    }

    /// The HF config.json and the GGUF conversion of the same fixture describe the same
    /// model; only the documented source conventions differ.
    #[test]
    fn hf_and_gguf_agree() {
        for rel in [
            "llama/tiny",
            "llama/tiny_rope_llama3",
            "qwen2/tiny",
            "qwen3/tiny",
            "qwen3_5/tiny",
            "qwen3_5/tiny_mtp",
        ] {
            let g = gguf_config(rel);
            let h = ModelConfig::from_hf(&HfConfig::load(fixture_dir(rel)).unwrap()).unwrap();
            assert_eq!(h.source, SourceKind::Hf);
            assert_eq!(h.rope_layout, RopeLayout::Neox);
            assert_eq!(h.norm_offset_one, h.arch == Arch::Qwen35, "{rel}");
            let mut h2 = h.clone();
            h2.source = g.source;
            h2.rope_layout = g.rope_layout;
            h2.norm_offset_one = g.norm_offset_one;
            if rel.ends_with("llama3") {
                // GGUF carries llama3 scaling as the rope_freqs tensor instead.
                assert!(
                    matches!(h2.rope_scaling, RopeScaling::Llama3 { factor, original_max_position, .. } if factor == 8.0 && original_max_position == 64.0)
                );
                h2.rope_scaling = RopeScaling::None;
            }
            assert_eq!(h2, g, "{rel}");
        }
    }

    /// A GGUF whose metadata lacks a key or has a bad value fails with an error naming it.
    #[test]
    fn bad_gguf_metadata_names_the_key() {
        use crate::format::gguf::{write_gguf, MetaValue};
        use crate::format::test_util::ScratchDir;
        let dir = ScratchDir::new("model-config");
        let base = vec![
            ("general.architecture", MetaValue::String("llama".into())),
            ("llama.embedding_length", MetaValue::U32(8)),
            ("llama.block_count", MetaValue::U32(1)),
            ("llama.attention.head_count", MetaValue::U32(2)),
            ("llama.feed_forward_length", MetaValue::U32(16)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                MetaValue::F32(1e-5),
            ),
            ("llama.context_length", MetaValue::U32(64)),
            ("llama.vocab_size", MetaValue::U32(10)),
        ];
        let none: &[(&str, crate::quant::DType, [usize; 1], [u8; 0])] = &[];
        let open = |meta: &[(&str, MetaValue)]| {
            let path = dir.join("m.gguf");
            write_gguf(&path, meta, none).unwrap();
            ModelConfig::from_gguf(&GgufFile::open(&path).unwrap())
        };
        let c = open(&base).unwrap();
        assert_eq!(
            (c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab),
            (8, 2, 2, 4, 10)
        );
        for drop in [
            "llama.embedding_length",
            "llama.feed_forward_length",
            "llama.attention.layer_norm_rms_epsilon",
        ] {
            let meta: Vec<_> = base.iter().filter(|(k, _)| *k != drop).cloned().collect();
            let e = open(&meta).unwrap_err().to_string();
            assert!(e.contains(drop), "{e}");
        }
        let mut meta = base.clone();
        meta.push((
            "llama.attention.head_count_kv",
            MetaValue::String("two".into()),
        ));
        assert!(open(&meta)
            .unwrap_err()
            .to_string()
            .contains("head_count_kv"));
        let mut meta = base.clone();
        meta.push(("llama.attention.head_count_kv", MetaValue::U32(3)));
        assert!(open(&meta).unwrap_err().to_string().contains("kv heads"));
        let mut meta = base.clone();
        meta[0].1 = MetaValue::String("gpt2".into());
        assert!(matches!(
            open(&meta),
            Err(ModelError::UnsupportedArch { .. })
        ));
    }

    /// A GGUF converted with its MTP block: block_count 5 and nextn_predict_layers 1 are a
    /// 4-layer trunk (recurrent_layers has 5 entries); the trunk equals the MTP-less fixture's.
    #[test]
    fn qwen35_gguf_nextn_block_is_not_a_trunk_layer() {
        let with = gguf_config("qwen3_5/tiny_mtp");
        let without = gguf_config("qwen3_5/tiny");
        assert_eq!(with.n_layers, 4);
        assert_eq!(with, without);
    }

    #[test]
    fn interval_layout() {
        use LayerKind::{Attention as A, GatedDeltaNet as G};
        assert_eq!(
            kinds_from_interval(8, 4).unwrap(),
            vec![G, G, G, A, G, G, G, A]
        );
        assert!(kinds_from_interval(8, 0).is_err());
    }

    #[test]
    fn validate_names_the_problem() {
        let mut c = gguf_config("llama/tiny");
        c.n_kv_heads = 3;
        assert!(c.validate().unwrap_err().contains("kv heads"));
        let mut c = gguf_config("llama/tiny");
        c.rope_dim = 7;
        assert!(c.validate().unwrap_err().contains("rotary"));
    }
}
