//! GPU results against the CPU backend's and references, on random shapes: what the test
//! suite runs where a GPU is present and `kasoku-cuda-check` runs on the GPU machine. Each
//! check returns lines saying what was compared and the relative error found
//! (`max |gpu − ref| / max |ref|`), and fails when an error passes its bound or a row's bits
//! depend on its batch.

use std::path::Path;
use std::sync::Arc;

use kasoku::kernels::attention::{attention, tree_attention, AttnGeometry};
use kasoku::kernels::matmul::{matmul, MatMulWeight};
use kasoku::kernels::rope::{Rope, RopeLayout, RopeScaling};
use kasoku::model::{TokenTree, TreeBuilder};
use kasoku::quant::{dequantize, DType};

use crate::kernels::{
    argmax_id, attention_chunks, gemm_part_bytes, gemm_scratch_bytes, Acts, AttnCall, DeviceMatrix,
    GemmScratch, GemmTile, GluTail, Kernels, MatSeg, NormTail, PostArgs, QkvPost, GEMM_MAX_SPLITS,
};
use crate::model::{fill_meta, MetaLayout};
use crate::runtime::{as_bytes, DeviceBuffer, Gpu};
use crate::synth::{random_tensor, Rng};

mod attention_prefill;
mod delta_net;
pub use delta_net::delta_net_checks;
mod draft;
pub use draft::{draft_speculative, row_top2_checks};
mod dflash;
pub use dflash::{compare_marginals, dflash_checks};
mod mma_packed;
pub use mma_packed::checks as mma_packed_checks;

/// The outcome of a group of checks.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub failures: usize,
}

impl Report {
    /// Checks that speculative `run` (taking `secs`) gave `plain`'s tokens, the line being
    /// `head`, the run's passes, drafts and speed, then `tail`; on a mismatch, where it starts.
    pub fn speculative_run(
        &mut self,
        run: &crate::SpecRun,
        plain: &[u32],
        head: String,
        secs: f64,
        tail: &str,
    ) {
        self.check(
            run.tokens == plain,
            format!(
                "{head}: {} tokens in {} passes ({:.2} tokens per pass), {} of {} drafts accepted, {:.0} tokens/s{tail}",
                run.tokens.len(),
                run.passes,
                run.tokens.len().saturating_sub(1) as f64 / run.passes.max(1) as f64,
                run.accepted,
                run.drafted,
                run.tokens.len() as f64 / secs
            ),
        );
        if run.tokens != plain {
            let at = run.tokens.iter().zip(plain).position(|(a, b)| a != b);
            self.lines
                .push(format!("     first difference at token {at:?}"));
        }
    }

    fn check(&mut self, ok: bool, line: String) {
        if !ok {
            self.failures += 1;
        }
        self.lines
            .push(format!("{} {line}", if ok { "ok  " } else { "FAIL" }));
    }

    pub fn merge(&mut self, other: Report) {
        self.lines.extend(other.lines);
        self.failures += other.failures;
    }
}

/// `max |a − b| / max |b|`.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    let d = a.iter().zip(b).fold(0f64, |m, (x, y)| {
        if x.is_nan() {
            f64::INFINITY
        } else {
            m.max((*x as f64 - y).abs())
        }
    });
    d / scale
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn randv(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.sym() * scale).collect()
}

type R<T> = Result<T, crate::Error>;

fn out_buf(gpu: &Arc<Gpu>, n: usize) -> R<DeviceBuffer> {
    let b = gpu.alloc(n * 4)?;
    b.fill(0xff)?; // NaN: an unwritten output shows
    Ok(b)
}

/// The int8 blocks of `x` exactly as the kernels make them (`quant_block32`): per 32 values
/// d = max|v| / 127 and q = round-half-even(v / d); returns the values d·q they stand for,
/// the quants and the (d, d·Σq halves) of each block.
pub fn quantize_ref(x: &[f32]) -> (Vec<f32>, Vec<i8>, Vec<[f32; 3]>) {
    let mut deq = Vec::with_capacity(x.len());
    let mut qs = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / 32);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let q: Vec<i32> = b
            .iter()
            .map(|&v| {
                if d == 0.0 {
                    0
                } else {
                    (v / d).round_ties_even() as i32
                }
            })
            .collect();
        let (s0, s1): (i32, i32) = (q[..16].iter().sum(), q[16..].iter().sum());
        scales.push([d, d * s0 as f32, d * s1 as f32]);
        for &v in &q {
            qs.push(v as i8);
            deq.push(d * v as f32);
        }
    }
    (deq, qs, scales)
}

/// Device room for the int8 blocks of `len` activation values.
struct QuantBufs {
    xq: DeviceBuffer,
    xs: DeviceBuffer,
}

impl QuantBufs {
    fn new(gpu: &Arc<Gpu>, len: usize) -> R<QuantBufs> {
        Ok(QuantBufs {
            xq: gpu.alloc(len)?,
            xs: gpu.alloc(len / 32 * 16)?,
        })
    }

    fn acts(&self, x: &DeviceBuffer, ld: usize) -> Acts {
        Acts {
            x: x.ptr(),
            xq: self.xq.ptr(),
            xs: self.xs.ptr(),
            ld,
        }
    }

    /// Whether the device's blocks of `len` values equal [`quantize_ref`]'s, bit for bit.
    fn equal_ref(&self, x: &[f32]) -> R<bool> {
        let (_, q, sc) = quantize_ref(x);
        let mut got_q = vec![0u8; x.len()];
        self.xq.read(0, &mut got_q)?;
        let got_s = self.xs.read_f32(x.len() / 32 * 4)?;
        let q_ok = got_q.iter().zip(&q).all(|(a, b)| *a as i8 == *b);
        let s_ok = sc
            .iter()
            .enumerate()
            .all(|(b, s)| (0..3).all(|i| got_s[4 * b + i].to_bits() == s[i].to_bits()));
        Ok(q_ok && s_ok)
    }
}

