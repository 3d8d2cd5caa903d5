//! Every kernel family of every backend against the f64 reference on random shapes: matmul on
//! every weight format, the embedding gather (GGUF and kasoku tables), RMSNorm, RoPE, the
//! activations, attention (chain and tree, over f32 / f16 / q8_0 caches), Gated DeltaNet
//! (recurrent, chunked, tree, replay) and conv1d (chain, tree, commit); and the moves model
//! code makes (row copies, to and from the host, the LM head into host memory, the KV store);
//! the fused epilogues (RMSNorm, SwiGLU, attention into products on kasoku's formats; on the
//! CPU also bit for bit against the unfused). The bounds are relative errors: float work in f32 against
//! f64 (1e-5..1e-4), and products whose activations the backend quantizes to 8 bits (block
//! formats: 3e-2); each would be of order 1 for a wrong result.

use half::f16;

use super::cpu::Cpu;
use super::reference::Reference;
use super::*;
use crate::kernels::attention::{AttnGeometry, BlockQ8_0, KvHeads, Stored, TreeRows};
use crate::kernels::conv1d::ConvTaps;
use crate::kernels::gated_delta::{GdnDims, HeadMap};
use crate::kernels::rope::{Rope, RopeLayout, RopeScaling};
use crate::test_util::Rng;

/// `‖a − b‖ / ‖b‖` (or `‖a‖` when `b` is zero).
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let e = rel(got, want);
    assert!(e <= tol, "{what}: rel error {e:.3e} > {tol:.0e}");
    assert!(got.iter().all(|v| v.is_finite()), "{what}: not finite");
}

/// The bytes of a random `rows × cols` matrix of `dtype` with small finite scales.
fn matrix_bytes(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match dtype {
        DType::F32 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F16 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::BF16 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => {
            let mut b = rng.bytes(rows * dtype.bytes_for(cols).unwrap());
            // Where each format keeps its f16 scales (and minimums).
            let scales: &[usize] = match dtype {
                DType::Q6K => &[208],
                DType::Q4K | DType::Q5K | DType::Q4_1 | DType::Q5_1 => &[0, 2],
                _ => &[0],
            };
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                for &o in scales {
                    let s = 0.01 + 0.02 * (rng.f32() + 1.0);
                    blk[o..o + 2].copy_from_slice(&f16::from_f32(s).to_le_bytes());
                }
            }
            b
        }
    }
}

const FORMATS: [DType; 11] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

fn matmul_out<B: Backend<Buffer = [f32]>>(
    b: &B,
    w: &B::Weight,
    x: &[f32],
    n: usize,
    rows: usize,
) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * rows];
    b.matmul(MatMul { w, x, n, y: &mut y });
    y
}

#[test]
fn matmul_every_format() {
    let mut rng = Rng::new(1);
    for dtype in FORMATS {
        for (rows, cols) in [(16, 256), (24, 512)] {
            let bytes = matrix_bytes(&mut rng, dtype, rows, cols);
            let cw = Cpu.pack(dtype, rows, cols, &bytes).unwrap();
            let rw = Reference.pack(dtype, rows, cols, &bytes).unwrap();
            for n in [1, 3, 8] {
                let x = rng.vec(n * cols, 1.0);
                let tol = if dtype.is_quantized() { 3e-2 } else { 1e-5 };
                close(
                    &format!("matmul {dtype} {rows}x{cols} n={n}"),
                    &matmul_out(&Cpu, &cw, &x, n, rows),
                    &matmul_out(&Reference, &rw, &x, n, rows),
                    tol,
                );
            }
        }
        // Several matrices in one job give each matrix's own product.
        let (r2, cols) = (8, 256);
        let (b1, b2) = (
            matrix_bytes(&mut rng, dtype, 16, cols),
            matrix_bytes(&mut rng, dtype, r2, cols),
        );
        let x = rng.vec(3 * cols, 1.0);
        let many = |b: &dyn Fn(&mut [f32], &mut [f32])| {
            let (mut y1, mut y2) = (vec![f32::NAN; 3 * 16], vec![f32::NAN; 3 * r2]);
            b(&mut y1, &mut y2);
            (y1, y2)
        };
        let (c1, c2) = (
            Cpu.pack(dtype, 16, cols, &b1).unwrap(),
            Cpu.pack(dtype, r2, cols, &b2).unwrap(),
        );
        let (f1, f2) = (
            Reference.pack(dtype, 16, cols, &b1).unwrap(),
            Reference.pack(dtype, r2, cols, &b2).unwrap(),
        );
        let (cy1, cy2) = many(&|y1, y2| {
            Cpu.matmul_many(MatMulMany {
                ws: &[&c1, &c2],
                x: &x,
                n: 3,
                ys: &mut [y1, y2],
            })
        });
        let (ry1, ry2) = many(&|y1, y2| {
            Reference.matmul_many(MatMulMany {
                ws: &[&f1, &f2],
                x: &x,
                n: 3,
                ys: &mut [y1, y2],
            })
        });
        assert_eq!(cy1, matmul_out(&Cpu, &c1, &x, 3, 16), "matmul_many {dtype}");
        let tol = if dtype.is_quantized() { 3e-2 } else { 1e-5 };
        close(&format!("matmul_many {dtype} 1"), &cy1, &ry1, tol);
        close(&format!("matmul_many {dtype} 2"), &cy2, &ry2, tol);
        // Wrong sizes are refused by both.
        assert!(Cpu.pack(dtype, 2, 256, &[0; 3]).is_err());
        assert!(Reference.pack(dtype, 2, 256, &[0; 3]).is_err());
    }
}

