//! The host KV cache of one attention layer (the store of the CPU and reference backends,
//! [`KvStore`]), and the formats it may store its rows in.
//!
//! Head-major: per KV head, `[position][head_dim]` rows, contiguous (what the attention kernel
//! streams), stored as f32, f16 or q8_0 ([`KvType`]). Each row is converted once, when it is
//! appended, by a rule that depends on that row alone, so a position's stored keys and values
//! do not depend on the batch it came in (speculative verification stores what plain decoding
//! would).

use half::f16;

use super::{Cpu, KvStore, Reference};
use crate::kernels::attention::{BlockQ8_0, KvHeads, Stored};

/// KV heads whose lists [`KvCache::with_heads`] keeps on the stack.
pub const INLINE_HEADS: usize = 64;

/// How a KV cache stores its rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// f32: exact (4 bytes a value).
    F32,
    /// IEEE half (2 bytes a value): the serving default, as llama.cpp's.
    #[default]
    F16,
    /// GGML's Q8_0, as llama.cpp's `q8_0` caches: blocks of 32 int8 values with an f16 scale
    /// (8.5 bits a value). Needs a head size that is a multiple of 32.
    Q8_0,
}

impl KvType {
    /// Every type, in the order of their bytes per value (largest first).
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// Its name on command lines: `f32`, `f16`, `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one row of `head_dim` values, or `None` when such rows cannot be stored (q8_0
    /// with a head size that is not a multiple of 32).
    pub fn row_bytes(self, head_dim: usize) -> Option<usize> {
        match self {
            KvType::F32 => Some(4 * head_dim),
            KvType::F16 => Some(2 * head_dim),
            KvType::Q8_0 => head_dim
                .is_multiple_of(BlockQ8_0::VALUES)
                .then(|| head_dim / BlockQ8_0::VALUES * std::mem::size_of::<BlockQ8_0>()),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown KV cache type '{s}' (expected f32, f16 or q8_0)"))
    }
}

/// Per KV head, its rows in one format.
#[derive(Clone, Debug)]
enum Heads {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
    Q8_0(Vec<Vec<BlockQ8_0>>),
}

/// `$body` with `$v` bound to the heads' vectors, whatever their format.
macro_rules! each {
    ($heads:expr, $v:ident => $body:expr) => {
        match $heads {
            Heads::F32($v) => $body,
            Heads::F16($v) => $body,
            Heads::Q8_0($v) => $body,
        }
    };
}

impl Heads {
    fn new(kv_type: KvType, n_heads: usize) -> Heads {
        match kv_type {
            KvType::F32 => Heads::F32(vec![Vec::new(); n_heads]),
            KvType::F16 => Heads::F16(vec![Vec::new(); n_heads]),
            KvType::Q8_0 => Heads::Q8_0(vec![Vec::new(); n_heads]),
        }
    }

    fn len(&self) -> usize {
        each!(self, h => h.len())
    }

    /// Appends one position's row (`[kv_head][head_dim]`).
    fn push(&mut self, row: &[f32], hd: usize) {
        fn push<S: Stored>(heads: &mut [Vec<S>], row: &[f32], hd: usize) {
            for (h, x) in heads.iter_mut().zip(row.chunks_exact(hd)) {
                let start = h.len();
                h.resize(start + hd / S::VALUES, S::default());
                S::store(x, &mut h[start..]);
            }
        }
        each!(self, h => push(h, row, hd))
    }

    /// Room for `rows` positions per head, where the allocator grants it.
    fn reserve(&mut self, rows: usize, hd: usize) {
        fn reserve<S: Stored>(heads: &mut [Vec<S>], rows: usize, hd: usize) {
            let units = rows.saturating_mul(hd / S::VALUES);
            for h in heads {
                let more = units.saturating_sub(h.len());
                // Refused (too large for the address space or the allocator): the head grows
                // as rows arrive instead.
                let _ = h.try_reserve_exact(more);
            }
        }
        each!(self, h => reserve(h, rows, hd))
    }

    /// Keeps the first `rows` positions.
    fn truncate(&mut self, rows: usize, hd: usize) {
        fn truncate<S: Stored>(heads: &mut [Vec<S>], rows: usize, hd: usize) {
            heads
                .iter_mut()
                .for_each(|h| h.truncate(rows * (hd / S::VALUES)));
        }
        each!(self, h => truncate(h, rows, hd))
    }

    /// Copies the row at position `src` to position `dst`.
    fn copy_row(&mut self, src: usize, dst: usize, hd: usize) {
        fn copy<S: Stored>(heads: &mut [Vec<S>], src: usize, dst: usize, hd: usize) {
            let u = hd / S::VALUES;
            heads
                .iter_mut()
                .for_each(|h| h.copy_within(src * u..(src + 1) * u, dst * u));
        }
        each!(self, h => copy(h, src, dst, hd))
    }