/// Matrix products on every format at 1..64 rows against f64 products of the dequantized
/// weights with the activations the kernel reads (int8 blocks for block formats, f32 for
/// float formats), and, for the record, against the CPU backend (its own int8 activations);
/// then batch invariance: each row of a batch has the bits it has alone; the fused argmax.
pub fn matvec(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    let mut rng = Rng(0x5eed);
    let nmax = 64;
    for dtype in DType::ALL {
        // 9216 columns: long rows, split over 2 or 4 warps per pair (kernels::matvec_split).
        for &(rows, cols) in &[(77usize, 512usize), (300, 1536), (45, 9216)] {
            let bytes = random_tensor(&mut rng, dtype, rows * cols, 0.05);
            let m = DeviceMatrix::upload(gpu, dtype, rows, cols, &bytes)?;
            let mut wf = vec![0f32; rows * cols];
            dequantize(dtype, &bytes, &mut wf);
            let cpu = MatMulWeight::new(dtype, rows, cols, &bytes).expect("cpu weight");
            let x = randv(&mut rng, nmax * cols, 1.0);
            let xd = gpu.upload_f32(&x)?;
            let qb = QuantBufs::new(gpu, nmax * cols)?;
            let acts = qb.acts(&xd, cols);
            k.quantize(acts, nmax * cols)?;
            let quant_ok = qb.equal_ref(&x)?;
            let xr = if dtype.is_quantized() {
                quantize_ref(&x).0
            } else {
                x.clone()
            };
            let yd = out_buf(gpu, nmax * rows)?;
            let want = product_f64(&xr, &wf, nmax, rows, cols);
            let mut worst = (0f64, 0f64);
            for n in [1usize, 3, 8, 13, 64] {
                yd.fill(0xff)?;
                k.matvec(&[m.seg(yd.ptr(), rows, None, false)], acts, n, cols)?;
                let y = yd.read_f32(n * rows)?;
                worst.0 = worst.0.max(rel_err(&y, &want[..n * rows]));
                let mut yc = vec![0f32; n * rows];
                matmul(&cpu, &x[..n * cols], n, &mut yc);
                worst.1 = worst.1.max(rel_err(&y, &f64s(&yc)));
            }
            rep.check(
                worst.0 < 1e-5 && quant_ok,
                format!(
                    "matvec {dtype} {rows}x{cols} n=1..64: rel err vs f64 {:.1e}, vs CPU backend {:.1e}{}",
                    worst.0,
                    worst.1,
                    if quant_ok { "" } else { " (int8 activations differ from the reference!)" }
                ),
            );
            // Batch invariance: 13 rows at once vs each alone, bit for bit.
            let n = 13;
            k.matvec(&[m.seg(yd.ptr(), rows, None, false)], acts, n, cols)?;
            let batched = yd.read_f32(n * rows)?;
            let mut same = true;
            for r in 0..n {
                k.matvec(
                    &[m.seg(yd.ptr(), rows, None, false)],
                    acts.from_row(r),
                    1,
                    cols,
                )?;
                let alone = yd.read_f32(rows)?;
                same &= alone
                    .iter()
                    .zip(&batched[r * rows..])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            }
            rep.check(
                same,
                format!("matvec {dtype} {rows}x{cols}: a row's bits do not depend on its batch"),
            );
            // The fused argmax of each row (what the LM head returns).
            let best = gpu.alloc(n * 8)?;
            best.fill(0)?;
            let mut seg = m.seg(yd.ptr(), rows, None, false);
            seg.best = best.ptr();
            k.matvec(&[seg], acts, n, cols)?;
            let y = yd.read_f32(n * rows)?;
            let got = argmax_ids(&best, n)?;
            let want: Vec<u32> = (0..n)
                .map(|r| kasoku::engine::sampler::argmax(&y[r * rows..(r + 1) * rows]))
                .collect();
            rep.check(
                got == want,
                format!("matvec {dtype} {rows}x{cols}: fused argmax of 13 rows"),
            );
        }
    }
    if !k.uses_mma() {
        rep.merge(fused_swiglu(k, &mut rng)?);
        rep.merge(fused_norm(k, &mut rng)?);
    } else {
        rep.lines.push(
            "note: the fused SwiGLU and RMSNorm products (opt-in, dp4a only) are checked under KASOKU_CUDA_MMA=0"
                .into(),
        );
    }
    // Three matrices of different formats in one launch, with bias and a residual epilogue.
    let cols = 256;
    let fmts = [(DType::Q4K, 40usize), (DType::Q6K, 24), (DType::F16, 24)];
    let n = 5;
    let x = randv(&mut rng, n * cols, 1.0);
    let xd = gpu.upload_f32(&x)?;
    let qb = QuantBufs::new(gpu, n * cols)?;
    let acts = qb.acts(&xd, cols);
    k.quantize(acts, n * cols)?;
    let xq = quantize_ref(&x).0;
    let mut segs = Vec::new();
    let mut keep = Vec::new();
    let mut want_all = Vec::new();
    for (i, &(d, rows)) in fmts.iter().enumerate() {
        let bytes = random_tensor(&mut rng, d, rows * cols, 0.05);
        let mut wf = vec![0f32; rows * cols];
        dequantize(d, &bytes, &mut wf);
        let m = DeviceMatrix::upload(gpu, d, rows, cols, &bytes)?;
        let bias = randv(&mut rng, rows, 0.1);
        let init = randv(&mut rng, n * rows, 1.0);
        let bd = gpu.upload_f32(&bias)?;
        let yd = gpu.upload_f32(&init)?;
        let acc = i == 1;
        segs.push(m.seg(yd.ptr(), rows, Some(bd.ptr()), acc));
        let xs = if d.is_quantized() { &xq } else { &x };
        let want: Vec<f64> = (0..n * rows)
            .map(|t| {
                let (r, j) = (t / rows, t % rows);
                let dot: f64 = (0..cols)
                    .map(|c| xs[r * cols + c] as f64 * wf[j * cols + c] as f64)
                    .sum();
                dot + bias[j] as f64 + if acc { init[t] as f64 } else { 0.0 }
            })
            .collect();
        want_all.push(want);
        keep.push((m, bd, yd, rows));
    }
    k.matvec(&segs, acts, n, cols)?;
    let mut e = 0f64;
    for ((_, _, yd, rows), want) in keep.iter().zip(&want_all) {
        e = e.max(rel_err(&yd.read_f32(n * rows)?, want));
    }
    rep.check(
        e < 1e-5,
        format!("matvec of Q4_K+Q6_K+F16 in one launch, bias, residual: rel err {e:.1e}"),
    );
    Ok(rep)
}

/// f16 scratch for the prefill products of up to `rows` weight rows and `n` activation rows.
struct GemmBufs {
    w16: DeviceBuffer,
    x16: DeviceBuffer,
    part: DeviceBuffer,
}

impl GemmBufs {
    fn new(gpu: &Arc<Gpu>, rows: usize, n: usize, cols: usize) -> R<GemmBufs> {
        let (w, x) = gemm_scratch_bytes(rows, n, cols);
        Ok(GemmBufs {
            w16: gpu.alloc(w)?,
            x16: gpu.alloc(x)?,
            part: gpu.alloc(gemm_part_bytes(rows, n, GEMM_MAX_SPLITS))?,
        })
    }

    fn scratch(&self) -> GemmScratch {
        GemmScratch {
            w16: self.w16.ptr(),
            w16_bytes: self.w16.len(),
            x16: self.x16.ptr(),
            x16_bytes: self.x16.len(),
            part: self.part.ptr(),
            part_bytes: self.part.len(),
        }
    }

