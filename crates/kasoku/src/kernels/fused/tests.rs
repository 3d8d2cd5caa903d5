//! The fused epilogues against their unfused kernels followed by the products' own
//! preparation, bit for bit, on every instruction-set path, for decode-, verify- and
//! prefill-sized batches (the last run over the pool), every rotation block and none.

use super::*;
use crate::kernels::activation::swiglu_inplace_with;
use crate::kernels::attention::{attention_with, AttnGeometry, KvHeads, TreeRows};
use crate::kernels::matmul::kasoku::Int8Acts;
use crate::kernels::matmul::{matmul_prepared_with, matmul_with, shares_prepared};
use crate::kernels::norm::rmsnorm_with;
use crate::quant::kasoku::{quantize, Rotation, TensorSpec};
use crate::test_util::Rng;

/// Matrices of `cols` columns in M and L, with rotations of every block and without.
fn matrices(rng: &mut Rng, cols: usize) -> Vec<MatMulWeight> {
    let mut specs = vec![
        TensorSpec::m(24, cols, 64, Some(Rotation::new(3, 32))),
        TensorSpec::l(16, cols, false, Some(Rotation::new(4, 128))),
        TensorSpec::m(8, cols, 32, None),
        TensorSpec::l(9, cols, true, Some(Rotation::new(5, 64))),
    ];
    specs.push(TensorSpec::m(17, cols, 128, Some(Rotation::new(6, 16))));
    specs
        .into_iter()
        .map(|s| {
            let w = rng.vec(s.rows * s.cols, 0.2);
            MatMulWeight::kasoku(quantize(s, &w).unwrap().view())
        })
        .collect()
}

/// Rows with a few outliers (what the rotation is for) and an all-zero row.
fn rows(rng: &mut Rng, n: usize, cols: usize) -> Vec<f32> {
    let mut x = rng.vec(n * cols, 1.0);
    for r in 0..n {
        x[r * cols + 7] *= 30.0;
    }
    if n > 2 {
        x[2 * cols..3 * cols].fill(0.0);
    }
    x
}

fn same_acts(a: &Int8Acts, b: &Int8Acts, what: &str) {
    assert_eq!(
        (a.n, a.cols, a.rotation),
        (b.n, b.cols, b.rotation),
        "{what}"
    );
    assert_eq!(a.qs, b.qs, "{what}: codes");
    assert!(
        a.d.iter()
            .zip(&b.d)
            .all(|(x, y)| x.to_bits() == y.to_bits())
            && a.d.len() == b.d.len(),
        "{what}: scales"
    );
    assert_eq!(
        (&a.nsum32, &a.nsum64),
        (&b.nsum32, &b.nsum64),
        "{what}: sums"
    );
    assert_eq!(
        (&a.n128sum32, &a.n128sum64),
        (&b.n128sum32, &b.n128sum64),
        "{what}: sums"
    );
}

/// The fused activations equal the unfused rows prepared by the product, and the product of
/// the fused ones equals `matmul` of the unfused rows, bit for bit.
fn check(isa: Isa, w: &MatMulWeight, fused: &Prepared, unfused: &[f32], n: usize, what: &str) {
    let k = w.kasoku.as_ref().unwrap();
    let mut want = Int8Acts::default();
    want.fill_with(isa, unfused, n, w.cols, k.signs());
    same_acts(&fused.acts.kasoku, &want, what);
    let mut y = vec![f32::NAN; n * w.rows];
    matmul_with(w, unfused, n, &mut y, isa);
    let mut z = vec![f32::NAN; n * w.rows];
    matmul_prepared_with(&[w], fused, n, &mut [&mut z], isa, 2);
    assert!(
        y.iter().zip(&z).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: products"
    );
}

#[test]
fn fused_rmsnorm_and_swiglu_give_the_unfused_bits_on_every_path() {
    let mut rng = Rng::new(1);
    let cols = 384;
    let ws = matrices(&mut rng, cols);
    let weight = rng.vec(cols, 2.0);
    // 1 (decode), 9 (verify), 200 (prefill: 76 800 values, rows over the pool).
    for n in [1, 9, 200] {
        let x = rows(&mut rng, n, cols);
        let up = rows(&mut rng, n, cols);
        for isa in Isa::available() {
            for w in &ws {
                let what = format!("{w:?} n={n} {isa:?}");
                let mut normed = vec![0f32; n * cols];
                rmsnorm_with(isa, &x, &weight, 1e-6, &mut normed);
                let mut p = Prepared::default();
                rmsnorm_with_fused(isa, &x, &weight, w, &mut p);
                check(isa, w, &p, &normed, n, &format!("rmsnorm {what}"));

                let mut prod = x.clone();
                swiglu_inplace_with(isa, &mut prod, &up);
                let mut p = Prepared::default();
                swiglu_with(isa, &x, &up, w, &mut p);
                check(isa, w, &p, &prod, n, &format!("swiglu {what}"));
            }
        }
    }
}

fn rmsnorm_with_fused(isa: Isa, x: &[f32], weight: &[f32], w: &MatMulWeight, p: &mut Prepared) {
    super::rmsnorm_with(isa, x, weight, 1e-6, w, p)
}

