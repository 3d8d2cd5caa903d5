//! Launchers of `draft_top.cu`: for each row of a pass's logits, the best and runner-up token
//! among its first columns and the softmax mass around the best, which is all a draft model's
//! tree (crate::draft) needs of a row: 20 bytes cross to the host instead of the row; a
//! DFlash block's per-row top-k selections in one launch ([`Kernels::rows_top_k`]); and the
//! rows of a target's recorded layer outputs a DFlash drafter projects, gathered on the
//! device ([`Kernels::gather_rows`]).

use super::{id_bits, p, Kernels};
use crate::runtime::{Error, Result};

/// Words [`Kernels::row_top2`] writes per row (TOP2_WORDS in draft_top.cu).
pub const TOP2_WORDS: usize = 5;

/// A row's two most likely tokens under the softmax of its scored logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowTop2 {
    /// The best (id, logit): the largest logit, the smaller id on ties.
    pub best: (u32, f32),
    /// The runner-up (id, logit) in the same order.
    pub second: (u32, f32),
    /// `Σ exp(l − best)` over the scored logits.
    pub mass: f32,
}

impl RowTop2 {
    /// From the kernel's [`TOP2_WORDS`] words of one row.
    pub fn from_words(w: &[u32]) -> RowTop2 {
        RowTop2 {
            best: (w[0], f32::from_bits(w[1])),
            second: (w[2], f32::from_bits(w[3])),
            mass: f32::from_bits(w[4]),
        }
    }

    /// The same on the host, from a whole row of scored logits (at least two): the reference
    /// the GPU check compares with. The order is the host sampler's (`total_cmp`, then the
    /// smaller id).
    pub fn of(row: &[f32]) -> RowTop2 {
        let mut best = [(0u32, f32::NEG_INFINITY); 2];
        for (i, &l) in row.iter().enumerate() {
            let better = |b: (u32, f32)| l.total_cmp(&b.1).is_gt();
            if i == 0 || better(best[0]) {
                best[1] = best[0];
                best[0] = (i as u32, l);
            } else if i == 1 || better(best[1]) {
                best[1] = (i as u32, l);
            }
        }
        let mass = row.iter().map(|&l| (l - best[0].1).exp()).sum();
        RowTop2 {
            best: best[0],
            second: best[1],
            mass,
        }
    }

    /// The probabilities of the best and the runner-up.
    pub fn probabilities(&self) -> (f32, f32) {
        let z = self.mass;
        (1.0 / z, (self.second.1 - self.best.1).exp() / z)
    }
}

impl Kernels {
    /// For each of `rows` rows of logits at `logits` (row stride `ld` floats), its
    /// [`RowTop2`] over the first `cols` logits, as [`TOP2_WORDS`] u32 words per row at
    /// `out`. `cols` in 2..=`ld`.
    pub fn row_top2(
        &self,
        logits: u64,
        ld: usize,
        cols: usize,
        rows: usize,
        out: u64,
    ) -> Result<()> {
        if cols < 2 || cols > ld || rows == 0 || i32::try_from(ld).is_err() {
            return Err(Error::Invalid(format!(
                "the best two of {cols} logits in {rows} rows of {ld}"
            )));
        }
        let (ld, cols) = (ld as i32, cols as i32);
        self.launch(
            "row_top2",
            (rows as u32, 1, 1),
            256,
            &mut [p(&logits), p(&ld), p(&cols), p(&out)],
        )
    }
}

impl Kernels {
    /// [`Kernels::top_k_select`] of each of `rows` rows of logits at `logits` (row stride `ld`
    /// floats, the first `cols` of each scored) in one launch: row `r`'s `count` (id, logit
    /// bits) pairs at `out + r × 2·count` words, the same pairs as the one-row kernel gives.
    /// `count` in 1..`cols`.
    pub fn rows_top_k(
        &self,
        logits: u64,
        ld: usize,
        cols: usize,
        rows: usize,
        count: usize,
        out: u64,
    ) -> Result<()> {
        if count == 0 || count >= cols || cols > ld || rows == 0 || i32::try_from(ld).is_err() {
            return Err(Error::Invalid(format!(
                "top-{count} selections of {cols} logits in {rows} rows of {ld}"
            )));
        }
        let (ld, c, k, b) = (ld as i32, cols as i32, count as i32, id_bits(cols) as i32);
        self.launch(
            "rows_top_k",
            (rows as u32, 1, 1),
            1024,
            &mut [p(&logits), p(&ld), p(&c), p(&k), p(&b), p(&out)],
        )
    }

    /// Row `r` of `dst` (`width` f32, packed) = row `idx[r]` of `src` (rows `ld` f32 apart)
    /// for the `rows` u32 indices at `idx` (device memory: a captured graph reads new ones
    /// each replay). The indices must be rows of `src`.
    pub fn gather_rows(
        &self,
        src: u64,
        ld: usize,
        idx: u64,
        rows: usize,
        width: usize,
        dst: u64,
    ) -> Result<()> {
        if width == 0 || width > ld || rows == 0 || i32::try_from(ld).is_err() {
            return Err(Error::Invalid(format!(
                "a gather of {rows} rows of {width} from rows of {ld}"
            )));
        }
        let (ld, w) = (ld as i32, width as i32);
        let split = width.div_ceil(1024).min(16) as u32;
        self.launch(
            "gather_rows",
            (rows as u32, split, 1),
            256,
            &mut [p(&src), p(&ld), p(&idx), p(&w), p(&dst)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_reference_orders_as_the_sampler_and_sums_the_mass() {
        let t = RowTop2::of(&[1.0, 3.0, 2.0, 3.0]);
        // Ties go to the smaller id: 1 first, then 3.
        assert_eq!(t.best, (1, 3.0));
        assert_eq!(t.second, (3, 3.0));
        let want = 2.0 + (-1.0f32).exp() + (-2.0f32).exp();
        assert!((t.mass - want).abs() < 1e-6);
        let (p1, p2) = t.probabilities();
        assert!((p1 - 1.0 / want).abs() < 1e-6 && (p1 - p2).abs() < 1e-6);
        let t = RowTop2::of(&[5.0, -1.0]);
        assert_eq!((t.best.0, t.second.0), (0, 1));
        let words = [7, 2f32.to_bits(), 9, 1f32.to_bits(), 1.5f32.to_bits()];
        assert_eq!(
            RowTop2::from_words(&words),
            RowTop2 {
                best: (7, 2.0),
                second: (9, 1.0),
                mass: 1.5
            }
        );
    }
}
