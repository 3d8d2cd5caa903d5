//! Rotary position embeddings (RoPE): precomputed inverse frequencies, the two pair layouts,
//! partial rotation and Llama 3 frequency scaling.
//!
//! For rotated pair `i` (0 ≤ i < rot_dim/2) at position `p` the angle is `p · inv_freq[i]`,
//! with `inv_freq[i] = theta^(-2i/rot_dim)` (then scaled, see [`RopeScaling`]). The pair is
//! `(x[i], x[i + rot_dim/2])` in the [`RopeLayout::Neox`] layout (Hugging Face rotate_half) and
//! `(x[2i], x[2i + 1])` in the [`RopeLayout::Interleaved`] layout (GPT-J; llama.cpp's GGUF
//! conversion of Llama permutes Q/K rows into it). Dims `rot_dim..head_dim` pass through.

use std::cell::Cell;

use super::scratch;

#[cfg(test)]
mod tests;

thread_local! {
    /// The calling thread's cosines and sines of one position.
    static COS_SIN: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Which dims of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pair `(i, i + rot_dim/2)`: Hugging Face `rotate_half`, GGUF qwen2/qwen3/qwen35.
    Neox,
    /// Pair `(2i, 2i + 1)`: GGUF llama (Q/K rows permuted by the converter).
    Interleaved,
}

/// Frequency scaling for long context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Every frequency divided by `factor` (position interpolation).
    Linear {
        factor: f64,
    },
    /// Llama 3.1's scheme: with wavelength λ = 2π/inv_freq, keep λ < orig/high_freq_factor,
    /// divide λ > orig/low_freq_factor by `factor`, interpolate smoothly in between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: f64,
    },
}

/// Precomputed inverse frequencies for one head geometry.
#[derive(Clone, Debug)]
pub struct Rope {
    pub layout: RopeLayout,
    pub head_dim: usize,
    /// Rotated dims at the start of each head (even, ≤ head_dim).
    pub rot_dim: usize,
    inv_freq: Vec<f64>,
}

impl Rope {
    /// `freq_factors` (GGUF `rope_freqs.weight`, rot_dim/2 values) divide the frequencies
    /// after scaling, as llama.cpp does for Llama 3 files.
    pub fn new(
        head_dim: usize,
        rot_dim: usize,
        theta: f64,
        layout: RopeLayout,
        scaling: &RopeScaling,
        freq_factors: Option<&[f32]>,
    ) -> Rope {
        assert!(
            rot_dim.is_multiple_of(2) && rot_dim <= head_dim,
            "rope: rot_dim must be even and ≤ head_dim"
        );
        let half = rot_dim / 2;
        let mut inv_freq: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64))
            .collect();
        match *scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let low_wavelen = original_max_position / low_freq_factor;
                let high_wavelen = original_max_position / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen < high_wavelen {
                        // high frequency: unchanged
                    } else if wavelen > low_wavelen {
                        *f /= factor;
                    } else {
                        let s = (original_max_position / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - s) * *f / factor + s * *f;
                    }
                }
            }
        }
        if let Some(ff) = freq_factors {
            assert_eq!(
                ff.len(),
                half,
                "rope: freq_factors must have rot_dim/2 values"
            );
            for (f, &d) in inv_freq.iter_mut().zip(ff) {
                *f /= d as f64;
            }
        }
        Rope {
            layout,
            head_dim,
            rot_dim,
            inv_freq,
        }
    }

    /// The inverse frequency of each rotated pair.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Rotates `x`, rows of `n_heads × head_dim` values, row `r` at position `positions[r]`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, positions: &[usize]) {
        let row = n_heads * self.head_dim;
        assert_eq!(
            x.len(),
            row * positions.len(),
            "rope: x does not match positions"
        );
        let half = self.rot_dim / 2;
        scratch::with(&COS_SIN, |buf| {
            let (cos, sin) = scratch::grow(buf, 2 * half).split_at_mut(half);
            self.rotate(x, row, positions, cos, sin)
        })
    }

    /// [`Rope::apply`] with memory for one position's cosines and sines.
    fn rotate(
        &self,
        x: &mut [f32],
        row: usize,
        positions: &[usize],
        cos: &mut [f32],
        sin: &mut [f32],
    ) {
        let half = self.rot_dim / 2;
        for (xr, &p) in x.chunks_exact_mut(row).zip(positions) {
            for i in 0..half {
                // The angle is rounded to f32 first, as Hugging Face computes it.
                let angle = (p as f32 * self.inv_freq[i] as f32) as f64;
                let (s, c) = angle.sin_cos();
                cos[i] = c as f32;
                sin[i] = s as f32;
            }
            for head in xr.chunks_exact_mut(self.head_dim) {
                match self.layout {
                    RopeLayout::Neox => {
                        let (a, b) = head[..self.rot_dim].split_at_mut(half);
                        for i in 0..half {
                            let (x0, x1) = (a[i], b[i]);
                            a[i] = x0 * cos[i] - x1 * sin[i];
                            b[i] = x1 * cos[i] + x0 * sin[i];
                        }
                    }
                    RopeLayout::Interleaved => {
                        for i in 0..half {
                            let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                            head[2 * i] = x0 * cos[i] - x1 * sin[i];
                            head[2 * i + 1] = x1 * cos[i] + x0 * sin[i];
                        }
                    }
                }
            }
        }
    }
}
