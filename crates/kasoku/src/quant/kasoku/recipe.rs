//! Which of a model's matrices take which of kasoku's formats (`kasoku quantize --format`,
//! `--quantize` on load), and the rotation each gets.
//!
//! By GGUF tensor name:
//! - the decoder layers' projections (`attn_q/k/v/output`, `ffn_gate/up/down`, Gated
//!   DeltaNet's `attn_qkv`, `attn_gate`, `ssm_out`): M (group 64 unless chosen otherwise) under
//!   `m`; L under `l`; under `mixed`, L for `attn_v` and `ffn_down` (the matrices llama.cpp's
//!   `_M` mixes also keep finer) and M for the rest;
//! - `output.weight`, and `token_embd.weight` when it is also the head (tied embeddings): L,
//!   groups of 32, in every scheme (the head's errors go straight into the logits); an
//!   embedding table of its own takes M under `m` and `mixed`, L under `l`
//!   ([`Recipe::embedding_spec`]: a step reads one of its rows, so its size is memory, not
//!   time);
//! - anything else (norms, biases, convolution taps, the tiny `ssm_alpha`/`ssm_beta`
//!   projections, the multi-token-prediction block): kept as it is. So is a matrix whose
//!   columns are not a multiple of 64.
//!
//! **Rotations** (unless `--no-rotate`): block 32, with the seed derived from the activation the
//! matrix reads, so matrices that read the same activation share signs and one rotated
//! activation serves them all: `blk.N.attn_in` for q, k, v (and Gated DeltaNet's qkv and gate
//! projections), `blk.N.ffn_in` for gate and up, `output` for the head (and a tied embedding
//! table), `token_embd` for an embedding table of its own, and the matrix's own name otherwise (`attn_output`, `ffn_down`, `ssm_out`). The seed is the
//! 64-bit FNV-1a hash of that key.

use super::rotation::DEFAULT_BLOCK;
use super::{m4, Rotation, TensorSpec, COLUMN_MULTIPLE};

/// The formats a model's matrices are quantized to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    M,
    L,
    Mixed,
}

impl Scheme {
    /// `m`, `l` or `mixed` (ASCII case ignored).
    pub fn from_name(name: &str) -> Option<Scheme> {
        match name.to_ascii_lowercase().as_str() {
            "m" => Some(Scheme::M),
            "l" => Some(Scheme::L),
            "mixed" => Some(Scheme::Mixed),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scheme::M => "m",
            Scheme::L => "l",
            Scheme::Mixed => "mixed",
        }
    }
}

/// A scheme with its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Recipe {
    pub scheme: Scheme,
    /// Rotate the matrices (and so their activations); `false` for `--no-rotate`.
    pub rotate: bool,
    /// M's group size (32, 64 or 128).
    pub m_group: usize,
}

impl Recipe {
    /// `scheme` with rotation and M groups of 64.
    pub fn new(scheme: Scheme) -> Recipe {
        Recipe {
            scheme,
            rotate: true,
            m_group: m4::DEFAULT_GROUP,
        }
    }

    /// The spec for the `rows × cols` matrix `name` (GGUF name; the tied head is
    /// `token_embd.weight`), or `None` to keep it as stored.
    pub fn spec_for(&self, name: &str, rows: usize, cols: usize) -> Option<TensorSpec> {
        if cols == 0 || !cols.is_multiple_of(COLUMN_MULTIPLE) || rows == 0 {
            return None;
        }
        let (role, key) = role(name)?;
        let rotation = self
            .rotate
            .then(|| Rotation::new(fnv1a(&key), DEFAULT_BLOCK));
        let l = TensorSpec::l(rows, cols, false, rotation);
        let m = TensorSpec::m(rows, cols, self.m_group, rotation);
        let spec = match (role, self.scheme) {
            (Role::Head, _) | (_, Scheme::L) => l,
            (Role::Fine, Scheme::Mixed) => l,
            _ => m,
        };
        spec.validate().is_ok().then_some(spec)
    }
}

