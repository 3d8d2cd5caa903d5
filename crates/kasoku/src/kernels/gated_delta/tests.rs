//! Tests of the recurrent and chunked forms against the recurrence in f64, of the forms and
//! paths against each other, and timings of the crossover (ignored; run by hand).

use super::chunked::{chunk_head, gemm, ChunkScratch};
use super::recurrent::recurrent_head;
use super::tree::{replay_with, tree_recurrent_with};
use super::*;
use crate::test_util::Rng;

/// Random prepared inputs shaped like a real layer's (unit q/k, g ≤ 0, β in (0, 1)).
struct Case {
    dims: GdnDims,
    n: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    s0: Vec<f32>,
}

impl Case {
    fn new(dims: GdnDims, n: usize, seed: u64) -> Case {
        let mut r = Rng::new(seed);
        let mut q = r.vec(n * dims.nk * dims.dk, 1.0);
        let mut k = r.vec(n * dims.nk * dims.dk, 1.0);
        l2norm_heads(&mut q, dims.dk, 1.0 / (dims.dk as f32).sqrt());
        l2norm_heads(&mut k, dims.dk, 1.0);
        let v = r.vec(n * dims.nv * dims.dv, 2.0);
        let a = r.vec(n * dims.nv, 3.0);
        let b = r.vec(n * dims.nv, 3.0);
        let ssm_a: Vec<f32> = (0..dims.nv).map(|h| -(0.2 + h as f32 * 0.3)).collect();
        let dt_bias = r.vec(dims.nv, 1.0);
        let mut g = vec![0f32; n * dims.nv];
        let mut beta = vec![0f32; n * dims.nv];
        gates(&a, &b, &ssm_a, &dt_bias, &mut g, &mut beta);
        let s0 = r.vec(dims.state_len(), 0.5);
        Case {
            dims,
            n,
            q,
            k,
            v,
            g,
            beta,
            s0,
        }
    }
    fn inputs(&self) -> GdnInputs<'_> {
        GdnInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
        }
    }
    /// Tokens `t0..t1` only.
    fn slice(&self, t0: usize, t1: usize) -> GdnInputs<'_> {
        let (qk, vv, hv) = (
            self.dims.nk * self.dims.dk,
            self.dims.nv * self.dims.dv,
            self.dims.nv,
        );
        GdnInputs {
            q: &self.q[t0 * qk..t1 * qk],
            k: &self.k[t0 * qk..t1 * qk],
            v: &self.v[t0 * vv..t1 * vv],
            g: &self.g[t0 * hv..t1 * hv],
            beta: &self.beta[t0 * hv..t1 * hv],
        }
    }

    /// The recurrence exactly as written in the reference (decay, read, delta, rank-1
    /// update, read the updated state), in f64. Returns (outputs, final state).
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let GdnDims {
            nk,
            nv,
            dk,
            dv,
            map,
        } = self.dims;
        let mut s: Vec<f64> = self.s0.iter().map(|&x| x as f64).collect();
        let mut out = vec![0f32; self.n * nv * dv];
        for t in 0..self.n {
            for h in 0..nv {
                let kh = match map {
                    HeadMap::Grouped => h / (nv / nk),
                    HeadMap::Tiled => h % nk,
                };
                let q = &self.q[(t * nk + kh) * dk..][..dk];
                let k = &self.k[(t * nk + kh) * dk..][..dk];
                let v = &self.v[(t * nv + h) * dv..][..dv];
                let g = self.g[t * nv + h] as f64;
                let beta = self.beta[t * nv + h] as f64;
                let st = &mut s[h * dk * dv..(h + 1) * dk * dv];
                for x in st.iter_mut() {
                    *x *= g.exp();
                }
                let mut delta = vec![0f64; dv];
                for j in 0..dv {
                    let mem: f64 = (0..dk).map(|i| st[i * dv + j] * k[i] as f64).sum();
                    delta[j] = (v[j] as f64 - mem) * beta;
                }
                for i in 0..dk {
                    for j in 0..dv {
                        st[i * dv + j] += k[i] as f64 * delta[j];
                    }
                }
                for j in 0..dv {
                    let o: f64 = (0..dk).map(|i| st[i * dv + j] * q[i] as f64).sum();
                    out[(t * nv + h) * dv + j] = o as f32;
                }
            }
        }
        (out, s.iter().map(|&x| x as f32).collect())
    }
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn paths() -> Vec<Isa> {
    Isa::available().collect()
}

fn dims(nk: usize, nv: usize, dk: usize, dv: usize, map: HeadMap) -> GdnDims {
    GdnDims {
        nk,
        nv,
        dk,
        dv,
        map,
    }
}