/// kasoku's formats (rotated and not): the CPU product against the reference's product of the
/// dequantized matrix with the unquantized activations; the difference is the int8 rounding of
/// the rotated activations (3e-2 as for the other block formats). Several matrices in one job,
/// of one rotation (they share the activations), keep each one's bits.
#[test]
fn matmul_kasoku_formats() {
    use crate::quant::kasoku::{quantize, Rotation, TensorSpec};
    let mut rng = Rng::new(4);
    let (rows, cols) = (24, 512);
    let rot = Some(Rotation::new(17, 32));
    let specs = [
        TensorSpec::m(rows, cols, 64, rot),
        TensorSpec::m(rows, cols, 32, None),
        TensorSpec::m(rows, cols, 128, rot),
        TensorSpec::l(rows, cols, false, rot),
        TensorSpec::l(rows, cols, true, None),
    ];
    let mut cpu = Vec::new();
    for spec in specs {
        let q = quantize(spec, &rng.vec(rows * cols, 0.1)).unwrap();
        let (cw, rw) = (Cpu.pack_kasoku(q.view()), Reference.pack_kasoku(q.view()));
        for n in [1, 3, 8] {
            let x = rng.vec(n * cols, 1.0);
            close(
                &format!("matmul {spec} n={n}"),
                &matmul_out(&Cpu, &cw, &x, n, rows),
                &matmul_out(&Reference, &rw, &x, n, rows),
                3e-2,
            );
        }
        cpu.push(cw);
    }
    let x = rng.vec(5 * cols, 1.0);
    let mut outs = vec![vec![0f32; 5 * rows]; 3];
    let [a, b, c] = &mut outs[..] else {
        unreachable!()
    };
    Cpu.matmul_many(MatMulMany {
        ws: &[&cpu[0], &cpu[2], &cpu[3]],
        x: &x,
        n: 5,
        ys: &mut [a, b, c],
    });
    for (w, got) in [&cpu[0], &cpu[2], &cpu[3]].iter().zip(&outs) {
        assert_eq!(got, &matmul_out(&Cpu, w, &x, 5, rows));
    }
}

/// An epilogue's rows through [`Backend::fused`], then their product with `w`.
fn fused_out<'a, 'k, B: Backend<Buffer = [f32]> + 'k>(
    b: &B,
    w: &'a B::Weight,
    epilogue: Epilogue<'a, 'k, B>,
    n: usize,
    rows: usize,
) -> Vec<f32> {
    let mut p = B::Prepared::default();
    b.fused(Fused {
        w,
        epilogue,
        out: &mut p,
    });
    let mut y = vec![f32::NAN; n * rows];
    b.matmul_prepared(MatMulPrepared {
        ws: &[w],
        x: &p,
        n,
        ys: &mut [&mut y],
    });
    y
}

