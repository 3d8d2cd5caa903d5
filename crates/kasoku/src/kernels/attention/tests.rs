//! Tests of attention against an f64 reference, of batch rows and tree nodes against plain
//! decoding (bit for bit), and of the AVX2 path against the portable one.

use super::*;
use crate::test_util::Rng;

/// Splits a `[position][kv_head][head_dim]` array into one `[position][head_dim]` per head.
pub(super) fn head_major(x: &[f32], n_kv: usize, hd: usize) -> Vec<Vec<f32>> {
    (0..n_kv)
        .map(|h| {
            x.chunks(n_kv * hd)
                .flat_map(|row| row[h * hd..(h + 1) * hd].to_vec())
                .collect()
        })
        .collect()
}

/// `attention` on position-major test arrays (the natural layout of the reference).
#[allow(clippy::too_many_arguments)]
pub(super) fn pm(
    isa: Option<Isa>,
    geo: AttnGeometry,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    scale: f32,
    out: &mut [f32],
) {
    let (kh, vh) = (
        head_major(k, geo.n_kv_heads, geo.head_dim),
        head_major(v, geo.n_kv_heads, geo.head_dim),
    );
    let kr: Vec<&[f32]> = kh.iter().map(|h| &h[..]).collect();
    let vr: Vec<&[f32]> = vh.iter().map(|h| &h[..]).collect();
    match isa {
        None => attention(geo, q, &kr, &vr, past, scale, out),
        Some(isa) => {
            let args = AttnArgs {
                geo,
                q,
                keys: KvHeads::F32(&kr),
                values: KvHeads::F32(&vr),
                past,
                scale,
                tree: None,
            };
            attention_with(isa, &args, out)
        }
    }
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).vec(n, 1.0)
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
        (9, 3, 64, 1500, 1),
        (4, 2, 32, 600, 37),
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
        pm(None, geo, &q, &k, &v, past, scale as f32, &mut got);
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
    let (past, n) = (300usize, 9usize);
    let q = values(n * 64, 11);
    let k = values((past + n) * 32, 12);
    let v = values((past + n) * 32, 13);
    let mut batch = vec![0f32; q.len()];
    pm(None, geo, &q, &k, &v, past, 0.25, &mut batch);
    for i in 0..n {
        let mut one = vec![0f32; 64];
        let kv_len = (past + i + 1) * 32;
        pm(
            None,
            geo,
            &q[i * 64..(i + 1) * 64],
            &k[..kv_len],
            &v[..kv_len],
            past + i,
            0.25,
            &mut one,
        );
        // The same bits: decode and verification batches split keys the same way.
        for d in 0..64 {
            assert_eq!(one[d].to_bits(), batch[i * 64 + d].to_bits());
        }
    }
}