    /// The first `len` values of the f16 weight scratch.
    fn weights(&self, len: usize) -> R<Vec<f32>> {
        let mut raw = vec![0u8; len * 2];
        self.w16.read(0, &mut raw)?;
        Ok(raw
            .chunks(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect())
    }
}

/// The ways the gemm checks run each product: both tiles, unsplit and K split 4 ways (3 where
/// the slices divide so: the last split shorter).
const GEMM_WAYS: [(GemmTile, usize); 4] = [
    (GemmTile::Large, 1),
    (GemmTile::Small, 1),
    (GemmTile::Large, 4),
    (GemmTile::Small, 4),
];

/// The token ids of the first `n` argmax keys a fused-argmax product left in `best`.
fn argmax_ids(best: &DeviceBuffer, n: usize) -> R<Vec<u32>> {
    let mut kb = vec![0u8; n * 8];
    best.read(0, &mut kb)?;
    Ok(kb
        .chunks(8)
        .map(|c| argmax_id(u64::from_le_bytes(c.try_into().unwrap())))
        .collect())
}

/// `y[r][j] = Σ_c x[r][c] · w[j][c]` in f64 for rows `0..n` of `x`.
fn product_f64(x: &[f32], w: &[f32], n: usize, rows: usize, cols: usize) -> Vec<f64> {
    let mut y = vec![0f64; n * rows];
    for r in 0..n {
        let xr = &x[r * cols..(r + 1) * cols];
        for j in 0..rows {
            let wj = &w[j * cols..(j + 1) * cols];
            y[r * rows + j] = xr.iter().zip(wj).map(|(a, b)| *a as f64 * *b as f64).sum();
        }
    }
    y
}

/// The prefill products (f16 tensor cores, kernels/gemm.cu) on every format, both tile
/// shapes, at 65, 100, 256 and 512 activation rows and weight rows that fill no tile
/// (float formats also a width that is no whole K slice): the f16 scratch against the CPU's
/// dequantization, the product against an f64 product of the same f16-rounded operands
/// (bound: f32 accumulation) and, for the record, of the unrounded f32 ones; then three
/// matrices of different formats in one product with bias, residual and output strides.
pub fn gemm(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    if !k.has_gemm() {
        rep.lines.push(format!(
            "note: no prefill products on compute capability {}.{}",
            gpu.capability.0, gpu.capability.1
        ));
        return Ok(rep);
    }
    let mut rng = Rng(0x6e33);
    let nmax = 512;
    let ns = [65usize, 100, 256, 512];
    for dtype in DType::ALL {
        let shapes: [(usize, usize); 2] = match dtype.block_size() {
            256 => [(200, 512), (77, 2304)],
            32 => [(200, 512), (77, 2336)],
            _ => [(200, 264), (77, 2056)],
        };
        for (rows, cols) in shapes {
            let bytes = random_tensor(&mut rng, dtype, rows * cols, 0.05);
            let m = DeviceMatrix::upload(gpu, dtype, rows, cols, &bytes)?;
            let mut wf = vec![0f32; rows * cols];
            dequantize(dtype, &bytes, &mut wf);
            let x = randv(&mut rng, nmax * cols, 1.0);
            let xd = gpu.upload_f32(&x)?;
            let acts = Acts {
                x: xd.ptr(),
                ld: cols,
                ..Acts::default()
            };
            let bufs = GemmBufs::new(gpu, rows, nmax, cols)?;
            let yd = out_buf(gpu, nmax * rows)?;
            let seg = m.seg(yd.ptr(), rows, None, false);
            k.gemm_prepare(&[seg], acts, nmax, cols, &bufs.scratch())?;
            let wh = bufs.weights(rows * cols)?;
            let deq_err = rel_err(&wh, &f64s(&wf));
            let want_h = product_f64(&f16_round(&x), &wh, nmax, rows, cols);
            let want = product_f64(&x[..65 * cols], &wf, 65, rows, cols);
            let (mut worst, mut vs_f32) = (0f64, 0f64);
            for (tile, splits) in GEMM_WAYS {
                for n in ns {
                    yd.fill(0xff)?;
                    k.gemm_prepare(&[seg], acts, n, cols, &bufs.scratch())?;
                    k.gemm_product(&[seg], acts, n, cols, &bufs.scratch(), tile, splits)?;
                    let y = yd.read_f32(nmax * rows)?;
                    worst = worst.max(rel_err(&y[..n * rows], &want_h[..n * rows]));
                    // Rows past n stay untouched (NaN).
                    if y[n * rows..].iter().any(|v| !v.is_nan()) {
                        worst = f64::INFINITY;
                    }
                    vs_f32 = vs_f32.max(rel_err(&y[..65 * rows], &want));
                }
            }
            rep.check(
                worst < 1e-4 && deq_err < 1e-3,
                format!(
                    "gemm {dtype} {rows}x{cols} n=65..512, both tiles, K whole and split: rel err vs f64 of the f16 \
                     operands {worst:.1e}, vs f64 of the f32 ones {vs_f32:.1e}; f16 weights vs \
                     dequantize {deq_err:.1e}"
                ),
            );
        }
    }
    // Three matrices of different formats in one product, with bias, a residual epilogue and
    // an output stride wider than the rows.
    let (cols, n) = (512, 100);
    let fmts = [(DType::Q4K, 40usize), (DType::Q6K, 25), (DType::F16, 33)];
    let x = randv(&mut rng, n * cols, 1.0);
    let xd = gpu.upload_f32(&x)?;
    let acts = Acts {
        x: xd.ptr(),
        ld: cols,
        ..Acts::default()
    };
    let bufs = GemmBufs::new(gpu, 98, n, cols)?;
    let mut segs = Vec::new();
    let mut keep = Vec::new();
    let mut wall = Vec::new();
    for (i, &(d, rows)) in fmts.iter().enumerate() {
        let bytes = random_tensor(&mut rng, d, rows * cols, 0.05);
        let mut wf = vec![0f32; rows * cols];
        dequantize(d, &bytes, &mut wf);
        wall.extend(wf);
        let m = DeviceMatrix::upload(gpu, d, rows, cols, &bytes)?;
        let ldy = rows + 3 * i;
        let bias = randv(&mut rng, rows, 0.1);
        let init = randv(&mut rng, n * ldy, 1.0);
        let bd = gpu.upload_f32(&bias)?;
        let yd = gpu.upload_f32(&init)?;
        let acc = i != 0;
        segs.push(m.seg(yd.ptr(), ldy, Some(bd.ptr()), acc));
        keep.push((m, bd, yd, rows, ldy, bias, init, acc));
    }
    let all_rows = 98;
    let want_h = product_f64(&f16_round(&x), &f16_round(&wall), n, all_rows, cols);
    let mut e = 0f64;
    for (tile, splits) in GEMM_WAYS {
        for (_, _, yd, _, _, _, init, _) in &keep {
            yd.write(0, as_bytes(init))?;
        }
        k.gemm_prepare(&segs, acts, n, cols, &bufs.scratch())?;
        k.gemm_product(&segs, acts, n, cols, &bufs.scratch(), tile, splits)?;
        let mut j0 = 0;
        for (_, _, yd, rows, ldy, bias, init, acc) in &keep {
            let got = yd.read_f32(n * ldy)?;
            let mut g = Vec::new();
            let mut w = Vec::new();
            for r in 0..n {
                for j in 0..*ldy {
                    let t = r * ldy + j;
                    g.push(got[t]);
                    w.push(if j < *rows {
                        want_h[r * all_rows + j0 + j]
                            + bias[j] as f64
                            + if *acc { init[t] as f64 } else { 0.0 }
                    } else {
                        init[t] as f64 // past the rows: untouched
                    });
                }
            }
            e = e.max(rel_err(&g, &w));
            j0 += rows;
        }
    }
    rep.check(
        e < 1e-4,
        format!(
            "gemm of Q4_K+Q6_K+F16 in one product at {n} rows, both tiles, split or not, bias, residual, \
             output strides: rel err {e:.1e}"
        ),
    );
    let bad = k.gemm(
        &[MatSeg { best: 8, ..segs[0] }],
        acts,
        n,
        cols,
        &bufs.scratch(),
    );
    rep.check(
        bad.is_err(),
        "gemm refuses a fused argmax (an error, nothing launched)".into(),
    );
    Ok(rep)
}

/// RMSNorm, SwiGLU, argmax and embedding lookups against the CPU kernels.
pub fn elementwise(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    let mut rng = Rng(11);
    let (rows, dim) = (7, 1536);
    let x = randv(&mut rng, rows * dim, 3.0);
    let w = randv(&mut rng, dim, 1.0);
    let (xd, wd, yd) = (
        gpu.upload_f32(&x)?,
        gpu.upload_f32(&w)?,
        out_buf(gpu, rows * dim)?,
    );
    let qb = QuantBufs::new(gpu, rows * dim)?;
    k.rmsnorm(xd.ptr(), wd.ptr(), 1e-6, dim, rows, qb.acts(&yd, dim))?;
    let mut want = vec![0f32; rows * dim];
    kasoku::kernels::norm::rmsnorm(&x, &w, 1e-6, &mut want);
    let got = yd.read_f32(rows * dim)?;
    let e = rel_err(&got, &f64s(&want));
    let q_ok = qb.equal_ref(&got)?;
    rep.check(
        e < 1e-6 && q_ok,
        format!("rmsnorm {rows}x{dim}: rel err vs CPU {e:.1e}; its int8 blocks equal the reference's: {q_ok}"),
    );

    let len = 3 * 8960;
    let (g, u) = (randv(&mut rng, len, 6.0), randv(&mut rng, len, 2.0));
    let (gd, ud) = (gpu.upload_f32(&g)?, gpu.upload_f32(&u)?);
    let qb = QuantBufs::new(gpu, len)?;
    k.swiglu(gd.ptr(), ud.ptr(), len, qb.acts(&gd, len))?;
    let mut want = vec![0f32; len];
    kasoku::kernels::activation::swiglu(&g, &u, &mut want);
    let got = gd.read_f32(len)?;
    let e = rel_err(&got, &f64s(&want));
    let q_ok = qb.equal_ref(&got)?;
    rep.check(
        e < 1e-6 && q_ok,
        format!(
            "swiglu {len}: rel err vs CPU {e:.1e}; its int8 blocks equal the reference's: {q_ok}"
        ),
    );

    let vocab = 151936;
    let mut l = randv(&mut rng, 3 * vocab, 10.0);
    l[vocab + 5] = 50.0;
    l[vocab + 900] = 50.0; // a tie: the first wins
    l[2 * vocab + vocab - 1] = 60.0;
    let ld = gpu.upload_f32(&l)?;
    let ids = gpu.alloc(12)?;
    k.argmax(ld.ptr(), vocab, 3, ids.ptr())?;
    let mut b = [0u8; 12];
    ids.read(0, &mut b)?;
    let got: Vec<u32> = b
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want: Vec<u32> = (0..3)
        .map(|r| kasoku::engine::sampler::argmax(&l[r * vocab..(r + 1) * vocab]))
        .collect();
    rep.check(
        got == want,
        format!("argmax over {vocab}: {got:?} (CPU {want:?})"),
    );

    for dtype in [
        DType::Q4K,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q6K,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::Q5K,
    ] {
        let (vocab, dim) = (50, 512);
        let bytes = random_tensor(&mut rng, dtype, vocab * dim, 0.5);
        let table = DeviceMatrix::upload(gpu, dtype, vocab, dim, &bytes)?;
        let tokens: Vec<u32> = vec![3, 49, 0, 17];
        let td = gpu.upload(as_bytes(&tokens))?;
        let yd = out_buf(gpu, tokens.len() * dim)?;
        k.embed(&table, td.ptr(), tokens.len(), yd.ptr(), 0, 0)?;
        let rb = dtype.bytes_for(dim).unwrap();
        let mut want = vec![0f32; tokens.len() * dim];
        for (i, &t) in tokens.iter().enumerate() {
            dequantize(
                dtype,
                &bytes[t as usize * rb..(t as usize + 1) * rb],
                &mut want[i * dim..(i + 1) * dim],
            );
        }
        let e = rel_err(&yd.read_f32(tokens.len() * dim)?, &f64s(&want));
        rep.check(
            e < 1e-6,
            format!("embedding rows of {dtype}: rel err vs dequantize {e:.1e}"),
        );
    }
    Ok(rep)
}

fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// The q/k/v epilogue (q/k norms, RoPE in both layouts, partial rotation, Llama 3 scaling)
/// and attention (chain with a long cache: split keys; a tree) against the CPU kernels on
/// keys and values rounded to f16 as the GPU cache holds them.
pub fn attention_checks(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    let mut rng = Rng(23);
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192.0,
    };
    let cases = [
        (
            "neox, qk-norm",
            4usize,
            2usize,
            128usize,
            128usize,
            RopeLayout::Neox,
            RopeScaling::None,
            true,
            1000usize,
            None,
        ),
        // More chunks than attention launches blocks per head: each block takes several.
        (
            "neox, 3000 cached",
            4,
            2,
            64,
            64,
            RopeLayout::Neox,
            RopeScaling::None,
            false,
            3000,
            None,
        ),
        (
            "interleaved, llama3 scaling",
            8,
            2,
            64,
            64,
            RopeLayout::Interleaved,
            llama3,
            false,
            300,
            None,
        ),
        (
            "partial rope 64/256",
            4,
            1,
            256,
            64,
            RopeLayout::Neox,
            RopeScaling::None,
            true,
            70,
            None,
        ),
        (
            "tree of 9",
            6,
            2,
            128,
            128,
            RopeLayout::Neox,
            RopeScaling::None,
            false,
            200,
            Some(()),
        ),
        // The 1.5B's heads (GQA 6, head_dim 128) at a short context, and past 32 chunks.
        (
            "GQA 6, qk-norm",
            12,
            2,
            128,
            128,
            RopeLayout::Neox,
            RopeScaling::None,
            true,
            300,
            None,
        ),
        (
            "GQA 6, 2100 cached",
            12,
            2,
            128,
            128,
            RopeLayout::Neox,
            RopeScaling::None,
            false,
            2100,
            None,
        ),
        // No grouping (GQA 1), head_dim 256 past 32 chunks, a group of 14 (two blocks of
        // query heads in attn_group), trees of each.
        (
            "GQA 1, 2100 cached",
            4,
            4,
            64,
            64,
            RopeLayout::Neox,
            RopeScaling::None,
            false,
            2100,
            None,
        ),
        (
            "head_dim 256, GQA 4, 2100 cached",
            8,
            2,
            256,
            128,
            RopeLayout::Neox,
            RopeScaling::None,
            true,
            2100,
            None,
        ),
        (
            "GQA 14",
            28,
            2,
            64,
            64,
            RopeLayout::Interleaved,
            RopeScaling::None,
            false,
            130,
            None,
        ),
        (
            "tree of 9, GQA 1",
            4,
            4,
            64,
            64,
            RopeLayout::Neox,
            RopeScaling::None,
            false,
            61,
            Some(()),
        ),
        (
            "tree of 9, head_dim 256, GQA 14",
            28,
            2,
            256,
            256,
            RopeLayout::Neox,
            RopeScaling::None,
            true,
            2050,
            Some(()),
        ),
    ];
    for (what, nh, nkv, hd, rot, layout, scaling, qk_norm, past, tree) in cases {
        let tree: Option<TokenTree> = tree.map(|_| {
            let mut b = TreeBuilder::new(1);
            let a = b.add(0, 2);
            let c = b.add(a, 3);
            b.add(c, 4);
            b.add(a, 5);
            let d = b.add(0, 6);
            b.add(d, 7);
            b.add(d, 8);
            b.add(0, 9);
            b.build().0
        });
        let n = tree.as_ref().map_or(5, |t| t.len());
        let rope = Rope::new(hd, rot, 10000.0, layout, &scaling, None);
        let inv: Vec<f32> = rope.inv_freq().iter().map(|&f| f as f32).collect();
        let (q_dim, kv_dim) = (nh * hd, nkv * hd);
        let q = randv(&mut rng, n * q_dim, 1.0);
        let kk = randv(&mut rng, n * kv_dim, 1.0);
        let v = randv(&mut rng, n * kv_dim, 1.0);
        let qn = randv(&mut rng, hd, 1.0);
        let kn = randv(&mut rng, hd, 1.0);
        // The committed cache: random keys and values at 0..past (already f16).
        let max_slots = past + 64;
        let k_old = f16_round(&randv(&mut rng, nkv * past * hd, 1.0));
        let v_old = f16_round(&randv(&mut rng, nkv * past * hd, 1.0));
        let mut kc = vec![half::f16::ZERO; nkv * max_slots * hd];
        let mut vc = kc.clone();
        for h in 0..nkv {
            for p in 0..past {
                for d in 0..hd {
                    kc[(h * max_slots + p) * hd + d] =
                        half::f16::from_f32(k_old[(h * past + p) * hd + d]);
                    vc[(h * max_slots + p) * hd + d] =
                        half::f16::from_f32(v_old[(h * past + p) * hd + d]);
                }
            }
        }
        let kcd = gpu.upload(as_bytes(
            &kc.iter().map(|x| x.to_bits()).collect::<Vec<u16>>(),
        ))?;
        let vcd = gpu.upload(as_bytes(
            &vc.iter().map(|x| x.to_bits()).collect::<Vec<u16>>(),
        ))?;
        let layout_m = MetaLayout::new(64);
        let mut words = vec![0u32; layout_m.words];
        let toks: Vec<u32> = (0..n as u32).collect();
        fill_meta(&layout_m, past, &toks, tree.as_ref(), &mut words);
        let meta = gpu.upload(as_bytes(&words))?;
        let (qd, kd, vd) = (
            gpu.upload_f32(&q)?,
            gpu.upload_f32(&kk)?,
            gpu.upload_f32(&v)?,
        );
        let (qnd, knd, invd) = (
            gpu.upload_f32(&qn)?,
            gpu.upload_f32(&kn)?,
            gpu.upload_f32(&inv)?,
        );
        k.qkv_post(&QkvPost {
            q: qd.ptr(),
            k: kd.ptr(),
            v: vd.ptr(),
            n,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            rot_dim: rot,
            interleaved: layout == RopeLayout::Interleaved,
            inv_freq: invd.ptr(),
            q_norm: if qk_norm { qnd.ptr() } else { 0 },
            k_norm: if qk_norm { knd.ptr() } else { 0 },
            eps: 1e-6,
            batch: meta.ptr(),
            pos: meta.at(layout_m.pos * 4),
            k_cache: kcd.ptr(),
            v_cache: vcd.ptr(),
            max_slots,
        })?;
        // CPU: norms, then RoPE at each row's position.
        let positions: Vec<usize> = (0..n)
            .map(|i| past + tree.as_ref().map_or(i, |t| t.depth(i)))
            .collect();
        let (mut qw, mut kw) = (q.clone(), kk.clone());
        if qk_norm {
            kasoku::kernels::norm::rmsnorm_inplace(&mut qw, &qn, 1e-6);
            kasoku::kernels::norm::rmsnorm_inplace(&mut kw, &kn, 1e-6);
        }
        rope.apply(&mut qw, nh, &positions);
        rope.apply(&mut kw, nkv, &positions);
        let e = rel_err(&qd.read_f32(n * q_dim)?, &f64s(&qw));
        rep.check(
            e < 1e-5,
            format!("qkv epilogue ({what}): q rel err vs CPU {e:.1e}"),
        );
        let mut kraw = vec![0u8; nkv * max_slots * hd * 2];
        kcd.read(0, &mut kraw)?;
        let kgot: Vec<f32> = kraw
            .chunks(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        let mut e = 0f64;
        for i in 0..n {
            for h in 0..nkv {
                let g = &kgot[(h * max_slots + past + i) * hd..][..hd];
                let w = &kw[(i * nkv + h) * hd..][..hd];
                e = e.max(rel_err(g, &f64s(w)));
            }
        }
        rep.check(
            e < 1e-3,
            format!("qkv epilogue ({what}): k in the f16 cache, rel err {e:.1e}"),
        );

        // Attention over the cache the epilogue just completed, by both kernels.
        let chunks = attention_chunks(max_slots);
        let pml = gpu.alloc(n * nh * chunks * 2 * 4)?;
        let po = gpu.alloc(n * nh * chunks * hd * 4)?;
        let arrivals = gpu.alloc(n * nh * 4)?;
        arrivals.fill(0)?;
        // One attention call of `rows` rows (queries `q`, batch `meta`, caches `kc`, `vc`)
        // into `out` and its int8 blocks `oq`, by either kernel.
        let attend = |q: u64,
                      kc: u64,
                      vc: u64,
                      meta: &DeviceBuffer,
                      rows: usize,
                      out: &DeviceBuffer,
                      oq: Acts,
                      grouped: bool|
         -> R<()> {
            k.attention_by(
                &AttnCall {
                    q,
                    k_cache: kc,
                    v_cache: vc,
                    max_slots,
                    n: rows,
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    batch: meta.ptr(),
                    pos: meta.at(layout_m.pos * 4),
                    path: meta.at(layout_m.path * 4),
                    part_ml: pml.ptr(),
                    part_o: po.ptr(),
                    arrivals: arrivals.ptr(),
                    chunks,
                    out: out.ptr(),
                    out_q: oq.xq,
                    out_s: oq.xs,
                    post: Default::default(),
                },
                grouped,
            )?;
            Ok(())
        };
        // CPU on the same f16 values (the GPU's own keys, as its cache holds them): per
        // head, [past + n][hd].
        let mut kf16 = vec![0f32; n * kv_dim];
        for i in 0..n {
            for h in 0..nkv {
                kf16[(i * nkv + h) * hd..][..hd]
                    .copy_from_slice(&kgot[(h * max_slots + past + i) * hd..][..hd]);
            }
        }
        let vf16 = f16_round(&v);
        let per_head = |old: &[f32], new: &[f32], h: usize| -> Vec<f32> {
            let mut r = old[h * past * hd..(h + 1) * past * hd].to_vec();
            for i in 0..n {
                r.extend_from_slice(&new[(i * nkv + h) * hd..][..hd]);
            }
            r
        };
        let keys: Vec<Vec<f32>> = (0..nkv).map(|h| per_head(&k_old, &kf16, h)).collect();
        let vals: Vec<Vec<f32>> = (0..nkv).map(|h| per_head(&v_old, &vf16, h)).collect();
        let kr: Vec<&[f32]> = keys.iter().map(|x| &x[..]).collect();
        let vr: Vec<&[f32]> = vals.iter().map(|x| &x[..]).collect();
        let geo = AttnGeometry {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        let mut want = vec![0f32; n * q_dim];
        let qgpu = qd.read_f32(n * q_dim)?;
        match &tree {
            None => attention(
                geo,
                &qgpu,
                &kr,
                &vr,
                past,
                1.0 / (hd as f32).sqrt(),
                &mut want,
            ),
            Some(t) => tree_attention(
                geo,
                &qgpu,
                &kr,
                &vr,
                past,
                t.parents(),
                1.0 / (hd as f32).sqrt(),
                &mut want,
            ),
        }
        let mut vraw = vec![0u8; nkv * max_slots * hd * 2];
        vcd.read(0, &mut vraw)?;
        for grouped in [false, true] {
            let kernel = if grouped {
                "attn_group"
            } else {
                "attn_partial"
            };
            let out = out_buf(gpu, n * q_dim)?;
            let qb = QuantBufs::new(gpu, n * q_dim)?;
            let oq = qb.acts(&out, q_dim);
            attend(qd.ptr(), kcd.ptr(), vcd.ptr(), &meta, n, &out, oq, grouped)?;
            let got = out.read_f32(n * q_dim)?;
            let e = rel_err(&got, &f64s(&want));
            let q_ok = qb.equal_ref(&got)?;
            rep.check(
                e < 1e-5 && q_ok,
                format!(
                    "attention by {kernel} ({what}, {past} cached, {n} rows, {} chunks): rel err vs CPU {e:.1e}; int8 blocks equal the reference's: {q_ok}",
                    attention_chunks(past + n)
                ),
            );
            // Each tree node against plain decoding of its path: the path's keys and values
            // moved to the chain's slots, its queries as the chain's rows, bit for bit.
            let Some(t) = &tree else { continue };
            let mut same = true;
            for i in 0..n {
                let mut path = vec![i];
                while let Some(p) = t.parent(*path.last().unwrap()) {
                    path.push(p);
                }
                path.reverse();
                let (mut kc1, mut vc1) = (kraw.clone(), vraw.clone());
                let mut q1 = Vec::with_capacity(path.len() * q_dim);
                // Slots from the tree's caches (a node's slot may be another row's target).
                for (d, &node) in path.iter().enumerate() {
                    q1.extend_from_slice(&qgpu[node * q_dim..][..q_dim]);
                    for h in 0..nkv {
                        let to = ((h * max_slots + past + d) * hd) * 2;
                        let from = ((h * max_slots + past + node) * hd) * 2;
                        kc1[to..to + hd * 2].copy_from_slice(&kraw[from..from + hd * 2]);
                        vc1[to..to + hd * 2].copy_from_slice(&vraw[from..from + hd * 2]);
                    }
                }
                let mut words = vec![0u32; layout_m.words];
                let toks: Vec<u32> = (0..path.len() as u32).collect();
                fill_meta(&layout_m, past, &toks, None, &mut words);
                let meta1 = gpu.upload(as_bytes(&words))?;
                let (kd1, vd1, qd1) = (gpu.upload(&kc1)?, gpu.upload(&vc1)?, gpu.upload_f32(&q1)?);
                let out1 = out_buf(gpu, path.len() * q_dim)?;
                let qb1 = QuantBufs::new(gpu, path.len() * q_dim)?;
                attend(
                    qd1.ptr(),
                    kd1.ptr(),
                    vd1.ptr(),
                    &meta1,
                    path.len(),
                    &out1,
                    qb1.acts(&out1, q_dim),
                    grouped,
                )?;
                let row = path.len() - 1;
                let chain = out1.read_bytes(path.len() * q_dim * 4)?;
                let node = out.read_bytes(n * q_dim * 4)?;
                same &= chain[row * q_dim * 4..][..q_dim * 4] == node[i * q_dim * 4..][..q_dim * 4];
            }
            rep.check(
                same,
                format!(
                    "attention by {kernel} ({what}): every tree node's output has the bits of its path's chain row: {same}"
                ),
            );
        }
        // A decode step with the epilogue fused into attention: the bits of the pair.
        if tree.is_none() {
            let upload_cache = |c: &[half::f16]| {
                gpu.upload(as_bytes(
                    &c.iter().map(|x| x.to_bits()).collect::<Vec<u16>>(),
                ))
            };
            let mut words = vec![0u32; layout_m.words];
            fill_meta(&layout_m, past, &[0], None, &mut words);
            let meta1 = gpu.upload(as_bytes(&words))?;
            let run = |fused: bool, grouped: bool| -> R<Snapshot> {
                let (kc1, vc1) = (upload_cache(&kc)?, upload_cache(&vc)?);
                let (q1, k1, v1) = (
                    gpu.upload_f32(&q[..q_dim])?,
                    gpu.upload_f32(&kk[..kv_dim])?,
                    gpu.upload_f32(&v[..kv_dim])?,
                );
                let post = QkvPost {
                    q: q1.ptr(),
                    k: k1.ptr(),
                    v: v1.ptr(),
                    n: 1,
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    rot_dim: rot,
                    interleaved: layout == RopeLayout::Interleaved,
                    inv_freq: invd.ptr(),
                    q_norm: if qk_norm { qnd.ptr() } else { 0 },
                    k_norm: if qk_norm { knd.ptr() } else { 0 },
                    eps: 1e-6,
                    batch: meta1.ptr(),
                    pos: meta1.at(layout_m.pos * 4),
                    k_cache: kc1.ptr(),
                    v_cache: vc1.ptr(),
                    max_slots,
                };
                if !fused {
                    k.qkv_post(&post)?;
                }
                let out1 = out_buf(gpu, q_dim)?;
                let qb1 = QuantBufs::new(gpu, q_dim)?;
                let o1 = qb1.acts(&out1, q_dim);
                k.attention_by(
                    &AttnCall {
                        q: q1.ptr(),
                        k_cache: kc1.ptr(),
                        v_cache: vc1.ptr(),
                        max_slots,
                        n: 1,
                        n_heads: nh,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        scale: 1.0 / (hd as f32).sqrt(),
                        batch: meta1.ptr(),
                        pos: meta1.at(layout_m.pos * 4),
                        path: meta1.at(layout_m.path * 4),
                        part_ml: pml.ptr(),
                        part_o: po.ptr(),
                        arrivals: arrivals.ptr(),
                        chunks,
                        out: out1.ptr(),
                        out_q: o1.xq,
                        out_s: o1.xs,
                        post: if fused {
                            PostArgs::fused(&post)
                        } else {
                            PostArgs::default()
                        },
                    },
                    grouped,
                )?;
                let bytes = |b: &DeviceBuffer, len: usize| -> R<Vec<u8>> {
                    let mut v = vec![0u8; len];
                    b.read(0, &mut v)?;
                    Ok(v)
                };
                let cache_len = nkv * max_slots * hd * 2;
                Ok((
                    bytes(&out1, q_dim * 4)?,
                    bytes(&qb1.xq, q_dim)?,
                    bytes(&kc1, cache_len)?,
                    bytes(&vc1, cache_len)?,
                ))
            };
            for grouped in [false, true] {
                let kernel = if grouped {
                    "attn_group"
                } else {
                    "attn_partial"
                };
                let (plain, fused) = (run(false, grouped)?, run(true, grouped)?);
                rep.check(
                    plain == fused,
                    format!(
                        "attention by {kernel} with the fused q/k/v epilogue ({what}, {past} cached, 1 row): output, int8 blocks and cache equal the unfused pair's: {}",
                        plain == fused
                    ),
                );
            }
        }
    }
    Ok(rep)
}

/// Four device buffers' bytes, for comparing two runs bit for bit.
type Snapshot = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

/// The gate|up product with SwiGLU fused in gives the bits of the product and the swiglu
/// kernel one after the other: the result and its int8 blocks, at several batch sizes, twice
/// in a row (the counts reset themselves).
fn fused_swiglu(k: &Kernels, rng: &mut Rng) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    for (dtype, rows, cols) in [
        (DType::Q4K, 256usize, 1536usize),
        (DType::Q6K, 96, 512),
        (DType::Q8_0, 160, 2048),
        (DType::F16, 64, 256),
    ] {
        let gate_b = random_tensor(rng, dtype, rows * cols, 0.05);
        let up_b = random_tensor(rng, dtype, rows * cols, 0.05);
        let gate = DeviceMatrix::upload(gpu, dtype, rows, cols, &gate_b)?;
        let up = DeviceMatrix::upload(gpu, dtype, rows, cols, &up_b)?;
        let nmax = 64;
        let x = randv(rng, nmax * cols, 1.0);
        let xd = gpu.upload_f32(&x)?;
        let qb = QuantBufs::new(gpu, nmax * cols)?;
        let acts = qb.acts(&xd, cols);
        k.quantize(acts, nmax * cols)?;
        let counts = gpu.alloc(rows / 32 * 4)?;
        counts.fill(0)?;
        let (g, u) = (out_buf(gpu, nmax * rows)?, out_buf(gpu, nmax * rows)?);
        let out = QuantBufs::new(gpu, nmax * rows)?;
        let mut same = true;
        for n in [1usize, 3, 8, 13, 64, 1] {
            // The pair of kernels.
            k.matvec(
                &[
                    gate.seg(g.ptr(), rows, None, false),
                    up.seg(u.ptr(), rows, None, false),
                ],
                acts,
                n,
                cols,
            )?;
            k.swiglu(g.ptr(), u.ptr(), n * rows, out.acts(&g, rows))?;
            let want = (
                g.read_f32(n * rows)?,
                out.xq.read_bytes(n * rows)?,
                out.xs.read_bytes(n * rows / 2)?,
            );
            // The fused kernel.
            g.fill(0xff)?;
            out.xq.fill(0)?;
            k.matvec_swiglu(
                gate.seg(g.ptr(), rows, None, false),
                up.seg(u.ptr(), rows, None, false),
                acts,
                n,
                cols,
                GluTail {
                    counts: counts.ptr(),
                    out: out.acts(&g, rows),
                },
            )?;
            let got = (
                g.read_f32(n * rows)?,
                out.xq.read_bytes(n * rows)?,
                out.xs.read_bytes(n * rows / 2)?,
            );
            same &= want
                .0
                .iter()
                .zip(&got.0)
                .all(|(a, b)| a.to_bits() == b.to_bits())
                && want.1 == got.1
                && want.2 == got.2;
        }
        rep.check(
            same,
            format!("matvec {dtype} gate|up {rows}x{cols} with SwiGLU fused: the bits of matvec + swiglu at n = 1..64"),
        );
    }
    Ok(rep)
}

/// A residual product with RMSNorm fused in gives the bits of the product and the rmsnorm
/// kernel one after the other: the residual stream, the normalized rows and their int8
/// blocks, at 1..4 rows, several times in a row (the count resets itself).
fn fused_norm(k: &Kernels, rng: &mut Rng) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    for (dtype, rows, cols) in [
        (DType::Q4K, 1536usize, 1536usize),
        (DType::Q6K, 896, 4864),
        (DType::Q8_0, 4096, 512),
        (DType::BF16, 160, 256),
    ] {
        let wb = random_tensor(rng, dtype, rows * cols, 0.05);
        let w = DeviceMatrix::upload(gpu, dtype, rows, cols, &wb)?;
        let nmax = 4;
        let x = randv(rng, nmax * cols, 1.0);
        let xd = gpu.upload_f32(&x)?;
        let qb = QuantBufs::new(gpu, nmax * cols)?;
        let acts = qb.acts(&xd, cols);
        k.quantize(acts, nmax * cols)?;
        let resid = randv(rng, nmax * rows, 1.0);
        let norm_w = gpu.upload_f32(&randv(rng, rows, 1.0))?;
        let count = gpu.alloc(4)?;
        count.fill(0)?;
        let y = out_buf(gpu, nmax * rows)?;
        let normed = out_buf(gpu, nmax * rows)?;
        let out = QuantBufs::new(gpu, nmax * rows)?;
        let mut same = true;
        for n in [1usize, 2, 3, 4, 1] {
            let read = || -> R<Snapshot> {
                Ok((
                    y.read_bytes(n * rows * 4)?,
                    normed.read_bytes(n * rows * 4)?,
                    out.xq.read_bytes(n * rows)?,
                    out.xs.read_bytes(n * rows / 2)?,
                ))
            };
            let seg = w.seg(y.ptr(), rows, None, true);
            // The pair of kernels.
            y.write(0, as_bytes(&resid))?;
            k.matvec(&[seg], acts, n, cols)?;
            k.rmsnorm(
                y.ptr(),
                norm_w.ptr(),
                1e-6,
                rows,
                n,
                out.acts(&normed, rows),
            )?;
            let want = read()?;
            // The fused kernel.
            y.write(0, as_bytes(&resid))?;
            normed.fill(0xff)?;
            out.xq.fill(0)?;
            k.matvec_norm(
                seg,
                acts,
                n,
                cols,
                NormTail {
                    count: count.ptr(),
                    w: norm_w.ptr(),
                    eps: 1e-6,
                    out: out.acts(&normed, rows),
                },
            )?;
            same &= read()? == want;
        }
        rep.check(
            same,
            format!("matvec {dtype} {rows}x{cols} with RMSNorm fused: the bits of matvec + rmsnorm at n = 1..4"),
        );
    }
    Ok(rep)
}

