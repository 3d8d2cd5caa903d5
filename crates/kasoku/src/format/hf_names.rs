//! Translation of Hugging Face tensor names to GGUF (llama.cpp) names, so that model code knows
//! one naming scheme whatever the checkpoint format.
//!
//! Covered: the text part of `llama` (and `mistral`), `qwen2`, `qwen3` and `qwen3_5`
//! checkpoints. The prefixes `model.language_model.` (vision-language wrappers) and `model.` are
//! removed; layer `N` becomes `blk.N`. Rules:
//!
//! | HF (after the prefix) | GGUF |
//! |---|---|
//! | `embed_tokens.weight`, `norm.weight`, `lm_head.weight` | `token_embd.weight`, `output_norm.weight`, `output.weight` |
//! | `layers.N.input_layernorm` | `blk.N.attn_norm` |
//! | `layers.N.post_attention_layernorm` | `blk.N.ffn_norm` (llama, qwen2, qwen3); `blk.N.post_attention_norm` (qwen3_5, as llama.cpp's `qwen35`) |
//! | `self_attn.{q,k,v,o}_proj` | `attn_{q,k,v,output}` |
//! | `self_attn.{q,k}_norm` | `attn_{q,k}_norm` |
//! | `mlp.{gate,up,down}_proj` | `ffn_{gate,up,down}` |
//! | `linear_attn.in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` | `attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha` |
//! | `linear_attn.conv1d.weight`, `dt_bias`, `A_log` | `ssm_conv1d.weight`, `ssm_dt.bias`, `ssm_a` |
//! | `linear_attn.norm`, `out_proj` | `ssm_norm`, `ssm_out` |
//!
//! Only names change, never values. In particular `ssm_a` from an HF checkpoint still holds
//! `A_log` (llama.cpp's converter stores `-exp(A_log)`), Qwen3.5 norms keep HF's `(1 + w)`
//! convention (the converter adds 1), V heads keep HF's grouped order, and llama Q/K rows are
//! not permuted: model code must ask [`TensorSource::origin`](super::TensorSource::origin).
//!
//! `mtp.*` (multi-token prediction) tensors keep their names here (`model.mtp.*` loses the `model.`
//! prefix): their GGUF names depend on the trunk's layer count, which [`mtp_name`] takes. Vision-tower tensors
//! (`model.visual.*`) are skipped: [`translate`] answers [`HfName::Skipped`]. Any other name keeps
//! its HF spelling, so strict claiming reports it as unclaimed.

/// What [`translate`] made of an HF tensor name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HfName {
    /// The GGUF name (or the unchanged HF name when no rule applies).
    Name(String),
    /// A tensor kasoku does not load and hides from the source (the vision tower).
    Skipped,
}

/// The GGUF name of an HF tensor for the given `model_type` (normalised: `qwen3_5`, not
/// `qwen3_5_text`).
pub fn translate(model_type: &str, hf: &str) -> HfName {
    if hf.starts_with("model.visual.") || hf.starts_with("visual.") {
        return HfName::Skipped;
    }
    if hf.starts_with("mtp.") {
        return HfName::Name(hf.to_string());
    }
    if let Some(rest) = hf.strip_prefix("model.mtp.") {
        return HfName::Name(format!("mtp.{rest}"));
    }
    if hf == "lm_head.weight" {
        return HfName::Name("output.weight".into());
    }
    let Some(rest) = hf
        .strip_prefix("model.language_model.")
        .or_else(|| hf.strip_prefix("model."))
    else {
        return HfName::Name(hf.to_string());
    };
    let mapped = match rest {
        "embed_tokens.weight" => Some("token_embd.weight".to_string()),
        "norm.weight" => Some("output_norm.weight".to_string()),
        _ => layer_name(model_type, rest),
    };
    HfName::Name(mapped.unwrap_or_else(|| hf.to_string()))
}