/// Every node of a tree gets the bits a single-row call over its path gives (context,
/// then its ancestors and itself), on both paths, with caches that span several chunks.
#[test]
fn tree_nodes_equal_plain_decoding_of_their_paths() {
    let geo = AttnGeometry {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 24,
    };
    let kvd = 2 * 24;
    //        0
    //      / | \
    //     1  4  6
    //    / \  \
    //   2   3  5   (and 7 a second root)
    let parents = [usize::MAX, 0, 1, 1, 0, 4, 0, usize::MAX];
    let n = parents.len();
    for past in [0usize, 5, 127, 300] {
        let q = values(n * 6 * 24, 21 + past as u64);
        let k = values((past + n) * kvd, 22);
        let v = values((past + n) * kvd, 23);
        let (kh, vh) = (head_major(&k, 2, 24), head_major(&v, 2, 24));
        let kr: Vec<&[f32]> = kh.iter().map(|h| &h[..]).collect();
        let vr: Vec<&[f32]> = vh.iter().map(|h| &h[..]).collect();
        let (mut nodes, mut start) = (Vec::new(), Vec::new());
        let whole = TreeRows {
            parents: &parents,
            first: 0,
        };
        let paths = TreePaths::build(whole, &mut nodes, &mut start);
        for isa in Isa::available() {
            let mut tree = vec![0f32; q.len()];
            let args = AttnArgs {
                geo,
                q: &q,
                keys: KvHeads::F32(&kr),
                values: KvHeads::F32(&vr),
                past,
                scale: 0.2,
                tree: Some(whole),
            };
            attention_with(isa, &args, &mut tree);
            // Computing only the later nodes (a tree grown level by level) gives their
            // rows the same bits.
            for first in [3usize, 5] {
                let mut part = vec![0f32; (n - first) * 144];
                let later = AttnArgs {
                    q: &q[first * 144..],
                    tree: Some(TreeRows {
                        parents: &parents,
                        first,
                    }),
                    ..args
                };
                attention_with(isa, &later, &mut part);
                assert!(
                    part.iter()
                        .zip(&tree[first * 144..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "past {past} rows from {first}"
                );
            }
            for i in 0..n {
                let path = paths.path(i);
                let mut kp = k[..past * kvd].to_vec();
                let mut vp = v[..past * kvd].to_vec();
                for &j in path {
                    kp.extend_from_slice(&k[(past + j) * kvd..(past + j + 1) * kvd]);
                    vp.extend_from_slice(&v[(past + j) * kvd..(past + j + 1) * kvd]);
                }
                let mut one = vec![0f32; 6 * 24];
                let qi = &q[i * 144..(i + 1) * 144];
                pm(
                    Some(isa),
                    geo,
                    qi,
                    &kp,
                    &vp,
                    past + path.len() - 1,
                    0.2,
                    &mut one,
                );
                assert!(
                    one.iter()
                        .zip(&tree[i * 144..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "past {past} node {i} {isa:?}"
                );
            }
        }
    }
}

#[test]
fn portable_and_avx2_agree() {
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = Isa::available().find(|isa| isa.avx2()) {
        for &n in &[1usize, 7, 8, 16, 31, 64, 128, 257] {
            let a = values(n, n as u64);
            let b = values(n, 100 + n as u64);
            // SAFETY: `isa` has AVX2 (and FMA), which the `avx2::` functions need.
            let s = unsafe { avx2::dot(&a, &b) };
            let p = Portable::dot(&a, &b);
            assert!(
                (p - s).abs() < 1e-5 * (1.0 + p.abs()),
                "dot n={n}: {p} vs {s}"
            );
            let mut y1 = values(n, 7);
            let mut y2 = y1.clone();
            Portable::axpy(&mut y1, 0.37, &a);
            // SAFETY: as above.
            unsafe { avx2::axpy(&mut y2, 0.37, &a) };
            for i in 0..n {
                assert!((y1[i] - y2[i]).abs() < 1e-6, "axpy n={n} i={i}");
            }
            // exp over the softmax range, against f64.
            let mut e1: Vec<f32> = a.iter().map(|v| v * 50.0 - 50.0).collect();
            let src = e1.clone();
            // SAFETY: as above.
            let sum = unsafe { avx2::exp_sum(&mut e1, 1.5) };
            let mut want_sum = 0f64;
            for (e, x) in e1.iter().zip(&src) {
                // The argument is rounded to f32 first, as the kernel does.
                let w = ((*x - 1.5f32) as f64).exp();
                want_sum += w;
                assert!(
                    (*e as f64 - w).abs() <= 1e-6 * w + 1e-37,
                    "exp({x} - 1.5) = {e}, want {w}"
                );
            }
            // (Values below e^-87 are flushed to 0, as for each element above.)
            assert!((sum as f64 - want_sum).abs() <= 1e-5 * want_sum + 1e-37 * n as f64);
        }
        // The whole kernel, both paths, including chunked caches.
        for &(nh, nkv, hd, past, n) in &[
            (4usize, 2usize, 16usize, 0usize, 5usize),
            (9, 3, 64, 900, 1),
            (6, 2, 40, 300, 20),
        ] {
            let geo = AttnGeometry {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
            };
            let q = values(n * nh * hd, 5);
            let k = values((past + n) * nkv * hd, 6);
            let v = values((past + n) * nkv * hd, 7);
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            pm(Some(Isa::PORTABLE), geo, &q, &k, &v, past, 0.3, &mut a);
            pm(Some(isa), geo, &q, &k, &v, past, 0.3, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() < 1e-5 * (1.0 + x.abs()),
                    "{nh}/{nkv}x{hd} past {past} n {n}: {x} vs {y}"
                );
            }
        }
        return;
    }
    eprintln!("note: AVX2/FMA not available; only the portable path was tested");
}

/// `x` stored as `S`, and those stored values back as f32.
fn stored<S: Stored>(x: &[f32]) -> (Vec<S>, Vec<f32>) {
    let mut s = vec![S::default(); x.len() / S::VALUES];
    S::store(x, &mut s);
    let mut back = vec![0f32; x.len()];
    S::load(&s, &mut back);
    (s, back)
}

/// Per KV head, `x` (position-major) stored as `S`, and its dequantized f32 copy.
fn stored_heads<S: Stored>(x: &[f32], n_kv: usize, hd: usize) -> (Vec<Vec<S>>, Vec<Vec<f32>>) {
    head_major(x, n_kv, hd)
        .iter()
        .map(|h| stored::<S>(h))
        .unzip()
}

/// Attention over an f16 or q8_0 cache gives, on every path, the bits of the same path over
/// that cache dequantized to f32 (the stored rows are read directly, converted by one rule):
/// decode rows, verification and prefill batches, trees, every blocked and per-key head size.
#[test]
fn stored_caches_equal_attention_over_their_dequantized_values() {
    fn check<S: Stored>(name: &str) {
        let parents = [usize::MAX, 0, 1, 1, 0, 4, 0, usize::MAX];
        for &(nh, nkv, hd, past, n, tree) in &[
            (4usize, 2usize, 32usize, 0usize, 5usize, false),
            (12, 2, 64, 300, 1, false),
            (12, 2, 64, 300, 8, true),
            (6, 1, 128, 700, 3, false),
            (8, 2, 128, 200, 90, false),
            (4, 2, 256, 150, 2, false),
            (4, 2, 96, 130, 8, true),
        ] {
            let geo = AttnGeometry {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
            };
            let q = values(n * nh * hd, 30 + hd as u64);
            let k = values((past + n) * nkv * hd, 31 + past as u64);
            let v = values((past + n) * nkv * hd, 32 + n as u64);
            let (ks, kf) = stored_heads::<S>(&k, nkv, hd);
            let (vs, vf) = stored_heads::<S>(&v, nkv, hd);
            let (ks, vs): (Vec<&[S]>, Vec<&[S]>) = (
                ks.iter().map(|h| &h[..]).collect(),
                vs.iter().map(|h| &h[..]).collect(),
            );
            let (kf, vf): (Vec<&[f32]>, Vec<&[f32]>) = (
                kf.iter().map(|h| &h[..]).collect(),
                vf.iter().map(|h| &h[..]).collect(),
            );
            let tree = tree.then(|| TreeRows {
                parents: &parents[..n],
                first: 0,
            });
            let mut want_portable = vec![0f32; q.len()];
            for isa in Isa::available() {
                let args = AttnArgs {
                    geo,
                    q: &q,
                    keys: S::heads(&ks),
                    values: S::heads(&vs),
                    past,
                    scale: 0.15,
                    tree,
                };
                let (mut got, mut want) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                attention_with(isa, &args, &mut got);
                let f32_args = AttnArgs {
                    keys: KvHeads::F32(&kf),
                    values: KvHeads::F32(&vf),
                    ..args
                };
                attention_with(isa, &f32_args, &mut want);
                let case = format!("{name} {nh}/{nkv}x{hd} past {past} n {n} {isa:?}");
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{case}: not the bits of the dequantized cache"
                );
                // The paths agree as they do over f32 caches.
                if isa == Isa::PORTABLE {
                    want_portable = got;
                } else {
                    for (x, y) in want_portable.iter().zip(&got) {
                        assert!((x - y).abs() < 1e-5 * (1.0 + x.abs()), "{case}: {x} vs {y}");
                    }
                }
            }
        }
    }
    check::<half::f16>("f16");
    check::<BlockQ8_0>("q8_0");
}

/// The AVX2 conversions of stored rows give the portable conversions' bits (f16 rows of any
/// length, q8_0 blocks including zero and extreme scales).
#[test]
fn stored_rows_convert_alike_on_every_path() {
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = Isa::available().find(|isa| isa.avx2()) {
        let _ = isa;
        for n in [1usize, 7, 8, 37, 64, 256] {
            let mut x = values(n, 40 + n as u64);
            x[0] = 65504.0 * 2.0; // beyond f16: stored as infinity
            let (s, want) = stored::<half::f16>(&x);
            let mut got = vec![0f32; n];
            // SAFETY: `isa` has AVX2, FMA and F16C.
            unsafe { avx2::load_row(&s, &mut got) };
            assert!(got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        let mut x = values(128, 41);
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        x[64..96].iter_mut().for_each(|v| *v *= 1e4);
        x[96..128].iter_mut().for_each(|v| *v *= 1e-6);
        let (s, want) = stored::<BlockQ8_0>(&x);
        let mut got = vec![0f32; 128];
        // SAFETY: as above.
        unsafe { avx2::load_row(&s, &mut got) };
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        return;
    }
    eprintln!("note: AVX2/FMA not available; only the portable path was tested");
}

/// q8_0 rows are stored exactly as GGML stores Q8_0 (its reference quantizer, byte for byte),
/// within half a step of each value; f16 rows within half an f16 ulp.
#[test]
fn stored_formats_are_ggmls() {
    let x = values(4 * 32, 50);
    let (blocks, back) = stored::<BlockQ8_0>(&x);
    let mut bytes = vec![0u8; 4 * 34];
    crate::quant::legacy::quantize_q8_0(&x, &mut bytes);
    let ours: Vec<u8> = blocks
        .iter()
        .flat_map(|b| {
            let mut v = b.d.to_le_bytes().to_vec();
            v.extend(b.qs.iter().map(|&q| q as u8));
            v
        })
        .collect();
    assert_eq!(ours, bytes);
    assert_eq!(std::mem::size_of::<BlockQ8_0>(), 34);
    for (xb, (b, yb)) in x.chunks(32).zip(blocks.iter().zip(back.chunks(32))) {
        let step = b.d.to_f32();
        for (a, y) in xb.iter().zip(yb) {
            // Half a step, plus the scale's own f16 rounding over up to 127 steps.
            assert!(
                (a - y).abs() <= 0.5 * step + 127.0 * step * 4.9e-4,
                "{a} vs {y}"
            );
        }
    }
    let (_, back) = stored::<half::f16>(&x);
    for (a, y) in x.iter().zip(&back) {
        assert!((a - y).abs() <= a.abs() * 4.9e-4 + 6e-8, "{a} vs {y}");
    }
}