/// Every kernel check.
pub fn kernels(k: &Kernels) -> R<Report> {
    let mut rep = matvec(k)?;
    rep.merge(gemm(k)?);
    rep.merge(elementwise(k)?);
    rep.merge(attention_checks(k)?);
    rep.merge(attention_prefill::checks(k)?);
    rep.merge(delta_net_checks(k)?);
    rep.merge(top_k_checks(k)?);
    rep.merge(row_top2_checks(k)?);
    rep.merge(mma_packed_checks(k)?);
    Ok(rep)
}

/// A random logits row of `vocab` values: `kind` 0 spread (few ties), 1 coarse (many ties at
/// every rank), 2 mostly one value with specials (infinities, NaNs, signed zeros), so that
/// the selection's boundary falls inside a run of equal logits.
pub fn random_logits(rng: &mut Rng, vocab: usize, kind: usize) -> Vec<f32> {
    let special = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        f32::MIN_POSITIVE / 2.0,
    ];
    (0..vocab)
        .map(|_| {
            let r = rng.next_u64();
            match kind {
                0 => rng.sym() * 20.0,
                1 => ((r >> 20) % 200) as f32 * 0.125 - 12.0,
                _ if r.is_multiple_of(97) => special[(r >> 8) as usize % special.len()],
                _ if r.is_multiple_of(5) => ((r >> 20) % 4) as f32,
                _ => 1.5,
            }
        })
        .collect()
}

