//! The memory a packed weight matrix lives in.
//!
//! A decode step streams every weight byte once, so the pages holding the weights matter: with
//! 4 KiB pages a 1 GB model spans a quarter of a million pages, and every step walks the page
//! tables for each of them. Where the OS offers transparent huge pages (Linux), large matrices
//! are placed in an anonymous mapping that asks for 2 MiB pages before it is first touched;
//! elsewhere, or when the mapping fails, the bytes stay in an ordinary `Vec`.

use std::ops::Deref;

/// Matrices at least this large get their own huge-page mapping (smaller ones would waste most
/// of a 2 MiB page).
#[cfg(target_os = "linux")]
const HUGE_PAGE_MIN: usize = 1 << 20;
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// Immutable packed weight bytes.
pub(crate) enum PackedBytes {
    Heap(Vec<u8>),
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        len: usize,
    },
}

impl PackedBytes {
    /// Moves `bytes` into huge pages where that is possible and worthwhile.
    pub(crate) fn new(bytes: Vec<u8>) -> PackedBytes {
        #[cfg(target_os = "linux")]
        if bytes.len() >= HUGE_PAGE_MIN {
            if let Some(p) = Self::mapped(&bytes) {
                return p;
            }
        }
        PackedBytes::Heap(bytes)
    }

    #[cfg(target_os = "linux")]
    fn mapped(bytes: &[u8]) -> Option<PackedBytes> {
        let len = bytes.len();
        let mut map = memmap2::MmapMut::map_anon(len.div_ceil(HUGE_PAGE) * HUGE_PAGE).ok()?;
        // Advice is a hint: without huge pages the mapping still works with small ones.
        let _ = map.advise(memmap2::Advice::HugePage);
        map[..len].copy_from_slice(bytes);
        Some(PackedBytes::Mapped { map, len })
    }
}

impl Deref for PackedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            PackedBytes::Heap(v) => v,
            #[cfg(target_os = "linux")]
            PackedBytes::Mapped { map, len } => &map[..*len],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_bytes_small_and_large() {
        for len in [0usize, 17, 3 << 20] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let packed = PackedBytes::new(bytes.clone());
            assert_eq!(&packed[..], &bytes[..], "len {len}");
        }
    }
}
