//! The launcher of `attention_prefill.cu`: attention of a long chain pass (a prompt's
//! prefill) on f16 tensor cores, a block per 64 rows and query head.

use super::{p, AttnCall, Kernels};
use crate::runtime::{Error, Result};

/// Rows per block of the prefill attention kernel (16 per warp, ATTP_WARPS warps).
pub const ATTP_ROWS: usize = 64;

/// Whether `attn_prefill` takes heads of `head_dim` (its fragments are sized per head width).
pub fn prefill_attention_fits(head_dim: usize) -> bool {
    head_dim == 64 || head_dim == 128
}

/// Whether long chain passes take `attn_prefill`: on unless `KASOKU_CUDA_ATTN_PREFILL=0`.
/// Read once per process by [`Kernels::new`].
pub fn prefill_attention_asked() -> bool {
    !std::env::var("KASOKU_CUDA_ATTN_PREFILL").is_ok_and(|v| v == "0")
}

/// The grid of [`Kernels::attention_prefill`]: (row tiles, query heads, 1).
pub fn prefill_attention_grid(n: usize, n_heads: usize) -> (u32, u32, u32) {
    (n.div_ceil(ATTP_ROWS) as u32, n_heads as u32, 1)
}

impl Kernels {
    /// Attention of the `a.n` chain rows of `a` (row `i` at position `pos[i]`, positions
    /// increasing, sees cache slots `0..=pos[i]`, which the pass's q/k/v epilogue has filled)
    /// into `a.out` and, when asked, its int8 blocks. Only `q`, the caches, the shape,
    /// `scale`, `pos` and the outputs of `a` are read (no tree, no fused epilogue, no
    /// split-K scratch). Not the decode kernels' bits: callers keep it to passes longer than
    /// any speculative tree.
    pub fn attention_prefill(&self, a: &AttnCall) -> Result<()> {
        if !prefill_attention_fits(a.head_dim)
            || a.n == 0
            || a.n_kv_heads == 0
            || !a.n_heads.is_multiple_of(a.n_kv_heads)
            || a.post.on != 0
        {
            return Err(Error::Invalid(format!(
                "prefill attention of {} rows, {} heads of {} over {} KV heads{}",
                a.n,
                a.n_heads,
                a.head_dim,
                a.n_kv_heads,
                if a.post.on != 0 {
                    " with the fused q/k/v epilogue"
                } else {
                    ""
                }
            )));
        }
        let name = if a.head_dim == 64 {
            "attn_prefill_64"
        } else {
            "attn_prefill_128"
        };
        let (q_ld, ms, n, nh, nkv) = (
            (a.n_heads * a.head_dim) as i32,
            a.max_slots as i32,
            a.n as i32,
            a.n_heads as i32,
            a.n_kv_heads as i32,
        );
        self.launch(
            name,
            prefill_attention_grid(a.n, a.n_heads),
            (ATTP_ROWS * 2) as u32,
            &mut [
                p(&a.q),
                p(&q_ld),
                p(&a.k_cache),
                p(&a.v_cache),
                p(&ms),
                p(&n),
                p(&nh),
                p(&nkv),
                p(&a.scale),
                p(&a.pos),
                p(&a.out),
                p(&q_ld),
                p(&a.out_q),
                p(&a.out_s),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_grid_covers_every_row_and_head() {
        assert_eq!(prefill_attention_grid(1, 12), (1, 12, 1));
        assert_eq!(prefill_attention_grid(64, 12), (1, 12, 1));
        assert_eq!(prefill_attention_grid(65, 12), (2, 12, 1));
        assert_eq!(prefill_attention_grid(512, 14), (8, 14, 1));
    }

    #[test]
    fn the_prefill_kernel_takes_the_head_widths_it_was_written_for() {
        assert!(prefill_attention_fits(64) && prefill_attention_fits(128));
        assert!(!prefill_attention_fits(256) && !prefill_attention_fits(80));
    }
}
