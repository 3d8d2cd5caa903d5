//! kasoku's formats M and L behind the [`Format`] interface, so that a `MatMulWeight` holding a
//! [`KasokuMatrix`](super::kasoku::KasokuMatrix) joins `matmul` and `matmul_many` jobs like any
//! other format: its activations are rotated and quantized once per job for every matrix of
//! the same rotation (q, k and v; gate and up), and its tiles are computed by the kernels of
//! `kasoku.rs` on the path of the job's instruction set. Rows give the same bits whatever
//! their batch and whatever the task split, as `kasoku.rs` guarantees.

use super::kasoku::{self, Path};
use super::{Acts, Format, MatMulWeight, PackedBytes, Tile};
use crate::kernels::simd::Isa;
use crate::quant::DType;

/// The family of kasoku's formats.
pub(crate) struct KasokuFamily;

impl Format for KasokuFamily {
    fn pack(&self, _dtype: DType, _rows: usize, _cols: usize, _bytes: &[u8]) -> PackedBytes {
        // kasoku matrices are packed from their quantized parts by `MatMulWeight::kasoku`;
        // no GGUF type maps to this family.
        PackedBytes::copy_of(&[])
    }

    fn prepare(&self, w: &MatMulWeight, x: &[f32], n: usize, isa: Isa, acts: &mut Acts) {
        let k = w.kasoku.as_ref().expect("a kasoku-format matrix");
        acts.kasoku.fill_with(isa, x, n, w.cols, k.signs());
    }

    fn work_len(&self, _w: &MatMulWeight, n: usize, _rows: usize) -> usize {
        kasoku::work_len(n)
    }

    fn compute_tile(&self, t: &Tile, out: &mut [f32], work: &mut [f32]) {
        let k = t.w.kasoku.as_ref().expect("a kasoku-format matrix");
        kasoku::compute_tile(
            k,
            &t.acts.kasoku,
            t.rows.clone(),
            out,
            Path::of(t.isa),
            work,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::{matmul_parts, MatMulWeight};
    use crate::kernels::simd::Isa;
    use crate::quant::kasoku::{quantize, Rotation, TensorSpec};
    use crate::quant::DType;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32
            })
            .collect()
    }

    #[test]
    fn matmul_weights_of_kasoku_formats_give_the_kernels_bits_on_every_isa() {
        let cols = 256;
        let rot = Some(Rotation::new(5, 32));
        let specs = [
            TensorSpec::m(40, cols, 64, rot),
            TensorSpec::l(24, cols, false, rot),
            TensorSpec::m(17, cols, 128, None),
            TensorSpec::l(9, cols, true, Some(Rotation::new(6, 32))),
        ];
        let qs: Vec<_> = specs
            .iter()
            .enumerate()
            .map(|(i, &s)| quantize(s, &values(i as u64 + 1, s.rows * cols)).unwrap())
            .collect();
        let ws: Vec<MatMulWeight> = qs.iter().map(|q| MatMulWeight::kasoku(q.view())).collect();
        // A GGUF matrix in the same job.
        let f32w: Vec<u8> = values(99, 16 * cols)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let g = MatMulWeight::new(DType::F32, 16, cols, &f32w).unwrap();
        for n in [1, 5, 12] {
            let x = values(n as u64 + 50, n * cols);
            let mut first: Option<Vec<Vec<f32>>> = None;
            for isa in Isa::available() {
                let all: Vec<&MatMulWeight> = ws.iter().chain([&g]).collect();
                let mut outs: Vec<Vec<f32>> = all.iter().map(|w| vec![0f32; n * w.rows]).collect();
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_parts(&all, &x, n, &mut ys, isa, 3);
                for (w, got) in ws.iter().zip(&outs) {
                    let mut want = vec![0f32; n * w.rows];
                    super::kasoku::matmul_prepared_with(
                        &[w.kasoku.as_ref().unwrap()],
                        &[&super::kasoku::Int8Acts::new(
                            &x,
                            n,
                            cols,
                            w.kasoku.as_ref().unwrap().signs(),
                        )],
                        &mut [&mut want],
                        super::Path::of(isa),
                        1,
                    );
                    assert!(
                        want.iter()
                            .zip(got)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?} n={n} {isa:?}",
                        w
                    );
                }
                match &first {
                    None => first = Some(outs),
                    Some(f) => assert_eq!(f, &outs, "{isa:?} differs from portable"),
                }
            }
        }
        // The first rows of a matrix compute what they computed in it.
        let x = values(7, 3 * cols);
        let mut full = vec![0f32; 3 * ws[0].rows];
        super::super::matmul(&ws[0], &x, 3, &mut full);
        let head = ws[0].first_rows(11);
        let mut part = vec![0f32; 3 * 11];
        super::super::matmul(&head, &x, 3, &mut part);
        for r in 0..3 {
            assert_eq!(&part[r * 11..(r + 1) * 11], &full[r * 40..r * 40 + 11]);
        }
        assert!(head.size_bytes() < ws[0].size_bytes());
    }
}
