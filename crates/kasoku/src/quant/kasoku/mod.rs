//! kasoku's own weight formats, designed with their kernels (`kernels::matmul::kasoku`):
//!
//! - **M** ([`m4`]): 4-bit asymmetric integers with an f16 scale and a 4-bit zero point per
//!   group of 64 columns (32 and 128 allowed): 4.3125 bits per weight at 64.
//! - **L** ([`l8`]): 8-bit symmetric integers with an f16 scale per group of 32 columns
//!   (8.5 bits per weight) or one f32 scale per row (≈8).
//!
//! Both are applied to a matrix's rows after the input-side rotation of [`rotation`] (a
//! block-diagonal randomized Hadamard transform, block 32 by default; `None` for
//! `--no-rotate`), so every value here lives in the rotated basis and [`dequantize`] rotates
//! back. A matrix is described by a [`TensorSpec`] (format, grouping, rotation, shape), which
//! checkpoints store as JSON beside its tensors ([`TensorSpec::to_json`]); its bytes are the
//! three parts of [`Part`] (codes, scales, and for M zero points), each a row-major 2-D array
//! with one row per matrix row.
//!
//! Columns must be a multiple of 64 (the kernels quantize activations in blocks of 64) and of
//! the group and rotation block sizes.

pub mod l8;
pub mod m4;
pub mod recipe;
pub mod rotation;

pub use recipe::{Recipe, Scheme};
pub use rotation::{Rotation, Signs};

use serde_json::{json, Value};

/// Columns of a kasoku-format matrix are a multiple of this (the activation block).
pub const COLUMN_MULTIPLE: usize = 64;

/// Errors describing or quantizing a kasoku-format matrix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KasokuError {
    #[error("bad tensor spec: {0}")]
    Spec(String),
    #[error("{part} of a {rows}x{cols} {format} matrix: expected {expected} bytes, got {found}")]
    Size {
        part: &'static str,
        format: String,
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error("row {row}: {reason}")]
    Values { row: usize, reason: String },
}

/// The two formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    M,
    L,
}

/// How many columns share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grouping {
    Columns(usize),
    /// One scale for the whole row (L only).
    Row,
}

/// Everything about one matrix that is not its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    pub format: Format,
    pub grouping: Grouping,
    pub rotation: Option<Rotation>,
    pub rows: usize,
    pub cols: usize,
}

/// The parts a matrix is stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// M: `[rows, cols/2]` u8, two codes per byte (even column low). L: `[rows, cols]` i8.
    Codes,
    /// M and grouped L: `[rows, groups]` f16. Per-row L: `[rows, 1]` f32.
    Scales,
    /// M only: `[rows, ⌈groups/2⌉]` u8, two zero points per byte (even group low).
    Zeros,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Codes => "codes",
            Part::Scales => "scales",
            Part::Zeros => "zeros",
        }
    }
}

impl std::fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fmt = match self.format {
            Format::M => "M",
            Format::L => "L",
        };
        match self.grouping {
            Grouping::Columns(g) => write!(f, "{fmt}/g{g}")?,
            Grouping::Row => write!(f, "{fmt}/row")?,
        }
        match self.rotation {
            Some(r) => write!(f, " rot{}#{}", r.block, r.seed),
            None => write!(f, " unrotated"),
        }
    }
}

impl TensorSpec {
    /// M with groups of `group` columns.
    pub fn m(rows: usize, cols: usize, group: usize, rotation: Option<Rotation>) -> TensorSpec {
        TensorSpec {
            format: Format::M,
            grouping: Grouping::Columns(group),
            rotation,
            rows,
            cols,
        }
    }

    /// L with groups of 32 columns (`per_row`: one scale a row).
    pub fn l(rows: usize, cols: usize, per_row: bool, rotation: Option<Rotation>) -> TensorSpec {
        TensorSpec {
            format: Format::L,
            grouping: if per_row {
                Grouping::Row
            } else {
                Grouping::Columns(l8::GROUP)
            },
            rotation,
            rows,
            cols,
        }
    }

