//! Disjoint parts of output buffers for pool tasks, and per-thread work memory: the one place
//! where tasks get `&mut` access to memory they share, so that kernels need no pointers.
//!
//! An output is cut into [`Blocks`]: seen as `rows` rows of `width` values (row-major), block
//! `b` is columns `b·block .. min((b + 1)·block, width)` of every row. Contiguous chunks are
//! the case of one row ([`Blocks::chunks`]); a column block of a row-major matrix (a matmul
//! task's share of every activation row's output, one head's share of every token's output) is
//! the general case. [`for_each`] runs task `t` with part `t` of its outputs (one [`Blocks`],
//! a tuple of them, or a [`BlockList`] spanning several outputs) and a [`Work`] area of its
//! thread.
//!
//! Why it is sound: an output stays borrowed mutably for as long as its `Blocks` and the parts
//! made from it live, and `for_each` consumes the `Blocks`; the pool runs every task index
//! exactly once, so each part is made once, and distinct parts are disjoint ([`Parts`]
//! implementations promise that): like `split_at_mut`, only split many ways. Work areas are
//! per slot and handed to a task for the length of the call alone (the task function is
//! generic over that borrow), and tasks of one slot never overlap in time
//! ([`super::parallel_for_slots`]).

use std::marker::PhantomData;

use super::{num_threads, parallel_for_slots};
use crate::kernels::scratch;

/// A mutable buffer of `rows × width` values cut into column blocks that tasks write.
pub(crate) struct Blocks<'a, T> {
    ptr: *mut T,
    rows: usize,
    width: usize,
    block: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a `Blocks` is the unique borrow of its buffer; sending it (or sharing it, which only
// lets `Parts::part` make `BlockMut`s, whose disjointness the callers of `part` guarantee)
// moves `T` values between threads, hence `T: Send`.
unsafe impl<T: Send> Send for Blocks<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Blocks<'_, T> {}

impl<'a, T> Blocks<'a, T> {
    /// `out` as `rows` rows (of `out.len() / rows` values), in column blocks of `block`.
    pub(crate) fn new(out: &'a mut [T], rows: usize, block: usize) -> Self {
        let width = out.len().checked_div(rows).unwrap_or(0);
        assert_eq!(
            out.len(),
            rows * width,
            "blocks: not a whole number of rows"
        );
        assert!(block > 0 || width == 0, "blocks: empty blocks");
        Blocks {
            ptr: out.as_mut_ptr(),
            rows,
            width,
            block,
            _borrow: PhantomData,
        }
    }

    /// `out` in consecutive chunks of `chunk` values (the last may be shorter).
    pub(crate) fn chunks(out: &'a mut [T], chunk: usize) -> Self {
        Blocks::new(out, 1, chunk)
    }

    /// The number of blocks.
    pub(crate) fn count(&self) -> usize {
        self.width.div_ceil(self.block.max(1))
    }

    /// Block `b`.
    ///
    /// # Safety
    /// No other [`BlockMut`] of block `b` of this buffer may be alive while the result is.
    unsafe fn block(&self, b: usize) -> BlockMut<'a, T> {
        assert!(b < self.count(), "blocks: block {b} of {}", self.count());
        let start = b * self.block;
        BlockMut {
            // SAFETY: `start < width`, so the offset is inside the buffer (row 0).
            ptr: unsafe { self.ptr.add(start) },
            rows: self.rows,
            stride: self.width,
            len: self.block.min(self.width - start),
            _borrow: PhantomData,
        }
    }
}

/// One block of a [`Blocks`]: `rows()` rows of `len()` values, each row its own slice.
pub(crate) struct BlockMut<'p, T> {
    ptr: *mut T,
    rows: usize,
    stride: usize,
    len: usize,
    _borrow: PhantomData<&'p mut [T]>,
}

impl<'p, T> BlockMut<'p, T> {
    /// All of `out` as one block of `rows` rows (for code that runs a task's function
    /// itself).
    #[cfg(test)]
    pub(crate) fn whole(out: &'p mut [T], rows: usize) -> Self {
        let len = out.len().checked_div(rows).unwrap_or(0);
        assert_eq!(out.len(), rows * len, "block: not a whole number of rows");
        BlockMut {
            ptr: out.as_mut_ptr(),
            rows,
            stride: len,
            len,
            _borrow: PhantomData,
        }
    }

    /// Values per row.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Row `r` of the block.
    pub(crate) fn row(&mut self, r: usize) -> &mut [T] {
        assert!(r < self.rows, "block: row {r} of {}", self.rows);
        // SAFETY: row `r` of the block is `len` values at `r·stride` past the block's start,
        // inside the buffer (`Blocks::block` checked the columns, `r < rows`); no other block
        // has these columns, and `&mut self` keeps one row borrowed at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.stride), self.len) }
    }