#[test]
fn recurrent_matches_reference() {
    for (ci, d) in [
        dims(2, 4, 16, 24, HeadMap::Grouped),
        dims(2, 6, 8, 12, HeadMap::Tiled),
        dims(1, 1, 32, 32, HeadMap::Grouped),
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case::new(d, 9, 100 + ci as u64);
        let (want_o, want_s) = case.reference();
        for path in paths() {
            let mut s = case.s0.clone();
            let mut o = vec![0f32; case.n * d.nv * d.dv];
            recurrent_with(path, &d, &case.inputs(), case.n, &mut s, &mut o);
            let (eo, es) = (max_err(&o, &want_o), max_err(&s, &want_s));
            assert!(
                eo < 1e-4 && es < 1e-4,
                "{path:?} {d:?}: out {eo}, state {es}"
            );
        }
    }
}

#[test]
fn head_map_matters() {
    // With nv ≠ nk the two maps read different key heads: a wrong map must change outputs.
    let d = dims(2, 4, 8, 8, HeadMap::Grouped);
    let case = Case::new(d, 3, 5);
    let run = |dd: GdnDims| {
        let mut s = case.s0.clone();
        let mut o = vec![0f32; case.n * d.nv * d.dv];
        recurrent_with(Isa::PORTABLE, &dd, &case.inputs(), case.n, &mut s, &mut o);
        o
    };
    assert!(
        max_err(
            &run(d),
            &run(GdnDims {
                map: HeadMap::Tiled,
                ..d
            })
        ) > 1e-3
    );
    assert_eq!(d.key_head(1), 0);
    assert_eq!(
        GdnDims {
            map: HeadMap::Tiled,
            ..d
        }
        .key_head(1),
        1
    );
}

#[test]
fn chunked_matches_reference() {
    let d = dims(2, 4, 16, 24, HeadMap::Grouped);
    let case = Case::new(d, 150, 42);
    let (want_o, want_s) = case.reference();
    for path in paths() {
        for chunk in [1, 7, 16, 64, 200] {
            let mut s = case.s0.clone();
            let mut o = vec![0f32; case.n * d.nv * d.dv];
            chunked_with(path, &d, &case.inputs(), case.n, chunk, &mut s, &mut o);
            let (eo, es) = (max_err(&o, &want_o), max_err(&s, &want_s));
            assert!(
                eo < 2e-4 && es < 2e-4,
                "{path:?} chunk {chunk}: out {eo}, state {es}"
            );
        }
    }
    // Odd head sizes (no AVX2 recurrent path; gemm tails) and the tiled map.
    let d = dims(1, 3, 12, 20, HeadMap::Tiled);
    let case = Case::new(d, 37, 43);
    let (want_o, want_s) = case.reference();
    for path in paths() {
        let mut s = case.s0.clone();
        let mut o = vec![0f32; case.n * d.nv * d.dv];
        chunked_with(path, &d, &case.inputs(), case.n, 16, &mut s, &mut o);
        let (eo, es) = (max_err(&o, &want_o), max_err(&s, &want_s));
        assert!(
            eo < 2e-4 && es < 2e-4,
            "{path:?} odd dims: out {eo}, state {es}"
        );
    }
}

#[test]
fn pieces_equal_whole_and_forms_agree() {
    // Prefill in uneven pieces with the dispatcher (mixing both forms) = one recurrent pass.
    let d = dims(2, 4, 16, 16, HeadMap::Grouped);
    let case = Case::new(d, 140, 9);
    let mut s_whole = case.s0.clone();
    let mut o_whole = vec![0f32; case.n * d.nv * d.dv];
    recurrent(&d, &case.inputs(), case.n, &mut s_whole, &mut o_whole);
    let mut s = case.s0.clone();
    let mut o = vec![0f32; case.n * d.nv * d.dv];
    let vv = d.nv * d.dv;
    let mut t0 = 0;
    for p in [1, 70, 3, 15, 16, 35] {
        let t1 = t0 + p;
        gated_delta(&d, &case.slice(t0, t1), p, &mut s, &mut o[t0 * vv..t1 * vv]);
        t0 = t1;
    }
    assert_eq!(t0, case.n);
    let (eo, es) = (max_err(&o, &o_whole), max_err(&s, &s_whole));
    assert!(eo < 2e-4 && es < 2e-4, "out {eo}, state {es}");
}

#[test]
fn strong_decay_and_zero_length() {
    // Very negative g (state forgotten) must stay finite in the chunked form.
    let d = dims(1, 2, 8, 8, HeadMap::Grouped);
    let mut case = Case::new(d, 40, 3);
    for (i, g) in case.g.iter_mut().enumerate() {
        if i % 5 == 0 {
            *g = -200.0;
        }
    }
    let (want_o, want_s) = case.reference();
    for path in paths() {
        let mut s = case.s0.clone();
        let mut o = vec![0f32; case.n * d.nv * d.dv];
        chunked_with(path, &d, &case.inputs(), case.n, 16, &mut s, &mut o);
        assert!(o.iter().chain(&s).all(|x| x.is_finite()));
        assert!(max_err(&o, &want_o) < 2e-4 && max_err(&s, &want_s) < 2e-4);
    }
    let empty = Case::new(d, 0, 1);
    let mut s = empty.s0.clone();
    gated_delta(&d, &empty.inputs(), 0, &mut s, &mut []);
    assert_eq!(s, empty.s0);
}