    /// Checks that the format, grouping, rotation and shape fit together.
    pub fn validate(&self) -> Result<(), KasokuError> {
        let bad = |m: String| Err(KasokuError::Spec(m));
        if self.cols == 0 || !self.cols.is_multiple_of(COLUMN_MULTIPLE) {
            return bad(format!(
                "{} columns is not a positive multiple of {COLUMN_MULTIPLE}",
                self.cols
            ));
        }
        match (self.format, self.grouping) {
            (Format::M, Grouping::Columns(g)) if m4::GROUPS.contains(&g) => {}
            (Format::L, Grouping::Columns(l8::GROUP) | Grouping::Row) => {}
            (f, g) => return bad(format!("{f:?} does not take grouping {g:?}")),
        }
        if let Some(r) = self.rotation {
            if !r.fits(self.cols) {
                return bad(format!(
                    "rotation block {} (of {:?}) does not fit {} columns",
                    r.block,
                    rotation::BLOCKS,
                    self.cols
                ));
            }
        }
        if self.rows.checked_mul(self.cols).is_none() {
            return bad(format!("{}x{} is too large", self.rows, self.cols));
        }
        Ok(())
    }

    /// Scale groups per row (1 for per-row L).
    pub fn groups(&self) -> usize {
        match self.grouping {
            Grouping::Columns(g) => self.cols / g,
            Grouping::Row => 1,
        }
    }

    /// Group size in columns (`cols` for per-row L).
    pub fn group(&self) -> usize {
        match self.grouping {
            Grouping::Columns(g) => g,
            Grouping::Row => self.cols,
        }
    }