/// The fused epilogues (RMSNorm, SwiGLU, attention as a chain and as a tree) into products
/// on kasoku's formats: the CPU against the reference (the int8 rounding of the rotated
/// activations: 3e-2), and against its own unfused kernels and product, bit for bit.
#[test]
fn fused_epilogues_on_kasoku_formats() {
    use crate::quant::kasoku::{quantize, Rotation, TensorSpec};
    let mut rng = Rng::new(9);
    let geo = AttnGeometry {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
    };
    let (rows, cols) = (24, 256);
    let past = 40;
    let parents = [usize::MAX, 0, 0, 1, 3, 2];
    for spec in [
        TensorSpec::m(rows, cols, 64, Some(Rotation::new(3, 32))),
        TensorSpec::m(rows, cols, 32, None),
        TensorSpec::l(rows, cols, false, Some(Rotation::new(4, 64))),
    ] {
        let q = quantize(spec, &rng.vec(rows * cols, 0.1)).unwrap();
        let (cw, rw) = (Cpu.pack_kasoku(q.view()), Reference.pack_kasoku(q.view()));
        assert!(Reference.can_prepare(&[&rw]));
        for (n, tree) in [
            (1, None),
            (6, None),
            (
                6,
                Some(TreeRows {
                    parents: &parents,
                    first: 0,
                }),
            ),
        ] {
            let what = |e: &str| format!("fused {e} {spec} n={n} tree={}", tree.is_some());
            let x = rng.vec(n * cols, 1.0);
            let up = rng.vec(n * cols, 1.0);
            let weight = rng.vec(cols, 1.5);
            let c = fused_out(
                &Cpu,
                &cw,
                Epilogue::RmsNorm {
                    x: &x,
                    weight: &weight,
                    eps: 1e-6,
                },
                n,
                rows,
            );
            let r = fused_out(
                &Reference,
                &rw,
                Epilogue::RmsNorm {
                    x: &x,
                    weight: &weight,
                    eps: 1e-6,
                },
                n,
                rows,
            );
            close(&what("rmsnorm"), &c, &r, 3e-2);
            let mut normed = vec![0f32; n * cols];
            Cpu.rmsnorm(Norm {
                x: &x,
                weight: &weight,
                eps: 1e-6,
                out: &mut normed,
            });
            assert_eq!(
                c,
                matmul_out(&Cpu, &cw, &normed, n, rows),
                "{}",
                what("rmsnorm")
            );

            let c = fused_out(&Cpu, &cw, Epilogue::SwiGlu { gate: &x, up: &up }, n, rows);
            let r = fused_out(
                &Reference,
                &rw,
                Epilogue::SwiGlu { gate: &x, up: &up },
                n,
                rows,
            );
            close(&what("swiglu"), &c, &r, 3e-2);
            let mut prod = x.clone();
            Cpu.activation(Activation::SwiGlu {
                gate: &mut prod,
                up: &up,
            });
            assert_eq!(
                c,
                matmul_out(&Cpu, &cw, &prod, n, rows),
                "{}",
                what("swiglu")
            );

            let total = past + n;
            let keys: Vec<Vec<f32>> = kv_rows(&mut rng, 2, total, 64);
            let values: Vec<Vec<f32>> = kv_rows(&mut rng, 2, total, 64);
            let (ks, vs): (Vec<&[f32]>, Vec<&[f32]>) = (
                keys.iter().map(|h| &h[..]).collect(),
                values.iter().map(|h| &h[..]).collect(),
            );
            let (k, v) = (KvHeads::F32(&ks), KvHeads::F32(&vs));
            let scale = 0.125;
            let c = fused_out(
                &Cpu,
                &cw,
                Epilogue::Attention {
                    geo,
                    q: &x,
                    keys: k,
                    values: v,
                    past,
                    scale,
                    tree,
                },
                n,
                rows,
            );
            let r = fused_out(
                &Reference,
                &rw,
                Epilogue::Attention {
                    geo,
                    q: &x,
                    keys: k,
                    values: v,
                    past,
                    scale,
                    tree,
                },
                n,
                rows,
            );
            close(&what("attention"), &c, &r, 3e-2);
            let mut out = vec![0f32; n * cols];
            Cpu.attention(Attend {
                geo,
                q: &x,
                keys: k,
                values: v,
                past,
                scale,
                tree,
                out: &mut out,
            });
            assert_eq!(
                c,
                matmul_out(&Cpu, &cw, &out, n, rows),
                "{}",
                what("attention")
            );
        }
    }
}

