//! `Batch`: what one pass of the model computes. Every caller (prefill, decode, tree
//! verification, growing a tree, the profiler) describes its work as a batch and hands it to
//! [`Model::run`](super::Model::run); the layer loop never branches on who is asking.
//!
//! A batch has tokens, a shape and the outputs it wants:
//! - **shape**: a [`Shape::Chain`] of tokens appended at positions `len..` of the state and
//!   committed at once; a [`Shape::Tree`] of draft nodes (node `i` at position
//!   `len + depth(i)`, seeing the committed context and its ancestors), left pending in the
//!   state until [`Model::commit`](super::Model::commit) keeps one root path; or
//!   [`Shape::Grow`], more nodes for the pending tree (a drafter growing its tree a level at a
//!   time).
//! - **outputs**: logits for no row, the last row or every row (from the model's LM head or
//!   from a reduced one, e.g. its first rows), the final-normed hidden states, and the
//!   outputs of chosen decoder layers ("taps"). Only what is asked for comes back to the host,
//!   into an [`Output`] the caller keeps from pass to pass.

use crate::kernels::attention::TreeRows;
use crate::kernels::matmul::MatMulWeight;

use super::tree::TokenTree;

/// Which rows get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every row: `rows × vocab` values.
    All,
    /// Only the last row: `vocab` values.
    Last,
    /// No logits (prefill whose last token comes later, hidden states only).
    None,
}

/// How the rows of a batch relate to the state and to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape<'a> {
    /// Row `i` at position `len + i`; the rows are committed (the state grows by them).
    Chain,
    /// The nodes of a token tree (`parents[i] < i`, or [`NO_PARENT`](super::tree::NO_PARENT)
    /// for a root; `depths[i]` its depth), left pending until a commit. A pending tree of an
    /// earlier pass is discarded first.
    Tree {
        parents: &'a [usize],
        depths: &'a [usize],
    },
    /// More nodes for the pending tree: row `k`'s parent is `parents[k]`, a node of the
    /// pending tree or an earlier row (`pending nodes + j`). Attention-only models.
    Grow { parents: &'a [usize] },
}

/// One pass of the model: see the module doc. `W` is the type of a replacement LM head
/// (the backend's packed matrix: `MatMulWeight` on the CPU).
pub struct Batch<'a, W = MatMulWeight> {
    pub(crate) tokens: &'a [u32],
    pub(crate) shape: Shape<'a>,
    pub(crate) logits: Logits,
    pub(crate) head: Option<&'a W>,
    pub(crate) hidden: bool,
    pub(crate) taps: &'a [usize],
}

impl<W> Clone for Batch<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W> Copy for Batch<'_, W> {}

impl<W> std::fmt::Debug for Batch<'_, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("tokens", &self.tokens)
            .field("shape", &self.shape)
            .field("logits", &self.logits)
            .field("own_head", &self.head.is_some())
            .field("hidden", &self.hidden)
            .field("taps", &self.taps)
            .finish()
    }
}

impl<'a, W> Batch<'a, W> {
    fn with_shape(tokens: &'a [u32], shape: Shape<'a>, logits: Logits) -> Batch<'a, W> {
        Batch {
            tokens,
            shape,
            logits,
            head: None,
            hidden: false,
            taps: &[],
        }
    }

    /// `tokens` appended to the state; logits of the last one.
    pub fn chain(tokens: &'a [u32]) -> Batch<'a, W> {
        Batch::with_shape(tokens, Shape::Chain, Logits::Last)
    }

    /// Every node of `tree`, pending until a commit; logits of every node.
    pub fn tree(tree: &'a TokenTree) -> Batch<'a, W> {
        let shape = Shape::Tree {
            parents: tree.parents(),
            depths: tree.depths(),
        };
        Batch::with_shape(tree.tokens(), shape, Logits::All)
    }

    /// `tokens` added to the pending tree under `parents` (see [`Shape::Grow`]); logits of
    /// every new node.
    pub fn grow(parents: &'a [usize], tokens: &'a [u32]) -> Batch<'a, W> {
        Batch::with_shape(tokens, Shape::Grow { parents }, Logits::All)
    }

    /// Which rows get logits.
    pub fn logits(mut self, logits: Logits) -> Batch<'a, W> {
        self.logits = logits;
        self
    }

    /// Logits from `head` instead of the model's LM head (e.g. its first rows: a drafter's
    /// reduced vocabulary); `None` for the model's own.
    pub fn head(mut self, head: Option<&'a W>) -> Batch<'a, W> {
        self.head = head;
        self
    }

    /// Also return every row's final-normed hidden state when `hidden` (what MTP-style
    /// drafters read).
    pub fn hidden(mut self, hidden: bool) -> Batch<'a, W> {
        self.hidden = hidden;
        self
    }

    /// Also return the outputs of the decoder layers `taps` (0-based, before the final norm)
    /// for every row (what DFlash-style drafters condition on).
    pub fn taps(mut self, taps: &'a [usize]) -> Batch<'a, W> {
        self.taps = taps;
        self
    }

    /// The batch's tokens.
    pub fn tokens(&self) -> &'a [u32] {
        self.tokens
    }

    /// The batch's shape.
    pub fn shape(&self) -> Shape<'a> {
        self.shape
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// What a pass returns to the host, in buffers kept from pass to pass (they only grow).
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// Logits of the rows asked for, `rows × head rows`, row by row; row `i` scores the token
    /// after row `i`'s token.
    pub logits: Vec<f32>,
    /// Final-normed hidden states, `rows × hidden`, when asked for; empty otherwise.
    pub hidden: Vec<f32>,
    /// The requested layers' outputs, `rows × taps × hidden` (row by row, taps in the order
    /// asked), when asked for; empty otherwise.
    pub taps: Vec<f32>,
}

impl Output {
    /// Empties every buffer, keeping its memory.
    pub fn clear(&mut self) {
        self.logits.clear();
        self.hidden.clear();
        self.taps.clear();
    }
}

/// A batch as the layers see it, once the model has placed it in the state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pass<'a> {
    /// Rows.
    pub(crate) n: usize,
    /// Committed positions before the rows.
    pub(crate) past: usize,
    /// Each row's position.
    pub(crate) positions: &'a [usize],
    /// For tree nodes: the whole pending tree's parents and the node of row 0 (the earlier
    /// nodes' keys and values already wait in the caches); `None` for a chain.
    pub(crate) tree: Option<TreeRows<'a>>,
}