#[test]
fn gemm_paths_agree() {
    let mut r = Rng::new(77);
    for &(m, kk, nn) in &[
        (1, 1, 1),
        (4, 16, 16),
        (7, 13, 37),
        (9, 64, 24),
        (130, 5, 8),
        (11, 20, 48),
        (3, 0, 5),
    ] {
        let (lda, ldb, ldc) = (kk + 3, nn + 1, nn + 2);
        let a = r.vec(m * lda, 1.0);
        let b = r.vec(kk.max(1) * ldb, 1.0);
        let c0 = r.vec(m * ldc, 1.0);
        // Direct definition.
        let mut want = c0.clone();
        for i in 0..m {
            for j in 0..nn {
                let x: f32 = (0..kk).map(|p| a[i * lda + p] * b[p * ldb + j]).sum();
                want[i * ldc + j] += x;
            }
        }
        for path in paths() {
            let mut c = c0.clone();
            gemm(path, m, kk, nn, &a, lda, &b, ldb, &mut c, ldc, true);
            assert!(max_err(&c, &want) < 1e-4, "{path:?} {m}x{kk}x{nn}");
            let mut c = c0.clone();
            gemm(path, m, kk, nn, &a, lda, &b, ldb, &mut c, ldc, false);
            for i in 0..m {
                for j in 0..ldc {
                    let w = if j < nn {
                        want[i * ldc + j] - c0[i * ldc + j]
                    } else {
                        c0[i * ldc + j]
                    };
                    assert!(
                        (c[i * ldc + j] - w).abs() < 1e-4,
                        "{path:?} overwrite {m}x{kk}x{nn}"
                    );
                }
            }
        }
    }
}

#[test]
fn gates_and_norm() {
    let mut g = [0f32; 4];
    let mut beta = [0f32; 4];
    // a + dt_bias = 0 → softplus = ln 2; = 30 → linear; b = 0 → β = 1/2.
    gates(
        &[0.0, 29.0, -1.0, 1.0],
        &[0.0, 100.0, -100.0, 2.0],
        &[-2.0, -0.5],
        &[0.0, 1.0],
        &mut g,
        &mut beta,
    );
    assert!((g[0] + 2.0 * std::f32::consts::LN_2).abs() < 1e-6);
    assert!((g[1] + 0.5 * 30.0).abs() < 1e-5);
    assert!((g[2] + 2.0 * (1.0f32 + (-1.0f32).exp()).ln()).abs() < 1e-6);
    assert!(
        (beta[0] - 0.5).abs() < 1e-7
            && beta[1] == 1.0
            && beta[2] < 1e-40
            && (beta[3] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6
    );
    let mut x = [3.0f32, 4.0, 0.0, 0.0];
    l2norm_heads(&mut x, 2, 0.5);
    assert!((x[0] - 0.3).abs() < 1e-6 && (x[1] - 0.4).abs() < 1e-6 && x[2] == 0.0);
}

/// Single-thread timing of one head of Qwen3.5-9B size (dk = dv = 128) in both forms
/// (run with `--ignored --nocapture`). Best of several trials: the machine is shared.
#[test]
#[ignore]
fn bench_crossover() {
    let d = dims(1, 1, 128, 128, HeadMap::Grouped);
    for &n in &[1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
        let case = Case::new(d, n, 1);
        let inp = case.inputs();
        let io = HeadIo {
            inp: &inp,
            dims: d,
            h: 0,
            kh: 0,
        };
        let mut o = vec![0f32; n * d.dv];
        let mut out = BlockMut::whole(&mut o, n);
        let reps = (16 / n).max(1);
        let time = |f: &mut dyn FnMut(&mut [f32])| {
            let mut s = case.s0.clone();
            f(&mut s);
            (0..400)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        f(&mut s);
                    }
                    t.elapsed().as_secs_f64() / (reps * n) as f64 * 1e9
                })
                .fold(f64::MAX, f64::min)
        };
        let mut line = format!("n={n:4} ns/token/head:");
        for path in paths() {
            let mut work = vec![0f32; 3 * d.dv];
            let r = time(&mut |s| recurrent_head(path, &io, n, s, &mut out, &mut work));
            line += &format!("  {path:?} recurrent {r:6.0}");
            for chunk in [16, 32, 64] {
                if chunk <= n.max(16) {
                    let mut buf = vec![0f32; ChunkScratch::len(chunk, d.dk, d.dv)];
                    let mut w = ChunkScratch::carve(&mut buf, chunk, d.dk, d.dv);
                    let c = time(&mut |s| {
                        let mut t0 = 0;
                        while t0 < n {
                            let c = chunk.min(n - t0);
                            chunk_head(path, &io, t0, c, s, &mut w, &mut out);
                            t0 += c;
                        }
                    });
                    line += &format!(" chunk{chunk} {c:6.0}");
                }
            }
        }
        println!("{line}");
    }
}