    /// The block as one slice, when it is contiguous (one row, or every column).
    pub(crate) fn into_slice(self) -> &'p mut [T] {
        assert!(
            self.rows <= 1 || self.len == self.stride,
            "block: not contiguous"
        );
        // SAFETY: the block's `rows × len` values are contiguous (checked) and inside the
        // buffer, and this `BlockMut`, consumed here, was their only handle.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.rows * self.len) }
    }
}

/// Outputs that tasks write in parts: part `t` is task `t`'s alone.
///
/// # Safety
/// For distinct `t < len()`, `part(t)` must give access to non-overlapping memory that stays
/// borrowed mutably for the parts' whole life (the `'a` of the [`Blocks`] they come from).
pub(crate) unsafe trait Parts: Sync {
    /// One task's part.
    type Part;

    /// The number of parts.
    fn len(&self) -> usize;

    /// Part `t`.
    ///
    /// # Safety
    /// At most once for each `t` over the life of `self`.
    unsafe fn part(&self, t: usize) -> Self::Part;
}

// SAFETY: no memory at all.
unsafe impl Parts for () {
    type Part = ();

    fn len(&self) -> usize {
        usize::MAX
    }

    unsafe fn part(&self, _: usize) {}
}

// SAFETY: distinct blocks are distinct column ranges of every row, borrowed for `'a`.
unsafe impl<'a, T: Send> Parts for Blocks<'a, T> {
    type Part = BlockMut<'a, T>;

    fn len(&self) -> usize {
        self.count()
    }

    unsafe fn part(&self, t: usize) -> BlockMut<'a, T> {
        // SAFETY: block `t` is made once (the caller's promise), so it has no other handle.
        unsafe { self.block(t) }
    }
}

// SAFETY: part `t` is part `t` of each output; the outputs are distinct borrows.
unsafe impl<A: Parts, B: Parts> Parts for (A, B) {
    type Part = (A::Part, B::Part);

    fn len(&self) -> usize {
        self.0.len().min(self.1.len())
    }

    unsafe fn part(&self, t: usize) -> Self::Part {
        // SAFETY: forwarded from the caller.
        unsafe { (self.0.part(t), self.1.part(t)) }
    }
}

// SAFETY: as for pairs.
unsafe impl<A: Parts, B: Parts, C: Parts> Parts for (A, B, C) {
    type Part = (A::Part, B::Part, C::Part);

    fn len(&self) -> usize {
        self.0.len().min(self.1.len()).min(self.2.len())
    }

    unsafe fn part(&self, t: usize) -> Self::Part {
        // SAFETY: forwarded from the caller.
        unsafe { (self.0.part(t), self.1.part(t), self.2.part(t)) }
    }
}

/// The most outputs a [`BlockList`] holds.
pub(crate) const MAX_LIST: usize = 8;

/// Several outputs' blocks as the parts of one job: the blocks of output 0, then those of
/// output 1, ...; part `t` is `(output, block, the block)`.
pub(crate) struct BlockList<'a, T> {
    outputs: [Option<Blocks<'a, T>>; MAX_LIST],
    /// `starts[i]`: the first part of output `i`; `starts[len]` the number of parts.
    starts: [usize; MAX_LIST + 1],
    len: usize,
}

impl<'a, T> BlockList<'a, T> {
    /// An empty list.
    pub(crate) fn new() -> Self {
        BlockList {
            outputs: [const { None }; MAX_LIST],
            starts: [0; MAX_LIST + 1],
            len: 0,
        }
    }

    /// Appends an output (at most [`MAX_LIST`]).
    pub(crate) fn push(&mut self, blocks: Blocks<'a, T>) {
        assert!(
            self.len < MAX_LIST,
            "block list: more than {MAX_LIST} outputs"
        );
        self.starts[self.len + 1] = self.starts[self.len] + blocks.count();
        self.outputs[self.len] = Some(blocks);
        self.len += 1;
    }

    /// The number of parts.
    pub(crate) fn parts(&self) -> usize {
        self.starts[self.len]
    }
}

// SAFETY: parts of distinct outputs are in distinct buffers, and within an output they are
// distinct blocks, all borrowed for `'a`.
unsafe impl<'a, T: Send> Parts for BlockList<'a, T> {
    type Part = (usize, usize, BlockMut<'a, T>);

    fn len(&self) -> usize {
        self.parts()
    }

    unsafe fn part(&self, t: usize) -> Self::Part {
        let i = (0..self.len)
            .find(|&i| t < self.starts[i + 1])
            .expect("block list: part out of range");
        let b = t - self.starts[i];
        let blocks = self.outputs[i].as_ref().expect("pushed");
        // SAFETY: part `t` is block `b` of output `i` alone, and it is made once (the
        // caller's promise).
        (i, b, unsafe { blocks.block(b) })
    }
}

/// Per-thread work memory for the tasks of a job: `len` values for each thread taking part,
/// carved from the caller's grow-only `buf` (so a job whose shapes were seen before
/// allocates nothing, on any thread).
pub(crate) struct Work<'a> {
    buf: Option<&'a mut Vec<f32>>,
    len: usize,
}

