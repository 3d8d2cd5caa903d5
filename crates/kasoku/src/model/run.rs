//! The forward pass: [`Model::run`] places a [`Batch`] in the state (positions, tree
//! ancestry), runs the one layer loop ([`run_layers`]) and returns to the host what the
//! batch asked for. Prefill, decode, tree verification, growing a tree, the MTP head and the
//! profiler all come through here.
//!
//! ```text
//! x = embed(tokens)
//! for each layer:  x += mixer(attn_norm(x));  x += mlp(ffn_norm(x))      (run_layers)
//! hidden = output_norm(x);  logits = head(hidden)                       (what was asked)
//! ```
//! Chains longer than [`CHUNK`] rows run in chunks, each weight matrix multiplied once per
//! chunk. The loop is generic over the backend (`Model<B>`, static dispatch): activations
//! stay in the backend's buffers, and only what the batch asked for (logits, hidden states,
//! layer taps) is copied to the host. Every kernel computes a row the same way whatever batch it comes in, so a row's
//! results do not depend on the rows beside it: a tree node's logits have the bits plain
//! decoding of its path gives.

use super::batch::{Batch, Logits, Output, Pass, Shape};
use super::config::LayerKind;
use super::mixer::Mixer;
use super::scratch::{rows, Scratch};
use super::state::{LayerState, ModelState};
use super::trace::{NoTrace, Op, Trace};
use super::transformer::{Layer, Model};
use super::ModelError;
use crate::backend::{
    Activation, Backend, Buf, BufVec, CopyRows, KvStore, Logits as Head, WeightInfo,
};
use crate::kernels::attention::TreeRows;

/// Rows per forward chunk: bounds activation memory while keeping matmuls batched.
pub const CHUNK: usize = 256;

impl<B: Backend> Model<B> {
    /// Runs `batch` on `state` and leaves what it asked for in `out` (emptied first). Invalid
    /// input (a token outside the vocabulary, no room in the state, a foreign state, a tree
    /// grown without a pending one) is an error and leaves the state untouched.
    pub fn run(
        &self,
        state: &mut ModelState<B>,
        batch: &Batch<'_, B::Weight>,
        out: &mut Output,
    ) -> Result<(), ModelError> {
        self.run_traced(state, batch, out, &mut NoTrace)
    }

    /// [`Model::run`] with every step of the pass handed to `tr` (see [`Trace`]).
    pub fn run_traced<T: Trace>(
        &self,
        state: &mut ModelState<B>,
        batch: &Batch<'_, B::Weight>,
        out: &mut Output,
        tr: &mut T,
    ) -> Result<(), ModelError> {
        out.clear();
        self.check_taps(batch.taps)?;
        match batch.shape {
            Shape::Chain => self.run_chain(state, batch, out, tr),
            Shape::Tree { parents, depths } => {
                state.discard_pending();
                self.check(state, batch.tokens)?;
                let n = batch.len();
                assert!(
                    parents.len() == n && depths.len() == n,
                    "tree: shape lengths"
                );
                if n == 0 {
                    return Ok(());
                }
                let ModelState {
                    layers,
                    len,
                    pending,
                    scratch,
                    ..
                } = state;
                let past = *len;
                pending.parents.clear();
                pending.parents.extend_from_slice(parents);
                pending.depths.clear();
                pending.depths.extend_from_slice(depths);
                pending.active = true;
                let Scratch {
                    positions,
                    x,
                    normed,
                    delta,
                    work,
                    prepared,
                } = scratch;
                positions.clear();
                positions.extend(depths.iter().map(|d| past + d));
                let pass = Pass {
                    n,
                    past,
                    positions,
                    tree: Some(TreeRows {
                        parents: &pending.parents,
                        first: 0,
                    }),
                };
                let mut buffers = Buffers {
                    x,
                    normed,
                    delta,
                    work,
                    prepared,
                };
                self.pass(layers, batch, &pass, 0, &mut buffers, out, tr);
                self.outputs(&mut buffers, n, batch, true, out, tr);
                Ok(())
            }
            Shape::Grow { parents } => self.run_grow(state, batch, parents, out, tr),
        }
    }