/// Single-thread GFLOP/s of `gemm` at the chunked form's shapes (`--ignored --nocapture`).
#[test]
#[ignore]
fn bench_gemm() {
    let mut r = Rng::new(5);
    for &(m, kk, nn) in &[
        (32usize, 128usize, 128usize),
        (128, 16, 128),
        (32, 128, 16),
        (16, 16, 128),
        (64, 128, 128),
        (128, 64, 128),
    ] {
        let a = r.vec(m * kk, 1.0);
        let b = r.vec(kk * nn, 1.0);
        let mut c = vec![0f32; m * nn];
        for path in paths() {
            let reps = 5;
            let best = (0..2000)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        gemm(path, m, kk, nn, &a, kk, &b, nn, &mut c, nn, true);
                    }
                    t.elapsed().as_secs_f64() / reps as f64
                })
                .fold(f64::MAX, f64::min);
            println!(
                "{m}x{kk}x{nn} {path:?}: {:.2} µs, {:.1} GFLOP/s",
                best * 1e6,
                2.0 * (m * kk * nn) as f64 / best * 1e-9
            );
        }
    }
}

// The tree form.

/// Every node's output equals single-token decoding of its path from the same state, bit
/// for bit; replaying a path's deltas gives decoding's final state bit for bit.
#[test]
fn nodes_and_commits_equal_decoding_their_paths() {
    let dims = GdnDims {
        nk: 2,
        nv: 4,
        dk: 16,
        dv: 24,
        map: HeadMap::Grouped,
    };
    //   0 → {1 → {2, 3 → 4}, 5}, and 6 a leaf under 0
    let parents = [usize::MAX, 0, 1, 1, 3, 0, 0];
    let n = parents.len();
    let mut rng = Rng::new(7);
    let (kd, vd) = (dims.nk * dims.dk, dims.nv * dims.dv);
    let mut q = rng.vec(n * kd, 0.3);
    let mut k = rng.vec(n * kd, 1.0);
    crate::kernels::gated_delta::l2norm_heads(&mut q, dims.dk, 0.25);
    crate::kernels::gated_delta::l2norm_heads(&mut k, dims.dk, 1.0);
    let v = rng.vec(n * vd, 1.0);
    let g: Vec<f32> = rng.vec(n * dims.nv, 1.0).iter().map(|x| -x.abs()).collect();
    let beta: Vec<f32> = rng
        .vec(n * dims.nv, 1.0)
        .iter()
        .map(|x| 0.5 + 0.4 * x)
        .collect();
    let s0 = rng.vec(dims.state_len(), 0.5);
    let inp = GdnInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
    };
    for path in paths() {
        let mut out = vec![0f32; n * vd];
        let mut deltas = vec![0f32; n * vd];
        tree_recurrent_with(path, &dims, &inp, &parents, &s0, &mut out, &mut deltas);
        for leaf in 0..n {
            let mut chain = vec![leaf];
            while parents[*chain.last().unwrap()] != usize::MAX {
                chain.push(parents[*chain.last().unwrap()]);
            }
            chain.reverse();
            // Decode the path one token at a time.
            let mut s = s0.clone();
            let mut replayed = s0.clone();
            for &t in &chain {
                let pick = |x: &[f32], w: usize| x[t * w..(t + 1) * w].to_vec();
                let (qt, kt, vt) = (pick(&q, kd), pick(&k, kd), pick(&v, vd));
                let (gt, bt) = (pick(&g, dims.nv), pick(&beta, dims.nv));
                let one = GdnInputs {
                    q: &qt,
                    k: &kt,
                    v: &vt,
                    g: &gt,
                    beta: &bt,
                };
                let mut o = vec![0f32; vd];
                recurrent_with(path, &dims, &one, 1, &mut s, &mut o);
                if t == leaf {
                    assert!(
                        o.iter()
                            .zip(&out[t * vd..])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{path:?}: node {t}"
                    );
                }
                replay_with(
                    path,
                    &dims,
                    &mut replayed,
                    &kt,
                    &gt,
                    &deltas[t * vd..][..vd],
                );
            }
            assert!(
                s.iter()
                    .zip(&replayed)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{path:?}: state after the path to {leaf}"
            );
        }
    }
}
