//! Products `y = x · Wᵀ` on kasoku's formats M and L (`quant::kasoku`), for any number of
//! activation rows, with every product an integer dot product: the activations are rotated
//! by the matrix's rotation and quantized to int8 once per call ([`Int8Acts`]), and each
//! (weight row, activation row, block) pair adds one exact integer sum times one scale.
//! `kasoku_avx2.rs` holds the AVX2 kernels (4 activation rows per tile) and `kasoku_vnni.rs`
//! the AVX512-VNNI ones (8 rows per tile, 256-bit vectors); the portable kernel here is the
//! reference they are tested against, bit for bit.
//!
//! **Activations** ([`Int8Acts`]): each row is rotated (`√b·R·x`: signs, then the
//! unnormalised Hadamard transform of each block), then cut into blocks of 64 values; a block
//! gets codes `a = round(x·127/max|x|)` (ties to even), the scale `d = (max|x|/127)·(1/√b)`
//! (the rotation's normalisation folded in; no factor without rotation), and the code sums of
//! each half and of the whole block, stored negated (`−Σa`) and times 128 (`−128·Σa`) for the
//! kernels' zero-point and offset corrections. Blocks are stored block-major (block `b` of row
//! `r` is entry `b·n + r`) so that one pointer reaches a tile's rows. The transform takes a row
//! chunk by chunk (a rotation block, or 64 values if larger: [`Int8Acts::fill_rows`]), so the
//! fused epilogues of `kernels::fused` feed it their values as they compute them.
//!
//! **Packed weights.** Rows are taken in groups of [`GROUP`] = 8 (the last padded with zero
//! rows: scale 0). For each group, its column blocks follow in order, each holding the eight
//! rows' data for that block:
//! - M, group `G` (32/64/128 columns), `20 + 4G` bytes: the eight f16 scales; the eight zero
//!   points as nibbles (row `i` in byte `i/2`, nibble `i%2`); then `G/8` code registers of 32
//!   bytes: register `j`, 32-bit lane `i` (row `i`), byte `t` holds in its low nibble the code
//!   of column `4j + t` and in its high nibble that of column `G/2 + 4j + t`.
//! - L, groups of 32, 272 bytes: the eight f16 scales, then 8 code registers: register `k`,
//!   lane `i`, byte `t` = code of column `4k + t` plus 128 (offset binary, so `vpdpbusd` can
//!   take it as the unsigned operand).
//! - L per row: the group starts with the eight f32 row scales (32 bytes); then blocks of 64
//!   columns, 16 code registers each (register `k`: columns `4k..4k+4`), offset binary.
//!
//! A code register times the activation's four bytes for its columns, broadcast to every lane,
//! gives the eight rows' partial dot products at once (`vpdpbusd`, or `maddubs` + `madd` on
//! AVX2): every weight byte is read once per call for all activation rows, and no horizontal
//! sums are needed.
//!
//! **Arithmetic** (the same on every path, in this order, so results agree bit for bit and a
//! row's result does not depend on how many rows share the call):
//! - M: per group (G ≤ 64) or per half-group of 64 columns (G = 128): the exact integer
//!   `t = Σ q·a − z·Σa`, then `acc = fma(t, s·d, acc)` (`s·d` one f32 product).
//! - L grouped: per group of 32, `t = Σ w·a`, `acc = fma(t, s·d, acc)`.
//! - L per row: per block of 64, `t = Σ w·a`, `acc = fma(t, d, acc)`; finally `y = acc·s`.
//!
//! Integer sums are exact (|t| < 2²⁴, so converting them to f32 is exact too).

use std::cell::RefCell;
use std::ops::Range;

use half::f16;

use super::PackedBytes;
use crate::kernels::simd::Isa;
use crate::kernels::{scratch, threads};
use crate::quant::kasoku::m4::round_even;
use crate::quant::kasoku::{Format, Grouping, QuantizedView, Rotation, Signs, TensorSpec};

/// Weight rows packed together.
pub(crate) const GROUP: usize = 8;
/// Activation block (values sharing one int8 scale).
pub(crate) const ACT_BLOCK: usize = 64;
/// Activation rows per outer block: larger calls loop over blocks of this many rows.
const XB: usize = 64;
/// Activation blocks per column chunk: a chunk of a weight group (8 × 2048 columns, ≤ 9 KiB
/// of M) stays in L1 while every activation tile of the call uses it.
const KC: usize = 32;

/// A matrix in format M or L, packed for [`matmul`]. Immutable; share it with `Arc`.
pub struct KasokuMatrix {
    pub spec: TensorSpec,
    /// The rotation's signs over the columns (made once; the activations need them).
    signs: Option<Signs>,
    packed: PackedBytes,
}

impl std::fmt::Debug for KasokuMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KasokuMatrix({} {}x{})",
            self.spec, self.spec.rows, self.spec.cols
        )
    }
}

/// The kernel shape of a spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// M with groups of this many columns.
    M(usize),
    /// L, groups of 32.
    L32,
    /// L, one scale per row.
    LRow,
}

impl Kind {
    pub(crate) fn of(spec: &TensorSpec) -> Kind {
        match (spec.format, spec.grouping) {
            (Format::M, g) => Kind::M(match g {
                Grouping::Columns(g) => g,
                Grouping::Row => unreachable!("validated: M has column groups"),
            }),
            (Format::L, Grouping::Row) => Kind::LRow,
            (Format::L, Grouping::Columns(_)) => Kind::L32,
        }
    }

    /// Columns of one packed block.
    pub(crate) fn block_cols(self) -> usize {
        match self {
            Kind::M(g) => g,
            Kind::L32 => 32,
            Kind::LRow => 64,
        }
    }

    /// Bytes of one packed block (eight rows).
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            Kind::M(g) => 20 + 4 * g,
            Kind::L32 => 16 + 256,
            Kind::LRow => 512,
        }
    }

    /// Bytes before a group's first block (L per row: its row scales).
    pub(crate) fn group_header(self) -> usize {
        match self {
            Kind::LRow => 32,
            _ => 0,
        }
    }
}