#[test]
fn fused_attention_gives_the_unfused_bits_on_every_path() {
    let mut rng = Rng::new(2);
    let geo = AttnGeometry {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
    };
    let q_row = geo.n_heads * geo.head_dim;
    let ws = matrices(&mut rng, q_row);
    let past = 300; // more than one key chunk
    for n in [1, 5, 80] {
        let total = past + n;
        let keys: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(total * 64, 1.0)).collect();
        let values: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(total * 64, 1.0)).collect();
        let kr: Vec<&[f32]> = keys.iter().map(|k| &k[..]).collect();
        let vr: Vec<&[f32]> = values.iter().map(|v| &v[..]).collect();
        let q = rng.vec(n * q_row, 1.0);
        // A chain, and the same rows as the nodes of a tree (each a child of the one before
        // it but every third, a root).
        let parents: Vec<usize> = (0..n)
            .map(|i| if i % 3 == 0 { usize::MAX } else { i - 1 })
            .collect();
        for tree in [
            None,
            Some(TreeRows {
                parents: &parents,
                first: 0,
            }),
        ] {
            let args = AttnArgs {
                geo,
                q: &q,
                keys: KvHeads::F32(&kr),
                values: KvHeads::F32(&vr),
                past,
                scale: 0.125,
                tree,
            };
            for isa in Isa::available() {
                let mut out = vec![0f32; n * q_row];
                attention_with(isa, &args, &mut out);
                for w in &ws {
                    let mut p = Prepared::default();
                    attend_with(isa, &args, w, &mut p);
                    let what = format!("attention {w:?} n={n} tree={} {isa:?}", tree.is_some());
                    check(isa, w, &p, &out, n, &what);
                }
            }
        }
    }
}

#[test]
fn one_prepared_buffer_serves_every_matrix_of_its_rotation_and_is_reused() {
    let mut rng = Rng::new(3);
    let cols = 256;
    let rot = Some(Rotation::new(9, 32));
    let make = |rng: &mut Rng, s: TensorSpec| {
        MatMulWeight::kasoku(quantize(s, &rng.vec(s.rows * s.cols, 0.2)).unwrap().view())
    };
    let q = make(&mut rng, TensorSpec::m(32, cols, 64, rot));
    let v = make(&mut rng, TensorSpec::l(16, cols, false, rot));
    let other = make(
        &mut rng,
        TensorSpec::m(16, cols, 64, Some(Rotation::new(10, 32))),
    );
    let plain = MatMulWeight::new(
        crate::quant::DType::F32,
        8,
        cols,
        &rng.vec(8 * cols, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    assert!(shares_prepared(&[&q, &v]));
    assert!(!shares_prepared(&[&q, &other]) && !shares_prepared(&[&q, &plain]));
    assert!(!shares_prepared(&[]));
    let weight = rng.vec(cols, 1.0);
    let mut p = Prepared::default();
    // A wider fill first: the buffer is then reused for fewer, narrower rows.
    let wide = make(&mut rng, TensorSpec::m(8, 2 * cols, 64, rot));
    rmsnorm(
        &rows(&mut rng, 6, 2 * cols),
        &rng.vec(2 * cols, 1.0),
        1e-6,
        &wide,
        &mut p,
    );
    let x = rows(&mut rng, 3, cols);
    rmsnorm(&x, &weight, 1e-6, &q, &mut p);
    let mut normed = vec![0f32; 3 * cols];
    crate::kernels::norm::rmsnorm(&x, &weight, 1e-6, &mut normed);
    let (mut yq, mut yv) = (vec![0f32; 3 * 32], vec![0f32; 3 * 16]);
    crate::kernels::matmul::matmul_prepared(&[&q, &v], &p, 3, &mut [&mut yq, &mut yv]);
    let (mut wq, mut wv) = (vec![0f32; 3 * 32], vec![0f32; 3 * 16]);
    crate::kernels::matmul::matmul_many(&[&q, &v], &normed, 3, &mut [&mut wq, &mut wv]);
    assert_eq!((yq, yv), (wq, wv));
}

#[test]
#[should_panic(expected = "another rotation")]
fn prepared_rows_refuse_a_matrix_of_another_rotation() {
    let mut rng = Rng::new(4);
    let cols = 128;
    let a = MatMulWeight::kasoku(
        quantize(
            TensorSpec::m(8, cols, 64, Some(Rotation::new(1, 32))),
            &rng.vec(8 * cols, 0.1),
        )
        .unwrap()
        .view(),
    );
    let b = MatMulWeight::kasoku(
        quantize(
            TensorSpec::m(8, cols, 64, Some(Rotation::new(2, 32))),
            &rng.vec(8 * cols, 0.1),
        )
        .unwrap()
        .view(),
    );
    let mut p = Prepared::default();
    rmsnorm(&rng.vec(cols, 1.0), &rng.vec(cols, 1.0), 1e-6, &a, &mut p);
    let mut y = vec![0f32; 8];
    crate::kernels::matmul::matmul_prepared(&[&b], &p, 1, &mut [&mut y]);
}

#[test]
fn the_switch_can_be_set_per_thread() {
    force(Some(false));
    assert!(!enabled());
    force(Some(true));
    assert!(enabled());
    force(None);
}