impl Recipe {
    /// The spec for the `rows × cols` embedding table: the head's when it is also the head
    /// (`tied`), else M (L under `l`) with its own rotation; `None` to keep it as stored.
    pub fn embedding_spec(&self, rows: usize, cols: usize, tied: bool) -> Option<TensorSpec> {
        if tied {
            return self.spec_for("token_embd.weight", rows, cols);
        }
        if cols == 0 || !cols.is_multiple_of(COLUMN_MULTIPLE) || rows == 0 {
            return None;
        }
        let rotation = self
            .rotate
            .then(|| Rotation::new(fnv1a("token_embd"), DEFAULT_BLOCK));
        let spec = match self.scheme {
            Scheme::L => TensorSpec::l(rows, cols, false, rotation),
            Scheme::M | Scheme::Mixed => TensorSpec::m(rows, cols, self.m_group, rotation),
        };
        spec.validate().is_ok().then_some(spec)
    }
}

/// How a matrix is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The head or the embedding table.
    Head,
    /// A projection that `mixed` keeps in L.
    Fine,
    /// Any other projection.
    Plain,
}

/// The role of a matrix and the key of the activation it reads; `None` for tensors kept.
fn role(name: &str) -> Option<(Role, String)> {
    let base = name.strip_suffix(" (tied head)").unwrap_or(name);
    if base == "output.weight" || base == "token_embd.weight" {
        return Some((Role::Head, "output".into()));
    }
    if let Some(r) = dflash_role(base) {
        return Some(r);
    }
    let rest = base.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let part = part.strip_suffix(".weight")?;
    let shared = |what: &str| format!("blk.{layer}.{what}");
    Some(match part {
        "attn_q" | "attn_k" | "attn_qkv" | "attn_gate" => (Role::Plain, shared("attn_in")),
        "attn_v" => (Role::Fine, shared("attn_in")),
        "ffn_gate" | "ffn_up" => (Role::Plain, shared("ffn_in")),
        "ffn_down" => (Role::Fine, base.to_string()),
        "attn_output" | "ssm_out" => (Role::Plain, base.to_string()),
        _ => return None,
    })
}

