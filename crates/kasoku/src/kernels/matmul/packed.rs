//! The memory a packed weight matrix lives in.
//!
//! A decode step streams every weight byte once, so the pages holding the weights matter: with
//! 4 KiB pages a 1 GB model spans a quarter of a million pages, and every step walks the page
//! tables for each of them. Where the OS offers transparent huge pages (Linux), large matrices
//! are placed in anonymous mappings that ask for 2 MiB pages before they are first touched.
//! Matrices share 64 MiB arenas (so a 2 MiB page is not spent on a matrix's last few bytes); one
//! larger than an arena gets a mapping of its own. An arena is unmapped when the last matrix in
//! it is dropped. Elsewhere, or when mapping fails, the bytes stay in an ordinary `Vec`.
//!
//! A format's `pack` writes straight into the final memory ([`PackedBytes::zeroed`], then
//! [`PackedMut::freeze`]), so loading never holds a matrix twice.

use std::ops::{Deref, DerefMut};
#[cfg(target_os = "linux")]
use std::sync::{Arc, Mutex};

/// Matrices at least this large go to huge pages (smaller ones stay on the heap).
#[cfg(target_os = "linux")]
const HUGE_PAGE_MIN: usize = 1 << 20;
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;
#[cfg(target_os = "linux")]
const ARENA: usize = 64 << 20;
/// Matrices start at this alignment inside an arena.
#[cfg(target_os = "linux")]
const ALIGN: usize = 4096;

/// Immutable packed weight bytes.
pub(crate) enum PackedBytes {
    Heap(Vec<u8>),
    #[cfg(target_os = "linux")]
    Mapped {
        arena: Arc<Arena>,
        offset: usize,
        len: usize,
    },
}

/// An anonymous huge-page mapping that matrices are placed into, front to back.
#[cfg(target_os = "linux")]
pub(crate) struct Arena {
    ptr: *mut u8,
    map: memmap2::MmapMut,
}

// SAFETY: each region of an arena is written only through the one `PackedMut` that reserved
// it, before any shared `PackedBytes` for it exists, and only read afterwards.
#[cfg(target_os = "linux")]
unsafe impl Send for Arena {}
// SAFETY: as above: shared access only reads regions that are no longer written.
#[cfg(target_os = "linux")]
unsafe impl Sync for Arena {}

#[cfg(target_os = "linux")]
impl Arena {
    fn new(len: usize) -> Option<Arena> {
        let mut map = memmap2::MmapMut::map_anon(len.div_ceil(HUGE_PAGE) * HUGE_PAGE).ok()?;
        // Advice is a hint: without huge pages the mapping still works with small ones.
        let _ = map.advise(memmap2::Advice::HugePage);
        Some(Arena {
            ptr: map.as_mut_ptr(),
            map,
        })
    }
}

/// The arena new matrices go to, and its first free byte.
#[cfg(target_os = "linux")]
static CURRENT: Mutex<Option<(Arc<Arena>, usize)>> = Mutex::new(None);

impl PackedBytes {
    /// `len` zero bytes to pack a matrix into: huge pages where that is possible and
    /// worthwhile, else the heap.
    pub(crate) fn zeroed(len: usize) -> PackedMut {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE_MIN {
            if let Some(p) = Self::mapped(len) {
                return PackedMut(p);
            }
        }
        PackedMut(PackedBytes::Heap(vec![0; len]))
    }

    /// Copies `bytes` into packed memory (as `zeroed` places it).
    pub(crate) fn copy_of(bytes: &[u8]) -> PackedBytes {
        let mut out = PackedBytes::zeroed(bytes.len());
        out.copy_from_slice(bytes);
        out.freeze()
    }

    /// Reserves `len` fresh (zero) bytes of an arena.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<PackedBytes> {
        let (arena, offset) = if len > ARENA / 2 {
            (Arc::new(Arena::new(len)?), 0)
        } else {
            let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
            let fits = current
                .as_ref()
                .is_some_and(|(a, next)| next + len <= a.map.len());
            if !fits {
                *current = Some((Arc::new(Arena::new(ARENA)?), 0));
            }
            let (arena, next) = current.as_mut().expect("set above");
            let offset = *next;
            *next = (offset + len).div_ceil(ALIGN) * ALIGN;
            (arena.clone(), offset)
        };
        Some(PackedBytes::Mapped { arena, offset, len })
    }
}

/// Packed memory being written: the only handle to its bytes until [`PackedMut::freeze`].
pub(crate) struct PackedMut(PackedBytes);

impl PackedMut {
    /// The finished, immutable bytes.
    pub(crate) fn freeze(self) -> PackedBytes {
        self.0
    }
}

impl Deref for PackedMut {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for PackedMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            PackedBytes::Heap(v) => v,
            #[cfg(target_os = "linux")]
            PackedBytes::Mapped { arena, offset, len } => {
                // SAFETY: the region lies inside the mapping and was reserved for this value
                // alone (arena regions are never handed out twice); no `PackedBytes` reading
                // it exists until `freeze`.
                unsafe { std::slice::from_raw_parts_mut(arena.ptr.add(*offset), *len) }
            }
        }
    }
}

impl Deref for PackedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            PackedBytes::Heap(v) => v,
            #[cfg(target_os = "linux")]
            PackedBytes::Mapped { arena, offset, len } => {
                // SAFETY: the region was fully written before this value existed and is never
                // written again; the arena outlives `self`.
                unsafe { std::slice::from_raw_parts(arena.ptr.add(*offset), *len) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_bytes_small_and_large() {
        let make = |len: usize, seed: usize| -> Vec<u8> {
            (0..len).map(|i| ((i + seed) * 31 % 251) as u8).collect()
        };
        let lens = [
            0usize,
            17,
            3 << 20,
            (1 << 20) + 5,
            40 << 20,
            70 << 20,
            2 << 20,
        ];
        let packed: Vec<(Vec<u8>, PackedBytes)> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| (make(len, i), PackedBytes::copy_of(&make(len, i))))
            .collect();
        for (bytes, p) in &packed {
            assert_eq!(&p[..], &bytes[..], "len {}", bytes.len());
        }
    }

    #[test]
    fn zeroed_is_zero() {
        for len in [5usize, 3 << 20, 40 << 20] {
            let p = PackedBytes::zeroed(len).freeze();
            assert!(p.iter().all(|&b| b == 0), "len {len}");
        }
    }
}