/// The device's top-K selection (`sample.cu`) against the host sampler's
/// (`kasoku::sampler::top_k_of`): the same set of (id, logit bits) on random rows with and
/// without ties and specials, for several K and vocabulary sizes; and the gathered logits.
/// Also times one selection of a Qwen-sized row.
pub fn top_k_checks(k: &Kernels) -> R<Report> {
    use kasoku::sampler::top_k_of;
    let gpu = &k.gpu;
    let mut rep = Report::default();
    let mut rng = Rng(0x7031);
    let max_count = 1024;
    let out = gpu.alloc(max_count * 8)?;
    let gathered = gpu.alloc(max_count * 4)?;
    for vocab in [300usize, 4099, 32_000, 151_936, 262_153] {
        for kind in 0..3 {
            let row = random_logits(&mut rng, vocab, kind);
            let dev = gpu.upload_f32(&row)?;
            let ids: Vec<u32> = (0..37)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            let ids_dev = gpu.upload(as_bytes(&ids))?;
            let mut bad = Vec::new();
            let counts = [1usize, 2, 40, 41, 64, 299, 1000, 1024];
            for &count in counts.iter().filter(|&&c| c < vocab) {
                out.fill(0xff)?;
                k.top_k_select(
                    dev.ptr(),
                    vocab,
                    count,
                    ids_dev.ptr(),
                    ids.len(),
                    out.ptr(),
                    gathered.ptr(),
                )?;
                let mut bytes = vec![0u8; 8 * count];
                out.read(0, &mut bytes)?;
                let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let mut got: Vec<(u32, u32)> = bytes
                    .chunks_exact(8)
                    .map(|p| (word(&p[..4]), word(&p[4..])))
                    .collect();
                got.sort_unstable();
                let all: Vec<(u32, f32)> = row
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l))
                    .collect();
                let mut want: Vec<(u32, u32)> = top_k_of(all, count)
                    .into_iter()
                    .map(|(i, l)| (i, l.to_bits()))
                    .collect();
                want.sort_unstable();
                let g = gathered.read_f32(ids.len())?;
                let g_ok = g
                    .iter()
                    .zip(&ids)
                    .all(|(a, &id)| a.to_bits() == row[id as usize].to_bits());
                if got != want || !g_ok {
                    bad.push(count);
                }
            }
            rep.check(
                bad.is_empty(),
                format!(
                    "top_k_select vocab {vocab}, {} row: the host's selection for K in {:?}{}",
                    ["spread", "coarse (ties)", "flat (ties, specials)"][kind],
                    counts.iter().filter(|&&c| c < vocab).collect::<Vec<_>>(),
                    if bad.is_empty() {
                        String::new()
                    } else {
                        format!("; differs at K {bad:?}")
                    }
                ),
            );
        }
    }
    // The cost of one selection of a Qwen-sized row (what a sampled token adds on the device).
    let vocab = 151_936;
    let row = random_logits(&mut rng, vocab, 0);
    let dev = gpu.upload_f32(&row)?;
    let timer = crate::runtime::Timer::new(gpu)?;
    for count in [40usize, 104, 1024] {
        let launch = || k.top_k_select(dev.ptr(), vocab, count, 0, 0, out.ptr(), gathered.ptr());
        launch()?;
        timer.start()?;
        for _ in 0..20 {
            launch()?;
        }
        let us = timer.stop_ms()? as f64 * 1e3 / 20.0;
        rep.lines.push(format!(
            "top_k_select of {count} from {vocab} logits: {us:.1} µs"
        ));
    }
    Ok(rep)
}