impl KasokuMatrix {
    /// Packs a quantized matrix (see the module documentation for the layout).
    pub fn new(q: QuantizedView) -> KasokuMatrix {
        use crate::quant::kasoku::Part;
        let spec = q.spec;
        let kind = Kind::of(&spec);
        let (bc, bb, hdr) = (kind.block_cols(), kind.block_bytes(), kind.group_header());
        let nblocks = spec.cols / bc;
        let groups = spec.rows.div_ceil(GROUP);
        let group_bytes = hdr + nblocks * bb;
        let mut out = PackedBytes::zeroed(groups * group_bytes);
        for row in 0..spec.rows {
            let (g, i) = (row / GROUP, row % GROUP);
            let base = g * group_bytes;
            let codes = q.row(Part::Codes, row);
            let scales = q.row(Part::Scales, row);
            match kind {
                Kind::M(gs) => {
                    let zeros = q.row(Part::Zeros, row);
                    for k in 0..nblocks {
                        let p = &mut out[base + k * bb..base + (k + 1) * bb];
                        p[2 * i..2 * i + 2].copy_from_slice(&scales[2 * k..2 * k + 2]);
                        let z = crate::quant::kasoku::m4::zero(zeros, k);
                        p[16 + i / 2] |= z << (4 * (i % 2));
                        for j in 0..gs / 8 {
                            for t in 0..4 {
                                let lo = crate::quant::kasoku::m4::code(codes, k * gs + 4 * j + t);
                                let hi = crate::quant::kasoku::m4::code(
                                    codes,
                                    k * gs + gs / 2 + 4 * j + t,
                                );
                                p[20 + 32 * j + 4 * i + t] = lo | (hi << 4);
                            }
                        }
                    }
                }
                Kind::L32 => {
                    for k in 0..nblocks {
                        let p = &mut out[base + k * bb..base + (k + 1) * bb];
                        p[2 * i..2 * i + 2].copy_from_slice(&scales[2 * k..2 * k + 2]);
                        for r in 0..8 {
                            for t in 0..4 {
                                p[16 + 32 * r + 4 * i + t] = codes[32 * k + 4 * r + t] ^ 0x80;
                            }
                        }
                    }
                }
                Kind::LRow => {
                    out[base + 4 * i..base + 4 * i + 4].copy_from_slice(scales);
                    for k in 0..nblocks {
                        let p = &mut out[base + hdr + k * bb..base + hdr + (k + 1) * bb];
                        for r in 0..16 {
                            for t in 0..4 {
                                p[32 * r + 4 * i + t] = codes[64 * k + 4 * r + t] ^ 0x80;
                            }
                        }
                    }
                }
            }
        }
        KasokuMatrix {
            spec,
            signs: spec.rotation.map(|r| r.signs(spec.cols)),
            packed: out.freeze(),
        }
    }

    pub fn rows(&self) -> usize {
        self.spec.rows
    }

    pub fn cols(&self) -> usize {
        self.spec.cols
    }

    /// Bytes the packed weights occupy (what one product reads).
    pub fn size_bytes(&self) -> usize {
        self.packed.len()
    }

    /// The signs its activations are rotated with (`None` without rotation).
    pub fn signs(&self) -> Option<&Signs> {
        self.signs.as_ref()
    }

    /// The matrix of its first `n ≤ rows` rows (e.g. a drafter's head over a reduced
    /// vocabulary): each row keeps its packed bytes, so it computes what it computed here.
    pub fn first_rows(&self, n: usize) -> KasokuMatrix {
        let n = n.min(self.spec.rows);
        let keep = self.group_bytes() * n.div_ceil(GROUP);
        KasokuMatrix {
            spec: TensorSpec {
                rows: n,
                ..self.spec
            },
            signs: self.signs.clone(),
            packed: PackedBytes::copy_of(&self.packed[..keep]),
        }
    }

    fn group_bytes(&self) -> usize {
        let kind = Kind::of(&self.spec);
        kind.group_header() + self.spec.cols / kind.block_cols() * kind.block_bytes()
    }
}

/// Activation rows rotated and quantized to int8 for products with matrices of one rotation
/// (see the module documentation). Build once, use for every matrix that reads them.
#[derive(Default)]
pub struct Int8Acts {
    pub n: usize,
    pub cols: usize,
    pub rotation: Option<Rotation>,
    /// `nb × n × 64` codes, block-major.
    pub(crate) qs: Vec<i8>,
    /// `nb × n` scales.
    pub(crate) d: Vec<f32>,
    /// `nb × n × 2`: `−Σa` of each half block (M, groups of 32).
    pub(crate) nsum32: Vec<i32>,
    /// `nb × n`: `−Σa` of each block (M, groups of 64 and 128).
    pub(crate) nsum64: Vec<i32>,
    /// `nb × n × 2`: `−128·Σa` of each half block (L grouped, VNNI).
    pub(crate) n128sum32: Vec<i32>,
    /// `nb × n`: `−128·Σa` of each block (L per row, VNNI).
    pub(crate) n128sum64: Vec<i32>,
}