    /// The parts this format stores.
    pub fn parts(&self) -> &'static [Part] {
        match self.format {
            Format::M => &[Part::Codes, Part::Scales, Part::Zeros],
            Format::L => &[Part::Codes, Part::Scales],
        }
    }

    /// Bytes of one row of `part` (0 for a part this format does not have).
    pub fn row_bytes(&self, part: Part) -> usize {
        match (self.format, part) {
            (Format::M, Part::Codes) => self.cols / 2,
            (Format::M, Part::Scales) => 2 * self.groups(),
            (Format::M, Part::Zeros) => self.groups().div_ceil(2),
            (Format::L, Part::Codes) => self.cols,
            (Format::L, Part::Scales) => match self.grouping {
                Grouping::Row => 4,
                Grouping::Columns(_) => 2 * self.groups(),
            },
            (Format::L, Part::Zeros) => 0,
        }
    }

    /// The 2-D shape of `part` as stored, and its element type name in safetensors terms.
    pub fn part_layout(&self, part: Part) -> ([usize; 2], &'static str) {
        let elem = match (self.format, part, self.grouping) {
            (Format::L, Part::Codes, _) => "I8",
            (_, Part::Scales, Grouping::Row) => "F32",
            (_, Part::Scales, _) => "F16",
            _ => "U8",
        };
        let width = match elem {
            "F16" => self.row_bytes(part) / 2,
            "F32" => self.row_bytes(part) / 4,
            _ => self.row_bytes(part),
        };
        ([self.rows, width], elem)
    }

    /// Bytes of the whole matrix.
    pub fn total_bytes(&self) -> usize {
        self.parts()
            .iter()
            .map(|&p| self.row_bytes(p) * self.rows)
            .sum()
    }

    /// Stored bits per weight.
    pub fn bits_per_weight(&self) -> f64 {
        (self.total_bytes() * 8) as f64 / (self.rows * self.cols).max(1) as f64
    }

    /// The JSON form checkpoints store:
    /// `{"format": "M"|"L", "group": 64 | "row", "rotation": {"kind": "hadamard", "block": 32,
    /// "seed": 123} | null, "shape": [rows, cols]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "format": match self.format { Format::M => "M", Format::L => "L" },
            "group": match self.grouping {
                Grouping::Columns(g) => json!(g),
                Grouping::Row => json!("row"),
            },
            "rotation": self.rotation.map(|r| json!({
                "kind": "hadamard", "block": r.block, "seed": r.seed,
            })),
            "shape": [self.rows, self.cols],
        })
    }

    /// Reads and validates [`TensorSpec::to_json`]'s form.
    pub fn from_json(v: &Value) -> Result<TensorSpec, KasokuError> {
        let bad = |m: &str| KasokuError::Spec(format!("{m} in {v}"));
        let obj = v.as_object().ok_or_else(|| bad("not an object"))?;
        let format = match obj.get("format").and_then(Value::as_str) {
            Some("M") => Format::M,
            Some("L") => Format::L,
            _ => return Err(bad("'format' is not \"M\" or \"L\"")),
        };
        let grouping = match obj.get("group") {
            Some(Value::String(s)) if s == "row" => Grouping::Row,
            Some(g) => Grouping::Columns(
                g.as_u64()
                    .and_then(|g| usize::try_from(g).ok())
                    .ok_or_else(|| bad("'group' is not a count or \"row\""))?,
            ),
            None => return Err(bad("no 'group'")),
        };
        let rotation = match obj.get("rotation") {
            None | Some(Value::Null) => None,
            Some(r) => {
                if r.get("kind").and_then(Value::as_str) != Some("hadamard") {
                    return Err(bad("rotation 'kind' is not \"hadamard\""));
                }
                let num = |k: &str| r.get(k).and_then(Value::as_u64);
                let block = num("block")
                    .and_then(|b| usize::try_from(b).ok())
                    .ok_or_else(|| bad("rotation has no 'block'"))?;
                let seed = num("seed").ok_or_else(|| bad("rotation has no 'seed'"))?;
                Some(Rotation::new(seed, block))
            }
        };
        let shape: Vec<usize> = obj
            .get("shape")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect()
            })
            .unwrap_or_default();
        let [rows, cols] = shape[..] else {
            return Err(bad("'shape' is not [rows, cols]"));
        };
        let spec = TensorSpec {
            format,
            grouping,
            rotation,
            rows,
            cols,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// A quantized matrix's bytes, borrowed (e.g. from a memory-mapped checkpoint), checked
/// against its spec.
#[derive(Clone, Copy, Debug)]
pub struct QuantizedView<'a> {
    pub spec: TensorSpec,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    /// Empty for L.
    pub zeros: &'a [u8],
}

impl<'a> QuantizedView<'a> {
    /// The view, if the spec is valid and every part has the size it implies.
    pub fn new(
        spec: TensorSpec,
        codes: &'a [u8],
        scales: &'a [u8],
        zeros: &'a [u8],
    ) -> Result<Self, KasokuError> {
        spec.validate()?;
        for (part, bytes) in [
            (Part::Codes, codes),
            (Part::Scales, scales),
            (Part::Zeros, zeros),
        ] {
            let expected = spec.row_bytes(part) * spec.rows;
            if bytes.len() != expected {
                return Err(KasokuError::Size {
                    part: part.name(),
                    format: spec.to_string(),
                    rows: spec.rows,
                    cols: spec.cols,
                    expected,
                    found: bytes.len(),
                });
            }
        }
        Ok(QuantizedView {
            spec,
            codes,
            scales,
            zeros,
        })
    }

