//! The block-diagonal randomized Hadamard transform that kasoku's formats apply to the input
//! side of a weight matrix before quantizing it (and to the activations that meet it).
//!
//! `R = diag(H_b, H_b, …) · D`: `D` flips the sign of some columns (a fixed pseudo-random
//! pattern drawn from the tensor's seed), then each block of `b` consecutive values goes
//! through the `b`-point Walsh–Hadamard transform `H_b` (Sylvester order, normalised by
//! `1/√b`). `R` is orthogonal, so `W·x = (W·Rᵀ)·(R·x)`: a matrix stored as `W·Rᵀ` (each row
//! rotated by `R`) meets activations rotated by the same `R`, and only the rounding of the
//! quantized values changes the product. An outlier column is spread over the `b` columns of
//! its block, which lowers the ratio of a group's largest value to its typical one, the thing
//! uniform quantization grids pay for.
//!
//! **Signs.** Column `j`'s sign is bit `j % 64` of the `j / 64`-th output of SplitMix64 started
//! at the seed (a set bit flips the sign): `state += 0x9E3779B97F4A7C15`, then
//! `z = (state ^ state >> 30) · 0xBF58476D1CE4E5B9`, `z = (z ^ z >> 27) · 0x94D049BB133111EB`,
//! `z ^ z >> 31`. Matrices that read the same activation (q/k/v, gate/up) are given the same
//! seed and block so one rotated activation serves them all.
//!
//! Activations are rotated without the `1/√b` factor ([`Rotation::rotate_unnormalised`]:
//! additions and subtractions only); the kernels fold the factor into each block's scale.

/// Rotation blocks kasoku accepts (powers of two).
pub const BLOCKS: [usize; 4] = [16, 32, 64, 128];
/// The block size `kasoku quantize` uses.
pub const DEFAULT_BLOCK: usize = 32;

/// One tensor's rotation: its sign seed and block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Rotation {
    pub seed: u64,
    pub block: usize,
}

/// The sign pattern of a rotation over `cols` columns, ready to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Signs {
    pub rotation: Rotation,
    /// ±1.0 per column.
    pub values: Vec<f32>,
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rotation {
    pub fn new(seed: u64, block: usize) -> Rotation {
        Rotation { seed, block }
    }

    /// Whether the block size is supported and divides `cols`.
    pub fn fits(&self, cols: usize) -> bool {
        BLOCKS.contains(&self.block) && cols.is_multiple_of(self.block)
    }

    /// The signs of columns `0..cols`.
    pub fn signs(&self, cols: usize) -> Signs {
        let mut state = self.seed;
        let mut values = Vec::with_capacity(cols);
        let mut word = 0u64;
        for j in 0..cols {
            if j % 64 == 0 {
                word = splitmix64(&mut state);
            }
            values.push(if (word >> (j % 64)) & 1 == 1 {
                -1.0
            } else {
                1.0
            });
        }
        Signs {
            rotation: *self,
            values,
        }
    }

    /// `1/√block`, the normalisation [`Rotation::rotate_unnormalised`] leaves out.
    pub fn norm(&self) -> f32 {
        (1.0 / (self.block as f64).sqrt()) as f32
    }
}

/// The unnormalised Walsh–Hadamard transform of `v` in place (length a power of two):
/// butterflies of span 1, 2, 4, …, each pair `(a, b) → (a + b, a − b)`.
pub fn hadamard_in_place(v: &mut [f32]) {
    let n = v.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (v[j], v[j + h]);
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        h *= 2;
    }
}

/// As [`hadamard_in_place`], in f64 (for the offline weight transform).
fn hadamard_f64(v: &mut [f64]) {
    let n = v.len();
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (v[j], v[j + h]);
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        h *= 2;
    }
}

impl Signs {
    /// `row ← R·row` (one row of `values.len()` columns), computed in f64 and rounded once:
    /// the offline transform of weight rows.
    pub fn rotate(&self, row: &mut [f32]) {
        self.apply(row, false);
    }

    /// `row ← Rᵀ·row`, the inverse of [`Signs::rotate`] (again in f64, rounded once).
    pub fn unrotate(&self, row: &mut [f32]) {
        self.apply(row, true);
    }

