//! Tests of the legacy-format kernels: the activation quantizer, the packed layout, products
//! against the formats' arithmetic in f64, and every path against the portable one bit for bit.

use super::*;
use crate::kernels::matmul::{matmul_with, MatMulWeight};
use crate::quant::legacy::tests::random_blocks;
use crate::test_util::Rng;

const FORMATS: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
];

fn random_weight(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    random_blocks(rng, dtype.block_bytes(), rows * cols / QK)
}

/// `y = x·Wᵀ` in f64 from the weights' codes and scales, with `x` first rounded through the
/// activation quantizer as the kernels use it (f16-rounded `d`, and `s = f16(d·Σq)` for the
/// formats with a min), so only float rounding separates it from the kernels.
fn expected(dtype: DType, rows: usize, cols: usize, wb: &[u8], x: &[f32], n: usize) -> Vec<f64> {
    let bb = dtype.block_bytes();
    let nb = cols / QK;
    let f16r = |v: f32| f16::from_f32(v).to_f32() as f64;
    let mut y = vec![0f64; n * rows];
    for r in 0..n {
        for j in 0..rows {
            let mut total = 0f64;
            for b in 0..nb {
                let mut q = [0i8; QK];
                let (d, sum) = quantize_block(&x[r * cols + b * QK..][..QK], &mut q);
                let blk = &wb[(j * nb + b) * bb..][..bb];
                let dw = crate::quant::legacy::f16_at(blk, 0) as f64;
                let codes: [i32; QK] = match dtype {
                    DType::Q8_0 => std::array::from_fn(|v| blk[2 + v] as i8 as i32),
                    _ => crate::quant::legacy::block_codes(blk).map(|c| c as i32),
                };
                let off = match dtype {
                    DType::Q4_0 => 8,
                    DType::Q5_0 => 16,
                    _ => 0,
                };
                let dot: f64 = codes
                    .iter()
                    .zip(q)
                    .map(|(&c, qx)| ((c - off) * qx as i32) as f64)
                    .sum();
                total += dw * f16r(d) * dot;
                if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
                    total += crate::quant::legacy::f16_at(blk, 2) as f64 * f16r(d * sum as f32);
                }
            }
            y[r * rows + j] = total;
        }
    }
    y
}

#[test]
fn quantize_block_rounds_to_nearest_even_and_sums() {
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    x[3] = 0.49;
    x[4] = -127.0;
    let mut q = [0i8; 32];
    let (d, s) = quantize_block(&x, &mut q);
    assert_eq!(d, 1.0);
    assert_eq!(&q[..5], &[127, 2, -4, 0, -127]);
    assert_eq!(s, 127 + 2 - 4 - 127);
}

#[test]
fn pack_then_unpack_gives_the_gguf_codes() {
    let mut rng = Rng(11);
    for dtype in FORMATS {
        let (rows, cols) = (11, 64);
        let wb = random_weight(&mut rng, dtype, rows, cols);
        let packed = pack(dtype, rows, cols, &wb);
        assert_eq!(packed.len(), 2 * 2 * GROUP * dtype.block_bytes());
        let mut deq = vec![0f32; cols];
        for j in 0..rows {
            crate::quant::dequantize(
                dtype,
                &wb[j * 2 * dtype.block_bytes()..][..2 * dtype.block_bytes()],
                &mut deq,
            );
            for b in 0..2 {
                let (g, i) = (j / GROUP, j % GROUP);
                let p = &packed[(g * 2 + b) * GROUP * dtype.block_bytes()..]
                    [..GROUP * dtype.block_bytes()];
                let q = unpack_block(dtype, p);
                let (m_off, _, _) = offsets(dtype);
                let d = f16::from_le_bytes([p[2 * i], p[2 * i + 1]]).to_f32();
                let m = if m_off != 0 {
                    f16::from_le_bytes([p[m_off + 2 * i], p[m_off + 2 * i + 1]]).to_f32()
                } else {
                    0.0
                };
                let off = match dtype {
                    DType::Q4_0 => 8,
                    DType::Q5_0 => 16,
                    _ => 0,
                };
                for v in 0..QK {
                    assert_eq!(
                        deq[b * QK + v],
                        d * (q[i][v] - off) as f32 + m,
                        "{dtype} row {j} value {v}"
                    );
                }
            }
        }
    }
}

#[test]
fn dot_products_match_dequantize_then_f32() {
    let mut rng = Rng(5);
    for dtype in FORMATS {
        let (rows, cols, n) = (16, 256, 3);
        let wb = random_weight(&mut rng, dtype, rows, cols);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        let want = expected(dtype, rows, cols, &wb, &x, n);
        // Also the unquantized product, to bound the int8 activation error.
        let mut wf = vec![0f32; rows * cols];
        crate::quant::dequantize(dtype, &wb, &mut wf);
        for isa in Isa::available() {
            let mut y = vec![0f32; n * rows];
            matmul_with(&w, &x, n, &mut y, isa);
            for r in 0..n {
                for j in 0..rows {
                    let (a, b) = (y[r * rows + j] as f64, want[r * rows + j]);
                    let scale: f64 = (0..cols)
                        .map(|c| (x[r * cols + c] * wf[j * cols + c]).abs() as f64)
                        .sum();
                    assert!(
                        (a - b).abs() <= 1e-5 * scale + 1e-6,
                        "{dtype} {isa:?}: {a} vs {b}"
                    );
                    let exact: f64 = (0..cols)
                        .map(|c| x[r * cols + c] as f64 * wf[j * cols + c] as f64)
                        .sum();
                    // int8 rounding: each activation moves by at most half a step of its
                    // block (max|x|/254), plus the f16 rounding of the step (2^-12 relative).
                    let bound: f64 = (0..cols)
                        .map(|c| {
                            let blk = &x[r * cols + c / QK * QK..][..QK];
                            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                            wf[j * cols + c].abs() as f64 * amax * (1.0 / 254.0 + 1.0 / 4096.0)
                        })
                        .sum();
                    assert!(
                        (a - exact).abs() <= bound + 1e-6,
                        "{dtype}: {a} vs exact {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_path_gives_the_same_bits() {
    let mut rng = Rng(9);
    for dtype in FORMATS {
        let (rows, cols) = (40, 32 * 70);
        let wb = random_weight(&mut rng, dtype, rows, cols);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        for n in [1, 2, 3, 4, 5, 8, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32() * 4.0).collect();
            // Both activation quantizers, every kernel.
            let mut tiles = Vec::new();
            for isa in Isa::available() {
                let mut acts = Acts::default();
                prepare(dtype, &x, n, cols, isa, &mut acts.q8);
                for path in Isa::available() {
                    let mut tile = vec![f32::NAN; n * rows];
                    let t = Tile {
                        w: &w,
                        x: &x,
                        acts: &acts,
                        n,
                        rows: 0..rows,
                        isa: path,
                    };
                    compute_tile(&t, &mut tile);
                    tiles.push((isa, path, tile));
                }
            }
            let (_, _, first) = &tiles[0];
            for (isa, path, t) in &tiles[1..] {
                assert!(
                    t.iter().zip(first).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype} n={n}: {isa:?} {path:?} differs from portable"
                );
            }
        }
    }
}
