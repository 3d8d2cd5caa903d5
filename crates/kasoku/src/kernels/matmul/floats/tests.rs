//! Tests of the float kernels: the packed layout, and products against f64 on every path.

use super::*;
use crate::kernels::matmul::{matmul_with, MatMulWeight};
use crate::test_util::Rng;

fn encode(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
    }
}

#[test]
fn pack_interleaves_columns_of_eight_rows() {
    let (rows, cols) = (9, 3);
    let v: Vec<f32> = (0..rows * cols).map(|k| k as f32).collect();
    let p = Floats.pack(DType::F32, rows, cols, &encode(DType::F32, &v));
    assert_eq!(p.len(), 2 * cols * GROUP * 4);
    // Group 0, column 1, row 2 → W[2][1] = 7; group 1, column 2, row 8 → W[8][2] = 26.
    assert_eq!(element(DType::F32, &p, GROUP + 2), 7.0);
    assert_eq!(element(DType::F32, &p, (cols + 2) * GROUP), 26.0);
    // Padding rows are zero.
    assert_eq!(element(DType::F32, &p, (cols + 2) * GROUP + 1), 0.0);
}

#[test]
fn float_products_match_f64_and_paths_agree_bit_for_bit() {
    let mut rng = Rng(21);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (rows, cols, n) = (19, 1031, 6);
        let wv: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
        let bytes = encode(dtype, &wv);
        let mut wf = vec![0f32; rows * cols];
        crate::quant::dequantize(dtype, &bytes, &mut wf);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        let w = MatMulWeight::new(dtype, rows, cols, &bytes).unwrap();
        let mut ys = Vec::new();
        for isa in Isa::available() {
            let mut y = vec![0f32; n * rows];
            matmul_with(&w, &x, n, &mut y, isa);
            for r in 0..n {
                for j in 0..rows {
                    let exact: f64 = (0..cols)
                        .map(|c| x[r * cols + c] as f64 * wf[j * cols + c] as f64)
                        .sum();
                    let scale: f64 = (0..cols)
                        .map(|c| (x[r * cols + c] * wf[j * cols + c]).abs() as f64)
                        .sum();
                    let got = y[r * rows + j] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-6 * scale,
                        "{dtype} {isa:?}: {got} vs {exact}"
                    );
                }
            }
            ys.push(y);
        }
        for y in &ys[1..] {
            assert!(
                y.iter()
                    .zip(&ys[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}"
            );
        }
    }
}
