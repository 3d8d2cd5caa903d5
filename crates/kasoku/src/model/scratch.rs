//! The activation memory of a state's passes: the residual stream, the normed rows, each
//! sub-layer's output, the positions of the rows, and one work area that each part of a
//! layer (attention, Gated DeltaNet, the MLP, the output norm) carves its intermediates from
//! in turn, and the rows a fused epilogue prepared for the next product, all in the backend's
//! memory (`B::Vec`, `B::Prepared`). A [`ModelState`](super::ModelState) owns
//! one; the buffers grow to the largest pass the state has run (at most
//! [`CHUNK`](super::CHUNK) rows) and are then reused, so a decode step or a verification pass
//! of a size seen before allocates nothing. They are never copied: a clone or fork of a state
//! starts with empty ones.
//!
//! Every buffer is handed out with stale values from the last pass; each user writes all of
//! what it reads (the kernels overwrite their outputs).

use crate::backend::{Backend, Buf, BufVec, Cpu, PreparedRows};

/// The buffers: see the module doc.
#[derive(Debug)]
pub(crate) struct Scratch<B: Backend = Cpu> {
    /// The rows' positions (host: the backend reads them as RoPE's input).
    pub(crate) positions: Vec<usize>,
    /// The residual stream: `n × hidden`.
    pub(crate) x: B::Vec,
    /// Normed rows: `n × hidden`.
    pub(crate) normed: B::Vec,
    /// A sub-layer's output before the residual add: `n × hidden`.
    pub(crate) delta: B::Vec,
    /// Intermediates of one part of a layer at a time ([`carve`]).
    pub(crate) work: B::Vec,
    /// The rows a fused epilogue prepared for the next product (a norm's for q/k/v or
    /// gate/up, attention's for the output projection, SwiGLU's for down), one at a time.
    pub(crate) prepared: B::Prepared,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            positions: Vec::new(),
            x: B::Vec::default(),
            normed: B::Vec::default(),
            delta: B::Vec::default(),
            work: B::Vec::default(),
            prepared: B::Prepared::default(),
        }
    }
}

impl<B: Backend> Scratch<B> {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.positions.capacity() * std::mem::size_of::<usize>()
            + self.x.bytes()
            + self.normed.bytes()
            + self.delta.bytes()
            + self.work.bytes()
            + self.prepared.bytes()
    }
}

/// The first `len` values of `buf`, which grows (with zeros) when it is shorter.
#[inline]
pub(crate) fn rows<B: Buf + ?Sized, V: BufVec<B>>(buf: &mut V, len: usize) -> &mut B {
    buf.prefix(len)
}

/// `N` disjoint parts of `buf` of the given lengths, in order (`buf` grows when it is
/// shorter than their sum).
pub(crate) fn carve<B: Buf + ?Sized, V: BufVec<B>, const N: usize>(
    buf: &mut V,
    lens: [usize; N],
) -> [&mut B; N] {
    let mut rest = Some(buf.prefix(lens.iter().sum()));
    lens.map(|len| {
        let (part, tail) = rest.take().expect("carve: the rest").split_mut(len);
        rest = Some(tail);
        part
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_splits_in_order_and_reuses_the_memory() {
        let mut buf: Vec<f32> = Vec::new();
        let [a, b, c] = carve(&mut buf, [2, 0, 3]);
        a.fill(1.0);
        c.fill(2.0);
        assert!(b.is_empty());
        assert_eq!(buf, [1.0, 1.0, 2.0, 2.0, 2.0]);
        let at = buf.as_ptr();
        let [a, b] = carve(&mut buf, [1, 3]);
        assert_eq!((a.len(), b.len()), (1, 3));
        assert_eq!(b, [1.0, 2.0, 2.0], "stale values are left");
        assert_eq!(buf.as_ptr(), at, "no new memory for a smaller pass");
    }
}