/// The role of a DFlash drafter's matrix, under the published checkpoint's names (`fc`, then
/// `layers.N.self_attn.*_proj` and `layers.N.mlp.*_proj`: no `model.` prefix, nothing a GGUF
/// name maps to), the same roles as a decoder layer's.
fn dflash_role(name: &str) -> Option<(Role, String)> {
    if name == "fc.weight" {
        return Some((Role::Plain, "dflash.fc".into()));
    }
    let rest = name.strip_prefix("layers.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let shared = |what: &str| format!("dflash.{layer}.{what}");
    Some(match part.strip_suffix(".weight")? {
        "self_attn.q_proj" | "self_attn.k_proj" => (Role::Plain, shared("attn_in")),
        "self_attn.v_proj" => (Role::Fine, shared("attn_in")),
        "self_attn.o_proj" => (Role::Plain, shared("attn_out")),
        "mlp.gate_proj" | "mlp.up_proj" => (Role::Plain, shared("ffn_in")),
        "mlp.down_proj" => (Role::Fine, shared("ffn_down")),
        _ => return None,
    })
}

/// 64-bit FNV-1a.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::super::Format;
    use super::*;

    #[test]
    fn a_dflash_drafters_matrices_have_the_roles_of_a_layers() {
        let r = Recipe::new(Scheme::Mixed);
        let spec = |n: &str| r.spec_for(n, 128, 256);
        let rot = |n: &str| spec(n).unwrap().rotation.unwrap();
        assert!(spec("fc.weight").is_some());
        assert_eq!(
            rot("layers.0.self_attn.q_proj.weight"),
            rot("layers.0.self_attn.v_proj.weight")
        );
        assert_eq!(
            rot("layers.1.mlp.gate_proj.weight"),
            rot("layers.1.mlp.up_proj.weight")
        );
        assert_ne!(
            rot("layers.0.self_attn.q_proj.weight"),
            rot("layers.1.self_attn.q_proj.weight")
        );
        // mixed keeps v and down in L, as in a decoder layer.
        let fmt = |n: &str| spec(n).unwrap().format;
        assert_eq!(
            fmt("layers.0.mlp.down_proj.weight"),
            fmt("layers.0.self_attn.v_proj.weight")
        );
        assert_ne!(
            fmt("layers.0.mlp.down_proj.weight"),
            fmt("layers.0.mlp.up_proj.weight")
        );
        // Norms and anything else stay as stored.
        assert!(spec("layers.0.input_layernorm.weight").is_none());
        assert!(spec("hidden_norm.weight").is_none());
    }

    #[test]
    fn matrices_reading_one_activation_share_their_rotation() {
        let r = Recipe::new(Scheme::M);
        let rot = |n: &str| r.spec_for(n, 128, 256).unwrap().rotation.unwrap();
        assert_eq!(rot("blk.3.attn_q.weight"), rot("blk.3.attn_k.weight"));
        assert_eq!(rot("blk.3.attn_q.weight"), rot("blk.3.attn_v.weight"));
        assert_eq!(rot("blk.3.ffn_gate.weight"), rot("blk.3.ffn_up.weight"));
        assert_ne!(rot("blk.3.attn_q.weight"), rot("blk.4.attn_q.weight"));
        assert_ne!(rot("blk.3.attn_q.weight"), rot("blk.3.ffn_up.weight"));
        assert_ne!(
            rot("blk.3.ffn_down.weight"),
            rot("blk.3.attn_output.weight")
        );
        assert_eq!(
            rot("output.weight"),
            rot("token_embd.weight (tied head)"),
            "the head, tied or not"
        );
        assert_eq!(rot("blk.0.attn_q.weight").block, 32);
        let plain = Recipe {
            rotate: false,
            ..Recipe::new(Scheme::M)
        };
        assert_eq!(
            plain
                .spec_for("blk.0.attn_q.weight", 8, 64)
                .unwrap()
                .rotation,
            None
        );
    }

    #[test]
    fn schemes_pick_formats_and_leave_other_tensors() {
        let fmt = |s: Scheme, n: &str| Recipe::new(s).spec_for(n, 64, 128).map(|t| t.format);
        assert_eq!(fmt(Scheme::M, "blk.0.ffn_down.weight"), Some(Format::M));
        assert_eq!(fmt(Scheme::Mixed, "blk.0.ffn_down.weight"), Some(Format::L));
        assert_eq!(fmt(Scheme::Mixed, "blk.0.attn_v.weight"), Some(Format::L));
        assert_eq!(fmt(Scheme::Mixed, "blk.0.attn_k.weight"), Some(Format::M));
        assert_eq!(fmt(Scheme::L, "blk.0.attn_k.weight"), Some(Format::L));
        assert_eq!(fmt(Scheme::M, "output.weight"), Some(Format::L));
        assert_eq!(fmt(Scheme::M, "blk.0.attn_norm.weight"), None);
        assert_eq!(fmt(Scheme::M, "blk.0.ssm_alpha.weight"), None);
        assert_eq!(fmt(Scheme::M, "blk.24.nextn.eh_proj.weight"), None);
        assert_eq!(fmt(Scheme::M, "blk.x.attn_q.weight"), None);
        assert_eq!(
            Recipe::new(Scheme::M).spec_for("blk.0.attn_q.weight", 8, 96),
            None
        );
        let g32 = Recipe {
            m_group: 32,
            ..Recipe::new(Scheme::M)
        };
        assert_eq!(
            g32.spec_for("blk.0.attn_q.weight", 8, 64).unwrap().group(),
            32
        );
        assert_eq!(Scheme::from_name("MIXED"), Some(Scheme::Mixed));
        // The embedding: the head's spec when tied, else M (L under l) on its own rotation.
        let r = Recipe::new(Scheme::M);
        let tied = r.embedding_spec(64, 128, true).unwrap();
        assert_eq!(Some(tied), r.spec_for("output.weight", 64, 128));
        let own = r.embedding_spec(64, 128, false).unwrap();
        assert_eq!(own.format, Format::M);
        assert_ne!(own.rotation, tied.rotation);
        let l = Recipe::new(Scheme::L)
            .embedding_spec(64, 128, false)
            .unwrap();
        assert_eq!(l.format, Format::L);
        assert_eq!(r.embedding_spec(64, 96, false), None);
        assert_eq!(Scheme::from_name("q4"), None);
    }
}