    fn run_chain<T: Trace>(
        &self,
        state: &mut ModelState<B>,
        batch: &Batch<'_, B::Weight>,
        out: &mut Output,
        tr: &mut T,
    ) -> Result<(), ModelError> {
        state.discard_pending();
        self.check(state, batch.tokens)?;
        let n_chunks = batch.len().div_ceil(CHUNK);
        let ModelState {
            layers,
            len,
            scratch,
            ..
        } = state;
        let Scratch {
            positions,
            x,
            normed,
            delta,
            work,
            prepared,
        } = scratch;
        let mut buffers = Buffers {
            x,
            normed,
            delta,
            work,
            prepared,
        };
        for (c, chunk) in batch.tokens.chunks(CHUNK).enumerate() {
            let n = chunk.len();
            let past = *len;
            positions.clear();
            positions.extend(past..past + n);
            let pass = Pass {
                n,
                past,
                positions,
                tree: None,
            };
            let part = Batch {
                tokens: chunk,
                ..*batch
            };
            self.pass(layers, &part, &pass, c * CHUNK, &mut buffers, out, tr);
            *len += n;
            self.outputs(&mut buffers, n, batch, c + 1 == n_chunks, out, tr);
        }
        Ok(())
    }

    /// More nodes for the pending tree ([`Shape::Grow`]).
    fn run_grow<T: Trace>(
        &self,
        state: &mut ModelState<B>,
        batch: &Batch<'_, B::Weight>,
        parents: &[usize],
        out: &mut Output,
        tr: &mut T,
    ) -> Result<(), ModelError> {
        let tokens = batch.tokens;
        if !state.pending.active {
            return Err(ModelError::StateMismatch(
                "growing a tree without a verified one".into(),
            ));
        }
        if self
            .layers
            .iter()
            .any(|l| l.mixer.kind() != LayerKind::Attention)
        {
            return Err(ModelError::Unsupported(
                "growing a verified tree through recurrent layers".into(),
            ));
        }
        let first = state.pending.parents.len();
        if parents.len() != tokens.len() || parents.iter().enumerate().any(|(k, &p)| p >= first + k)
        {
            return Err(ModelError::StateMismatch(
                "growing a tree: a parent after its child".into(),
            ));
        }
        self.check_tokens(tokens)?;
        self.check_room(state, first + tokens.len())?;
        let n = tokens.len();
        if n == 0 {
            return Ok(());
        }
        let ModelState {
            layers,
            len,
            pending,
            scratch,
            ..
        } = state;
        for &p in parents {
            let d = pending.depths[p] + 1;
            pending.parents.push(p);
            pending.depths.push(d);
        }
        let past = *len;
        let Scratch {
            positions,
            x,
            normed,
            delta,
            work,
            prepared,
        } = scratch;
        positions.clear();
        positions.extend(pending.depths[first..].iter().map(|d| past + d));
        let pass = Pass {
            n,
            past,
            positions,
            tree: Some(TreeRows {
                parents: &pending.parents,
                first,
            }),
        };
        let mut buffers = Buffers {
            x,
            normed,
            delta,
            work,
            prepared,
        };
        self.pass(layers, batch, &pass, 0, &mut buffers, out, tr);
        self.outputs(&mut buffers, n, batch, true, out, tr);
        Ok(())
    }

    /// Embeds the rows into `buf.x` and runs them through the layers, leaving their hidden
    /// rows there. Taps go to `out.taps` from row `start` on.
    #[allow(clippy::too_many_arguments)]
    fn pass<T: Trace>(
        &self,
        states: &mut [LayerState<B>],
        batch: &Batch<'_, B::Weight>,
        pass: &Pass,
        start: usize,
        buf: &mut Buffers<B>,
        out: &mut Output,
        tr: &mut T,
    ) {
        let (n, h) = (pass.n, self.config.hidden);
        let x = rows(buf.x, n * h);
        let row_bytes = self.embedding.row_bytes();
        tr.op(Op::new("embed", None, n).reading(n * row_bytes), || {
            self.embedding.lookup(&self.backend, batch.tokens, x)
        });
        let taps = batch.taps;
        out.taps.resize((start + n) * taps.len() * h, 0.0);
        let tapped = Taps {
            layers: taps,
            start,
            out: &mut out.taps,
        };
        run_layers(
            &self.backend,
            &self.layers,
            states,
            0,
            buf,
            pass,
            tapped,
            tr,
        );
    }