/// Quantizes one block of 64 (already rotated) values: writes the codes, returns `(max|x|,
/// Σ first half, Σ second half)`.
fn quantize_block(v: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    let amax = v.iter().fold(0f32, |a, x| a.max(x.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let (mut s0, mut s1) = (0i32, 0i32);
    for (c, (o, x)) in q.iter_mut().zip(v).enumerate() {
        let r = round_even(x * id) as i32;
        *o = r as i8;
        if c < ACT_BLOCK / 2 {
            s0 += r;
        } else {
            s1 += r;
        }
    }
    (amax, s0, s1)
}

impl Int8Acts {
    /// Rotates (with `signs`, if any) and quantizes `n` rows of `cols` values.
    pub fn new(x: &[f32], n: usize, cols: usize, signs: Option<&Signs>) -> Int8Acts {
        let mut acts = Int8Acts::default();
        acts.fill(x, n, cols, signs);
        acts
    }

    /// [`Int8Acts::new`] into `self`, reusing its memory.
    pub fn fill(&mut self, x: &[f32], n: usize, cols: usize, signs: Option<&Signs>) {
        self.fill_with(Isa::detect(), x, n, cols, signs);
    }

    /// [`Int8Acts::fill`] with the row transform of `isa` (every path gives the same bits).
    pub(crate) fn fill_with(
        &mut self,
        isa: Isa,
        x: &[f32],
        n: usize,
        cols: usize,
        signs: Option<&Signs>,
    ) {
        assert_eq!(x.len(), n * cols, "activations: length");
        self.fill_rows(isa, n, cols, signs, 0, |r, w, _| {
            w.put_row(&x[r * cols..(r + 1) * cols])
        });
    }

    /// Fills `self` with `n` rows of `cols` values that `row(r, writer, work)` computes and
    /// hands to `writer` chunk by chunk ([`RowWriter`]), each chunk rotated and quantized as
    /// it comes: the fused epilogues (`kernels::fused`) write their results this way, never
    /// as f32 rows. `work` is `work_len` values of the running thread's memory, as the
    /// previous row left them. Large batches run their rows in parallel (so `row` may run on
    /// any thread of the pool). Every row must put all its chunks.
    pub(crate) fn fill_rows<F>(
        &mut self,
        isa: Isa,
        n: usize,
        cols: usize,
        signs: Option<&Signs>,
        work_len: usize,
        row: F,
    ) where
        F: Fn(usize, &mut RowWriter, &mut [f32]) + Sync,
    {
        assert!(cols.is_multiple_of(ACT_BLOCK), "activations: columns");
        if let Some(s) = signs {
            assert_eq!(s.values.len(), cols, "activations: signs");
            assert!(
                s.rotation.block.is_power_of_two() && s.rotation.block <= MAX_CHUNK,
                "activations: rotation block"
            );
        }
        let nb = cols / ACT_BLOCK;
        let acts = self;
        acts.n = n;
        acts.cols = cols;
        acts.rotation = signs.map(|s| s.rotation);
        // Every entry below is written for every row, so stale values never survive.
        acts.qs.resize(n * cols, 0);
        acts.d.resize(n * nb, 0.0);
        acts.nsum32.resize(2 * n * nb, 0);
        acts.nsum64.resize(n * nb, 0);
        acts.n128sum32.resize(2 * n * nb, 0);
        acts.n128sum64.resize(n * nb, 0);
        // Rows are independent: large batches (prefill) are done in parallel, each task
        // writing its rows' entries (disjoint indices of the block-major arrays).
        let rows_per_task = if n * cols >= 1 << 16 {
            n.div_ceil(4 * threads::num_threads()).max(1)
        } else {
            n.max(1)
        };
        let tasks = n.div_ceil(rows_per_task);
        let slots = threads::num_threads().min(tasks).max(1);
        scratch::with(&ROW_WORK, |buf| {
            let areas = scratch::grow(buf, slots * work_len);
            let out = ActsOut {
                qs: acts.qs.as_mut_ptr(),
                d: acts.d.as_mut_ptr(),
                nsum32: acts.nsum32.as_mut_ptr(),
                nsum64: acts.nsum64.as_mut_ptr(),
                n128sum32: acts.n128sum32.as_mut_ptr(),
                n128sum64: acts.n128sum64.as_mut_ptr(),
                work: areas.as_mut_ptr(),
            };
            let simd = isa.avx2();
            let norm = signs.map_or(1.0, |s| s.rotation.norm());
            threads::parallel_for_slots(tasks, slots, |t, slot| {
                // SAFETY: tasks of one slot never run at the same time, and slot `slot`'s
                // area is `work_len` values of `areas` (`slot < slots`), alive for the call.
                let work = unsafe {
                    std::slice::from_raw_parts_mut(out.work.add(slot * work_len), work_len)
                };
                // A chunk's values and their rotation, on the stack for the task's rows.
                let (mut input, mut rot) = ([0f32; MAX_CHUNK], [0f32; MAX_CHUNK]);
                for r in t * rows_per_task..((t + 1) * rows_per_task).min(n) {
                    let mut w = RowWriter {
                        out: &out,
                        r,
                        n,
                        cols,
                        signs,
                        simd,
                        norm,
                        done: 0,
                        input: &mut input,
                        rot: &mut rot,
                    };
                    row(r, &mut w, work);
                    assert_eq!(w.done, cols, "activations: a row was not written whole");
                }
            });
        });
    }

    /// Entry index of row `r`, block `b`.
    #[inline]
    pub(crate) fn idx(&self, r: usize, b: usize) -> usize {
        b * self.n + r
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.qs.capacity()
            + 4 * (self.d.capacity()
                + self.nsum32.capacity()
                + self.nsum64.capacity()
                + self.n128sum32.capacity()
                + self.n128sum64.capacity())
    }
}

/// The longest chunk a [`RowWriter`] takes: the largest rotation block.
pub(crate) const MAX_CHUNK: usize = 128;

/// Where one row of [`Int8Acts::fill_rows`] goes: its values are put chunk by chunk, in any
/// order, each chunk [`RowWriter::chunk`] values starting at a multiple of that (whole
/// rotation blocks and whole activation blocks), and each is rotated and quantized at once.
pub(crate) struct RowWriter<'a> {
    out: &'a ActsOut,
    r: usize,
    n: usize,
    cols: usize,
    signs: Option<&'a Signs>,
    simd: bool,
    norm: f32,
    /// Values put so far.
    done: usize,
    /// Where [`RowWriter::put_with`]'s function writes a chunk.
    input: &'a mut [f32; MAX_CHUNK],
    /// A chunk after the rotation.
    rot: &'a mut [f32; MAX_CHUNK],
}

impl RowWriter<'_> {
    /// Values of one chunk: the larger of the rotation block and the activation block.
    #[inline]
    pub(crate) fn chunk(&self) -> usize {
        self.signs
            .map_or(ACT_BLOCK, |s| s.rotation.block.max(ACT_BLOCK))
    }

    /// Puts the whole row.
    pub(crate) fn put_row(&mut self, row: &[f32]) {
        assert_eq!(row.len(), self.cols, "activations: row length");
        let c = self.chunk();
        for (k, v) in row.chunks_exact(c).enumerate() {
            self.put(k * c, v);
        }
    }

    /// Puts the chunk of the row's values `v` starting at column `c0`: `√b·R·v` (signs, then
    /// the unnormalised transform of each rotation block), then int8 blocks of 64.
    pub(crate) fn put(&mut self, c0: usize, v: &[f32]) {
        let len = self.chunk();
        assert!(v.len() == len, "activations: chunk");
        let rot = &mut self.rot[..len];
        transform(self.signs, self.simd, c0, v, rot);
        self.store(c0);
    }

    /// [`RowWriter::put`] of the chunk that `f` writes into the slice it is given (the
    /// chunk's length, its values as the last chunk left them).
    #[inline]
    pub(crate) fn put_with(&mut self, c0: usize, f: impl FnOnce(&mut [f32])) {
        let len = self.chunk();
        let input = &mut self.input[..len];
        f(input);
        transform(self.signs, self.simd, c0, input, &mut self.rot[..len]);
        self.store(c0);
    }

    /// Quantizes the rotated chunk at column `c0` into the row's blocks.
    fn store(&mut self, c0: usize) {
        let len = self.chunk();
        assert!(
            c0.is_multiple_of(len) && c0 + len <= self.cols,
            "activations: chunk"
        );
        let out = self.out;
        for (k, v) in self.rot[..len].chunks_exact(ACT_BLOCK).enumerate() {
            let e = (c0 / ACT_BLOCK + k) * self.n + self.r;
            // SAFETY: entry `e = b·n + r` belongs to this row alone, which one task writes,
            // and every index is within the arrays `fill_rows` sized (`e < nb·n`).
            let q = unsafe { std::slice::from_raw_parts_mut(out.qs.add(e * ACT_BLOCK), ACT_BLOCK) };
            let (amax, s0, s1) = if self.simd {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `simd` is only set from an `Isa` with AVX2 (`kernels::simd`).
                unsafe {
                    super::kasoku_avx2::quantize_block(v, q)
                }
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!()
            } else {
                quantize_block(v, q)
            };
            // SAFETY: as above.
            unsafe {
                *out.d.add(e) = amax / 127.0 * self.norm;
                *out.nsum32.add(2 * e) = -s0;
                *out.nsum32.add(2 * e + 1) = -s1;
                *out.nsum64.add(e) = -(s0 + s1);
                *out.n128sum32.add(2 * e) = -128 * s0;
                *out.n128sum32.add(2 * e + 1) = -128 * s1;
                *out.n128sum64.add(e) = -128 * (s0 + s1);
            }
        }
        self.done += len;
    }
}