/// A fixture (tests/fixtures/<arch>/<name>/: reference.json from transformers and GGUFs)
/// through the GPU: logits of the reference tokens and the greedy continuation, against
/// transformers for the f32 file, and against the CPU backend on the same file for quantized
/// ones (whose weights transformers never saw). The relative error is stated; the f16 KV cache
/// bounds it near 1e-3 on f32 weights.
pub fn fixture(gpu: &Arc<Gpu>, dir: &Path, gguf: &str, tol: f64) -> R<Report> {
    let mut rep = Report::default();
    let bad = |e: String| crate::Error::Invalid(e);
    let text =
        std::fs::read_to_string(dir.join("reference.json")).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let ids = |key: &str| -> Vec<u32> {
        v[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (tokens, mut greedy) = (ids("tokens"), ids("greedy_continuation"));
    let mut logits: Vec<f64> = v["logits"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .flat_map(|r| {
                    r.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_f64())
                })
                .collect()
        })
        .unwrap_or_default();
    let path = dir.join(gguf);
    let against = if gguf.contains("f32") {
        "transformers"
    } else {
        // The CPU backend on the same quantized file.
        use kasoku::model::{Logits, Model};
        let cpu = Model::load(&path).map_err(|e| bad(e.to_string()))?;
        let mut st = cpu.new_state(tokens.len() + greedy.len() + 8);
        let all = cpu
            .forward(&mut st, &tokens, Logits::All)
            .map_err(|e| bad(e.to_string()))?;
        logits = f64s(&all);
        let vocab = cpu.config.vocab;
        let mut next = kasoku::engine::sampler::argmax(&all[(tokens.len() - 1) * vocab..]);
        let want = greedy.len();
        greedy.clear();
        while greedy.len() < want {
            greedy.push(next);
            let l = cpu
                .forward(&mut st, &[next], Logits::Last)
                .map_err(|e| bad(e.to_string()))?;
            next = kasoku::engine::sampler::argmax(&l);
        }
        "the CPU backend"
    };
    let m = crate::CudaModel::load(gpu, &path)?;
    let mut st = m.new_state(tokens.len() + greedy.len() + 8)?;
    let got = st.logits(&m, &tokens)?;
    let e = rel_err(&got, &logits);
    let what = format!("{}/{gguf}", dir.display());
    rep.check(
        e < tol,
        format!(
            "fixture {what}: logits of {} tokens vs {against}, rel err {e:.1e}",
            tokens.len()
        ),
    );
    // The same logits with every product on the prefill GEMM (f16 tensor cores), which
    // prefill passes take from MAX_TREE + 1 rows on: the fixtures' prompts are shorter.
    let mut st = m.new_state(tokens.len() + greedy.len() + 8)?;
    st.gemm_rows = Some(1);
    if st.uses_gemm(1) {
        let got = st.logits(&m, &tokens)?;
        let e = rel_err(&got, &logits);
        // Twice the bound: f16 weights and activations add their rounding to the cache's.
        rep.check(
            e < 2.0 * tol,
            format!(
                "fixture {what}: logits of {} tokens through the prefill GEMM vs {against}, rel err {e:.1e} (bound {:.0e})",
                tokens.len(),
                2.0 * tol
            ),
        );
    }
    let mut st = m.new_state(tokens.len() + greedy.len() + 8)?;
    let out = crate::generate_plain(&m, &mut st, &tokens, greedy.len())?;
    rep.check(
        out == greedy,
        format!("fixture {what}: greedy continuation {out:?} ({against}: {greedy:?})"),
    );
    Ok(rep)
}