#[test]
fn gather_rmsnorm_rope_activations() {
    let mut rng = Rng::new(2);
    // Embedding rows.
    for dtype in [DType::F16, DType::Q8_0] {
        let (vocab, dim) = (10, 64);
        let table = matrix_bytes(&mut rng, dtype, vocab, dim);
        let tokens = [3u32, 0, 9, 3];
        let run = |b: &dyn Fn(&mut [f32])| {
            let mut out = vec![f32::NAN; tokens.len() * dim];
            b(&mut out);
            out
        };
        let c = run(&|out| {
            Cpu.gather(Gather {
                table: Table::Raw {
                    dtype,
                    bytes: &table,
                },
                dim,
                tokens: &tokens,
                out,
            })
        });
        let r = run(&|out| {
            Reference.gather(Gather {
                table: Table::Raw {
                    dtype,
                    bytes: &table,
                },
                dim,
                tokens: &tokens,
                out,
            })
        });
        assert_eq!(c, r, "gather {dtype}");
    }
    // RMSNorm.
    for d in [8, 64, 100] {
        let x = rng.vec(3 * d, 2.0);
        let w = rng.vec(d, 1.0);
        let norm = |b: &dyn Fn(&mut [f32])| {
            let mut out = vec![f32::NAN; x.len()];
            b(&mut out);
            out
        };
        let c = norm(&|out| {
            Cpu.rmsnorm(Norm {
                x: &x,
                weight: &w,
                eps: 1e-6,
                out,
            })
        });
        let r = norm(&|out| {
            Reference.rmsnorm(Norm {
                x: &x,
                weight: &w,
                eps: 1e-6,
                out,
            })
        });
        close(&format!("rmsnorm d={d}"), &c, &r, 1e-5);
        let (mut ci, mut ri) = (x.clone(), x.clone());
        Cpu.rmsnorm_inplace(NormInPlace {
            x: &mut ci,
            weight: &w,
            eps: 1e-6,
        });
        Reference.rmsnorm_inplace(NormInPlace {
            x: &mut ri,
            weight: &w,
            eps: 1e-6,
        });
        assert_eq!(ci, c, "rmsnorm in place d={d}");
        close(&format!("rmsnorm in place d={d}"), &ci, &ri, 1e-5);
    }
    // RoPE, both layouts, whole and partial rotation.
    for layout in [RopeLayout::Neox, RopeLayout::Interleaved] {
        for rot in [32, 16] {
            let rope = Rope::new(32, rot, 10000.0, layout, &RopeScaling::None, None);
            let positions = [0usize, 7, 513, 4099];
            let x = rng.vec(positions.len() * 3 * 32, 1.0);
            let (mut c, mut r) = (x.clone(), x.clone());
            Cpu.rope(RopeArgs {
                rope: &rope,
                heads: 3,
                positions: &positions,
                x: &mut c,
            });
            Reference.rope(RopeArgs {
                rope: &rope,
                heads: 3,
                positions: &positions,
                x: &mut r,
            });
            close(&format!("rope {layout:?} rot {rot}"), &c, &r, 1e-5);
            assert!(rel(&c, &x) > 1e-2, "rope {layout:?}: nothing rotated");
        }
    }
    // Activations.
    let (g, u) = (rng.vec(300, 6.0), rng.vec(300, 2.0));
    let (mut c, mut r) = (g.clone(), g.clone());
    Cpu.activation(Activation::SwiGlu {
        gate: &mut c,
        up: &u,
    });
    Reference.activation(Activation::SwiGlu {
        gate: &mut r,
        up: &u,
    });
    close("swiglu", &c, &r, 1e-5);
    let (mut c, mut r) = (u.clone(), u.clone());
    Cpu.activation(Activation::SigmoidGate {
        x: &mut c,
        gate: &g,
    });
    Reference.activation(Activation::SigmoidGate {
        x: &mut r,
        gate: &g,
    });
    close("sigmoid gate", &c, &r, 1e-5);
    let (mut c, mut r) = (u.clone(), u.clone());
    Cpu.activation(Activation::SiluGate {
        x: &mut c,
        gate: &g,
    });
    Reference.activation(Activation::SiluGate {
        x: &mut r,
        gate: &g,
    });
    close("silu gate", &c, &r, 1e-5);
    let (mut c, mut r) = (u.clone(), u.clone());
    Cpu.activation(Activation::Add { x: &mut c, d: &g });
    Reference.activation(Activation::Add { x: &mut r, d: &g });
    close("add", &c, &r, 1e-7);
    let bias = rng.vec(30, 1.0);
    let (mut c, mut r) = (u.clone(), u.clone());
    Cpu.activation(Activation::AddBias {
        x: &mut c,
        bias: &bias,
    });
    Reference.activation(Activation::AddBias {
        x: &mut r,
        bias: &bias,
    });
    close("bias", &c, &r, 1e-7);
    for (dim, scale) in [(10, 1.0), (30, 0.25)] {
        let (mut c, mut r) = (u.clone(), u.clone());
        Cpu.activation(Activation::L2Norm {
            x: &mut c,
            dim,
            scale,
        });
        Reference.activation(Activation::L2Norm {
            x: &mut r,
            dim,
            scale,
        });
        close(&format!("l2 norm {dim}"), &c, &r, 1e-6);
    }
}