/// The GGUF name of a multi-token-prediction tensor (`mtp.*`, as [`translate`] leaves it) of a model
/// with `n_layers` trunk layers, as llama.cpp's converter writes it: the block becomes the extra
/// layer `blk.{n_layers}` (`mtp.layers.K.*` → `blk.{n_layers + K}.*`, named like trunk layers) and
///
/// | HF | GGUF |
/// |---|---|
/// | `mtp.fc.weight` | `blk.{n}.nextn.eh_proj.weight` |
/// | `mtp.pre_fc_norm_embedding.weight` | `blk.{n}.nextn.enorm.weight` |
/// | `mtp.pre_fc_norm_hidden.weight` | `blk.{n}.nextn.hnorm.weight` |
/// | `mtp.norm.weight` | `blk.{n}.nextn.shared_head_norm.weight` |
///
/// `None` for any other name. Values are not changed (norms stay `(1 + w)`).
pub fn mtp_name(model_type: &str, hf: &str, n_layers: usize) -> Option<String> {
    let rest = hf.strip_prefix("mtp.")?;
    let head = match rest {
        "fc.weight" => Some("eh_proj"),
        "pre_fc_norm_embedding.weight" => Some("enorm"),
        "pre_fc_norm_hidden.weight" => Some("hnorm"),
        "norm.weight" => Some("shared_head_norm"),
        _ => None,
    };
    if let Some(part) = head {
        return Some(format!("blk.{n_layers}.nextn.{part}.weight"));
    }
    let (index, part) = rest.strip_prefix("layers.")?.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let k: usize = index.parse().ok()?;
    layer_name(
        model_type,
        &format!("layers.{}.{part}", n_layers.checked_add(k)?),
    )
}

