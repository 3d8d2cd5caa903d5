//! Tests of the products on every format and batch size against f64 products of the
//! dequantized weights, of batch and split independence, of several matrices in one job, and
//! of `first_rows`.

use super::*;
use crate::quant::legacy::tests::random_blocks;
use crate::test_util::Rng;

const ALL: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
];

fn random_matrix(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    match dtype {
        DType::F32 => (0..rows * cols)
            .flat_map(|_| rng.f32().to_le_bytes())
            .collect(),
        DType::F16 => (0..rows * cols)
            .flat_map(|_| half::f16::from_f32(rng.f32()).to_le_bytes())
            .collect(),
        DType::BF16 => (0..rows * cols)
            .flat_map(|_| half::bf16::from_f32(rng.f32()).to_le_bytes())
            .collect(),
        DType::Q4K | DType::Q5K | DType::Q6K => {
            // Random bytes with finite f16 scales (Q4_K/Q5_K: d, dmin; Q6_K: d at the end).
            let mut b = rng.bytes(rows * dtype.bytes_for(cols).unwrap());
            let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                for &o in at {
                    blk[o..o + 2]
                        .copy_from_slice(&half::f16::from_f32(rng.f32() * 0.05).to_le_bytes());
                }
            }
            b
        }
        _ => random_blocks(rng, dtype.block_bytes(), rows * cols / dtype.block_size()),
    }
}

/// Checks `y` against f64 products of the dequantized weights: floats to 1e-6 of the sum of
/// |terms|, int8-activation formats to the activation rounding bound (half a step of
/// max|x|/127 per value, the step itself rounded to f16) plus float noise.
fn check(dtype: DType, rows: usize, cols: usize, wb: &[u8], x: &[f32], n: usize, y: &[f32]) {
    let mut wf = vec![0f32; rows * cols];
    crate::quant::dequantize(dtype, wb, &mut wf);
    for r in 0..n {
        let xr = &x[r * cols..(r + 1) * cols];
        for j in 0..rows {
            let wr = &wf[j * cols..(j + 1) * cols];
            let exact: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = xr
                .iter()
                .zip(wr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let tol = if dtype.is_quantized() {
                let amax = xr.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                let wabs: f64 = wr.iter().map(|v| v.abs() as f64).sum();
                wabs * amax * (1.0 / 254.0 + 1.0 / 4096.0) + 1e-5 * scale + 1e-6
            } else {
                1e-6 * scale + 1e-7
            };
            let got = y[r * rows + j] as f64;
            assert!(
                (got - exact).abs() <= tol,
                "{dtype} n={n} r={r} j={j}: {got} vs {exact} (tol {tol})"
            );
        }
    }
}

#[test]
fn every_format_and_batch_size_matches_the_reference() {
    let mut rng = Rng(1);
    for dtype in ALL {
        let (rows, cols) = (37, 96);
        let wb = random_matrix(&mut rng, dtype, rows, cols);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        let reference = MatMulWeight::reference(dtype, rows, cols, &wb).unwrap();
        for n in [1, 2, 3, 4, 7, 8, 16, 64, 100] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; n * rows];
                matmul_with(&w, &x, n, &mut y, isa);
                check(dtype, rows, cols, &wb, &x, n, &y);
            }
            // The dequantizing path, through the same tasks.
            let mut y = vec![f32::NAN; n * rows];
            matmul(&reference, &x, n, &mut y);
            check(dtype, rows, cols, &wb, &x, n, &y);
        }
    }
}

#[test]
fn several_matrices_in_one_job_match_each_alone() {
    let mut rng = Rng(4);
    let cols = 256;
    // Mixed families and heights, one of them empty, two sharing their activations.
    let shapes = [
        (DType::Q4_0, 70),
        (DType::F16, 9),
        (DType::Q6K, 33),
        (DType::Q8_0, 0),
        (DType::Q4_0, 17),
    ];
    let ws: Vec<MatMulWeight> = shapes
        .iter()
        .map(|&(dtype, rows)| {
            let wb = random_matrix(&mut rng, dtype, rows, cols);
            MatMulWeight::new(dtype, rows, cols, &wb).unwrap()
        })
        .collect();
    let refs: Vec<&MatMulWeight> = ws.iter().collect();
    for n in [1, 5] {
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        matmul_many(&refs, &x, n, &mut slices);
        for (w, got) in ws.iter().zip(&outs) {
            let mut alone = vec![0f32; n * w.rows];
            matmul(w, &x, n, &mut alone);
            assert!(
                got.iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} n={n}",
                w.dtype
            );
        }
    }
}

