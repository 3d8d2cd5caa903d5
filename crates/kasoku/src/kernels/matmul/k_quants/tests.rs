//! Tests of the K-quant kernels: tiles against GGML's dot bit for bit on every path, the
//! panel layout, real GGUF rows, the SIMD activation quantizer, and extreme codes.

use super::*;
use crate::kernels::matmul::matmul;
use crate::quant::k_quants::{quantize_row_q8_k, vec_dot, BlockQ8K};

const DTYPES: [DType; 3] = [DType::Q4K, DType::Q5K, DType::Q6K];

use crate::test_util::Rng;

/// Random GGUF rows of `dtype`: random bytes, with finite random f16 scales.
fn random_rows(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b: Vec<u8> = (0..rows * dtype.bytes_for(cols).unwrap())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for blk in b.chunks_exact_mut(dtype.block_bytes()) {
        let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
        for &o in at {
            let v = f16::from_f32(rng.f32() * 0.05);
            blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    b
}

fn random_x(len: usize, rng: &mut Rng) -> Vec<f32> {
    (0..len).map(|_| rng.f32() * 2.0).collect()
}

/// GGML's dot of every (activation row, weight row) pair: `n × rows`.
fn reference(dtype: DType, w: &[u8], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f32> {
    let rb = dtype.bytes_for(cols).unwrap();
    let q: Vec<Vec<BlockQ8K>> = x.chunks_exact(cols).map(quantize_row_q8_k).collect();
    let mut y = vec![0f32; n * rows];
    for r in 0..n {
        for j in 0..rows {
            y[r * rows + j] = vec_dot(dtype, &w[j * rb..(j + 1) * rb], &q[r]);
        }
    }
    y
}

#[test]
fn tiles_match_ggml_dot_bit_for_bit_on_every_path() {
    let mut rng = Rng(0x5eed);
    // A partial row group; one panel, and three (the last partial).
    for (rows, cols, dtype) in DTYPES
        .iter()
        .flat_map(|&d| [(21, 768, d), (21, (2 * PANEL + 3) * QK_K, d)])
    {
        let wb = random_rows(dtype, rows, cols, &mut rng);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        for n in [1, 2, 3, 4, 5, 7, 8, 9, 13] {
            let x = random_x(n * cols, &mut rng);
            let expect = reference(dtype, &wb, rows, cols, &x, n);
            let act = acts_of(&w, &x, n);
            for path in Isa::available() {
                // Whole range, and a range that starts and ends inside row groups.
                for range in [0..rows, 3..19, 8..16, 20..21] {
                    let len = range.len();
                    let mut tile = vec![f32::NAN; n * len];
                    tile_of(&w, &act, n, range.clone(), &mut tile, path);
                    for r in 0..n {
                        for (k, j) in range.clone().enumerate() {
                            assert_eq!(
                                tile[r * len + k].to_bits(),
                                expect[r * rows + j].to_bits(),
                                "{dtype} {path:?} n={n} r={r} j={j}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The activation blocks of `x` for `w`.
fn acts_of(w: &MatMulWeight, x: &[f32], n: usize) -> Vec<u8> {
    let mut acts = Vec::new();
    prepare(w, x, n, Isa::detect(), &mut acts);
    acts
}

/// [`compute_tile`] with work memory of its own.
fn tile_of(
    w: &MatMulWeight,
    acts: &[u8],
    n: usize,
    rows: Range<usize>,
    tile: &mut [f32],
    isa: Isa,
) {
    let mut work = vec![f32::NAN; sums_len(n, rows.len())];
    compute_tile(w, acts, n, rows, tile, &mut work, isa);
}

#[test]
fn the_layout_places_every_block_once() {
    for nb in [1, PANEL - 1, PANEL, PANEL + 1, 3 * PANEL + 5] {
        let (groups, pbb) = (3, 7);
        let mut seen = vec![false; groups * nb];
        for g in 0..groups {
            for s in 0..nb {
                let at = block_offset(groups, nb, pbb, g, s);
                assert_eq!(at % pbb, 0);
                assert!(!std::mem::replace(&mut seen[at / pbb], true), "nb={nb}");
            }
        }
        assert!(seen.iter().all(|&b| b), "nb={nb}");
    }
}

/// Real weights: the first 20 rows of the first Q4_K, Q5_K and Q6_K matrices of the cached
/// Qwen2.5-Coder-0.5B Q4_K_M file, when it is there (`shared/models/fetch.sh`).
#[test]
fn real_gguf_rows_match_ggml_dot() {
    let Some(home) = std::env::var_os("HOME") else {
        return;
    };
    let path = std::path::Path::new(&home)
        .join(".cache/kasoku/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let Ok(file) = crate::format::gguf::GgufFile::open(&path) else {
        return;
    };
    let mut rng = Rng(11);
    let mut seen = Vec::new();
    for info in file.tensor_infos() {
        if !DTYPES.contains(&info.dtype) || info.shape.len() != 2 || seen.contains(&info.dtype) {
            continue;
        }
        seen.push(info.dtype);
        let t = file.tensor(&info.name).unwrap();
        let (rows, cols) = (20.min(info.shape[0]), info.shape[1]);
        let wb = &t.data.as_slice()[..rows * info.dtype.bytes_for(cols).unwrap()];
        let w = MatMulWeight::new(info.dtype, rows, cols, wb).unwrap();
        let n = 3;
        let x = random_x(n * cols, &mut rng);
        let mut y = vec![0f32; n * rows];
        matmul(&w, &x, n, &mut y);
        assert_eq!(
            y,
            reference(info.dtype, wb, rows, cols, &x, n),
            "{}",
            info.name
        );
    }
    assert!(
        seen.contains(&DType::Q4K) && seen.contains(&DType::Q6K),
        "{seen:?}"
    );
}

#[test]
fn simd_activation_quantizer_matches_the_scalar_one() {
    let mut rng = Rng(0xac7);
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-30f32, 1e-3, 1.0, 3e4, 1e30] {
        blocks.push((0..QK_K).map(|_| rng.f32() * scale).collect());
    }
    // Ties: max 127 makes iscale −1, so the halves round to even.
    blocks.push(
        (0..QK_K)
            .map(|i| (i % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32)
            .collect(),
    );
    blocks.push(
        (0..QK_K)
            .map(|i| if i == 77 { -3.0 } else { 0.0 })
            .collect(),
    );
    blocks.push(
        (0..QK_K)
            .map(|i| if i % 9 == 0 { 2.5 } else { -2.5 })
            .collect(),
    );
    blocks.push(vec![0.0; QK_K]);
    blocks.push(vec![-0.0; QK_K]);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut b: Vec<f32> = (0..QK_K).map(|_| rng.f32()).collect();
        b[100] = bad;
        blocks.push(b);
    }
    for (k, xs) in blocks.iter().enumerate() {
        let mut expect = vec![0u8; ACT_BLOCK];
        write_act_block(&kq::quantize_block_q8_k(xs), &mut expect);
        for isa in Isa::available() {
            let mut got = vec![0xA5u8; ACT_BLOCK];
            quantize_act_block(isa, xs, &mut got);
            assert_eq!(got, expect, "block {k} {isa:?}");
        }
    }
}

#[test]
fn zero_columns_give_zeros() {
    for dtype in DTYPES {
        let w = MatMulWeight::new(dtype, 5, 0, &[]).unwrap();
        let mut y = vec![1f32; 2 * 5];
        matmul(&w, &[], 2, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }
}

#[test]
fn extreme_codes_and_scales_do_not_overflow() {
    // Every code and scale at its maximum, activations all at ±127: the 16-bit partial sums
    // are at their largest.
    let (rows, cols) = (8, 512);
    for dtype in DTYPES {
        for fill in [0xFFu8, 0x80, 0x7F] {
            let mut wb = vec![fill; rows * dtype.bytes_for(cols).unwrap()];
            for blk in wb.chunks_exact_mut(dtype.block_bytes()) {
                let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
                for &o in at {
                    blk[o..o + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                }
            }
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            for xv in [1.0f32, -1.0] {
                let x = vec![xv; 3 * cols];
                let expect = reference(dtype, &wb, rows, cols, &x, 3);
                let act = acts_of(&w, &x, 3);
                for path in Isa::available() {
                    let mut y = vec![0f32; 3 * rows];
                    tile_of(&w, &act, 3, 0..rows, &mut y, path);
                    assert_eq!(y, expect, "{dtype} fill={fill:#x} x={xv} {path:?}");
                }
            }
        }
    }
}

#[test]
fn matmul_matches_dequantized_product() {
    let mut rng = Rng(42);
    let (rows, cols) = (37, 512);
    for dtype in DTYPES {
        let wb = random_rows(dtype, rows, cols, &mut rng);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        let rb = dtype.bytes_for(cols).unwrap();
        let mut wf = vec![0f32; rows * cols];
        for j in 0..rows {
            crate::quant::dequantize(
                dtype,
                &wb[j * rb..(j + 1) * rb],
                &mut wf[j * cols..(j + 1) * cols],
            );
        }
        for n in [1, 2, 3, 4, 8, 16, 64, 100] {
            let x = random_x(n * cols, &mut rng);
            let mut y = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut y);
            let exact = reference(dtype, &wb, rows, cols, &x, n);
            assert_eq!(y, exact, "{dtype} n={n}: not GGML's dot");
            for r in 0..n {
                let xr = &x[r * cols..(r + 1) * cols];
                let q = quantize_row_q8_k(xr);
                for j in 0..rows {
                    let wr = &wf[j * cols..(j + 1) * cols];
                    let f: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    // Q8_K rounds each activation by at most |d|/2 of its block.
                    let bound: f64 = wr
                        .chunks_exact(QK_K)
                        .zip(&q)
                        .map(|(wb, qb)| {
                            wb.iter().map(|v| v.abs() as f64).sum::<f64>() * qb.d.abs() as f64 / 2.0
                        })
                        .sum();
                    let err = (y[r * rows + j] as f64 - f).abs();
                    assert!(
                        err <= bound * 1.01 + 1e-4,
                        "{dtype} n={n} r={r} j={j}: err {err} bound {bound}"
                    );
                }
            }
        }
    }
}