impl<'a> Work<'a> {
    /// `len` values per thread from `buf`.
    pub(crate) fn new(buf: &'a mut Vec<f32>, len: usize) -> Self {
        Work {
            buf: Some(buf),
            len,
        }
    }

    /// No work memory (tasks get an empty slice).
    pub(crate) fn none() -> Self {
        Work { buf: None, len: 0 }
    }
}

/// Runs `f(t, part t of parts, work)` for every task `t < tasks` on the pool (each exactly
/// once), where `work` is the running thread's [`Work`] area: `work.len` values, left as the
/// previous task of that thread (or an earlier call) left them.
pub(crate) fn for_each<P: Parts>(
    tasks: usize,
    parts: P,
    work: Work<'_>,
    f: impl Fn(usize, P::Part, &mut [f32]) + Sync,
) {
    assert!(tasks <= parts.len(), "for_each: more tasks than parts");
    let slots = num_threads().min(tasks).max(1);
    let len = work.len;
    let areas: &mut [f32] = match work.buf {
        Some(buf) => scratch::grow(buf, slots * len),
        None => &mut [],
    };
    let areas = Blocks::chunks(areas, len.max(1));
    parallel_for_slots(tasks, slots, |t, slot| {
        // SAFETY: the pool runs task `t` once, so part `t` is alive only here.
        let part = unsafe { parts.part(t) };
        if len == 0 {
            return f(t, part, &mut []);
        }
        // SAFETY: `slot < slots` areas; tasks of one slot never run at the same time, and
        // each lends its area to `f` for the call alone, so this is the area's only live
        // handle.
        let area = unsafe { areas.block(slot) }.into_slice();
        f(t, part, area);
    });
}

/// `f(t, chunk t)` for the consecutive chunks of `chunk` values of `out` (the last may be
/// shorter), in parallel.
pub(crate) fn for_each_disjoint<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let blocks = Blocks::chunks(out, chunk);
    let tasks = blocks.count();
    for_each(tasks, blocks, Work::none(), |t, part, _| {
        f(t, part.into_slice())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn column_blocks_cover_every_value_once() {
        for (rows, width, block) in [(1, 10, 3), (4, 33, 16), (3, 8, 8), (5, 7, 100), (0, 0, 4)] {
            let mut out = vec![0u32; rows * width];
            let blocks = Blocks::new(&mut out, rows, block);
            let n = blocks.count();
            assert_eq!(n, width.div_ceil(block));
            for_each(n, blocks, Work::none(), |b, mut part, _| {
                for r in 0..rows {
                    for (k, v) in part.row(r).iter_mut().enumerate() {
                        *v += (r * width + b * block + k) as u32 + 1;
                    }
                }
            });
            let want: Vec<u32> = (1..=(rows * width) as u32).collect();
            assert_eq!(out, want, "{rows}x{width} by {block}");
        }
    }

    #[test]
    fn pairs_lists_and_chunks() {
        let (mut a, mut b) = (vec![0usize; 12], vec![0usize; 6]);
        let pair = (Blocks::chunks(&mut a, 4), Blocks::new(&mut b, 2, 1));
        for_each(3, pair, Work::none(), |t, (mut x, mut y), _| {
            x.row(0).fill(t + 1);
            y.row(0)[0] = t + 1;
            y.row(1)[0] = 10 * (t + 1);
        });
        assert_eq!(a, [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
        assert_eq!(b, [1, 2, 3, 10, 20, 30]);

        let (mut p, mut q) = (vec![0usize; 5], vec![0usize; 2 * 3]);
        let mut list = BlockList::new();
        list.push(Blocks::chunks(&mut p, 2));
        list.push(Blocks::new(&mut q, 2, 2));
        let n = list.parts();
        assert_eq!(n, 3 + 2);
        for_each(n, list, Work::none(), |t, (i, b, mut part), _| {
            for r in 0..[1, 2][i] {
                part.row(r).fill(100 * i + 10 * b + t);
            }
        });
        assert_eq!(p, [0, 0, 11, 11, 22]);
        assert_eq!(q, [103, 103, 114, 103, 103, 114]);

        let mut c = vec![0u8; 10];
        for_each_disjoint(&mut c, 3, |t, s| s.fill(t as u8));
        assert_eq!(c, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]);
    }

    #[test]
    fn work_areas_are_never_shared_by_running_tasks() {
        let mut buf = Vec::new();
        let done = AtomicUsize::new(0);
        for_each(500, (), Work::new(&mut buf, 3), |t, (), work| {
            assert_eq!(work.len(), 3);
            // Another task in this area meanwhile would overwrite the values.
            work.fill(t as f32);
            for _ in 0..2000 {
                std::hint::spin_loop();
            }
            assert!(work.iter().all(|&v| v == t as f32), "task {t}");
            done.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(done.load(Ordering::Relaxed), 500);
        assert!(buf.len() >= 3);
    }
}
