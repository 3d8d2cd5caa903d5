//! The prefill attention kernel (`attention_prefill.cu`) against the CPU's attention over the
//! same f16 keys and values: long chain passes of the real models' head shapes, with and
//! without int8 output; and each row's bits the same whether the pass starts at its prompt's
//! beginning or partway (the rows split over two calls).

use kasoku::kernels::attention::{attention, AttnGeometry};

use super::{f16_round, f64s, out_buf, randv, rel_err, QuantBufs, Report, R};
use crate::kernels::{AttnCall, Kernels};
use crate::runtime::{as_bytes, DeviceBuffer};
use crate::synth::Rng;

/// (what, query heads, KV heads, head_dim, cached positions, rows, int8 output)
type Case = (&'static str, usize, usize, usize, usize, usize, bool);

const CASES: [Case; 5] = [
    (
        "the 1.5B's heads, a 512-row prompt",
        12,
        2,
        128,
        0,
        512,
        true,
    ),
    (
        "the 0.5B's heads after 100 cached",
        14,
        2,
        64,
        100,
        200,
        false,
    ),
    ("GQA 1 after 700 cached", 4, 4, 128, 700, 77, true),
    ("65 rows, one past a block", 8, 2, 64, 0, 65, true),
    ("GQA 6 after 2000 cached", 12, 2, 128, 2000, 300, false),
];

/// Every case of [`CASES`].
pub fn checks(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    let mut rng = Rng(41);
    for (what, nh, nkv, hd, past, n, int8) in CASES {
        let (q_dim, total) = (nh * hd, past + n);
        let max_slots = total + 16;
        let q = randv(&mut rng, n * q_dim, 1.0);
        // Keys and values per KV head, [total][hd], as the f16 cache holds them.
        let keys: Vec<Vec<f32>> = (0..nkv)
            .map(|_| f16_round(&randv(&mut rng, total * hd, 2.0)))
            .collect();
        let vals: Vec<Vec<f32>> = (0..nkv)
            .map(|_| f16_round(&randv(&mut rng, total * hd, 1.0)))
            .collect();
        let cache = |per_head: &[Vec<f32>]| -> R<DeviceBuffer> {
            let mut bits = vec![0u16; nkv * max_slots * hd];
            for (h, x) in per_head.iter().enumerate() {
                for (i, v) in x.iter().enumerate() {
                    bits[h * max_slots * hd + i] = half::f16::from_f32(*v).to_bits();
                }
            }
            gpu.upload(as_bytes(&bits))
        };
        let (kc, vc) = (cache(&keys)?, cache(&vals)?);
        let positions: Vec<i32> = (past..total).map(|p| p as i32).collect();
        let pos = gpu.upload(as_bytes(&positions))?;
        let qd = gpu.upload(as_bytes(&q))?;
        let scale = 1.0 / (hd as f32).sqrt();
        // Rows `from..to` of the pass in one call, into `out` (and its int8 blocks).
        let attend = |from: usize, to: usize, out: &DeviceBuffer, qb: &QuantBufs| -> R<()> {
            let at = from * q_dim;
            k.attention_prefill(&AttnCall {
                q: qd.at(at * 4),
                k_cache: kc.ptr(),
                v_cache: vc.ptr(),
                max_slots,
                n: to - from,
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                scale,
                batch: 0,
                pos: pos.at(from * 4),
                path: 0,
                part_ml: 0,
                part_o: 0,
                chunks: 0,
                arrivals: 0,
                out: out.at(at * 4),
                out_q: if int8 { qb.xq.at(at) } else { 0 },
                out_s: if int8 { qb.xs.at(at / 32 * 16) } else { 0 },
                post: Default::default(),
            })?;
            Ok(())
        };
        let out = out_buf(gpu, n * q_dim)?;
        let qb = QuantBufs::new(gpu, n * q_dim)?;
        attend(0, n, &out, &qb)?;
        let got = out.read_f32(n * q_dim)?;

        let kr: Vec<&[f32]> = keys.iter().map(|x| &x[..]).collect();
        let vr: Vec<&[f32]> = vals.iter().map(|x| &x[..]).collect();
        let geo = AttnGeometry {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        let mut want = vec![0f32; n * q_dim];
        attention(geo, &q, &kr, &vr, past, scale, &mut want);
        let e = rel_err(&got, &f64s(&want));
        let q_ok = !int8 || qb.equal_ref(&got)?;
        rep.check(
            e < 1e-5 && q_ok,
            format!(
                "prefill attention ({what}: {nh}/{nkv} heads of {hd}, {past} cached, {n} rows): rel err vs CPU {e:.1e}{}",
                if int8 {
                    format!("; int8 blocks equal the reference's: {q_ok}")
                } else {
                    String::new()
                }
            ),
        );

        // The same rows in two calls, split at an odd row: the bits of the single call.
        let split = n / 3 + 1;
        let out2 = out_buf(gpu, n * q_dim)?;
        let qb2 = QuantBufs::new(gpu, n * q_dim)?;
        attend(0, split, &out2, &qb2)?;
        attend(split, n, &out2, &qb2)?;
        let got2 = out2.read_f32(n * q_dim)?;
        let same = got
            .iter()
            .zip(&got2)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        rep.check(
            same,
            format!(
                "prefill attention ({what}): rows split over two calls at row {split} have the single call's bits: {same}"
            ),
        );
    }
    Ok(rep)
}