    /// Head `h`'s rows as f32.
    #[cfg(test)]
    fn dequantized(&self, h: usize) -> Vec<f32> {
        fn load<S: Stored>(rows: &[S]) -> Vec<f32> {
            let mut out = vec![0f32; rows.len() * S::VALUES];
            S::load(rows, &mut out);
            out
        }
        each!(self, heads => load(&heads[h]))
    }
}

/// Keys and values of one attention layer.
#[derive(Clone, Debug)]
pub struct KvCache {
    head_dim: usize,
    kv_type: KvType,
    keys: Heads,
    values: Heads,
    len: usize,
}

impl KvCache {
    /// An empty f32 cache for `n_kv_heads` heads of `head_dim` values.
    #[cfg(test)]
    pub fn new(n_kv_heads: usize, head_dim: usize) -> KvCache {
        KvCache::with_type(n_kv_heads, head_dim, KvType::F32)
    }

    /// An empty cache storing its rows as `kv_type`.
    ///
    /// # Panics
    /// When `kv_type` cannot store rows of `head_dim` ([`KvType::row_bytes`]).
    pub fn with_type(n_kv_heads: usize, head_dim: usize, kv_type: KvType) -> KvCache {
        assert!(
            kv_type.row_bytes(head_dim).is_some(),
            "kv cache: {kv_type} cannot store rows of {head_dim} values"
        );
        KvCache {
            head_dim,
            kv_type,
            keys: Heads::new(kv_type, n_kv_heads),
            values: Heads::new(kv_type, n_kv_heads),
            len: 0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn n_kv_heads(&self) -> usize {
        self.keys.len()
    }

    /// Values per position over all heads (`n_kv_heads × head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.keys.len() * self.head_dim
    }

    /// Bytes the stored keys and values take.
    pub fn bytes(&self) -> usize {
        let row = self.kv_type.row_bytes(self.head_dim).unwrap_or(0);
        2 * self.len * self.n_kv_heads() * row
    }

    /// Keys of KV head `h` as f32 (`len × head_dim`; converted from the stored format).
    #[cfg(test)]
    pub fn keys_f32(&self, h: usize) -> Vec<f32> {
        self.keys.dequantized(h)
    }

    /// Values of KV head `h` as f32, as [`KvCache::keys_f32`].
    #[cfg(test)]
    pub fn values_f32(&self, h: usize) -> Vec<f32> {
        self.values.dequantized(h)
    }

    /// Room for `positions` rows in all, so that appending up to there allocates nothing
    /// (where the allocator grants it; otherwise the cache grows as rows arrive).
    pub fn reserve(&mut self, positions: usize) {
        self.keys.reserve(positions, self.head_dim);
        self.values.reserve(positions, self.head_dim);
    }

    /// Runs `f` over the stored keys and values, as the attention kernel reads them. The
    /// lists of heads live on the stack up to [`INLINE_HEADS`] heads (every released model;
    /// more are listed on the heap).
    pub fn with_heads<R>(&self, f: impl for<'k> FnOnce(KvHeads<'k>, KvHeads<'k>) -> R) -> R {
        fn call<S: Stored, R>(
            keys: &[Vec<S>],
            values: &[Vec<S>],
            f: impl for<'k> FnOnce(KvHeads<'k>, KvHeads<'k>) -> R,
        ) -> R {
            if keys.len() > INLINE_HEADS || values.len() > INLINE_HEADS {
                let keys: Vec<&[S]> = keys.iter().map(|h| &h[..]).collect();
                let values: Vec<&[S]> = values.iter().map(|h| &h[..]).collect();
                return f(S::heads(&keys), S::heads(&values));
            }
            let mut k: [&[S]; INLINE_HEADS] = [&[]; INLINE_HEADS];
            let mut v: [&[S]; INLINE_HEADS] = [&[]; INLINE_HEADS];
            for (slot, h) in k.iter_mut().zip(keys) {
                *slot = h;
            }
            for (slot, h) in v.iter_mut().zip(values) {
                *slot = h;
            }
            f(S::heads(&k[..keys.len()]), S::heads(&v[..values.len()]))
        }
        match (&self.keys, &self.values) {
            (Heads::F32(k), Heads::F32(v)) => call(k, v, f),
            (Heads::F16(k), Heads::F16(v)) => call(k, v, f),
            (Heads::Q8_0(k), Heads::Q8_0(v)) => call(k, v, f),
            _ => unreachable!("keys and values are made in one format"),
        }
    }

    /// Appends rows of keys and values given position-major (`[position][kv_head][head_dim]`,
    /// as projections produce them).
    pub fn append(&mut self, keys: &[f32], values: &[f32]) {
        let (d, hd) = (self.kv_dim(), self.head_dim);
        assert!(
            d > 0 && keys.len() == values.len() && keys.len().is_multiple_of(d),
            "kv cache: bad rows"
        );
        for (krow, vrow) in keys.chunks_exact(d).zip(values.chunks_exact(d)) {
            self.keys.push(krow, hd);
            self.values.push(vrow, hd);
        }
        self.len += keys.len() / d;
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        let keep = len.min(self.len);
        self.keys.truncate(keep, self.head_dim);
        self.values.truncate(keep, self.head_dim);
        self.len = keep;
    }

    /// After a batch appended at `base`, keeps only the rows `base + accepted[i]` (in that
    /// order, each index < the batch size, increasing) at positions `base + i`.
    pub fn commit(&mut self, base: usize, accepted: &[usize]) {
        for (i, &a) in accepted.iter().enumerate() {
            assert!(
                base + a < self.len,
                "kv cache: accepted row {a} past the end"
            );
            if a != i {
                self.keys.copy_row(base + a, base + i, self.head_dim);
                self.values.copy_row(base + a, base + i, self.head_dim);
            }
        }
        self.truncate(base + accepted.len());
    }
}

/// The host cache is the KV store of both host backends (whose buffers are `[f32]` and whose
/// attention reads `KvHeads`).
macro_rules! host_store {
    ($backend:ty) => {
        impl KvStore<$backend> for KvCache {
            #[inline]
            fn len(&self) -> usize {
                KvCache::len(self)
            }
            fn kv_dim(&self) -> usize {
                KvCache::kv_dim(self)
            }
            fn bytes(&self) -> usize {
                KvCache::bytes(self)
            }
            fn reserve(&mut self, positions: usize) {
                KvCache::reserve(self, positions)
            }
            #[inline]
            fn append(&mut self, keys: &[f32], values: &[f32]) {
                KvCache::append(self, keys, values)
            }
            fn truncate(&mut self, len: usize) {
                KvCache::truncate(self, len)
            }
            fn commit(&mut self, base: usize, accepted: &[usize]) {
                KvCache::commit(self, base, accepted)
            }
            #[inline]
            fn with_heads<R>(&self, f: impl for<'k> FnOnce(KvHeads<'k>, KvHeads<'k>) -> R) -> R {
                KvCache::with_heads(self, f)
            }
        }
    };
}

host_store!(Cpu);
host_store!(Reference);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_truncate_commit() {
        // 2 heads of 1 value; rows given position-major [h0, h1].
        let mut c = KvCache::new(2, 1);
        assert_eq!(c.len(), 0);
        c.append(
            &[0., 100., 1., 101., 2., 102.],
            &[10., 110., 11., 111., 12., 112.],
        );
        assert_eq!((c.len(), c.kv_dim()), (3, 2));
        assert_eq!(c.keys_f32(0), [0., 1., 2.]);
        assert_eq!(c.keys_f32(1), [100., 101., 102.]);
        // A batch of 4 at base 3; keep rows 1 and 3.
        c.append(
            &[3., 103., 4., 104., 5., 105., 6., 106.],
            &[13., 113., 14., 114., 15., 115., 16., 116.],
        );
        c.commit(3, &[1, 3]);
        assert_eq!(c.len(), 5);
        assert_eq!(c.keys_f32(0), [0., 1., 2., 4., 6.]);
        assert_eq!(c.keys_f32(1), [100., 101., 102., 104., 106.]);
        assert_eq!(c.values_f32(0), [10., 11., 12., 14., 16.]);
        assert_eq!(c.values_f32(1), [110., 111., 112., 114., 116.]);
        c.truncate(1);
        assert_eq!(
            (c.keys_f32(0), c.values_f32(1), c.len()),
            (vec![0.], vec![110.], 1)
        );
    }

