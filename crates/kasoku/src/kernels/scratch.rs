//! Memory the kernels reuse from call to call, so that once a shape has been seen its calls
//! allocate nothing.
//!
//! Each buffer is a thread-local `Cell<Vec<T>>` declared beside the kernel that uses it:
//!
//! ```ignore
//! thread_local! {
//!     static PATHS: Cell<Vec<usize>> = const { Cell::new(Vec::new()) };
//! }
//! scratch::with(&PATHS, |paths| { paths.clear(); /* ... */ });
//! ```
//!
//! [`with`] takes the buffer out of its cell for the length of the call and puts it back
//! after, so a nested use of the same buffer (a kernel called from inside another's closure)
//! finds an empty one and allocates instead of failing; a panic drops the buffer. Buffers only
//! grow ([`grow`]). They belong to the *calling* thread: pool tasks get theirs from a
//! [`crate::kernels::threads::Work`] area carved out of such a buffer by the caller, so worker
//! threads never allocate either.

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` with the calling thread's buffer `key` (taken out of it meanwhile).
pub(crate) fn with<T, R>(
    key: &'static LocalKey<Cell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    let mut buf = key.take();
    let r = f(&mut buf);
    key.set(buf);
    r
}

/// The first `len` values of `buf`, which grows (with `T::default()`) if it is shorter;
/// values already there are left as they are (for buffers whose length does not matter).
pub(crate) fn grow<T: Clone + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

/// `buf` resized to `len` values (new ones `T::default()`, the others as they were), within
/// its capacity when that suffices (for buffers whose length is checked).
pub(crate) fn sized<T: Clone + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    buf.resize(len, T::default());
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static BUF: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    }

    #[test]
    fn buffers_are_kept_and_nesting_gets_a_fresh_one() {
        let first = with(&BUF, |b| {
            grow(b, 10).fill(7);
            // A nested use sees an empty buffer, not this one.
            with(&BUF, |inner| assert!(inner.is_empty()));
            b.as_ptr() as usize
        });
        with(&BUF, |b| {
            assert_eq!(b.as_ptr() as usize, first, "the same memory");
            assert_eq!(grow(b, 4), &[7, 7, 7, 7]);
            assert_eq!(grow(b, 12)[10..], [0, 0]);
            let at = b.as_ptr() as usize;
            assert_eq!(sized(b, 3).len(), 3);
            assert_eq!(sized(b, 12)[3..], [0; 9]);
            assert_eq!(
                b.as_ptr() as usize,
                at,
                "shrinking and growing back keeps the memory"
            );
        });
    }
}