    /// Row `r`'s bytes of `part`.
    pub fn row(&self, part: Part, r: usize) -> &'a [u8] {
        let n = self.spec.row_bytes(part);
        let all = match part {
            Part::Codes => self.codes,
            Part::Scales => self.scales,
            Part::Zeros => self.zeros,
        };
        &all[r * n..(r + 1) * n]
    }

    /// Row `r`'s values in the rotated basis (what the kernels multiply).
    pub fn dequantize_row_rotated(&self, r: usize, out: &mut [f32]) {
        let s = &self.spec;
        let (codes, scales) = (self.row(Part::Codes, r), self.row(Part::Scales, r));
        match (s.format, s.grouping) {
            (Format::M, _) => {
                m4::dequantize_row(codes, scales, self.row(Part::Zeros, r), s.group(), out)
            }
            (Format::L, Grouping::Row) => l8::dequantize_row_per_row(codes, scales, out),
            (Format::L, Grouping::Columns(_)) => l8::dequantize_row_grouped(codes, scales, out),
        }
    }

    /// The matrix's values in the original basis, row-major `rows × cols`.
    pub fn dequantize(&self) -> Vec<f32> {
        let s = &self.spec;
        let signs = s.rotation.map(|r| r.signs(s.cols));
        let mut out = vec![0f32; s.rows * s.cols];
        for (r, row) in out.chunks_exact_mut(s.cols.max(1)).enumerate() {
            self.dequantize_row_rotated(r, row);
            if let Some(signs) = &signs {
                signs.unrotate(row);
            }
        }
        out
    }
}

/// A quantized matrix with owned bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedMatrix {
    pub spec: TensorSpec,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub zeros: Vec<u8>,
}

impl QuantizedMatrix {
    pub fn view(&self) -> QuantizedView<'_> {
        QuantizedView {
            spec: self.spec,
            codes: &self.codes,
            scales: &self.scales,
            zeros: &self.zeros,
        }
    }

    /// The bytes of `part`.
    pub fn part(&self, part: Part) -> &[u8] {
        match part {
            Part::Codes => &self.codes,
            Part::Scales => &self.scales,
            Part::Zeros => &self.zeros,
        }
    }
}