    /// Every format keeps, moves and drops whole rows the same way, and stores each row as
    /// its format stores that row alone (blocks never span rows or heads).
    #[test]
    fn every_format_commits_rows_as_stored() {
        let (heads, hd) = (2, 64);
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|r| {
                (0..heads * hd)
                    .map(|i| ((r * 131 + i * 7) % 97) as f32 / 9.0 - 5.0)
                    .collect()
            })
            .collect();
        for t in KvType::ALL {
            let mut c = KvCache::with_type(heads, hd, t);
            for r in &rows {
                c.append(r, r);
            }
            let one_row = |r: usize, h: usize| {
                let mut alone = KvCache::with_type(heads, hd, t);
                alone.append(&rows[r], &rows[r]);
                alone.keys_f32(h)
            };
            c.commit(2, &[1, 3]);
            assert_eq!(c.len(), 4);
            assert_eq!(c.bytes(), 2 * 4 * heads * t.row_bytes(hd).unwrap());
            for h in 0..heads {
                let want: Vec<f32> = [0, 1, 3, 5].iter().flat_map(|&r| one_row(r, h)).collect();
                assert_eq!(c.keys_f32(h), want, "{t} head {h}");
                assert_eq!(c.values_f32(h), want, "{t} head {h}");
            }
        }
    }

    #[test]
    fn types_parse_and_size_rows() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
        assert!("q4_0".parse::<KvType>().is_err());
        assert_eq!(KvType::Q8_0.row_bytes(128), Some(136));
        assert_eq!(KvType::Q8_0.row_bytes(16), None);
        assert_eq!(KvType::F16.row_bytes(16), Some(32));
        assert_eq!(KvType::default(), KvType::F16);
    }
}