/// Per KV head, `rows` random rows of `hd` values stored as `S`.
fn kv_rows<S: Stored>(rng: &mut Rng, heads: usize, rows: usize, hd: usize) -> Vec<Vec<S>> {
    (0..heads)
        .map(|_| {
            let mut h = vec![S::default(); rows * hd / S::VALUES];
            for row in h.chunks_exact_mut(hd / S::VALUES) {
                S::store(&rng.vec(hd, 1.0), row);
            }
            h
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn attention_into<'a, B>(
    b: &B,
    geo: AttnGeometry,
    q: &'a [f32],
    keys: KvHeads<'a>,
    values: KvHeads<'a>,
    past: usize,
    tree: Option<TreeRows<'a>>,
    out: &'a mut [f32],
) where
    B: Backend<Buffer = [f32], Kv<'a> = KvHeads<'a>> + 'a,
{
    b.attention(Attend {
        geo,
        q,
        keys,
        values,
        past,
        scale: 1.0 / (geo.head_dim as f32).sqrt(),
        tree,
        out,
    });
}

fn attention_for<S: Stored>(rng: &mut Rng, what: &str) {
    let geo = AttnGeometry {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 32,
    };
    let past = 37;
    // A tree of 6 nodes: 0 root; 1, 2 under 0; 3 under 1; 4 under 3; 5 under 2.
    let parents = [usize::MAX, 0, 0, 1, 3, 2];
    for (n, tree) in [
        (1, None),
        (5, None),
        (
            6,
            Some(TreeRows {
                parents: &parents,
                first: 0,
            }),
        ),
        (
            3,
            Some(TreeRows {
                parents: &parents,
                first: 3,
            }),
        ),
    ] {
        let first = tree.map_or(0, |t| t.first);
        let total = past + first + n;
        let keys: Vec<Vec<S>> = kv_rows(rng, geo.n_kv_heads, total, geo.head_dim);
        let values: Vec<Vec<S>> = kv_rows(rng, geo.n_kv_heads, total, geo.head_dim);
        let (ks, vs): (Vec<&[S]>, Vec<&[S]>) = (
            keys.iter().map(|h| &h[..]).collect(),
            values.iter().map(|h| &h[..]).collect(),
        );
        let q = rng.vec(n * geo.n_heads * geo.head_dim, 1.0);
        let (mut c, mut r) = (vec![f32::NAN; q.len()], vec![f32::NAN; q.len()]);
        let (k, v) = (S::heads(&ks), S::heads(&vs));
        attention_into(&Cpu, geo, &q, k, v, past, tree, &mut c);
        attention_into(&Reference, geo, &q, k, v, past, tree, &mut r);
        close(
            &format!("attention {what} n={n} tree={}", tree.is_some()),
            &c,
            &r,
            1e-4,
        );
    }
}

#[test]
fn attention_chain_and_tree_over_every_cache_format() {
    let mut rng = Rng::new(3);
    attention_for::<f32>(&mut rng, "f32");
    attention_for::<f16>(&mut rng, "f16");
    attention_for::<BlockQ8_0>(&mut rng, "q8_0");
}

/// Random Gated DeltaNet inputs for `n` rows: q and k l2-normalised (q scaled), decays below
/// zero, strengths in (0, 1).
fn delta_inputs(rng: &mut Rng, d: &GdnDims, n: usize) -> [Vec<f32>; 5] {
    let unit = |rng: &mut Rng, scale: f32| -> Vec<f32> {
        let mut v = rng.vec(n * d.nk * d.dk, 1.0);
        for h in v.chunks_exact_mut(d.dk) {
            let r = h.iter().map(|x| x * x).sum::<f32>().sqrt();
            h.iter_mut().for_each(|x| *x *= scale / r);
        }
        v
    };
    let q = unit(rng, 1.0 / (d.dk as f32).sqrt());
    let k = unit(rng, 1.0);
    let v = rng.vec(n * d.nv * d.dv, 1.0);
    let g: Vec<f32> = rng
        .vec(n * d.nv, 1.0)
        .iter()
        .map(|x| -0.3 * (x + 1.1))
        .collect();
    let beta: Vec<f32> = rng
        .vec(n * d.nv, 1.0)
        .iter()
        .map(|x| 0.5 + 0.45 * x)
        .collect();
    [q, k, v, g, beta]
}

fn inputs<'a, B: Backend<Buffer = [f32]>>(i: &'a [Vec<f32>; 5]) -> DeltaInputs<'a, B> {
    DeltaInputs {
        q: &i[0],
        k: &i[1],
        v: &i[2],
        g: &i[3],
        beta: &i[4],
    }
}