/// Quantizes `values` (row-major `rows × cols`, original basis) to `spec`: each row is
/// rotated (if the spec says so), then quantized; chunks of rows run on scoped threads. Fails on a
/// shape that does not fit, a non-finite value, or a scale beyond f16's range (naming the
/// first such row).
pub fn quantize(spec: TensorSpec, values: &[f32]) -> Result<QuantizedMatrix, KasokuError> {
    spec.validate()?;
    if values.len() != spec.rows * spec.cols {
        return Err(KasokuError::Spec(format!(
            "{} values for a {}x{} matrix",
            values.len(),
            spec.rows,
            spec.cols
        )));
    }
    let signs = spec.rotation.map(|r| r.signs(spec.cols));
    let mut m = QuantizedMatrix {
        spec,
        codes: vec![0; spec.row_bytes(Part::Codes) * spec.rows],
        scales: vec![0; spec.row_bytes(Part::Scales) * spec.rows],
        zeros: vec![0; spec.row_bytes(Part::Zeros) * spec.rows],
    };
    if spec.rows == 0 {
        return Ok(m);
    }
    let (cb, sb, zb) = (
        spec.row_bytes(Part::Codes),
        spec.row_bytes(Part::Scales),
        spec.row_bytes(Part::Zeros),
    );
    // Rows in parallel: one scoped thread per chunk of rows, each writing its rows' parts.
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = spec.rows.div_ceil(threads).max(1);
    let quantize_rows = |first: usize, codes: &mut [u8], scales: &mut [u8], zeros: &mut [u8]| {
        for i in 0..codes.len() / cb {
            let r = first + i;
            let src = &values[r * spec.cols..(r + 1) * spec.cols];
            if let Some(c) = src.iter().position(|v| !v.is_finite()) {
                return Err(KasokuError::Values {
                    row: r,
                    reason: format!("column {c} is {}", src[c]),
                });
            }
            let mut row = src.to_vec();
            if let Some(signs) = &signs {
                signs.rotate(&mut row);
            }
            let (c, s) = (
                &mut codes[i * cb..(i + 1) * cb],
                &mut scales[i * sb..(i + 1) * sb],
            );
            let ok = match (spec.format, spec.grouping) {
                (Format::M, _) => {
                    m4::quantize_row(&row, spec.group(), c, s, &mut zeros[i * zb..(i + 1) * zb])
                }
                (Format::L, Grouping::Row) => {
                    l8::quantize_row_per_row(&row, c, s);
                    Some(())
                }
                (Format::L, Grouping::Columns(_)) => l8::quantize_row_grouped(&row, c, s),
            };
            ok.ok_or_else(|| KasokuError::Values {
                row: r,
                reason: "a group's scale exceeds f16's range".into(),
            })?;
        }
        Ok(())
    };
    let results: Vec<Result<(), KasokuError>> = std::thread::scope(|scope| {
        let zero_chunks: Vec<&mut [u8]> = if zb == 0 {
            (0..spec.rows.div_ceil(per))
                .map(|_| <&mut [u8]>::default())
                .collect()
        } else {
            m.zeros.chunks_mut(per * zb).collect()
        };
        let handles: Vec<_> = m
            .codes
            .chunks_mut(per * cb)
            .zip(m.scales.chunks_mut(per * sb))
            .zip(zero_chunks)
            .enumerate()
            .map(|(t, ((codes, scales), zeros))| {
                let quantize_rows = &quantize_rows;
                scope.spawn(move || quantize_rows(t * per, codes, scales, zeros))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    // The first failing row (chunks are in row order).
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn weights(seed: u64, rows: usize, cols: usize) -> Vec<f32> {
        let mut s = seed | 1;
        (0..rows * cols)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                // A few outlier columns, as real weight matrices have.
                let boost = if i % cols == 7 || i % cols == 100 {
                    8.0
                } else {
                    1.0
                };
                (u * u * u * 0.05 * boost) as f32
            })
            .collect()
    }

    fn specs(rows: usize, cols: usize) -> Vec<TensorSpec> {
        let rot = Some(Rotation::new(42, 32));
        vec![
            TensorSpec::m(rows, cols, 32, rot),
            TensorSpec::m(rows, cols, 64, rot),
            TensorSpec::m(rows, cols, 128, None),
            TensorSpec::l(rows, cols, false, rot),
            TensorSpec::l(rows, cols, true, None),
            TensorSpec::l(rows, cols, true, Some(Rotation::new(1, 64))),
        ]
    }

    #[test]
    fn quantize_then_dequantize_stays_within_each_formats_bound() {
        let (rows, cols) = (5, 256);
        let w = weights(3, rows, cols);
        for spec in specs(rows, cols) {
            let q = quantize(spec, &w).unwrap();
            assert_eq!(
                q.codes.len() + q.scales.len() + q.zeros.len(),
                spec.total_bytes()
            );
            let back = q.view().dequantize();
            let signs = spec.rotation.map(|r| r.signs(cols));
            for r in 0..rows {
                // Bound in the rotated basis (where the grid lives), per group: M's rms error
                // at most half the min-max step; L's every value within half a step. The
                // rotation is orthogonal, so the row's total squared error is the same in the
                // original basis (up to f32 rounding).
                let mut rot = w[r * cols..(r + 1) * cols].to_vec();
                if let Some(s) = &signs {
                    s.rotate(&mut rot);
                }
                let mut deq = vec![0f32; cols];
                q.view().dequantize_row_rotated(r, &mut deq);
                let g = spec.group();
                let mut allowed = 0f64;
                for (grp, (a, b)) in rot.chunks(g).zip(deq.chunks(g)).enumerate() {
                    let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
                    let bound = match spec.format {
                        Format::M => {
                            let lo = a.iter().fold(0f32, |m, &v| m.min(v));
                            let hi = a.iter().fold(0f32, |m, &v| m.max(v));
                            let step = m4::f16_at_least((hi - lo) / 15.0).unwrap().to_f32();
                            (step as f64 / 2.0).powi(2) * g as f64
                        }
                        Format::L => {
                            let amax = a.iter().fold(0f32, |m, &v| m.max(v.abs()));
                            let step = if spec.grouping == Grouping::Row {
                                l8::row_scale(q.view().row(Part::Scales, r))
                            } else {
                                m4::f16_at_least(amax / 127.0).unwrap().to_f32()
                            };
                            (step as f64 / 2.0).powi(2) * g as f64
                        }
                    };
                    assert!(err <= bound * (1.0 + 1e-5), "{spec} row {r} group {grp}");
                    allowed += bound;
                }
                let orig: f64 = w[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&back[r * cols..(r + 1) * cols])
                    .map(|(x, y)| ((x - y) as f64).powi(2))
                    .sum();
                assert!(
                    orig <= allowed * 1.001 + 1e-12,
                    "{spec} row {r}: {orig} > {allowed}"
                );
            }
        }
    }

    #[test]
    fn the_rotation_lowers_m_error_on_outlier_columns() {
        let (rows, cols) = (16, 512);
        let w = weights(9, rows, cols);
        let err = |rotation| {
            let q = quantize(TensorSpec::m(rows, cols, 64, rotation), &w).unwrap();
            let back = q.view().dequantize();
            w.iter()
                .zip(&back)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum::<f64>()
        };
        let (plain, rotated) = (err(None), err(Some(Rotation::new(7, 32))));
        assert!(rotated < 0.9 * plain, "rotated {rotated} vs plain {plain}");
    }

    #[test]
    fn specs_round_trip_through_json_and_bad_ones_are_named() {
        for spec in specs(3, 128) {
            let back = TensorSpec::from_json(&spec.to_json()).unwrap();
            assert_eq!(back, spec);
        }
        let bad = [
            json!({"format": "Q", "group": 64, "shape": [1, 64]}),
            json!({"format": "M", "group": 48, "shape": [1, 96]}),
            json!({"format": "M", "group": "row", "shape": [1, 64]}),
            json!({"format": "L", "group": 32, "shape": [1, 96]}),
            json!({"format": "L", "group": 32, "shape": [1]}),
            json!({"format": "M", "group": 64, "rotation": {"kind": "hadamard", "block": 24, "seed": 1}, "shape": [2, 64]}),
            json!({"format": "M", "group": 64, "rotation": {"kind": "givens", "block": 32, "seed": 1}, "shape": [2, 64]}),
            json!([1, 2]),
        ];
        for v in bad {
            assert!(
                matches!(TensorSpec::from_json(&v), Err(KasokuError::Spec(_))),
                "{v}"
            );
        }
    }

    #[test]
    fn views_check_part_sizes_and_quantize_checks_values() {
        let spec = TensorSpec::m(2, 64, 64, None);
        assert!(QuantizedView::new(spec, &[0; 64], &[0; 4], &[0; 2]).is_ok());
        let e = QuantizedView::new(spec, &[0; 64], &[0; 4], &[0; 1]).unwrap_err();
        assert!(e.to_string().contains("zeros"), "{e}");
        let mut w = vec![0.1f32; 128];
        w[70] = f32::NAN;
        let e = quantize(spec, &w).unwrap_err();
        assert_eq!(
            e,
            KasokuError::Values {
                row: 1,
                reason: "column 6 is NaN".into()
            }
        );
        assert!(quantize(spec, &w[..64]).is_err());
    }

    #[test]
    fn bits_per_weight() {
        let bpw = |s: TensorSpec| s.bits_per_weight();
        assert_eq!(bpw(TensorSpec::m(8, 1536, 64, None)), 4.3125);
        assert_eq!(bpw(TensorSpec::m(8, 1536, 32, None)), 4.625);
        assert_eq!(bpw(TensorSpec::m(8, 1536, 128, None)), 4.15625);
        assert_eq!(bpw(TensorSpec::l(8, 1536, false, None)), 8.5);
        assert!((bpw(TensorSpec::l(8, 1536, true, None)) - 8.0208).abs() < 1e-3);
    }
}
