//! One sequence's DFlash drafter on the GPU: its context K/V (f16, the target's cache layout:
//! per layer keys then values, `[kv_head][slot][head_dim]`), the pass buffers, and the two
//! passes of `kasoku::model::dflash`'s math:
//!
//! - [`DFlashState::append`]: committed tokens' features (uploaded from the host) → `fc` →
//!   `hidden_norm` → per layer `k = rope(k_norm(W_k c), t)`, `v = W_v c` into the context
//!   slots after those already held (`qkv_post` with the rows' own positions);
//! - [`DFlashState::block`]: `[root, MASK × (B−1)]` embedded with the target's table, per layer
//!   q/k/v (`qkv_post` rotates at positions `pos … pos+B−1` and writes the block's K/V into
//!   the slots after the context), attention with every row seeing every context slot and
//!   every block slot (the attention kernel's virtual position of each row set to the last
//!   block slot: a chain over `context + B` slots, unmasked inside the block), `o`, SwiGLU
//!   MLP; then the drafter's norm of rows `1..=rows`, the target's head over its first
//!   `head_rows` ids, and per row the `top_k` best (id, logit) (`top_k_select`) and the
//!   softmax mass (`row_top2`), the only bytes that come back. The block's K/V slots are not
//!   kept (the context's length does not change).
//!
//! Plain launches, no captured graph (on the 1.5B shape a cycle's drafting costs more than a
//! 9-node verification; capturing it is the next step). Checked on an H100 (2026-12-06).

use std::sync::Arc;

use crate::kernels::{attention_chunks, Acts, AttnCall, PostArgs, QkvPost, TOP2_WORDS};
use crate::runtime::{DeviceBuffer, Error, Gpu, PinnedBuffer, Result};
use crate::CudaModel;

use super::weights::DFlashWeights;

/// Context rows one projection pass takes at most (more are split).
pub const APPEND_ROWS: usize = 256;

/// Candidates per block row the device selects at most.
pub const MAX_DRAFT_TOP_K: usize = 64;

/// Word offsets of the pass description in the meta buffer: the batch (4 words), then per
/// row its RoPE position, its virtual attention position, and the block's token ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftMeta {
    pub rope_pos: usize,
    pub seen: usize,
    pub tokens: usize,
    pub words: usize,
}

impl DraftMeta {
    /// For passes of up to `rows` rows.
    pub fn new(rows: usize) -> DraftMeta {
        let rope_pos = 4;
        let seen = rope_pos + rows;
        let tokens = seen + rows;
        DraftMeta {
            rope_pos,
            seen,
            tokens,
            words: tokens + rows,
        }
    }
}

/// Float activations in `buf`, rows `ld` apart, with no int8 blocks (the drafter's products
/// read float weights).
fn float_acts(buf: &DeviceBuffer, ld: usize) -> Acts {
    Acts {
        x: buf.ptr(),
        xq: 0,
        xs: 0,
        ld,
    }
}

/// The meta words of a block pass: the batch (`past` = context rows, `n` = the block, a
/// chain), RoPE positions `pos …`, every row's virtual position the block's last slot, and
/// the tokens `[root, mask, …]`.
pub fn block_meta(
    layout: &DraftMeta,
    context: usize,
    root: u32,
    mask: u32,
    pos: usize,
    block: usize,
) -> Vec<u32> {
    let mut w = vec![0u32; layout.words];
    w[..4].copy_from_slice(&[context as u32, block as u32, 1, 0]);
    for i in 0..block {
        w[layout.rope_pos + i] = (pos + i) as u32;
        w[layout.seen + i] = (context + block - 1) as u32;
        w[layout.tokens + i] = if i == 0 { root } else { mask };
    }
    w
}

/// The meta words of a context projection: the batch (`past` = rows held, `n` new rows) and
/// each new row's RoPE position.
pub fn append_meta(layout: &DraftMeta, context: usize, positions: &[usize]) -> Vec<u32> {
    let mut w = vec![0u32; layout.words];
    w[..4].copy_from_slice(&[context as u32, positions.len() as u32, 1, 0]);
    for (i, &p) in positions.iter().enumerate() {
        w[layout.rope_pos + i] = p as u32;
        w[layout.seen + i] = (context + i) as u32;
    }
    w
}

