//! Host-side parts of the GPU DFlash drafter (no GPU needed): the pass descriptions, the
//! candidates read back, the scored head rows and the checkpoint checks.

use kasoku::format::{HfCheckpoint, TensorSource};
use kasoku::model::dflash::DFlashConfig;
use kasoku::spec::marginal_tree::top_k_log_probs;

use super::state::{append_meta, block_meta, candidates_from_words, gather_meta, DraftMeta};
use super::weights::{check_geometry, check_tensors, expected_tensors};
use super::*;
use crate::kernels::{RowTop2, TOP2_WORDS};

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// Every block row sees the context and the whole block (virtual position: the block's last
/// slot) while RoPE rotates row `i` at `pos + i`; a projection's rows sit after the context.
#[test]
fn a_block_is_unmasked_and_rotated_at_its_own_positions() {
    let layout = DraftMeta::new(8);
    let w = block_meta(&layout, 5, 42, 370, 9, 4);
    assert_eq!(&w[..4], &[5, 4, 1, 0]);
    assert_eq!(&w[layout.rope_pos..layout.rope_pos + 4], &[9, 10, 11, 12]);
    assert_eq!(&w[layout.seen..layout.seen + 4], &[8, 8, 8, 8]);
    assert_eq!(&w[layout.tokens..layout.tokens + 4], &[42, 370, 370, 370]);
    let w = append_meta(&layout, 3, &[3, 4, 7]);
    assert_eq!(&w[..4], &[3, 3, 1, 0]);
    assert_eq!(&w[layout.rope_pos..layout.rope_pos + 3], &[3, 4, 7]);
    assert_eq!(layout.words, 4 + 3 * 8);
}

/// A projection of rows the target recorded names them in the token slots (a path's nodes,
/// in any order), its positions and the context's length as a projection of host features.
#[test]
fn a_projection_in_place_names_the_recorded_rows() {
    let layout = DraftMeta::new(8);
    let w = gather_meta(&layout, 6, &[6, 7, 8], &[0, 4, 2]);
    assert_eq!(&w[..4], &[6, 3, 1, 0]);
    assert_eq!(&w[layout.rope_pos..layout.rope_pos + 3], &[6, 7, 8]);
    assert_eq!(&w[layout.tokens..layout.tokens + 3], &[0, 4, 2]);
    let plain = append_meta(&layout, 6, &[6, 7, 8]);
    assert_eq!(&w[..layout.tokens], &plain[..layout.tokens]);
}

/// The device's words give the host's `top_k_log_probs` of the same rows.
#[test]
fn candidates_from_the_devices_words_match_the_host_selection() {
    let rows: [&[f32]; 2] = [&[0.5, 2.0, -1.0, 2.0, 0.0], &[3.0, 1.0, 2.5, -4.0, 0.25]];
    let k = 3;
    let mut words = Vec::new();
    for row in rows {
        // The kernel's pairs come in no particular order.
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &i in idx[..k].iter().rev() {
            words.extend([i as u32, row[i].to_bits()]);
        }
    }
    for row in rows {
        let t = RowTop2::of(row);
        words.extend([
            t.best.0,
            t.best.1.to_bits(),
            t.second.0,
            t.second.1.to_bits(),
            t.mass.to_bits(),
        ]);
    }
    assert_eq!(words.len(), 2 * (2 * k + TOP2_WORDS));
    let got = candidates_from_words(&words, 2, k);
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let want = top_k_log_probs(&flat, 5, k);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.iter().map(|c| c.0).collect::<Vec<_>>(),
            w.iter().map(|c| c.0).collect::<Vec<_>>()
        );
        for (a, b) in g.iter().zip(w) {
            assert!((a.1 - b.1).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn the_head_scores_the_cpu_drafters_rows() {
    assert_eq!(scored_rows(0, 384), 384);
    assert_eq!(scored_rows(40, 384), 40);
    assert_eq!(scored_rows(41, 384), 48);
    assert_eq!(scored_rows(383, 384), 384);
    assert_eq!(scored_rows(32768, 151936), 32768);
    assert_eq!(scored_rows(200000, 151936), 151936);
}

/// The committed fixture passes the GPU loader's checks; a missing, misshapen or unknown
/// tensor, or a shape the kernels cannot take, is a clear error.
#[test]
fn the_checkpoint_checks_name_the_tensor() {
    let dir = fixture("qwen2/tiny_dflash");
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let config = DFlashConfig::from_hf(ckpt.config()).unwrap();
    check_tensors(&config, &ckpt).unwrap();
    check_geometry(&config).unwrap();
    assert_eq!(expected_tensors(&config).len(), ckpt.names().len());
    assert!(config.check_shape(64, 2, 384, 384).is_ok());
    let e = config.check_shape(64, 1, 384, 384).unwrap_err();
    assert!(e.contains("beyond the target's 1 layers"), "{e}");

    let mut more = config.clone();
    more.n_layers = 3;
    let e = check_tensors(&more, &ckpt).unwrap_err().to_string();
    assert!(
        e.contains("layers.2.input_layernorm.weight is missing"),
        "{e}"
    );
    let mut fewer = config.clone();
    fewer.n_layers = 1;
    let e = check_tensors(&fewer, &ckpt).unwrap_err().to_string();
    assert!(
        e.contains("layers.1.") && e.contains("not part of the network"),
        "{e}"
    );
    let mut wider = config.clone();
    wider.intermediate = 128;
    let e = check_tensors(&wider, &ckpt).unwrap_err().to_string();
    assert!(e.contains("mlp.gate_proj") && e.contains("shape"), "{e}");
    let mut odd = config.clone();
    odd.hidden = 48;
    assert!(check_geometry(&odd)
        .unwrap_err()
        .contains("multiples of 32"));
    odd = config.clone();
    odd.head_dim = 512;
    assert!(check_geometry(&odd).unwrap_err().contains("head_dim 512"));

    // The drafter in kasoku's own formats (`kasoku quantize DIR OUT --format l`): its
    // matrices pass the checks and go to the GPU as F16 values near the original ones.
    use kasoku::format::kasoku_write::{write_quantized, Naming};
    use kasoku::quant::kasoku::{Recipe, Scheme};
    let out = std::env::temp_dir().join(format!("kasoku-cuda-dflash-l-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    write_quantized(
        &ckpt,
        Naming::Hf(&ckpt),
        Recipe::new(Scheme::L),
        &out.join("model.safetensors"),
        &mut |_, _, _| {},
    )
    .unwrap();
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    let quantized = HfCheckpoint::open(&out).unwrap();
    check_tensors(&config, &quantized).unwrap();
    let q = quantized
        .quantized("fc.weight")
        .expect("fc.weight quantized");
    let original = ckpt.get("fc.weight").unwrap();
    let mut want = vec![0f32; original.numel()];
    kasoku::quant::dequantize(original.dtype, original.data.as_slice(), &mut want);
    let got: Vec<f32> = super::weights::f16_bytes(&q)
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| x * x).sum::<f32>().sqrt();
    let err =
        norm(&mut got.iter().zip(&want).map(|(a, b)| a - b)) / norm(&mut want.iter().copied());
    assert!(err < 0.01, "L fc.weight relative error {err}");
    // A quantized matrix of the wrong shape is named.
    let mut wider = config.clone();
    wider.hidden = 128;
    let e = check_tensors(&wider, &quantized).unwrap_err().to_string();
    std::fs::remove_dir_all(&out).ok();
    assert!(e.contains("fc.weight has shape"), "{e}");
}