/// `rot ← √b·R·v` for the chunk `v` at column `c0` (a plain copy without a rotation), on the
/// AVX2 path when `simd`.
#[inline]
fn transform(signs: Option<&Signs>, simd: bool, c0: usize, v: &[f32], rot: &mut [f32]) {
    let len = v.len();
    let signs = signs.map(|s| (&s.values[c0..c0 + len], s.rotation.block));
    match (signs, simd) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd` is only set from an `Isa` with AVX2 (`kernels::simd`); `rot` is as
        // long as `v`, a multiple of the block and of 8.
        (s, true) => unsafe { super::kasoku_avx2::rotate_row(v, s, rot) },
        (Some((s, b)), _) => crate::quant::kasoku::rotation::rotate_unnormalised(s, b, v, rot),
        (None, _) => rot.copy_from_slice(v),
    }
}

thread_local! {
    /// Per-thread work memory of [`Int8Acts::fill_rows`]'s row functions.
    static ROW_WORK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Where [`Int8Acts::fill_rows`]'s tasks write.
struct ActsOut {
    qs: *mut i8,
    d: *mut f32,
    nsum32: *mut i32,
    nsum64: *mut i32,
    n128sum32: *mut i32,
    n128sum64: *mut i32,
    /// The threads' work areas.
    work: *mut f32,
}
// SAFETY: used only to write disjoint entries from the pool's tasks (see `Int8Acts::fill_rows`),
// while the arrays it points into are alive and not otherwise borrowed.
unsafe impl Send for ActsOut {}
// SAFETY: as above.
unsafe impl Sync for ActsOut {}

/// The rows of a tile and the column chunk they start at.
pub(crate) struct XTile<'a> {
    pub acts: &'a Int8Acts,
    /// First activation row.
    pub r0: usize,
    /// First activation block (of 64 columns).
    pub b0: usize,
}

/// The kernel that computes tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

impl Path {
    /// The path of an instruction-set level (the kernels need exactly the features the
    /// levels check).
    pub(crate) fn of(isa: crate::kernels::simd::Isa) -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            if isa.vnni() {
                return Path::Vnni;
            }
            if isa.avx2() {
                return Path::Avx2;
            }
        }
        let _ = isa;
        Path::Portable
    }

    /// The fastest path this CPU runs (`KASOKU_NO_VNNI=1` keeps AVX2, for comparisons).
    pub(crate) fn detect() -> Path {
        static PATH: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *PATH.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if super::kasoku_vnni::available() && std::env::var_os("KASOKU_NO_VNNI").is_none() {
                    return Path::Vnni;
                }
                if super::kasoku_avx2::available() {
                    return Path::Avx2;
                }
            }
            Path::Portable
        })
    }

    /// Whether tiles take two weight groups at once ([`kernel2`]) for matrices of `kind`.
    fn pairs(self, kind: Kind) -> bool {
        #[cfg(test)]
        if bench::NO_PAIRS.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if self == Path::Vnni {
            return matches!(kind, Kind::M(_) | Kind::L32) && super::kasoku_vnni::pairs_available();
        }
        let _ = kind;
        false
    }

    /// Activation rows one kernel call takes.
    fn tile(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Vnni => 8,
            _ => 4,
        }
    }

    /// Every path this CPU runs.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Path> {
        let mut v = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if super::kasoku_avx2::available() {
                v.push(Path::Avx2);
            }
            if super::kasoku_vnni::available() {
                v.push(Path::Vnni);
            }
        }
        v
    }
}

thread_local! {
    /// Per-thread output tile, reused across calls.
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y[r][j] = Σ_c x[r][c] · W[j][c]` for `r < n`, `j < w.rows()` (`x` is `n × cols`, `y`
/// is `n × rows`, both row-major).
pub fn matmul(w: &KasokuMatrix, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_many(&[w], x, n, &mut [y]);
}

/// Several products over the same activations in one parallel job (q, k, v; gate, up): the
/// activations are rotated and quantized once per distinct rotation, and each output gets the
/// same bits as [`matmul`] of its matrix alone.
pub fn matmul_many(ws: &[&KasokuMatrix], x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    let mut acts: Vec<Int8Acts> = Vec::new();
    let mut act_of = Vec::with_capacity(ws.len());
    for w in ws {
        assert_eq!(x.len(), n * w.cols(), "matmul: x has the wrong length");
        let rot = w.spec.rotation;
        let at = acts
            .iter()
            .position(|a| a.rotation == rot && a.cols == w.cols())
            .unwrap_or_else(|| {
                acts.push(Int8Acts::new(x, n, w.cols(), w.signs()));
                acts.len() - 1
            });
        act_of.push(at);
    }
    let refs: Vec<&Int8Acts> = act_of.iter().map(|&i| &acts[i]).collect();
    matmul_prepared_with(ws, &refs, ys, Path::detect(), threads::num_threads());
}

/// Products with activations already rotated and quantized (`acts[i]` for `ws[i]`, with the
/// same rotation and columns).
pub fn matmul_prepared(ws: &[&KasokuMatrix], acts: &[&Int8Acts], ys: &mut [&mut [f32]]) {
    matmul_prepared_with(ws, acts, ys, Path::detect(), threads::num_threads());
}

/// Splits `rows` into about `4 × threads` chunks whose sizes are multiples of 16 (so every
/// chunk starts on a packed-group boundary).
fn split_rows(rows: usize, threads: usize) -> Vec<Range<usize>> {
    let tasks = (threads * 4).max(1);
    let step = (rows.div_ceil(tasks).div_ceil(16) * 16).max(16);
    (0..rows)
        .step_by(step)
        .map(|s| s..(s + step).min(rows))
        .collect()
}

#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: used only to write disjoint ranges from the pool's tasks, within the borrow of ys.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

pub(crate) fn matmul_prepared_with(
    ws: &[&KasokuMatrix],
    acts: &[&Int8Acts],
    ys: &mut [&mut [f32]],
    path: Path,
    threads: usize,
) {
    assert!(
        ws.len() == acts.len() && ws.len() == ys.len(),
        "matmul: one of each per matrix"
    );
    let mut tasks: Vec<(usize, Range<usize>)> = Vec::new();
    let mut outs = Vec::with_capacity(ws.len());
    for (i, ((w, a), y)) in ws.iter().zip(acts).zip(ys.iter_mut()).enumerate() {
        assert!(
            a.cols == w.cols() && a.rotation == w.spec.rotation,
            "matmul: activations prepared for another rotation or width"
        );
        assert_eq!(y.len(), a.n * w.rows(), "matmul: y has the wrong length");
        outs.push(SharedOut(y.as_mut_ptr()));
        if a.n > 0 {
            tasks.extend(split_rows(w.rows(), threads).into_iter().map(|r| (i, r)));
        }
    }
    threads::parallel_for(tasks.len(), |t| {
        let (i, ref rows) = tasks[t];
        let (w, a, out) = (ws[i], acts[i], outs[i]);
        TILE.with(|cell| {
            let mut tile = cell.borrow_mut();
            tile.resize(a.n * rows.len() + work_len(a.n), 0.0);
            let (tile, acc) = tile.split_at_mut(a.n * rows.len());
            compute_tile(w, a, rows.clone(), tile, path, acc);
            for r in 0..a.n {
                // SAFETY: tasks write disjoint row ranges of the outputs, which outlive the
                // call.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        out.get().add(r * w.rows() + rows.start),
                        rows.len(),
                    )
                };
                dst.copy_from_slice(&tile[r * rows.len()..(r + 1) * rows.len()]);
            }
        });
    });
}