    /// What the host asked for of the hidden rows in `buf.x` (`n × hidden`, before the
    /// output norm) of one chunk (`last`: the batch's last).
    fn outputs<T: Trace>(
        &self,
        buf: &mut Buffers<B>,
        n: usize,
        batch: &Batch<'_, B::Weight>,
        last: bool,
        out: &mut Output,
        tr: &mut T,
    ) {
        let (b, h) = (&self.backend, self.config.hidden);
        let x = buf.x.all().at(0..n * h);
        let head = batch.head.unwrap_or(&self.head);
        let norm_op = |rows| Op::new("output_norm", None, rows);
        if batch.hidden || batch.logits == Logits::All {
            let normed = rows(buf.normed, n * h);
            tr.op(norm_op(n), || self.output_norm.forward(b, x, normed));
            if batch.hidden {
                let at = out.hidden.len();
                out.hidden.resize(at + n * h, 0.0);
                b.read(CopyRows::whole(&*normed, &mut out.hidden[at..]));
            }
            match batch.logits {
                Logits::All => head_logits(b, head, normed, n, &mut out.logits, tr),
                Logits::Last if last => {
                    let normed = normed.at((n - 1) * h..n * h);
                    head_logits(b, head, normed, 1, &mut out.logits, tr)
                }
                _ => {}
            }
        } else if batch.logits == Logits::Last && last {
            let normed = rows(buf.normed, h);
            tr.op(norm_op(1), || {
                self.output_norm
                    .forward(b, x.at((n - 1) * h..n * h), normed)
            });
            head_logits(b, head, normed, 1, &mut out.logits, tr);
        }
    }

    /// Tap layers must exist.
    pub(crate) fn check_taps(&self, taps: &[usize]) -> Result<(), ModelError> {
        match taps.iter().find(|&&l| l >= self.layers.len()) {
            Some(l) => Err(ModelError::Unsupported(format!(
                "hidden states of layer {l} requested; the model has {} layers",
                self.layers.len()
            ))),
            None => Ok(()),
        }
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        match tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            Some(&bad) => Err(ModelError::TokenOutOfRange {
                token: bad,
                vocab: self.config.vocab,
            }),
            None => Ok(()),
        }
    }

    /// Whether `new` more positions fit in `state`.
    fn check_room(&self, state: &ModelState<B>, new: usize) -> Result<(), ModelError> {
        if state
            .len
            .checked_add(new)
            .is_none_or(|end| end > state.max_len)
        {
            return Err(ModelError::ContextFull {
                len: state.len,
                new,
                max_len: state.max_len,
            });
        }
        Ok(())
    }

    /// `tokens` may be appended to `state`, which belongs to this model.
    pub(crate) fn check(&self, state: &ModelState<B>, tokens: &[u32]) -> Result<(), ModelError> {
        self.check_tokens(tokens)?;
        self.check_room(state, tokens.len())?;
        check_layers(&self.layers, state)
    }
}

/// `state` holds one matching state per layer of `layers`.
pub(crate) fn check_layers<B: Backend>(
    layers: &[Layer<B>],
    state: &ModelState<B>,
) -> Result<(), ModelError> {
    if state.layers.len() != layers.len() {
        return Err(ModelError::StateMismatch(format!(
            "{} layer states for {} layers",
            state.layers.len(),
            layers.len()
        )));
    }
    for (i, (l, s)) in layers.iter().zip(&state.layers).enumerate() {
        if l.mixer.kind() != s.kind() {
            return Err(ModelError::StateMismatch(format!(
                "layer {i} is {:?}, state is {:?}",
                l.mixer.kind(),
                s.kind()
            )));
        }
        if let (Mixer::Attention(a), LayerState::Kv(c)) = (&l.mixer, s) {
            if c.kv_dim() != a.kv_dim() || c.len() != state.len {
                return Err(ModelError::StateMismatch(format!(
                    "layer {i}: cache of {} positions × {} for a state of {} positions × {}",
                    c.len(),
                    c.kv_dim(),
                    state.len,
                    a.kv_dim()
                )));
            }
        }
    }
    Ok(())
}

