//! Upper bounds on the sizes a checkpoint may declare, checked before anything is allocated
//! from them. A file is hostile until proven otherwise: a layer count of 2^40 in a tiny
//! config.json must be an error naming the field, not a multi-terabyte allocation.
//!
//! Each limit is far above every released model (the largest open models have ~126 layers,
//! hidden 16384-25600, 128 heads of at most 256 dims, FFN 53248, vocabularies of at most
//! ~262k tokens and contexts of at most ~10M positions), so no real checkpoint comes near
//! one; the tensors themselves are then checked against the declared sizes by
//! [`super::Claims`].

/// Transformer blocks.
pub const MAX_LAYERS: usize = 1024;
/// Model (embedding) width.
pub const MAX_HIDDEN: usize = 1 << 16;
/// Attention heads (query or key/value), and Gated DeltaNet heads.
pub const MAX_HEADS: usize = 1024;
/// Values per head (attention and Gated DeltaNet).
pub const MAX_HEAD_DIM: usize = 1024;
/// MLP inner width.
pub const MAX_FFN: usize = 1 << 20;
/// Token ids (the vocabulary, added tokens included).
pub const MAX_VOCAB: usize = 1 << 22;
/// Positions of the trained context.
pub const MAX_CONTEXT: usize = 1 << 24;
/// Gated DeltaNet's causal convolution width (real models: 4).
pub const MAX_CONV_KERNEL: usize = 64;

/// `value` as a `usize` if it is at most `max`, else an error naming `field`.
pub fn bounded(field: &str, value: u64, max: usize) -> Result<usize, String> {
    match usize::try_from(value) {
        Ok(v) if v <= max => Ok(v),
        _ => Err(format!(
            "'{field}' = {value} is above the limit of {max} kasoku accepts"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_names_the_field() {
        assert_eq!(bounded("n", 1024, MAX_LAYERS), Ok(1024));
        let e = bounded("llama.block_count", 1 << 40, MAX_LAYERS).unwrap_err();
        assert!(
            e.contains("'llama.block_count'") && e.contains("1099511627776"),
            "{e}"
        );
        assert!(bounded("x", u64::MAX, usize::MAX).is_ok() || usize::BITS < 64);
    }
}
