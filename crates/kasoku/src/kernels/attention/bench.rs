//! A timing of decode attention over caches larger than the last-level cache (ignored; run
//! by hand).

use super::*;

/// `cargo test --release -p kasoku --lib attention::bench -- --ignored --nocapture`
#[test]
#[ignore]
fn decode_attention_speed() {
    for &(nh, nkv, hd, ctx) in &[
        (9usize, 3usize, 64usize, 2048usize),
        (12, 2, 128, 4096),
        (16, 4, 256, 4096),
        (4, 1, 256, 4096),
        (6, 1, 128, 4096),
    ] {
        let geo = AttnGeometry {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        // Enough layers that their caches exceed the last-level cache, as in a model.
        let layer_bytes = 2 * ctx * nkv * hd * 4;
        let layers = (128usize << 20).div_ceil(layer_bytes);
        let kh: Vec<Vec<Vec<f32>>> = (0..layers)
            .map(|_| vec![vec![0.01f32; ctx * hd]; nkv])
            .collect();
        let vh: Vec<Vec<Vec<f32>>> = (0..layers)
            .map(|_| vec![vec![0.02f32; ctx * hd]; nkv])
            .collect();
        let q = vec![0.1f32; nh * hd];
        let mut out = vec![0f32; nh * hd];
        let reps = 10;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            for l in 0..layers {
                let k: Vec<&[f32]> = kh[l].iter().map(|h| &h[..]).collect();
                let v: Vec<&[f32]> = vh[l].iter().map(|h| &h[..]).collect();
                attention(geo, &q, &k, &v, ctx - 1, 0.1, &mut out);
            }
        }
        let dt = t.elapsed().as_secs_f64() / (reps * layers) as f64;
        let bytes = (2 * ctx * nkv * hd * 4) as f64;
        eprintln!(
            "{nh}/{nkv}x{hd} ctx {ctx}: {:.3} ms per layer, {:.1} GB/s of KV",
            dt * 1e3,
            bytes / dt / 1e9
        );
    }
}