/// Where the layer loop copies the outputs of chosen layers: `out` is
/// `[row][tap][hidden]`, this pass's rows from row `start` on.
pub(crate) struct Taps<'a> {
    pub(crate) layers: &'a [usize],
    pub(crate) start: usize,
    pub(crate) out: &'a mut [f32],
}

/// The activation buffers of a pass (a state's [`Scratch`] but its positions, which the
/// [`Pass`] borrows).
pub(crate) struct Buffers<'a, B: Backend> {
    /// The residual stream: the embedded rows in, the last layer's outputs out.
    pub(crate) x: &'a mut B::Vec,
    pub(crate) normed: &'a mut B::Vec,
    pub(crate) delta: &'a mut B::Vec,
    /// What each part of a layer carves its intermediates from.
    pub(crate) work: &'a mut B::Vec,
    /// Rows a fused epilogue prepared for the next product.
    pub(crate) prepared: &'a mut B::Prepared,
}

/// The layer loop: the rows in `buf.x` (`n × hidden`, embedded) through every layer of
/// `layers` on `b` (numbered from `first_layer` for the trace), each layer's state advanced
/// or holding the pass's tree nodes. The one place where a decoder block is written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_layers<B: Backend, T: Trace>(
    b: &B,
    layers: &[Layer<B>],
    states: &mut [LayerState<B>],
    first_layer: usize,
    buf: &mut Buffers<B>,
    pass: &Pass,
    taps: Taps,
    tr: &mut T,
) {
    let n = pass.n;
    let Some(h) = layers.first().map(|l| l.attn_norm.dim()) else {
        return;
    };
    let x = buf.x.prefix(n * h);
    let normed = rows(buf.normed, n * h);
    let delta = rows(buf.delta, n * h);
    for (i, (layer, st)) in layers.iter().zip(states.iter_mut()).enumerate() {
        let l = first_layer + i;
        let op = |name| Op::new(name, Some(l), n);
        // Each norm writes its rows as f32, or prepared for the matrices that read them.
        let (into, prepared) = (layer.mixer.prepared_input(b), &mut *buf.prepared);
        tr.op(op("attn_norm"), || {
            layer.attn_norm.forward_for(b, x, normed, into, prepared)
        });
        layer
            .mixer
            .run(b, st, normed, pass, delta, buf.work, buf.prepared, l, tr);
        tr.op(op("residual"), || {
            b.activation(Activation::Add { x, d: delta })
        });
        let (into, prepared) = (layer.mlp.prepared_input(b), &mut *buf.prepared);
        tr.op(op("ffn_norm"), || {
            layer.ffn_norm.forward_for(b, x, normed, into, prepared)
        });
        layer
            .mlp
            .run(b, normed, n, delta, buf.work, buf.prepared, l, tr);
        tr.op(op("residual"), || {
            b.activation(Activation::Add { x, d: delta })
        });
        let stride = taps.layers.len() * h;
        for (k, _) in taps.layers.iter().enumerate().filter(|(_, &t)| t == l) {
            b.read(CopyRows {
                src: &*x,
                src_at: 0,
                src_stride: h,
                dst: &mut *taps.out,
                dst_at: taps.start * stride + k * h,
                dst_stride: stride,
                rows: n,
                width: h,
            });
        }
    }
}

/// Appends the logits of `m` final-normed rows through `head` to `logits` (on the host).
pub(crate) fn head_logits<B: Backend, T: Trace>(
    b: &B,
    head: &B::Weight,
    normed: &B::Buffer,
    m: usize,
    logits: &mut Vec<f32>,
    tr: &mut T,
) {
    let at = logits.len();
    logits.resize(at + m * head.rows(), 0.0);
    let op = Op::new("head", None, m)
        .matmul(head.format())
        .reading(head.size_bytes());
    tr.op(op, || {
        b.logits(Head {
            w: head,
            x: normed,
            n: m,
            y: &mut logits[at..],
        })
    });
}
