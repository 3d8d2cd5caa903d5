//! The activation memory of a state's passes: the residual stream, the normed rows, each
//! sub-layer's output, the positions of the rows, one work area that each part of a layer
//! (attention, Gated DeltaNet, the MLP, the output norm) carves its intermediates from in
//! turn, and the rows a fused epilogue prepared for the next product. A [`ModelState`](super::ModelState) owns one; the buffers grow to the largest pass
//! the state has run (at most [`CHUNK`](super::CHUNK) rows) and are then reused, so a decode
//! step or a verification pass of a size seen before allocates nothing. They are never
//! copied: a clone or fork of a state starts with empty ones.
//!
//! Every buffer is handed out with stale values from the last pass; each user writes all of
//! what it reads (the kernels overwrite their outputs).

use crate::kernels::matmul::Prepared;

/// The buffers: see the module doc.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The rows' positions.
    pub(crate) positions: Vec<usize>,
    /// The residual stream: `n × hidden`.
    pub(crate) x: Vec<f32>,
    /// Normed rows: `n × hidden`.
    pub(crate) normed: Vec<f32>,
    /// A sub-layer's output before the residual add: `n × hidden`.
    pub(crate) delta: Vec<f32>,
    /// Intermediates of one part of a layer at a time ([`carve`]).
    pub(crate) work: Vec<f32>,
    /// The rows a fused epilogue prepared for the next product (a norm's for q/k/v or
    /// gate/up, attention's for the output projection, SwiGLU's for down), one at a time.
    pub(crate) prepared: Prepared,
}

impl Scratch {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.positions.capacity() * std::mem::size_of::<usize>()
            + (self.x.capacity()
                + self.normed.capacity()
                + self.delta.capacity()
                + self.work.capacity())
                * 4
            + self.prepared.bytes()
    }
}

/// The first `len` values of `buf`, which grows (with zeros) when it is shorter.
pub(crate) fn rows(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// `N` disjoint slices of `buf` of the given lengths, in order (`buf` grows when it is
/// shorter than their sum).
pub(crate) fn carve<const N: usize>(buf: &mut Vec<f32>, lens: [usize; N]) -> [&mut [f32]; N] {
    let mut rest = rows(buf, lens.iter().sum());
    lens.map(|len| {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        part
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_splits_in_order_and_reuses_the_memory() {
        let mut buf = Vec::new();
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