/// The f32 accumulators [`compute_tile`] needs for `n` activation rows.
pub(crate) fn work_len(n: usize) -> usize {
    XB.min(n) * 2 * GROUP
}

/// `tile[r][j - rows.start] = Σ_c x[r][c]·W[j][c]` for the weight rows `rows` (starting on a
/// group boundary), with `acc` of at least [`work_len`]`(n)` values.
pub(crate) fn compute_tile(
    w: &KasokuMatrix,
    acts: &Int8Acts,
    rows: Range<usize>,
    tile: &mut [f32],
    path: Path,
    acc: &mut [f32],
) {
    debug_assert_eq!(rows.start % GROUP, 0);
    let kind = Kind::of(&w.spec);
    let (n, len) = (acts.n, rows.len());
    let nb = w.cols() / ACT_BLOCK;
    let (bb, hdr) = (kind.block_bytes(), kind.group_header());
    let group_bytes = w.group_bytes();
    let acc = &mut acc[..work_len(n)];
    // Groups taken two at a time (sixteen weight rows per 512-bit vector): M and grouped L on
    // the VNNI path for more than one activation row, where the product is bound by compute.
    let pairs = path.pairs(kind) && n > 1;
    let (first, end) = (rows.start / GROUP, rows.end.div_ceil(GROUP));
    for xr0 in (0..n).step_by(XB) {
        let xn = XB.min(n - xr0);
        let mut g = first;
        while g < end {
            let two = pairs && g + 1 < end;
            let gr = if two { 2 * GROUP } else { GROUP };
            acc[..xn * gr].fill(0.0);
            let gw = &w.packed[g * group_bytes..(g + 1) * group_bytes];
            for b0 in (0..nb).step_by(KC) {
                let kn = KC.min(nb - b0);
                // Weight blocks of this chunk's columns (chunks start on a multiple of every
                // block size: KC·64 columns).
                let (w0, w1) = (
                    b0 * ACT_BLOCK / kind.block_cols(),
                    (b0 + kn) * ACT_BLOCK / kind.block_cols(),
                );
                let chunk = &gw[hdr + w0 * bb..hdr + w1 * bb];
                let next = two.then(|| {
                    let gw = &w.packed[(g + 1) * group_bytes..(g + 2) * group_bytes];
                    &gw[hdr + w0 * bb..hdr + w1 * bb]
                });
                for xt in (0..xn).step_by(path.tile()) {
                    let xr = path.tile().min(xn - xt);
                    let x = XTile {
                        acts,
                        r0: xr0 + xt,
                        b0,
                    };
                    let acc = &mut acc[xt * gr..(xt + xr) * gr];
                    match next {
                        Some(chunk1) => kernel2(kind, path, chunk, chunk1, kn, &x, xr, acc),
                        None => kernel(kind, path, chunk, kn, &x, xr, acc),
                    }
                }
            }
            if kind == Kind::LRow {
                for i in 0..GROUP {
                    let s = f32::from_le_bytes(gw[4 * i..4 * i + 4].try_into().unwrap());
                    for r in 0..xn {
                        acc[r * GROUP + i] *= s;
                    }
                }
            }
            for r in 0..xn {
                for i in 0..gr {
                    let j = g * GROUP + i;
                    if j < rows.end {
                        tile[(xr0 + r) * len + j - rows.start] = acc[r * gr + i];
                    }
                }
            }
            g += gr / GROUP;
        }
    }
}

/// [`kernel`] for two consecutive groups at once (`w0`, `w1`: their blocks of the same
/// columns), into `acc[r][i]` for `i < 16`; only where [`Path::pairs`] says so.
#[allow(clippy::too_many_arguments)]
fn kernel2(
    kind: Kind,
    path: Path,
    w0: &[u8],
    w1: &[u8],
    kn: usize,
    x: &XTile,
    xr: usize,
    acc: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: pairs are only taken when `kasoku_vnni::pairs_available()` (`Path::pairs`);
        // the kernel checks that `w0`, `w1`, `x` and `acc` cover `kn` blocks and `xr` rows.
        Path::Vnni => unsafe { super::kasoku_vnni::kernel2(kind, w0, w1, kn, x, xr, acc) },
        _ => unreachable!("group pairs on {path:?}"),
    }
}

