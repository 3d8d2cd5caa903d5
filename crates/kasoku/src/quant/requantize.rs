//! Load-time requantization: rewriting a matrix stored in one format into a lighter one
//! (dequantize each row to f32, quantize it again with GGML's reference rule), for models
//! whose exactness does not matter, such as a draft model: its guesses are checked by the
//! target, so it may trade a little accuracy for fewer bytes per token.

use super::{dequantize, legacy, DType};

/// Bits per value of `dtype` (block bytes × 8 / block values).
pub fn bits_per_value(dtype: DType) -> f64 {
    (dtype.block_bytes() * 8) as f64 / dtype.block_size() as f64
}

/// The formats [`requantize`] writes.
pub fn can_write(to: DType) -> bool {
    matches!(to, DType::Q4_0 | DType::Q8_0)
}

/// Whether a `[_, cols]` matrix stored as `from` is worth rewriting as `to`: `to` is writable,
/// takes fewer bits per value, and its blocks divide the rows.
pub fn worth_it(from: DType, to: DType, cols: usize) -> bool {
    can_write(to)
        && bits_per_value(to) < bits_per_value(from)
        && cols.is_multiple_of(to.block_size())
        && cols.is_multiple_of(from.block_size())
}

/// Rewrites `rows` rows of `cols` values from format `from` (`bytes`, rows contiguous) into
/// format `to`. Returns `None` when `bytes` is not `rows` whole rows of `from`, or when the
/// shapes do not fit [`worth_it`]'s block rule.
pub fn requantize(
    from: DType,
    to: DType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Option<Vec<u8>> {
    let (src_row, dst_row) = (from.bytes_for(cols)?, to.bytes_for(cols)?);
    if !can_write(to) || bytes.len() != src_row.checked_mul(rows)? {
        return None;
    }
    let mut out = vec![0u8; dst_row * rows];
    let mut values = vec![0f32; cols];
    for (src, dst) in bytes
        .chunks_exact(src_row.max(1))
        .zip(out.chunks_exact_mut(dst_row.max(1)))
    {
        dequantize(from, src, &mut values);
        match to {
            DType::Q4_0 => legacy::quantize_q4_0(&values, dst),
            DType::Q8_0 => legacy::quantize_q8_0(&values, dst),
            _ => unreachable!("checked by can_write"),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::legacy::tests::{random_blocks, Rng};

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// llama.cpp's `llama-quantize --allow-requantize … Q4_0` on real rows of the
    /// Qwen2.5-Coder-0.5B Q4_K_M file (tools/make_requant_fixture.py): the same bytes.
    #[test]
    fn q4_0_matches_llama_quantize_byte_for_byte() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/requant/q4_0.json"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(
            cases.len() >= 3,
            "the fixture covers several source formats"
        );
        for case in cases {
            let name = case["source_type"].as_str().unwrap();
            let from = DType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
            let cols = case["cols"].as_u64().unwrap() as usize;
            let src = hex(case["source"].as_str().unwrap());
            let expect = hex(case["q4_0"].as_str().unwrap());
            let got = requantize(from, DType::Q4_0, 1, cols, &src).unwrap();
            assert_eq!(got, expect, "{} ({name} → Q4_0)", case["tensor"]);
        }
    }

    #[test]
    fn q4_0_round_trip_stays_within_half_a_step() {
        let mut rng = Rng(0x4_0);
        let x: Vec<f32> = (0..32 * 64).map(|_| rng.f32() * 3.0 - 1.5).collect();
        let mut q = vec![0u8; 64 * 18];
        legacy::quantize_q4_0(&x, &mut q);
        let mut back = vec![0f32; x.len()];
        dequantize(DType::Q4_0, &q, &mut back);
        for (b, (xb, yb)) in q
            .chunks_exact(18)
            .zip(x.chunks_exact(32).zip(back.chunks_exact(32)))
        {
            let d = legacy::f16_at(b, 0).abs();
            for (v, w) in xb.iter().zip(yb) {
                // Half a step, plus the rounding of d to f16 across the 8 steps to the extreme.
                assert!(
                    (v - w).abs() <= 0.5 * d + 8.0 * d * 1e-3 + 1e-6,
                    "{v} vs {w} (d {d})"
                );
            }
        }
    }

    #[test]
    fn only_lighter_formats_are_worth_it() {
        assert!(worth_it(DType::Q5_0, DType::Q4_0, 64));
        assert!(worth_it(DType::Q6K, DType::Q4_0, 256));
        assert!(worth_it(DType::F16, DType::Q8_0, 64));
        assert!(!worth_it(DType::Q4K, DType::Q4_0, 256)); // same 4.5 bits
        assert!(!worth_it(DType::Q4_0, DType::Q8_0, 64));
        assert!(!worth_it(DType::Q5_0, DType::Q4_1, 64)); // not a format it writes
        assert!(!worth_it(DType::F32, DType::Q4_0, 48)); // blocks do not divide the row
    }

    #[test]
    fn malformed_input_is_refused() {
        let mut rng = Rng(7);
        let src = random_blocks(&mut rng, 22, 4); // 4 Q5_0 blocks: two rows of 64
        assert!(requantize(DType::Q5_0, DType::Q4_0, 2, 64, &src).is_some());
        assert!(requantize(DType::Q5_0, DType::Q4_0, 3, 64, &src).is_none());
        assert!(requantize(DType::Q5_0, DType::Q4_0, 2, 64, &src[..80]).is_none());
        assert!(requantize(DType::Q5_0, DType::Q4K, 2, 64, &src).is_none());
    }
}