/// Speculative decoding equals plain decoding on the GPU, token for token: with prompt
/// lookup (n-gram trees) on `prompt`, and with the verification of arbitrary trees.
pub fn speculative(gpu: &Arc<Gpu>, model: &Path, prompt: &[u32], n: usize) -> R<Report> {
    let mut rep = Report::default();
    let m = crate::CudaModel::load(gpu, model)?;
    let mut st = m.new_state(prompt.len() + n + 80)?;
    let plain = crate::generate_plain(&m, &mut st, prompt, n)?;
    // The prompt's prefill on the GEMM (f16 tensor cores) against matvec (int8 activations).
    if st.uses_gemm(prompt.len()) {
        let mut last = Vec::new();
        let on = st.gemm_rows;
        for rows in [on, on, None] {
            st.reset();
            st.gemm_rows = rows;
            let id = st.prefill(&m, prompt)?;
            last.push((id, st.last_logits(&m)?));
        }
        st.gemm_rows = on;
        let same = last[0]
            .1
            .iter()
            .zip(&last[1].1)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        rep.check(
            same,
            format!(
                "prefill of {} tokens on the GEMM twice: the same bits",
                prompt.len()
            ),
        );
        // A loose bound: the two differ by f16 against int8 activations, through every layer.
        let e = rel_err(&last[0].1, &f64s(&last[2].1));
        rep.check(
            e < 0.1,
            format!(
                "prefill of {} tokens on the GEMM vs matvec: last logits rel err {e:.1e}, next token {} vs {}",
                prompt.len(),
                last[0].0,
                last[2].0
            ),
        );
    }
    for (budget, depth) in [(8usize, 8usize), (16, 8), (63, 16)] {
        let mut st = m.new_state(prompt.len() + n + 80)?;
        let mut drafter = kasoku::spec::ngram::NgramDrafter::default();
        let run = crate::generate_speculative(&m, &mut st, prompt, n, &mut drafter, budget, depth)?;
        rep.check(
            run.tokens == plain,
            format!(
                "speculative == plain on {} (n-gram, budget {budget}): {} tokens in {} passes, {} of {} drafts accepted",
                model.display(), n, run.passes, run.accepted, run.drafted
            ),
        );
        if run.tokens != plain {
            let at = run.tokens.iter().zip(&plain).position(|(a, b)| a != b);
            rep.lines
                .push(format!("     first difference at token {at:?}"));
        }
    }
    // Trees that follow plain decoding's own path (and siblings that do not): every path
    // node's id must be plain's next token.
    let mut st = m.new_state(prompt.len() + n + 80)?;
    let first = st.prefill(&m, prompt)?;
    let mut b = TreeBuilder::new(first);
    let mut node = 0;
    for (i, &t) in plain[1..9.min(plain.len())].iter().enumerate() {
        b.add(node, t.wrapping_add(1) % m.config.vocab as u32);
        node = b.add(node, t);
        let _ = i;
    }
    let (tree, _) = b.build();
    let ids = st.verify(&m, &tree)?;
    let path = tree.path(tree.len() - 1);
    let deepest = (0..tree.len()).max_by_key(|&i| tree.depth(i)).unwrap();
    let path = if tree.depth(deepest) > tree.depth(*path.last().unwrap()) {
        tree.path(deepest)
    } else {
        path
    };
    let on_path: Vec<u32> = path.iter().map(|&i| ids[i]).collect();
    let want = &plain[1..1 + on_path.len()];
    rep.check(
        on_path == want,
        format!(
            "a tree of {} nodes along plain decoding's path: ids {on_path:?} (plain {want:?})",
            tree.len()
        ),
    );
    Ok(rep)
}