#[test]
fn odd_row_counts() {
    let mut rng = Rng(2);
    for dtype in ALL {
        for rows in [1, 5, 8, 9, 15, 17, 33] {
            let cols = 64;
            let wb = random_matrix(&mut rng, dtype, rows, cols);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            let n = 3;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut y = vec![f32::NAN; n * rows];
            matmul(&w, &x, n, &mut y);
            check(dtype, rows, cols, &wb, &x, n, &y);
        }
    }
}

#[test]
fn a_row_result_does_not_depend_on_batch_or_split() {
    let mut rng = Rng(3);
    for dtype in ALL {
        let (rows, cols, n) = (203, 320, 11);
        let wb = random_matrix(&mut rng, dtype, rows, cols);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        let isa = Isa::detect();
        let mut one = vec![0f32; n * rows];
        matmul_split(&w, &x, n, &mut one, isa, 1);
        let mut many = vec![0f32; n * rows];
        matmul_split(&w, &x, n, &mut many, isa, 7);
        assert!(
            one.iter()
                .zip(&many)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{dtype}: split"
        );
        // Row r alone gives the same bits as row r in the batch.
        for r in [0, 5, 10] {
            let mut y1 = vec![0f32; rows];
            matmul_with(&w, &x[r * cols..(r + 1) * cols], 1, &mut y1, isa);
            assert!(
                y1.iter()
                    .zip(&one[r * rows..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}: row {r}"
            );
        }
    }
}

#[test]
fn prefill_sized_batches_equal_single_rows() {
    // Large enough for the parallel activation quantizer and several outer row blocks.
    let mut rng = Rng(4);
    for dtype in [DType::Q4_0, DType::Q5_1, DType::Q8_0, DType::BF16] {
        let (rows, cols, n) = (24, 2048, 70);
        let wb = random_matrix(&mut rng, dtype, rows, cols);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; n * rows];
        matmul(&w, &x, n, &mut y);
        for r in 0..n {
            let mut y1 = vec![0f32; rows];
            matmul(&w, &x[r * cols..(r + 1) * cols], 1, &mut y1);
            assert!(
                y1.iter()
                    .zip(&y[r * rows..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}: row {r}"
            );
        }
    }
}

#[test]
fn first_rows_compute_what_the_full_matrix_computes() {
    let mut rng = Rng(9);
    let k_quants = [DType::Q4K, DType::Q5K, DType::Q6K];
    for dtype in ALL.into_iter().chain(k_quants) {
        // 11 K-quant super-blocks per row: more than one column panel.
        let (rows, cols, n) = (37, 11 * 256, 3);
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let wb = random_matrix(&mut rng, dtype, rows, cols);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        // The fast kernels, and the reference path.
        for build in [MatMulWeight::new, MatMulWeight::reference] {
            let w = build(dtype, rows, cols, &wb).unwrap();
            let mut full = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut full);
            for keep in [8, 13, 37] {
                let part = w.first_rows(keep);
                // As large as those rows packed alone.
                let alone = build(dtype, keep, cols, &wb[..keep * row_bytes]).unwrap();
                assert_eq!(part.size_bytes(), alone.size_bytes(), "{dtype} keep={keep}");
                let mut y = vec![0f32; n * keep];
                matmul(&part, &x, n, &mut y);
                for r in 0..n {
                    assert_eq!(
                        y[r * keep..(r + 1) * keep],
                        full[r * rows..r * rows + keep],
                        "{dtype}"
                    );
                }
            }
        }
    }
}

#[test]
fn size_errors_are_values() {
    assert!(matches!(
        MatMulWeight::new(DType::Q4_0, 2, 48, &[0; 36]),
        Err(MatMulError::Columns { .. })
    ));
    assert!(matches!(
        MatMulWeight::new(DType::Q4_0, 2, 64, &[0; 71]),
        Err(MatMulError::Size { .. })
    ));
    assert!(MatMulWeight::new(DType::F16, 2, 3, &[0; 12]).is_ok());
}

/// Activations that are not numbers (a broken checkpoint's) give garbage, never a trap, on
/// every format and path: on AVX2 a NaN quantizes to the integer-indefinite code, whose block
/// sum overflowed the Q4_0/Q5_0/Q8_0 offset correction (found by the gguf fuzz target).
#[test]
fn non_finite_activations_do_not_trap() {
    let mut rng = Rng(9);
    let (rows, cols) = (8, 256);
    for dtype in ALL.into_iter().chain([DType::Q4K, DType::Q5K, DType::Q6K]) {
        let wb = random_matrix(&mut rng, dtype, rows, cols);
        let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX] {
            for n in [1, 3] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|c| if c % 3 == 0 { bad } else { 1.0 })
                    .collect();
                for isa in Isa::available() {
                    let mut y = vec![0f32; n * rows];
                    matmul_with(&w, &x, n, &mut y, isa);
                }
            }
        }
    }
}
