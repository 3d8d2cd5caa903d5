//! Multi-head causal attention of a batch of new tokens over a KV cache, with grouped-query
//! heads (query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
//!
//! The cache holds `[position][kv_head][head_dim]` f32 rows and already contains the new
//! tokens' keys and values: new row `i` sits at position `past + i` and sees positions
//! `0..=past + i` (the old cache plus the earlier new tokens). Scores and softmax are f32.
//! Work is split over (head, block of rows) tasks on the worker pool. The dot products and
//! the weighted sum of values have an AVX2/FMA path beside the portable one.

use super::activation::softmax_inplace;
use super::threads;

/// Head counts and size of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnGeometry {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// `out[i][h] = Σ_j softmax_j(scale · q[i][h]·k[j][kvh]) · v[j][kvh]`, `j ≤ past + i`.
///
/// `q` and `out` are `n × n_heads × head_dim`; `keys` and `values` hold at least
/// `past + n` positions of `n_kv_heads × head_dim`.
pub fn attention(
    geo: AttnGeometry,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    past: usize,
    scale: f32,
    out: &mut [f32],
) {
    let AttnGeometry {
        n_heads,
        n_kv_heads,
        head_dim: hd,
    } = geo;
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "attention: n_heads must be a multiple of n_kv_heads"
    );
    let q_row = n_heads * hd;
    let kv_row = n_kv_heads * hd;
    assert!(
        q.len().is_multiple_of(q_row) && out.len() == q.len(),
        "attention: q/out lengths"
    );
    let n = q.len() / q_row;
    assert!(
        keys.len() >= (past + n) * kv_row && values.len() >= (past + n) * kv_row,
        "attention: cache too short"
    );
    if n == 0 {
        return;
    }
    let group = n_heads / n_kv_heads;
    // Enough tasks to balance the pool, but each at least a few rows.
    let want_tasks = threads::num_threads() * 4;
    let blocks = want_tasks.div_ceil(n_heads).clamp(1, n);
    let rows_per = n.div_ceil(blocks);
    let blocks = n.div_ceil(rows_per);
    let outp = SharedOut(out.as_mut_ptr());
    threads::parallel_for(n_heads * blocks, |t| {
        let (h, b) = (t / blocks, t % blocks);
        let kvh = h / group;
        let rows = b * rows_per..((b + 1) * rows_per).min(n);
        let mut scores = vec![0f32; past + rows.end];
        let mut acc = vec![0f32; hd];
        for i in rows {
            let qv = &q[i * q_row + h * hd..][..hd];
            let len = past + i + 1;
            let s = &mut scores[..len];
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = dot(qv, &keys[j * kv_row + kvh * hd..][..hd]) * scale;
            }
            softmax_inplace(s);
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (j, &p) in s.iter().enumerate() {
                axpy(&mut acc, p, &values[j * kv_row + kvh * hd..][..hd]);
            }
            // SAFETY: each (row, head) slot of `out` is written by exactly one task, while
            // `attention` holds the only borrow of `out`.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(outp.get().add(i * q_row + h * hd), hd) };
            dst.copy_from_slice(&acc);
        }
    });
}

#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: only used to write disjoint slots from the pool's tasks during `attention`.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `Σ a[i]·b[i]`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA are available; lengths are equal.
        return unsafe { avx2::dot(a, b) };
    }
    portable::dot(a, b)
}

/// `y[i] += alpha · x[i]`.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA are available; lengths are equal.
        unsafe { avx2::axpy(y, alpha, x) };
        return;
    }
    portable::axpy(y, alpha, x)
}