/// A block's candidates from the device's words: per row `k` (id, logit bits) pairs in no
/// order, then per row [`TOP2_WORDS`] words whose best logit and mass give the log-sum-exp.
/// Each row's list comes sorted as the host's `top_k_log_probs` sorts (logit descending,
/// ties to the smaller id), with log-probabilities.
pub fn candidates_from_words(words: &[u32], rows: usize, k: usize) -> Vec<Vec<(u32, f32)>> {
    let top2 = &words[rows * 2 * k..];
    (0..rows)
        .map(|r| {
            let t = &top2[r * TOP2_WORDS..(r + 1) * TOP2_WORDS];
            let lse = f32::from_bits(t[1]) + f32::from_bits(t[4]).ln();
            let mut row: Vec<(u32, f32)> = words[r * 2 * k..(r + 1) * 2 * k]
                .chunks_exact(2)
                .map(|p| (p[0], f32::from_bits(p[1])))
                .collect();
            row.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            row.into_iter().map(|(id, l)| (id, l - lse)).collect()
        })
        .collect()
}

/// A DFlash drafter's per-sequence memory on the GPU.
pub struct DFlashState {
    gpu: Arc<Gpu>,
    /// Each context row's position (row `i` in slot `i`).
    positions: Vec<usize>,
    max_len: usize,
    max_slots: usize,
    chunks: usize,
    head_rows: usize,
    layout: DraftMeta,
    kv: DeviceBuffer,
    feat: DeviceBuffer,
    feat_host: PinnedBuffer,
    x: DeviceBuffer,
    normed: DeviceBuffer,
    xq: DeviceBuffer,
    xs: DeviceBuffer,
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    att: DeviceBuffer,
    g: DeviceBuffer,
    u: DeviceBuffer,
    part_ml: DeviceBuffer,
    part_o: DeviceBuffer,
    arrivals: DeviceBuffer,
    logits: DeviceBuffer,
    meta: DeviceBuffer,
    meta_host: PinnedBuffer,
    top: DeviceBuffer,
    top_host: PinnedBuffer,
}

impl DFlashState {
    /// Memory for `max_len` context rows of drafter `w`, its head scoring ids `0..head_rows`
    /// of `target`'s head.
    pub fn new(
        target: &CudaModel,
        w: &DFlashWeights,
        max_len: usize,
        head_rows: usize,
    ) -> Result<DFlashState> {
        let c = &w.config;
        if head_rows < 2 || head_rows > target.config.vocab {
            return Err(Error::Invalid(format!(
                "a DFlash head of {head_rows} rows (2..={})",
                target.config.vocab
            )));
        }
        let gpu = target.gpu().clone();
        gpu.bind()?;
        let b = c.block_size;
        let rows = APPEND_ROWS.max(b);
        let max_slots = max_len + b;
        let chunks = attention_chunks(max_slots);
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let f = |n: usize| gpu.alloc(n * 4);
        let layout = DraftMeta::new(rows);
        let width = c.taps.len() * h;
        let top_words = (b - 1) * (2 * MAX_DRAFT_TOP_K + TOP2_WORDS);
        let st = DFlashState {
            positions: Vec::new(),
            max_len,
            max_slots,
            chunks,
            head_rows,
            layout,
            kv: gpu.alloc(c.n_layers * 2 * kvd * max_slots * 2)?,
            feat: f(APPEND_ROWS * width)?,
            feat_host: gpu.pinned(APPEND_ROWS * width * 4)?,
            x: f(rows * h)?,
            normed: f(rows * h)?,
            xq: gpu.alloc(b * h)?,
            xs: gpu.alloc(b * h / 32 * 16)?,
            q: {
                let q = f(rows * qd)?;
                q.fill(0)?;
                q
            },
            k: f(rows * kvd)?,
            v: f(rows * kvd)?,
            att: f(b * qd)?,
            g: f(b * c.intermediate)?,
            u: f(b * c.intermediate)?,
            part_ml: f(b * c.n_heads * chunks * 2)?,
            part_o: f(b * c.n_heads * chunks * hd)?,
            arrivals: {
                let a = f(b * c.n_heads)?;
                a.fill(0)?;
                a
            },
            logits: f((b - 1) * head_rows)?,
            meta: gpu.alloc(layout.words * 4)?,
            meta_host: gpu.pinned(layout.words * 4)?,
            top: gpu.alloc(top_words * 4)?,
            top_host: gpu.pinned(top_words * 4)?,
            gpu,
        };
        st.kv.fill(0)?;
        Ok(st)
    }

    /// Each context row's position.
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    /// Keeps the first `rows` context rows.
    pub fn truncate(&mut self, rows: usize) {
        self.positions.truncate(rows);
    }