/// Accumulates `kn` activation blocks' worth of packed weight blocks (`w`) of one group into
/// `acc[r][i]` for `xr` activation rows starting at `x`.
fn kernel(kind: Kind, path: Path, w: &[u8], kn: usize, x: &XTile, xr: usize, acc: &mut [f32]) {
    match path {
        Path::Portable => portable_kernel(kind, w, kn, x, xr, acc),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Path::Avx2` is only chosen when `kasoku_avx2::available()`; the kernel
        // checks that `w`, `x` and `acc` cover `kn` blocks and `xr` rows.
        Path::Avx2 => unsafe { super::kasoku_avx2::kernel(kind, w, kn, x, xr, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Path::Vnni` is only chosen when `kasoku_vnni::available()`; as above.
        Path::Vnni => unsafe { super::kasoku_vnni::kernel(kind, w, kn, x, xr, acc) },
    }
}

/// Scale `i` of the eight f16 scales at the start of `p`.
fn scale_at(p: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([p[2 * i], p[2 * i + 1]]).to_f32()
}

/// The reference kernel: the arithmetic of the module documentation, one pair at a time.
fn portable_kernel(kind: Kind, w: &[u8], kn: usize, x: &XTile, xr: usize, acc: &mut [f32]) {
    let a = x.acts;
    let bb = kind.block_bytes();
    for r in 0..xr {
        let row = x.r0 + r;
        for i in 0..GROUP {
            let mut s_acc = acc[r * GROUP + i];
            match kind {
                Kind::M(g) => {
                    for k in 0..kn * ACT_BLOCK / g {
                        let p = &w[k * bb..(k + 1) * bb];
                        let s = scale_at(p, i);
                        let z = ((p[16 + i / 2] >> (4 * (i % 2))) & 15) as i32;
                        // Columns of this block, relative to the chunk's first activation block.
                        let col0 = k * g;
                        // Segments of at most 64 columns (one activation block each).
                        for seg in 0..g.div_ceil(ACT_BLOCK) {
                            let (c0, c1) = (seg * ACT_BLOCK, (g).min((seg + 1) * ACT_BLOCK));
                            let b = x.b0 + (col0 + c0) / ACT_BLOCK;
                            let e = a.idx(row, b);
                            let xq = &a.qs[e * ACT_BLOCK..(e + 1) * ACT_BLOCK];
                            let off = (col0 + c0) % ACT_BLOCK;
                            let mut t = 0i32;
                            for c in c0..c1 {
                                let (j, t4, hi) = if c < g / 2 {
                                    (c / 4, c % 4, false)
                                } else {
                                    ((c - g / 2) / 4, c % 4, true)
                                };
                                let byte = p[20 + 32 * j + 4 * i + t4];
                                let q = if hi { byte >> 4 } else { byte & 15 } as i32;
                                t += q * xq[off + c - c0] as i32;
                            }
                            let nsum = if g == 32 {
                                a.nsum32[2 * e + off / 32]
                            } else {
                                a.nsum64[e]
                            };
                            t += z * nsum;
                            s_acc = (t as f32).mul_add(s * a.d[e], s_acc);
                        }
                    }
                }
                Kind::L32 => {
                    for k in 0..kn * 2 {
                        let p = &w[k * bb..(k + 1) * bb];
                        let s = scale_at(p, i);
                        let e = a.idx(row, x.b0 + k / 2);
                        let xq = &a.qs[e * ACT_BLOCK + 32 * (k % 2)..][..32];
                        let mut t = 0i32;
                        for c in 0..32 {
                            let q = (p[16 + 32 * (c / 4) + 4 * i + c % 4] ^ 0x80) as i8 as i32;
                            t += q * xq[c] as i32;
                        }
                        s_acc = (t as f32).mul_add(s * a.d[e], s_acc);
                    }
                }
                Kind::LRow => {
                    for k in 0..kn {
                        let p = &w[k * bb..(k + 1) * bb];
                        let e = a.idx(row, x.b0 + k);
                        let xq = &a.qs[e * ACT_BLOCK..(e + 1) * ACT_BLOCK];
                        let mut t = 0i32;
                        for c in 0..64 {
                            let q = (p[32 * (c / 4) + 4 * i + c % 4] ^ 0x80) as i8 as i32;
                            t += q * xq[c] as i32;
                        }
                        s_acc = (t as f32).mul_add(a.d[e], s_acc);
                    }
                }
            }
            acc[r * GROUP + i] = s_acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kasoku::{quantize, Rotation};

    fn weights(seed: u64, rows: usize, cols: usize) -> Vec<f32> {
        let mut s = seed | 1;
        (0..rows * cols)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                let boost = if i % cols == 3 { 10.0 } else { 1.0 };
                (u * u * u * 0.1 * boost) as f32
            })
            .collect()
    }

    fn acts(seed: u64, n: usize, cols: usize) -> Vec<f32> {
        let mut x = weights(seed, n, cols);
        // Activation outliers (a few channels of every row), and a zero row.
        for r in 0..n {
            x[r * cols + 5] *= 40.0;
            if r == 2 {
                x[r * cols..(r + 1) * cols].fill(0.0);
            }
        }
        x
    }

    fn specs(rows: usize, cols: usize) -> Vec<TensorSpec> {
        let rot = Some(Rotation::new(11, 32));
        vec![
            TensorSpec::m(rows, cols, 64, rot),
            TensorSpec::m(rows, cols, 32, rot),
            TensorSpec::m(rows, cols, 128, None),
            TensorSpec::l(rows, cols, false, rot),
            TensorSpec::l(rows, cols, true, Some(Rotation::new(3, 64))),
            TensorSpec::l(rows, cols, false, None),
        ]
    }

    /// The kernels' function computed in f64 from the quantized weights (rotated basis) and
    /// the activation codes: differs from the kernels by float rounding only.
    fn emulated(w: &crate::quant::kasoku::QuantizedMatrix, a: &Int8Acts) -> Vec<f64> {
        let s = w.spec;
        let mut y = vec![0f64; a.n * s.rows];
        let mut row = vec![0f32; s.cols];
        for j in 0..s.rows {
            w.view().dequantize_row_rotated(j, &mut row);
            for r in 0..a.n {
                let mut t = 0f64;
                for (c, &wv) in row.iter().enumerate() {
                    let e = a.idx(r, c / ACT_BLOCK);
                    t += wv as f64 * a.qs[e * ACT_BLOCK + c % ACT_BLOCK] as f64 * a.d[e] as f64;
                }
                y[r * s.rows + j] = t;
            }
        }
        y
    }

    #[test]
    fn every_path_matches_the_emulation_and_the_dequantized_product() {
        let (rows, cols) = (21, 384);
        let w = weights(1, rows, cols);
        for spec in specs(rows, cols) {
            let q = quantize(spec, &w).unwrap();
            let m = KasokuMatrix::new(q.view());
            let wf = q.view().dequantize();
            for n in [1, 3, 9] {
                let x = acts(n as u64 + 7, n, cols);
                let signs = spec.rotation.map(|r| r.signs(cols));
                let a = Int8Acts::new(&x, n, cols, signs.as_ref());
                let want = emulated(&q, &a);
                for path in Path::available() {
                    let mut y = vec![f32::NAN; n * rows];
                    matmul_prepared_with(&[&m], &[&a], &mut [&mut y], path, 2);
                    for r in 0..n {
                        let xr = &x[r * cols..(r + 1) * cols];
                        for j in 0..rows {
                            let wr = &wf[j * cols..(j + 1) * cols];
                            let got = y[r * rows + j] as f64;
                            let mag: f64 =
                                xr.iter().zip(wr).map(|(a, b)| (a * b).abs() as f64).sum();
                            let e = want[r * rows + j];
                            assert!(
                                (got - e).abs() <= 1e-5 * mag + 1e-6,
                                "{spec} {path:?} n={n} r={r} j={j}: {got} vs {e}"
                            );
                            // Against dequantize-then-f32 in the original basis: the int8
                            // activation rounding moves each rotated value by at most half a
                            // step of its block, so the error is at most Σ_c |w'_c|·d_c/2.
                            let exact: f64 =
                                xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                            let mut wrot = vec![0f32; cols];
                            q.view().dequantize_row_rotated(j, &mut wrot);
                            let bound: f64 = wrot
                                .iter()
                                .enumerate()
                                .map(|(c, v)| {
                                    let e = a.idx(r, c / ACT_BLOCK);
                                    v.abs() as f64 * a.d[e] as f64 / 2.0
                                })
                                .sum();
                            assert!(
                                (got - exact).abs() <= bound * 1.0001 + 1e-5 * mag + 1e-6,
                                "{spec} {path:?}: {got} vs exact {exact} (bound {bound})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_path_gives_the_same_bits_at_every_batch_size() {
        let (rows, cols) = (40, 64 * 70); // more than one column chunk
        let w = weights(2, rows, cols);
        for spec in specs(rows, cols) {
            let q = quantize(spec, &w).unwrap();
            let m = KasokuMatrix::new(q.view());
            let n = 19;
            let x = acts(5, n, cols);
            let signs = spec.rotation.map(|r| r.signs(cols));
            let a = Int8Acts::new(&x, n, cols, signs.as_ref());
            let mut first: Option<Vec<f32>> = None;
            for path in Path::available() {
                let mut y = vec![f32::NAN; n * rows];
                matmul_prepared_with(&[&m], &[&a], &mut [&mut y], path, 3);
                match &first {
                    None => first = Some(y),
                    Some(f) => assert!(
                        f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{spec}: {path:?} differs from portable"
                    ),
                }
            }
            // Each row alone (and any prefix of rows) gives the bits it has in the batch.
            let all = first.unwrap();
            for k in [1, 2, 5, 8, 9, 16] {
                let a = Int8Acts::new(&x[..k * cols], k, cols, signs.as_ref());
                let mut y = vec![0f32; k * rows];
                matmul_prepared_with(&[&m], &[&a], &mut [&mut y], Path::detect(), 1);
                assert!(
                    y.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{spec}: first {k} rows"
                );
            }
            let mut y1 = vec![0f32; rows];
            matmul(&m, &x[7 * cols..8 * cols], 1, &mut y1);
            assert_eq!(y1, all[7 * rows..8 * rows], "{spec}: row 7 alone");
        }
    }

    #[test]
    fn prefill_sized_batches_equal_single_rows() {
        // More rows than one outer block, and enough values for the parallel quantizer.
        let (rows, cols, n) = (24, 1024, 70);
        let spec = TensorSpec::m(rows, cols, 64, Some(Rotation::new(4, 32)));
        let m = KasokuMatrix::new(quantize(spec, &weights(6, rows, cols)).unwrap().view());
        let x = acts(8, n, cols);
        let mut y = vec![0f32; n * rows];
        matmul(&m, &x, n, &mut y);
        for r in 0..n {
            let mut y1 = vec![0f32; rows];
            matmul(&m, &x[r * cols..(r + 1) * cols], 1, &mut y1);
            assert_eq!(y1, y[r * rows..(r + 1) * rows], "row {r}");
        }
    }

    #[test]
    fn many_matrices_share_activations_and_keep_their_bits() {
        let cols = 256;
        let rot = Some(Rotation::new(9, 32));
        let specs = [
            TensorSpec::m(33, cols, 64, rot),
            TensorSpec::l(8, cols, false, rot),
            TensorSpec::m(17, cols, 32, None),
        ];
        let ms: Vec<KasokuMatrix> = specs
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                KasokuMatrix::new(
                    quantize(s, &weights(i as u64, s.rows, cols))
                        .unwrap()
                        .view(),
                )
            })
            .collect();
        let n = 4;
        let x = acts(3, n, cols);
        let mut outs: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; n * m.rows()]).collect();
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        matmul_many(&ms.iter().collect::<Vec<_>>(), &x, n, &mut slices);
        for (m, got) in ms.iter().zip(&outs) {
            let mut alone = vec![0f32; n * m.rows()];
            matmul(m, &x, n, &mut alone);
            assert_eq!(&alone, got);
        }
    }

    #[test]
    fn the_simd_activation_transform_gives_the_portable_bits() {
        let (n, cols) = (5, 512);
        let mut x = acts(4, n, cols);
        x[9] = 0.5; // exact ties after scaling are likely somewhere; force a few values
        x[10] = -1.5;
        for block in crate::quant::kasoku::rotation::BLOCKS {
            for signs in [None, Some(Rotation::new(8, block).signs(cols))] {
                let slow = Int8Acts::new(&x, n, cols, signs.as_ref());
                for isa in Isa::available() {
                    let mut fast = Int8Acts::default();
                    fast.fill_with(isa, &x, n, cols, signs.as_ref());
                    assert_eq!(fast.qs, slow.qs, "block {block}");
                    assert!(fast
                        .d
                        .iter()
                        .zip(&slow.d)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                    assert_eq!((&fast.nsum32, &fast.nsum64), (&slow.nsum32, &slow.nsum64));
                    assert_eq!(
                        (&fast.n128sum32, &fast.n128sum64),
                        (&slow.n128sum32, &slow.n128sum64)
                    );
                }
            }
        }
    }

    #[test]
    fn rows_put_chunk_by_chunk_in_any_order_give_the_bits_of_whole_rows() {
        let (n, cols) = (3, 256);
        let x = acts(6, n, cols);
        for block in crate::quant::kasoku::rotation::BLOCKS {
            let signs = Rotation::new(2, block).signs(cols);
            let want = Int8Acts::new(&x, n, cols, Some(&signs));
            for isa in Isa::available() {
                let mut got = Int8Acts::default();
                got.fill_rows(isa, n, cols, Some(&signs), 0, |r, w, _| {
                    let c = w.chunk();
                    for c0 in (0..cols).step_by(c).rev() {
                        w.put(c0, &x[r * cols + c0..r * cols + c0 + c]);
                    }
                });
                assert_eq!(got.qs, want.qs, "block {block} {isa:?}");
                assert!(got
                    .d
                    .iter()
                    .zip(&want.d)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                assert_eq!(got.nsum64, want.nsum64);
            }
        }
    }

    #[test]
    #[should_panic(expected = "not written whole")]
    fn a_row_left_incomplete_is_refused() {
        let x = vec![1f32; 128];
        let mut a = Int8Acts::default();
        a.fill_rows(Isa::PORTABLE, 1, 128, None, 0, |_, w, _| w.put(0, &x[..64]));
    }

    #[test]
    fn activation_blocks_hold_codes_scales_and_sums() {
        let cols = 128;
        let mut x = vec![0f32; cols];
        x[0] = 127.0;
        x[1] = -63.5;
        x[70] = 2.0;
        let a = Int8Acts::new(&x, 1, cols, None);
        assert_eq!((a.d[0], a.d[1]), (1.0, 2.0 / 127.0));
        assert_eq!((a.qs[0], a.qs[1]), (127, -64)); // -63.5 rounds to even
        assert_eq!(a.qs[64 + 6], 127);
        assert_eq!((a.nsum32[0], a.nsum32[1], a.nsum64[0]), (-63, 0, -63));
        assert_eq!(a.n128sum64[1], -128 * 127);
        // With a rotation the scale carries 1/√b.
        let s = Rotation::new(1, 32).signs(cols);
        let r = Int8Acts::new(&x, 1, cols, Some(&s));
        let mut rot = x.clone();
        s.rotate(&mut rot);
        let amax = rot[..64].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!((r.d[0] * 127.0 - amax).abs() < 1e-4 * amax);
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use crate::quant::kasoku::{quantize, Rotation};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Set by [`m_product_speed`] alone (an ignored test) to time the one-group kernels.
    pub(super) static NO_PAIRS: AtomicBool = AtomicBool::new(false);

    /// Time per product of an M matrix of Qwen2.5-Coder-1.5B's MLP shape (8960 × 1536) on
    /// the pool, by path and activation rows (ignored; run by hand:
    /// `cargo test --release -p kasoku --lib kasoku::bench -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn m_product_speed() {
        let (rows, cols) = (8960, 1536);
        let mut rng = crate::test_util::Rng::new(3);
        let spec = TensorSpec::m(rows, cols, 64, Some(Rotation::new(1, 32)));
        let m = KasokuMatrix::new(quantize(spec, &rng.vec(rows * cols, 0.1)).unwrap().view());
        for n in [1, 4, 8, 16] {
            let x = rng.vec(n * cols, 1.0);
            let a = Int8Acts::new(&x, n, cols, m.signs());
            let mut y = vec![0f32; n * rows];
            // Path by path, and on the VNNI path with and without group pairs, taking turns
            // round by round (the machine may be shared): the best round of each.
            let mut ways: Vec<(Path, bool)> =
                Path::available().into_iter().map(|p| (p, false)).collect();
            if ways.last().is_some_and(|w| w.0.pairs(Kind::M(64))) {
                ways.push((ways.last().unwrap().0, true));
            }
            let mut best = vec![f64::MAX; ways.len()];
            let reps = if n == 1 { 40 } else { 10 };
            for _ in 0..7 {
                for (w, &(path, no_pairs)) in ways.iter().enumerate() {
                    if path == Path::Portable && n > 1 {
                        continue;
                    }
                    NO_PAIRS.store(no_pairs, Ordering::Relaxed);
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        matmul_prepared_with(
                            &[&m],
                            &[&a],
                            &mut [&mut y],
                            path,
                            threads::num_threads(),
                        );
                    }
                    best[w] = best[w].min(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            NO_PAIRS.store(false, Ordering::Relaxed);
            for (&(path, no_pairs), t) in ways.iter().zip(&best).filter(|(_, t)| t.is_finite()) {
                let what = if no_pairs { " (one group a tile)" } else { "" };
                eprintln!("n={n:2} {path:?}{what}: {:.3} ms", t * 1e3);
            }
        }
    }

    /// Products streaming from memory as a model's pass does: 24 copies of an M matrix of
    /// 8960 × 1536 (185 MB, more than the last-level cache) one after the other, by
    /// prefetch distance of the paired kernel (ignored; run by hand, as above).
    #[test]
    #[ignore]
    #[cfg(target_arch = "x86_64")]
    fn m_streaming_speed() {
        use super::super::kasoku_vnni::PAIR_PREFETCH_TEST;
        if !Path::detect().pairs(Kind::M(64)) {
            return;
        }
        let (rows, cols) = (8960, 1536);
        let mut rng = crate::test_util::Rng::new(3);
        let spec = TensorSpec::m(rows, cols, 64, Some(Rotation::new(1, 32)));
        let q = quantize(spec, &rng.vec(rows * cols, 0.1)).unwrap();
        let ms: Vec<KasokuMatrix> = (0..24).map(|_| KasokuMatrix::new(q.view())).collect();
        for n in [1, 8, 16] {
            let x = rng.vec(n * cols, 1.0);
            let a = Int8Acts::new(&x, n, cols, ms[0].signs());
            let mut y = vec![0f32; n * rows];
            let dists = [2048, 6144, 8192, 12288, 16384];
            let mut best = [f64::MAX; 5];
            for _ in 0..5 {
                for (k, &d) in dists.iter().enumerate() {
                    PAIR_PREFETCH_TEST.store(d, Ordering::Relaxed);
                    let t = std::time::Instant::now();
                    for m in &ms {
                        matmul_prepared_with(
                            &[m],
                            &[&a],
                            &mut [&mut y],
                            Path::detect(),
                            threads::num_threads(),
                        );
                    }
                    best[k] = best[k].min(t.elapsed().as_secs_f64() / ms.len() as f64);
                }
            }
            PAIR_PREFETCH_TEST.store(0, Ordering::Relaxed);
            for (d, t) in dists.iter().zip(best) {
                eprintln!("n={n:2} prefetch {d}: {:.3} ms per matrix", t * 1e3);
            }
        }
    }
}