    fn apply(&self, row: &mut [f32], inverse: bool) {
        let b = self.rotation.block;
        assert_eq!(row.len(), self.values.len(), "rotation: row length");
        let norm = 1.0 / (b as f64).sqrt();
        // The largest block of `BLOCKS`, on the stack (no allocation per row).
        let mut stack = [0f64; 128];
        let buf = &mut stack[..b];
        for (blk, signs) in row.chunks_exact_mut(b).zip(self.values.chunks_exact(b)) {
            for ((o, &v), &s) in buf.iter_mut().zip(blk.iter()).zip(signs) {
                *o = if inverse {
                    v as f64
                } else {
                    v as f64 * s as f64
                };
            }
            hadamard_f64(buf);
            for ((v, &o), &s) in blk.iter_mut().zip(buf.iter()).zip(signs) {
                let o = o * norm;
                *v = if inverse {
                    (o * s as f64) as f32
                } else {
                    o as f32
                };
            }
        }
    }

    /// `out ← √b · R·x` in f32 (signs, then the unnormalised transform of each block): the
    /// online activation transform. Every path computes exactly these operations, so its
    /// result has the same bits everywhere.
    pub fn rotate_unnormalised(&self, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.values.len());
        rotate_unnormalised(&self.values, self.rotation.block, x, out);
    }
}

/// [`Signs::rotate_unnormalised`] of a run of whole blocks: `out ← √b·R·x` with `signs` the
/// signs of `x`'s columns and `b` the block.
pub fn rotate_unnormalised(signs: &[f32], b: usize, x: &[f32], out: &mut [f32]) {
    assert!(signs.len() == x.len() && out.len() == x.len() && x.len().is_multiple_of(b));
    for ((o, v), s) in out.iter_mut().zip(x).zip(signs) {
        *o = v * s;
    }
    for blk in out.chunks_exact_mut(b) {
        hadamard_in_place(blk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn rotate_then_unrotate_is_the_identity() {
        let mut s = 7;
        for block in BLOCKS {
            let cols = block * 5;
            let signs = Rotation::new(99, block).signs(cols);
            let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s) * 10.0).collect();
            let mut y = x.clone();
            signs.rotate(&mut y);
            assert_ne!(x, y);
            signs.unrotate(&mut y);
            for (a, b) in x.iter().zip(&y) {
                // One f32 rounding of each direction: within 2 ulps of the largest value.
                assert!((a - b).abs() <= 2.0 * f32::EPSILON * 10.0, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn the_rotation_keeps_dot_products_and_norms() {
        let mut s = 3;
        let cols = 256;
        let signs = Rotation::new(5, 32).signs(cols);
        let w: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
        let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
        let dot = |a: &[f32], b: &[f32]| -> f64 {
            a.iter().zip(b).map(|(p, q)| *p as f64 * *q as f64).sum()
        };
        let (mut rw, mut rx) = (w.clone(), x.clone());
        signs.rotate(&mut rw);
        signs.rotate(&mut rx);
        assert!((dot(&w, &x) - dot(&rw, &rx)).abs() < 1e-5);
        assert!((dot(&w, &w) - dot(&rw, &rw)).abs() < 1e-5);
        // The online form is √b times the rotation.
        let mut ux = vec![0f32; cols];
        signs.rotate_unnormalised(&x, &mut ux);
        for (u, r) in ux.iter().zip(&rx) {
            assert!((u * signs.rotation.norm() - r).abs() < 1e-6);
        }
    }

    #[test]
    fn an_outlier_is_spread_over_its_block() {
        let mut x = vec![0.01f32; 64];
        x[5] = 100.0;
        let signs = Rotation::new(1, 32).signs(64);
        signs.rotate(&mut x);
        // Every value of the first block carries 100/√32 ≈ 17.7 (± the small ones).
        assert!(x[..32].iter().all(|v| (v.abs() - 17.68).abs() < 0.2));
        assert!(x[32..].iter().all(|v| v.abs() < 0.1));
    }

    #[test]
    fn signs_follow_splitmix64() {
        // SplitMix64 from state 0: first output 0xE220A8397B1DCDAF (the reference sequence).
        let mut st = 0u64;
        assert_eq!(splitmix64(&mut st), 0xE220_A839_7B1D_CDAF);
        let s = Rotation::new(0, 32).signs(70);
        let word = 0xE220_A839_7B1D_CDAFu64;
        for j in 0..64 {
            assert_eq!(s.values[j] < 0.0, (word >> j) & 1 == 1, "column {j}");
        }
        // Different seeds give different patterns; the same seed the same.
        assert_ne!(
            Rotation::new(1, 32).signs(64),
            Rotation::new(2, 32).signs(64)
        );
        assert_eq!(
            Rotation::new(1, 32).signs(64).values,
            Rotation::new(1, 64).signs(64).values
        );
    }
}