    /// Token ids the head scores: `0..head_rows`.
    pub fn head_rows(&self) -> usize {
        self.head_rows
    }

    /// Layer `layer`'s key and value caches.
    fn caches(&self, w: &DFlashWeights, layer: usize) -> (u64, u64) {
        let c = &w.config;
        let layer_elems = c.n_kv_heads * c.head_dim * self.max_slots;
        (
            self.kv.at(2 * layer * layer_elems * 2),
            self.kv.at((2 * layer + 1) * layer_elems * 2),
        )
    }

    fn put_meta(&mut self, words: &[u32]) -> Result<()> {
        self.meta_host.put_u32s(0, words);
        self.meta
            .write_async(0, &self.meta_host, self.layout.words * 4)
    }

    /// The q/k/v epilogue of `n` rows of layer `li` (RoPE positions from the meta buffer;
    /// keys and values into the slots after the context).
    fn qkv_post(&self, t: &CudaModel, w: &DFlashWeights, li: usize, n: usize) -> Result<()> {
        let c = &w.config;
        let l = &w.layers[li];
        let (k_cache, v_cache) = self.caches(w, li);
        t.kernels.qkv_post(&QkvPost {
            q: self.q.ptr(),
            k: self.k.ptr(),
            v: self.v.ptr(),
            n,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            rot_dim: c.head_dim,
            interleaved: false,
            inv_freq: w.inv_freq.ptr(),
            q_norm: l.q_norm.ptr(),
            k_norm: l.k_norm.ptr(),
            eps: c.rms_eps,
            batch: self.meta.ptr(),
            pos: self.meta.at(self.layout.rope_pos * 4),
            k_cache,
            v_cache,
            max_slots: self.max_slots,
        })
    }

    /// Projects `positions.len()` committed tokens' features (`feature_width` values each)
    /// into context rows after those held.
    pub fn append(
        &mut self,
        t: &CudaModel,
        w: &DFlashWeights,
        features: &[f32],
        positions: &[usize],
    ) -> Result<()> {
        let c = &w.config;
        let width = c.taps.len() * c.hidden;
        if features.len() != positions.len() * width {
            return Err(Error::Invalid(format!(
                "DFlash: {} feature values for {} tokens of {width}",
                features.len(),
                positions.len()
            )));
        }
        if self.positions.len() + positions.len() > self.max_len {
            return Err(Error::Invalid(format!(
                "DFlash context full: {} + {} rows > {}",
                self.positions.len(),
                positions.len(),
                self.max_len
            )));
        }
        self.gpu.bind()?;
        for (feats, pos) in features
            .chunks(APPEND_ROWS * width)
            .zip(positions.chunks(APPEND_ROWS))
        {
            self.append_rows(t, w, feats, pos)?;
        }
        Ok(())
    }

    fn append_rows(
        &mut self,
        t: &CudaModel,
        w: &DFlashWeights,
        features: &[f32],
        positions: &[usize],
    ) -> Result<()> {
        let c = &w.config;
        let (n, h) = (positions.len(), c.hidden);
        let kvd = c.n_kv_heads * c.head_dim;
        let width = c.taps.len() * h;
        let bits: Vec<u32> = features.iter().map(|x| x.to_bits()).collect();
        self.feat_host.put_u32s(0, &bits);
        self.feat.write_async(0, &self.feat_host, bits.len() * 4)?;
        let words = append_meta(&self.layout, self.positions.len(), positions);
        self.put_meta(&words)?;
        let k = &t.kernels;
        k.matvec(
            &[w.fc.seg(self.x.ptr(), h, None, false)],
            float_acts(&self.feat, width),
            n,
            width,
        )?;
        k.rmsnorm(
            self.x.ptr(),
            w.hidden_norm.ptr(),
            c.rms_eps,
            h,
            n,
            float_acts(&self.normed, h),
        )?;
        for (li, l) in w.layers.iter().enumerate() {
            k.matvec(
                &[
                    l.k.seg(self.k.ptr(), kvd, None, false),
                    l.v.seg(self.v.ptr(), kvd, None, false),
                ],
                float_acts(&self.normed, h),
                n,
                h,
            )?;
            // The query heads of this call rotate the (zeroed) q scratch: unused.
            self.qkv_post(t, w, li, n)?;
        }
        self.gpu.synchronize()?;
        self.positions.extend_from_slice(positions);
        Ok(())
    }

