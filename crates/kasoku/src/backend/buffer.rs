//! What model code may do with a backend's activation memory without reading its values:
//! take a range of a buffer, split one in two, and grow an owned one. [`Buf`] is the
//! borrowed buffer (`Backend::Buffer`), [`BufVec`] the owned, growable one (`Backend::Vec`:
//! the scratch of a state's passes, a recurrent layer's state). The host backends use `[f32]`
//! and `Vec<f32>`; a device backend implements them over its own allocations. Values move
//! between buffers, and to or from the host, only through the backend's copy methods.

use std::fmt::Debug;
use std::ops::Range;

/// A borrowed buffer of f32 activations.
pub trait Buf {
    /// Values held.
    fn len(&self) -> usize;
    /// Whether it holds no values.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values `r`.
    fn at(&self, r: Range<usize>) -> &Self;
    /// The values `r`, writable.
    fn at_mut(&mut self, r: Range<usize>) -> &mut Self;
    /// The values before `mid` and from `mid` on.
    fn split_mut(&mut self, mid: usize) -> (&mut Self, &mut Self);
}

/// An owned buffer that grows on demand (it never shrinks).
pub trait BufVec<B: ?Sized>: Default + Clone + Debug + Send + Sync {
    /// `len` zeros.
    fn zeros(len: usize) -> Self;
    /// Values held.
    fn len(&self) -> usize;
    /// Whether it holds no values.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every value.
    fn all(&self) -> &B;
    /// Every value, writable.
    fn all_mut(&mut self) -> &mut B;
    /// The first `len` values, growing (with zeros) when it holds fewer; what grew stays.
    fn prefix(&mut self, len: usize) -> &mut B;
    /// Bytes of memory it holds (its capacity).
    fn bytes(&self) -> usize;
}

impl Buf for [f32] {
    #[inline]
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }
    #[inline]
    fn at(&self, r: Range<usize>) -> &[f32] {
        &self[r]
    }
    #[inline]
    fn at_mut(&mut self, r: Range<usize>) -> &mut [f32] {
        &mut self[r]
    }
    #[inline]
    fn split_mut(&mut self, mid: usize) -> (&mut [f32], &mut [f32]) {
        self.split_at_mut(mid)
    }
}

impl BufVec<[f32]> for Vec<f32> {
    fn zeros(len: usize) -> Vec<f32> {
        vec![0.0; len]
    }
    #[inline]
    fn len(&self) -> usize {
        Vec::len(self)
    }
    #[inline]
    fn all(&self) -> &[f32] {
        self
    }
    #[inline]
    fn all_mut(&mut self) -> &mut [f32] {
        self
    }
    #[inline]
    fn prefix(&mut self, len: usize) -> &mut [f32] {
        if Vec::len(self) < len {
            self.resize(len, 0.0);
        }
        &mut self[..len]
    }
    fn bytes(&self) -> usize {
        self.capacity() * 4
    }
}
