//! The packed tensor-core products (`mma_packed.cu`) against mma.cu's on the same GGUF bytes:
//! every output and the fused argmax bit for bit at 1..64 activation rows, and against an f64
//! product of the dequantized weights with the int8 activations the kernels read.

use kasoku::quant::{dequantize, DType};

use super::{argmax_ids, out_buf, product_f64, quantize_ref, randv, rel_err, QuantBufs, Report, R};
use crate::kernels::{capability_has_mma, DeviceMatrix, Kernels};
use crate::synth::{random_tensor, Rng};

/// Q4_K and Q6_K matrices of the 1.5B's widths (1536: 6 warps a tile; 8960: 35 super-blocks
/// over 16 warps, uneven ranges) and rows that fill no tile.
pub fn checks(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    if !capability_has_mma(gpu.capability) {
        rep.lines.push(format!(
            "note: no tensor-core products on compute capability {}.{}",
            gpu.capability.0, gpu.capability.1
        ));
        return Ok(rep);
    }
    let mut rng = Rng(0x9ac4);
    let nmax = 64;
    for dtype in [DType::Q4K, DType::Q6K] {
        for &(rows, cols) in &[(40usize, 256usize), (301, 1536), (45, 8960)] {
            let bytes = random_tensor(&mut rng, dtype, rows * cols, 0.05);
            let mut m = DeviceMatrix::upload(gpu, dtype, rows, cols, &bytes)?;
            k.pack(&mut m)?;
            let mut wf = vec![0f32; rows * cols];
            dequantize(dtype, &bytes, &mut wf);
            let x = randv(&mut rng, nmax * cols, 1.0);
            let xd = gpu.upload_f32(&x)?;
            let qb = QuantBufs::new(gpu, nmax * cols)?;
            let acts = qb.acts(&xd, cols);
            k.quantize(acts, nmax * cols)?;
            let xr = quantize_ref(&x).0;
            let (yd, best) = (out_buf(gpu, nmax * rows)?, gpu.alloc(nmax * 8)?);
            let want = product_f64(&xr, &wf, nmax, rows, cols);
            let (mut same, mut best_same, mut worst) = (true, true, 0f64);
            for n in [1usize, 3, 8, 13, 16, 17, 33, 64] {
                let mut runs = Vec::new();
                for packed in [false, true] {
                    let mut seg = m.seg(yd.ptr(), rows, None, false);
                    best.fill(0)?;
                    seg.best = best.ptr();
                    yd.fill(0xff)?;
                    if packed {
                        k.matvec(&[seg], acts, n, cols)?;
                    } else {
                        seg.packed = 0;
                        k.launch_mma(&[seg], acts, n, cols)?;
                    }
                    runs.push((yd.read_f32(n * rows)?, argmax_ids(&best, n)?));
                }
                same &= runs[0]
                    .0
                    .iter()
                    .zip(&runs[1].0)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                best_same &= runs[0].1 == runs[1].1;
                worst = worst.max(rel_err(&runs[1].0, &want[..n * rows]));
            }
            rep.check(
                same && best_same && worst < 1e-5,
                format!(
                    "packed {dtype} {rows}x{cols} n=1..64: {}, fused argmax {}, rel err vs f64 {worst:.1e}",
                    if same { "mma.cu's bits" } else { "BITS DIFFER from mma.cu" },
                    if best_same { "the same" } else { "DIFFERS" },
                ),
            );
        }
    }
    Ok(rep)
}