mod portable {
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o += alpha * v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Cached feature check (0 = unknown, 1 = no, 2 = yes): this runs per key.
    pub fn available() -> bool {
        static STATE: AtomicU8 = AtomicU8::new(0);
        match STATE.load(Ordering::Relaxed) {
            2 => true,
            1 => false,
            _ => {
                let ok = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
                STATE.store(if ok { 2 } else { 1 }, Ordering::Relaxed);
                ok
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; `a.len() == b.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i)), _mm256_loadu_ps(bp.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(ap.add(i + 8)),
                _mm256_loadu_ps(bp.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i)), _mm256_loadu_ps(bp.add(i)), acc0);
            i += 8;
        }
        let v = _mm256_add_ps(acc0, acc1);
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        let mut sum = _mm_cvtss_f32(s);
        while i < n {
            sum += *ap.add(i) * *bp.add(i);
            i += 1;
        }
        sum
    }

    /// # Safety
    /// AVX2 and FMA must be available; `y.len() == x.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_fmadd_ps(a, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), v);
            i += 8;
        }
        while i < n {
            *yp.add(i) += alpha * *xp.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x2545F4914F6CDD1D).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Straightforward f64 attention: every row, every head, explicit causal mask.
    fn reference(
        geo: AttnGeometry,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        scale: f64,
    ) -> Vec<f64> {
        let AttnGeometry {
            n_heads,
            n_kv_heads,
            head_dim: hd,
        } = geo;
        let n = q.len() / (n_heads * hd);
        let mut out = vec![0f64; q.len()];
        for i in 0..n {
            for h in 0..n_heads {
                let kvh = h * n_kv_heads / n_heads;
                let qv = &q[(i * n_heads + h) * hd..][..hd];
                let total = past + n;
                let mut s: Vec<f64> = (0..total)
                    .map(|j| {
                        if j > past + i {
                            f64::NEG_INFINITY
                        } else {
                            let kv = &k[(j * n_kv_heads + kvh) * hd..][..hd];
                            qv.iter()
                                .zip(kv)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                * scale
                        }
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                s.iter_mut().for_each(|x| *x = (*x - m).exp());
                let z: f64 = s.iter().sum();
                for (j, p) in s.iter().enumerate() {
                    let vv = &v[(j * n_kv_heads + kvh) * hd..][..hd];
                    for d in 0..hd {
                        out[(i * n_heads + h) * hd + d] += p / z * vv[d] as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference_for_batches_over_a_cache() {
        let cases = [
            (4usize, 2usize, 16usize, 0usize, 5usize),
            (9, 3, 64, 7, 1),
            (9, 3, 64, 7, 6),
            (2, 2, 8, 0, 1),
            (8, 1, 33, 3, 40),
        ];
        for &(nh, nkv, hd, past, n) in &cases {
            let geo = AttnGeometry {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
            };
            let q = values(n * nh * hd, 1 + nh as u64);
            let k = values((past + n) * nkv * hd, 2 + past as u64);
            let v = values((past + n) * nkv * hd, 3 + n as u64);
            let scale = 1.0 / (hd as f64).sqrt();
            let want = reference(geo, &q, &k, &v, past, scale);
            let mut got = vec![0f32; q.len()];
            attention(geo, &q, &k, &v, past, scale as f32, &mut got);
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() < 1e-5 * (1.0 + b.abs()),
                    "{nh}/{nkv}x{hd} past {past} n {n}: {a} vs {b}"
                );
            }
        }
    }

    /// Row i of a batch equals a single-row call over the cache truncated after it.
    #[test]
    fn batch_rows_equal_single_rows() {
        let geo = AttnGeometry {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
        };
        let (past, n) = (3usize, 4usize);
        let q = values(n * 64, 11);
        let k = values((past + n) * 32, 12);
        let v = values((past + n) * 32, 13);
        let mut batch = vec![0f32; q.len()];
        attention(geo, &q, &k, &v, past, 0.25, &mut batch);
        for i in 0..n {
            let mut one = vec![0f32; 64];
            let kv_len = (past + i + 1) * 32;
            attention(
                geo,
                &q[i * 64..(i + 1) * 64],
                &k[..kv_len],
                &v[..kv_len],
                past + i,
                0.25,
                &mut one,
            );
            for d in 0..64 {
                assert!((one[d] - batch[i * 64 + d]).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn portable_and_avx2_agree() {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            for &n in &[1usize, 7, 8, 16, 31, 64, 128, 257] {
                let a = values(n, n as u64);
                let b = values(n, 100 + n as u64);
                let (p, s) = (portable::dot(&a, &b), unsafe { avx2::dot(&a, &b) });
                assert!(
                    (p - s).abs() < 1e-5 * (1.0 + p.abs()),
                    "dot n={n}: {p} vs {s}"
                );
                let mut y1 = values(n, 7);
                let mut y2 = y1.clone();
                portable::axpy(&mut y1, 0.37, &a);
                // SAFETY: AVX2 and FMA are available.
                unsafe { avx2::axpy(&mut y2, 0.37, &a) };
                for i in 0..n {
                    assert!((y1[i] - y2[i]).abs() < 1e-6, "axpy n={n} i={i}");
                }
            }
            return;
        }
        eprintln!("note: AVX2/FMA not available; only the portable path was tested");
    }
}