    /// One block pass rooted at `root` (position `pos`): each of block rows `1..=rows`'s
    /// `top_k` best ids among `0..head_rows` with log-probabilities, most likely first.
    pub fn block(
        &mut self,
        t: &CudaModel,
        w: &DFlashWeights,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let c = &w.config;
        let b = c.block_size;
        if rows == 0 || rows >= b {
            return Err(Error::Invalid(format!(
                "DFlash: {rows} rows asked of a block of {b}"
            )));
        }
        if root as usize >= t.config.vocab {
            return Err(Error::Invalid(format!(
                "token {root} out of range (vocab {})",
                t.config.vocab
            )));
        }
        let top_k = top_k.clamp(1, MAX_DRAFT_TOP_K).min(self.head_rows - 1);
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd, ffn) = (c.n_heads * hd, c.n_kv_heads * hd, c.intermediate);
        let context = self.positions.len();
        self.gpu.bind()?;
        let words = block_meta(&self.layout, context, root, c.mask_token, pos, b);
        self.put_meta(&words)?;
        let k = &t.kernels;
        k.embed(
            t.embed_table(),
            self.meta.at(self.layout.tokens * 4),
            b,
            self.x.ptr(),
            0,
            0,
        )?;
        for (li, l) in w.layers.iter().enumerate() {
            k.rmsnorm(
                self.x.ptr(),
                l.input_norm.ptr(),
                c.rms_eps,
                h,
                b,
                float_acts(&self.normed, h),
            )?;
            k.matvec(
                &[
                    l.q.seg(self.q.ptr(), qd, None, false),
                    l.k.seg(self.k.ptr(), kvd, None, false),
                    l.v.seg(self.v.ptr(), kvd, None, false),
                ],
                float_acts(&self.normed, h),
                b,
                h,
            )?;
            self.qkv_post(t, w, li, b)?;
            let (k_cache, v_cache) = self.caches(w, li);
            let seen = self.meta.at(self.layout.seen * 4);
            k.attention(&AttnCall {
                q: self.q.ptr(),
                k_cache,
                v_cache,
                max_slots: self.max_slots,
                n: b,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                batch: self.meta.ptr(),
                pos: seen,
                path: seen,
                part_ml: self.part_ml.ptr(),
                part_o: self.part_o.ptr(),
                chunks: self.chunks,
                arrivals: self.arrivals.ptr(),
                out: self.att.ptr(),
                out_q: 0,
                out_s: 0,
                post: PostArgs::default(),
            })?;
            k.matvec(
                &[l.o.seg(self.x.ptr(), h, None, true)],
                float_acts(&self.att, qd),
                b,
                qd,
            )?;
            k.rmsnorm(
                self.x.ptr(),
                l.post_norm.ptr(),
                c.rms_eps,
                h,
                b,
                float_acts(&self.normed, h),
            )?;
            k.matvec(
                &[
                    l.gate.seg(self.g.ptr(), ffn, None, false),
                    l.up.seg(self.u.ptr(), ffn, None, false),
                ],
                float_acts(&self.normed, h),
                b,
                h,
            )?;
            k.swiglu(self.g.ptr(), self.u.ptr(), b * ffn, Acts::default())?;
            k.matvec(
                &[l.down.seg(self.x.ptr(), h, None, true)],
                float_acts(&self.g, ffn),
                b,
                ffn,
            )?;
        }
        // The drafter's norm of rows 1..=rows, with int8 blocks for a quantized head.
        let head_in = Acts {
            x: self.normed.ptr(),
            xq: self.xq.ptr(),
            xs: self.xs.ptr(),
            ld: h,
        };
        k.rmsnorm(self.x.at(h * 4), w.norm.ptr(), c.rms_eps, h, rows, head_in)?;
        let mut seg = t.head().seg(self.logits.ptr(), self.head_rows, None, false);
        seg.rows = self.head_rows as i32;
        k.matvec(&[seg], head_in, rows, h)?;
        for r in 0..rows {
            k.top_k_select(
                self.logits.at(r * self.head_rows * 4),
                self.head_rows,
                top_k,
                0,
                0,
                self.top.at(r * 2 * top_k * 4),
                0,
            )?;
        }
        k.row_top2(
            self.logits.ptr(),
            self.head_rows,
            self.head_rows,
            rows,
            self.top.at(rows * 2 * top_k * 4),
        )?;
        let n_words = rows * (2 * top_k + TOP2_WORDS);
        self.top.read_async(0, &self.top_host, n_words * 4)?;
        self.gpu.synchronize()?;
        let words = self.top_host.get_u32s(0, n_words);
        Ok(candidates_from_words(&words, rows, top_k))
    }
}