/// A chain: outputs and the advanced state.
fn delta_chain<B: Backend<Buffer = [f32]>>(
    b: &B,
    dims: GdnDims,
    i: &[Vec<f32>; 5],
    n: usize,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let mut s = state.to_vec();
    let mut out = vec![f32::NAN; n * dims.nv * dims.dv];
    b.gated_delta(DeltaNet::Chain {
        dims,
        inputs: inputs::<B>(i),
        n,
        state: &mut s,
        out: &mut out,
    });
    (out, s)
}

/// A tree: outputs and deltas; then the state after replaying the path to `leaf`.
fn delta_tree<B: Backend<Buffer = [f32]>>(
    b: &B,
    dims: GdnDims,
    i: &[Vec<f32>; 5],
    parents: &[usize],
    state: &[f32],
    path: &[usize],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let vd = dims.nv * dims.dv;
    let n = parents.len();
    let (mut out, mut deltas) = (vec![f32::NAN; n * vd], vec![f32::NAN; n * vd]);
    b.gated_delta(DeltaNet::Tree {
        dims,
        inputs: inputs::<B>(i),
        parents,
        state,
        out: &mut out,
        deltas: &mut deltas,
    });
    let kd = dims.nk * dims.dk;
    let mut s = state.to_vec();
    for &j in path {
        b.gated_delta(DeltaNet::Replay {
            dims,
            state: &mut s,
            k: &i[1][j * kd..(j + 1) * kd],
            g: &i[3][j * dims.nv..(j + 1) * dims.nv],
            delta: &deltas[j * vd..(j + 1) * vd],
        });
    }
    (out, deltas, s)
}

#[test]
fn gated_delta_recurrent_chunked_tree_and_replay() {
    let mut rng = Rng::new(4);
    for (nk, nv, dk, dv, map) in [
        (2, 4, 16, 8, HeadMap::Tiled),
        (1, 3, 8, 12, HeadMap::Grouped),
        (2, 4, 32, 16, HeadMap::Grouped),
    ] {
        let dims = GdnDims {
            nk,
            nv,
            dk,
            dv,
            map,
        };
        let state = rng.vec(dims.state_len(), 0.3);
        // 1 and 5 rows run the recurrent form, 40 the chunked one (with AVX2).
        for n in [1, 5, 40] {
            let i = delta_inputs(&mut rng, &dims, n);
            let (co, cs) = delta_chain(&Cpu, dims, &i, n, &state);
            let (ro, rs) = delta_chain(&Reference, dims, &i, n, &state);
            let what = format!("gated delta {dims:?} n={n}");
            close(&format!("{what} out"), &co, &ro, 1e-4);
            close(&format!("{what} state"), &cs, &rs, 1e-4);
        }
        let parents = [usize::MAX, 0, 1, 1, 0, 4, 5];
        let i = delta_inputs(&mut rng, &dims, parents.len());
        let path = [0, 4, 5, 6];
        let (co, cd, cs) = delta_tree(&Cpu, dims, &i, &parents, &state, &path);
        let (ro, rd, rs) = delta_tree(&Reference, dims, &i, &parents, &state, &path);
        let what = format!("gated delta tree {dims:?}");
        close(&format!("{what} out"), &co, &ro, 1e-4);
        close(&format!("{what} deltas"), &cd, &rd, 1e-4);
        close(&format!("{what} replayed state"), &cs, &rs, 1e-4);
        // The replayed path equals running it as a chain.
        let chain: [Vec<f32>; 5] = std::array::from_fn(|a| {
            let w = i[a].len() / parents.len();
            path.iter()
                .flat_map(|&j| i[a][j * w..(j + 1) * w].to_vec())
                .collect()
        });
        let (_, rs_chain) = delta_chain(&Reference, dims, &chain, path.len(), &state);
        close(&format!("{what} replay = chain"), &rs, &rs_chain, 1e-6);
    }
}