/// A device state that hands back whole rows only (no top-k selection): the path every
/// host-sampled token took before the selection, to compare against.
struct RowsOnly(Box<dyn kasoku::engine::DeviceState>);

impl kasoku::engine::DeviceState for RowsOnly {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn max_len(&self) -> usize {
        self.0.max_len()
    }
    fn max_tree(&self) -> usize {
        self.0.max_tree()
    }
    fn truncate(&mut self, len: usize) {
        self.0.truncate(len)
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<u32, kasoku::engine::EngineError> {
        self.0.feed(tokens)
    }
    fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), kasoku::engine::EngineError> {
        self.0.last_logits(out)
    }
    fn node_logits(
        &mut self,
        node: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), kasoku::engine::EngineError> {
        self.0.node_logits(node, out)
    }
    fn vocab(&self) -> usize {
        self.0.vocab()
    }
    fn verify(&mut self, tree: &TokenTree) -> Result<Vec<u32>, kasoku::engine::EngineError> {
        self.0.verify(tree)
    }
    fn commit(&mut self, path: &[usize]) -> Result<(), kasoku::engine::EngineError> {
        self.0.commit(path)
    }
}

/// The engine's `DeviceSession` on the GPU (what `run` and `serve` use): greedy with only ids
/// crossing equals [`crate::generate_plain`]; with prompt lookup it equals plain decoding,
/// greedy and sampled; sampled top-k draws from the device's selection equal draws from whole
/// rows, plain and with prompt lookup; and what each kind of request costs per token (decode
/// tokens per second: ids only, top-k 40 from the selection and from whole rows, top-k off).
pub fn session(gpu: &Arc<Gpu>, model: &Path, prompt: &[u32], n: usize) -> R<Report> {
    use kasoku::engine::{
        device_speculator, DeviceModel, DeviceSession, Flow, GenerateOptions, Generation, SpecKind,
    };
    use kasoku::sampler::SamplingParams;
    use kasoku::spec::PolicyConfig;

    let engine = |e: kasoku::engine::EngineError| crate::Error::Invalid(e.to_string());
    let mut rep = Report::default();
    let m = Arc::new(crate::CudaModel::load(gpu, model)?);
    let ctx = prompt.len() + n + 80;
    let mut st = m.new_state(ctx)?;
    let plain = crate::generate_plain(&m, &mut st, prompt, n)?;
    drop(st);
    let device = crate::CudaDevice::new(m.clone());
    let session = |spec: bool| -> R<DeviceSession> {
        let mut s = DeviceSession::on(&device, ctx).map_err(engine)?;
        if spec {
            s.set_speculator(
                device_speculator(SpecKind::Ngram, false, PolicyConfig::default())
                    .map_err(engine)?,
            );
        }
        Ok(s)
    };
    let options = |sampling: SamplingParams| GenerateOptions {
        sampling,
        max_tokens: n,
        ..Default::default()
    };
    let generate = |s: &mut DeviceSession, o: &GenerateOptions| -> R<Generation> {
        s.generate(prompt, o, &|| false, &mut |_| Flow::Continue)
            .map_err(engine)
    };
    let greedy = options(SamplingParams::default());
    let g = generate(&mut session(false)?, &greedy)?;
    rep.check(
        g.tokens == plain,
        format!("DeviceSession greedy == generate_plain ({} tokens)", n),
    );
    let hot = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        repetition_penalty: 1.05,
        seed: 3,
        ..Default::default()
    };
    for (what, o) in [
        ("greedy", greedy.clone()),
        ("sampled", options(hot.clone())),
    ] {
        let a = generate(&mut session(false)?, &o)?;
        let b = generate(&mut session(true)?, &o)?;
        let spec = b.stats.spec.clone().unwrap_or_default();
        rep.check(
            a.tokens == b.tokens,
            format!(
                "DeviceSession {what}: prompt lookup == plain ({} passes for {} tokens, {} drafts accepted)",
                b.stats.decode_passes,
                b.tokens.len(),
                spec.accepted_tokens()
            ),
        );
    }
    // Top-k draws from the device's selection (sample.cu) == draws from whole rows on the
    // host, the same logits either way: plain and with prompt lookup, penalties that lower and
    // that raise logits.
    let rows_session = |spec: bool| -> R<DeviceSession> {
        let state = device.new_state(ctx).map_err(engine)?;
        let mut s = DeviceSession::new(Box::new(RowsOnly(state)), "rows-only");
        if spec {
            s.set_speculator(
                device_speculator(SpecKind::Ngram, false, PolicyConfig::default())
                    .map_err(engine)?,
            );
        }
        Ok(s)
    };
    let top_k_sets = [
        hot.clone(),
        SamplingParams {
            temperature: 1.2,
            top_k: 5,
            min_p: 0.05,
            presence_penalty: -0.8,
            frequency_penalty: 0.3,
            seed: 8,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 200,
            top_p: 0.8,
            repetition_penalty: 0.9,
            frequency_penalty: -0.4,
            penalty_last_n: 256,
            seed: 21,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.6,
            top_k: 1,
            seed: 2,
            ..Default::default()
        },
    ];
    for (i, sampling) in top_k_sets.into_iter().enumerate() {
        let o = options(sampling.clone());
        for spec in [false, true] {
            let a = generate(&mut session(spec)?, &o)?;
            let b = generate(&mut rows_session(spec)?, &o)?;
            rep.check(
                a.tokens == b.tokens,
                format!(
                    "DeviceSession top-k {} (set {i}{}): device selection == whole rows ({} tokens)",
                    sampling.top_k,
                    if spec { ", prompt lookup" } else { "" },
                    a.tokens.len()
                ),
            );
        }
    }
    // Costs: the same session (graphs captured), the median of three answers each.
    let vocab = m.config.vocab;
    let top_p = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: 3,
        ..Default::default()
    };
    for (what, sampling, rows) in [
        ("ids only (greedy)", SamplingParams::default(), false),
        ("sampled, top-k 40, device selection", hot.clone(), false),
        ("sampled, top-k 40, whole rows", hot.clone(), true),
        ("sampled, top-k off, top-p 0.9, whole rows", top_p, true),
    ] {
        let mut s = if rows {
            rows_session(false)?
        } else {
            session(false)?
        };
        let o = options(sampling);
        let mut rates = Vec::new();
        for _ in 0..3 {
            s.reset();
            rates.push(generate(&mut s, &o)?.stats.decode_tokens_per_second());
        }
        rates.sort_by(f64::total_cmp);
        rep.lines.push(format!(
            "session decode {what}: {:.0} tokens/s{}",
            rates[1],
            if rows {
                format!(" ({} bytes of logits per sampled token)", vocab * 4)
            } else {
                String::new()
            }
        ));
    }
    Ok(rep)
}