/// `layers.N.<part>` → `blk.N.<gguf part>`.
fn layer_name(model_type: &str, rest: &str) -> Option<String> {
    let rest = rest.strip_prefix("layers.")?;
    let (index, part) = rest.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (stem, suffix) = part.rsplit_once('.')?; // suffix: weight | bias
    if suffix != "weight" && suffix != "bias" {
        // GDN parameters without a `.weight` suffix.
        return match part {
            "linear_attn.dt_bias" => Some(format!("blk.{index}.ssm_dt.bias")),
            "linear_attn.A_log" => Some(format!("blk.{index}.ssm_a")),
            _ => None,
        };
    }
    let post_attention = if model_type == "qwen3_5" || model_type == "qwen3_5_moe" {
        "post_attention_norm"
    } else {
        "ffn_norm"
    };
    let gguf = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => post_attention,
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "linear_attn.in_proj_qkv" => "attn_qkv",
        "linear_attn.in_proj_z" => "attn_gate",
        "linear_attn.in_proj_b" => "ssm_beta",
        "linear_attn.in_proj_a" => "ssm_alpha",
        "linear_attn.conv1d" => "ssm_conv1d",
        "linear_attn.norm" => "ssm_norm",
        "linear_attn.out_proj" => "ssm_out",
        _ => return None,
    };
    Some(format!("blk.{index}.{gguf}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(model_type: &str, hf: &str) -> String {
        match translate(model_type, hf) {
            HfName::Name(n) => n,
            HfName::Skipped => "<skipped>".into(),
        }
    }

    #[test]
    fn dense_names() {
        for mt in ["llama", "qwen2", "qwen3"] {
            assert_eq!(t(mt, "model.embed_tokens.weight"), "token_embd.weight");
            assert_eq!(t(mt, "model.norm.weight"), "output_norm.weight");
            assert_eq!(t(mt, "lm_head.weight"), "output.weight");
            assert_eq!(
                t(mt, "model.layers.0.input_layernorm.weight"),
                "blk.0.attn_norm.weight"
            );
            assert_eq!(
                t(mt, "model.layers.12.post_attention_layernorm.weight"),
                "blk.12.ffn_norm.weight"
            );
            assert_eq!(
                t(mt, "model.layers.3.self_attn.q_proj.bias"),
                "blk.3.attn_q.bias"
            );
            assert_eq!(
                t(mt, "model.layers.3.self_attn.o_proj.weight"),
                "blk.3.attn_output.weight"
            );
            assert_eq!(
                t(mt, "model.layers.3.self_attn.k_norm.weight"),
                "blk.3.attn_k_norm.weight"
            );
            assert_eq!(
                t(mt, "model.layers.3.mlp.down_proj.weight"),
                "blk.3.ffn_down.weight"
            );
        }
    }

    #[test]
    fn qwen35_names() {
        let mt = "qwen3_5";
        let p = "model.language_model.layers.4.";
        assert_eq!(
            t(mt, "model.language_model.embed_tokens.weight"),
            "token_embd.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}post_attention_layernorm.weight")),
            "blk.4.post_attention_norm.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.in_proj_qkv.weight")),
            "blk.4.attn_qkv.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.in_proj_z.weight")),
            "blk.4.attn_gate.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.in_proj_b.weight")),
            "blk.4.ssm_beta.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.in_proj_a.weight")),
            "blk.4.ssm_alpha.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.conv1d.weight")),
            "blk.4.ssm_conv1d.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.dt_bias")),
            "blk.4.ssm_dt.bias"
        );
        assert_eq!(t(mt, &format!("{p}linear_attn.A_log")), "blk.4.ssm_a");
        assert_eq!(
            t(mt, &format!("{p}linear_attn.norm.weight")),
            "blk.4.ssm_norm.weight"
        );
        assert_eq!(
            t(mt, &format!("{p}linear_attn.out_proj.weight")),
            "blk.4.ssm_out.weight"
        );
        assert_eq!(
            t(mt, "model.layers.4.linear_attn.A_log"),
            "blk.4.ssm_a",
            "text-only export"
        );
        assert_eq!(t(mt, "mtp.fc.weight"), "mtp.fc.weight");
        assert_eq!(
            t(mt, "mtp.layers.0.self_attn.q_proj.weight"),
            "mtp.layers.0.self_attn.q_proj.weight"
        );
        assert_eq!(t(mt, "model.visual.blocks.0.attn.qkv.weight"), "<skipped>");
    }

    #[test]
    fn mtp_names() {
        let m = |hf: &str| mtp_name("qwen3_5", hf, 24);
        assert_eq!(t("qwen3_5", "model.mtp.fc.weight"), "mtp.fc.weight");
        assert_eq!(
            m("mtp.fc.weight").as_deref(),
            Some("blk.24.nextn.eh_proj.weight")
        );
        assert_eq!(
            m("mtp.pre_fc_norm_embedding.weight").as_deref(),
            Some("blk.24.nextn.enorm.weight")
        );
        assert_eq!(
            m("mtp.pre_fc_norm_hidden.weight").as_deref(),
            Some("blk.24.nextn.hnorm.weight")
        );
        assert_eq!(
            m("mtp.norm.weight").as_deref(),
            Some("blk.24.nextn.shared_head_norm.weight")
        );
        assert_eq!(
            m("mtp.layers.0.self_attn.q_proj.weight").as_deref(),
            Some("blk.24.attn_q.weight")
        );
        assert_eq!(
            m("mtp.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.24.post_attention_norm.weight")
        );
        assert_eq!(
            m("mtp.layers.1.mlp.down_proj.weight").as_deref(),
            Some("blk.25.ffn_down.weight")
        );
        for bad in [
            "mtp.fc.bias",
            "mtp.layers.x.mlp.down_proj.weight",
            "mtp.layers.0.mystery.weight",
            "mtp.embed_tokens.weight",
            "model.layers.0.mlp.down_proj.weight",
        ] {
            assert_eq!(m(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_names_keep_their_hf_spelling() {
        for hf in [
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            "model.layers.x.input_layernorm.weight",
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "something.else",
            "model.layers.0.linear_attn.A_log.extra",
        ] {
            assert_eq!(t("qwen3_5", hf), hf);
        }
    }
}