#[test]
fn conv1d_chain_tree_and_commit() {
    let mut rng = Rng::new(5);
    for (ch, k) in [(24, 4), (7, 2), (16, 1)] {
        let taps = ConvTaps::from_channel_major(&rng.vec(ch * k, 0.7), ch, k);
        let state = rng.vec(taps.state_len(), 1.0);
        for n in [1, 6] {
            let x = rng.vec(n * ch, 1.0);
            let run = |b: &dyn Fn(&mut [f32], &mut [f32])| {
                let (mut s, mut y) = (state.clone(), vec![f32::NAN; n * ch]);
                b(&mut s, &mut y);
                (y, s)
            };
            let (cy, cs) = run(&|s, y| {
                Cpu.conv1d(Conv::Chain {
                    taps: &taps,
                    state: s,
                    x: &x,
                    n,
                    y,
                })
            });
            let (ry, rs) = run(&|s, y| {
                Reference.conv1d(Conv::Chain {
                    taps: &taps,
                    state: s,
                    x: &x,
                    n,
                    y,
                })
            });
            close(&format!("conv1d ch={ch} k={k} n={n}"), &cy, &ry, 1e-5);
            assert_eq!(cs, rs, "conv1d ch={ch} k={k} n={n}: state");
        }
        let parents = [usize::MAX, 0, 1, 0, 3, 4];
        let x = rng.vec(parents.len() * ch, 1.0);
        let tree = |b: &dyn Fn(&mut [f32])| {
            let mut y = vec![f32::NAN; parents.len() * ch];
            b(&mut y);
            y
        };
        let cy = tree(&|y| {
            Cpu.conv1d(Conv::Tree {
                taps: &taps,
                state: &state,
                x: &x,
                parents: &parents,
                y,
            })
        });
        let ry = tree(&|y| {
            Reference.conv1d(Conv::Tree {
                taps: &taps,
                state: &state,
                x: &x,
                parents: &parents,
                y,
            })
        });
        close(&format!("conv1d tree ch={ch} k={k}"), &cy, &ry, 1e-5);
        for node in [2, 5] {
            let (mut cs, mut rs) = (state.clone(), state.clone());
            let (p, xs) = (&parents[..], &x[..]);
            Cpu.conv1d(Conv::Commit {
                taps: &taps,
                state: &mut cs,
                x: xs,
                parents: p,
                node,
            });
            Reference.conv1d(Conv::Commit {
                taps: &taps,
                state: &mut rs,
                x: xs,
                parents: p,
                node,
            });
            assert_eq!(cs, rs, "conv1d commit ch={ch} k={k} node={node}");
        }
    }
}

/// The moves model code makes without reading values: strided row copies between buffers, to
/// the host and from it, give exactly the rows asked for on every backend; the LM head's
/// product into host memory equals the backend's own matmul; a KV store appends, commits and
/// truncates whole rows as attention then reads them.
#[test]
fn copies_logits_and_kv_store() {
    let mut rng = Rng::new(9);
    let src = rng.vec(7 * 10, 1.0);
    // Rows 3 values wide from column 2 of a 10-wide source into column 1 of a 5-wide target.
    let want = |rows: usize| {
        let mut d = vec![-1f32; 40];
        for r in 0..rows {
            for c in 0..3 {
                d[4 + r * 5 + 1 + c] = src[2 + r * 10 + c];
            }
        }
        d
    };
    fn moves<B: Backend<Buffer = [f32]>>(b: &B, src: &[f32]) -> [Vec<f32>; 3] {
        let args = |dst| CopyRows {
            src,
            src_at: 2,
            src_stride: 10,
            dst,
            dst_at: 5,
            dst_stride: 5,
            rows: 7,
            width: 3,
        };
        let mut out = [vec![-1f32; 40], vec![-1f32; 40], vec![-1f32; 40]];
        let [c, r, w] = &mut out;
        b.copy(args(c));
        b.read(args(r));
        b.write(args(w));
        out
    }
    for got in [moves(&Cpu, &src), moves(&Reference, &src)] {
        for g in got {
            assert_eq!(g, want(7));
        }
    }
    let mut whole = vec![0f32; 70];
    Cpu.copy(CopyRows::whole(&src[..], &mut whole[..]));
    assert_eq!(whole, src);

    // The head's product on the host.
    let (rows, cols) = (12, 64);
    let bytes = matrix_bytes(&mut rng, DType::Q8_0, rows, cols);
    let x = rng.vec(3 * cols, 1.0);
    let cw = Cpu.pack(DType::Q8_0, rows, cols, &bytes).unwrap();
    let rw = Reference.pack(DType::Q8_0, rows, cols, &bytes).unwrap();
    assert_eq!((WeightInfo::rows(&cw), WeightInfo::cols(&cw)), (rows, cols));
    assert_eq!((rw.rows(), rw.cols()), (rows, cols));
    let mut logits = vec![f32::NAN; 3 * rows];
    Cpu.logits(Logits {
        w: &cw,
        x: &x,
        n: 3,
        y: &mut logits,
    });
    assert_eq!(logits, matmul_out(&Cpu, &cw, &x, 3, rows));
    Reference.logits(Logits {
        w: &rw,
        x: &x,
        n: 3,
        y: &mut logits,
    });
    assert_eq!(logits, matmul_out(&Reference, &rw, &x, 3, rows));

    // A KV store through its interface: rows 1 and 3 of a 4-row batch kept after 2 rows.
    fn store<B: Backend<Buffer = [f32]>>(b: &B, rows: &[f32]) -> Vec<f32> {
        let mut kv = b.new_kv_cache(2, 4, KvType::F32);
        kv.reserve(8);
        kv.append(&rows[..16], &rows[..16]);
        kv.append(&rows[16..], &rows[16..]);
        assert_eq!((kv.len(), kv.kv_dim()), (6, 8));
        kv.commit(2, &[1, 3]);
        assert_eq!((kv.len(), kv.bytes()), (4, 2 * 4 * 8 * 4));
        let mut keep = kv.clone();
        keep.truncate(3);
        assert_eq!(keep.len(), 3);
        // One query at position 3 attends to all four rows.
        let q = vec![0.5f32; 2 * 4];
        let mut out = vec![0f32; 2 * 4];
        kv.with_heads(|keys, values| {
            b.attention(Attend {
                geo: AttnGeometry {
                    n_heads: 2,
                    n_kv_heads: 2,
                    head_dim: 4,
                },
                q: &q,
                keys,
                values,
                past: 3,
                scale: 0.5,
                tree: None,
                out: &mut out,
            })
        });
        out
    }
    let rows = rng.vec(6 * 8, 1.0);
    close(
        "kv store + attention",
        &store(&Cpu, &rows),
        &store(&Reference, &rows),
        1e-5,
    );
}

/// An embedding table in kasoku's formats gives each row dequantized in the original basis on
/// every backend.
#[test]
fn gather_kasoku_tables() {
    use crate::quant::kasoku::{quantize, Rotation, TensorSpec};
    let mut rng = Rng::new(10);
    let (vocab, dim) = (6, 64);
    let w = rng.vec(vocab * dim, 1.0);
    for spec in [
        TensorSpec::l(vocab, dim, false, Some(Rotation::new(3, 32))),
        TensorSpec::m(vocab, dim, 64, None),
    ] {
        let q = quantize(spec, &w).unwrap();
        let signs = spec.rotation.map(|r| r.signs(dim));
        let tokens = [4u32, 0, 4];
        let gather = |b: &dyn Fn(&mut [f32])| {
            let mut out = vec![f32::NAN; tokens.len() * dim];
            b(&mut out);
            out
        };
        let table = Table::Kasoku {
            view: q.view(),
            signs: signs.as_ref(),
        };
        let c = gather(&|out| {
            Cpu.gather(Gather {
                table,
                dim,
                tokens: &tokens,
                out,
            })
        });
        let r = gather(&|out| {
            Reference.gather(Gather {
                table,
                dim,
                tokens: &tokens,
                out,
            })
        });
        assert_eq!(c, r, "{spec}");
        let all = q.view().dequantize();
        assert_eq!(&c[..dim], &all[4 * dim..5 * dim], "{spec}");
        assert_eq!(&c[dim..2 * dim], &all[..dim], "{spec}");
        // 4-bit M on uniform values is off by about 6 %; a wrong row by about 140 %.
        close(
            &format!("{spec} near the values"),
            &c[dim..2 * dim],
            &w[..dim],
            0.15,
        );
    }
}
