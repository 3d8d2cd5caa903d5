//! One sequence's DFlash drafter on the GPU: its context K/V (f16, the target's cache layout:
//! per layer keys then values, `[kv_head][slot][head_dim]`), the pass buffers, and the two
//! passes of `kasoku::model::dflash`'s math:
//!
//! - projection ([`DFlashState::append`] from host features, [`DFlashState::append_device`]
//!   from the rows the target recorded on this GPU, gathered in place by `gather_rows`):
//!   committed tokens' features → `fc` → `hidden_norm` → per layer `k = rope(k_norm(W_k c),
//!   t)`, `v = W_v c` into the context slots after those already held (`qkv_post` with the
//!   rows' own positions);
//! - [`DFlashState::block`]: `[root, MASK × (B−1)]` embedded with the target's table, per layer
//!   q/k/v (`qkv_post` rotates at positions `pos … pos+B−1` and writes the block's K/V into
//!   the slots after the context), attention with every row seeing every context slot and
//!   every block slot (the attention kernel's virtual position of each row set to the last
//!   block slot: a chain over `context + B` slots, unmasked inside the block), `o`, SwiGLU
//!   MLP; then the drafter's norm of rows `1..=rows`, the target's head over its first
//!   `head_rows` ids, every row's `top_k` best (id, logit) in one launch (`rows_top_k`) and
//!   the rows' softmax mass (`row_top2`), the only bytes that come back. The block's K/V
//!   slots are not kept (the context's length does not change).
//!
//! Both passes are captured as CUDA graphs (a block per (rows, top-k), a projection of device
//! rows per (rows, source)) and replayed: what changes from cycle to cycle (the context's
//! length, the positions, the root, the gathered rows) is in the meta buffer, copied from
//! pinned memory by the graph's first node. The block pass and the projection have a region
//! of the meta buffer each; a projection is queued without a synchronisation (the block pass
//! after it synchronises once), and a pass waits only before it overwrites pinned memory a
//! queued copy of its own kind may still read.
//!
//! A speculative cycle on the 1.5B shape (2 layers, block 16, 15 rows, top-8, a 3-node path):
//!
//! | | host stream operations | synchronisations |
//! |---|--:|--:|
//! | before: taps to the host (1–3 runs + 1 copy), upload + projection, block | 2–4 + 8 + 39 | 3 |
//! | now: projection graph, block graph | 2 (8 + 25 nodes) | 1 |
//!
//! (the target's own verification, 1 graph launch and 1 synchronisation, and commit aside).
//! [`DFlashState::counts`] counts them; `kasoku-cuda-check dflash` prints them per cycle.

use std::collections::HashMap;
use std::sync::Arc;

use crate::kernels::{attention_chunks, Acts, AttnCall, PostArgs, QkvPost, TOP2_WORDS};
use crate::model::TapView;
use crate::runtime::{DeviceBuffer, Error, Gpu, Graph, PinnedBuffer, Result};
use crate::CudaModel;

use super::weights::DFlashWeights;

/// Context rows one projection pass takes at most (more are split).
pub const APPEND_ROWS: usize = 256;

/// Candidates per block row the device selects at most.
pub const MAX_DRAFT_TOP_K: usize = 64;

/// Rows of device features a projection captures as a graph at most (an accepted path; a
/// prompt's longer projections run as plain launches).
pub const GRAPH_APPEND_ROWS: usize = 64;

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

/// The meta words of a projection of device rows: [`append_meta`], with the rows of the
/// target's recorded layer outputs to gather in the token slots.
pub fn gather_meta(
    layout: &DraftMeta,
    context: usize,
    positions: &[usize],
    src_rows: &[usize],
) -> Vec<u32> {
    let mut w = append_meta(layout, context, positions);
    for (i, &r) in src_rows.iter().enumerate() {
        w[layout.tokens + i] = r as u32;
    }
    w
}

/// Which part of the meta buffer (and of its pinned copy) a pass describes itself in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// The block pass's words.
    Block,
    /// A projection's words.
    Project,
}

/// How a recorded layer-output row is gathered: where the target's rows are and their
/// stride in floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Source {
    ptr: u64,
    ld: usize,
}

/// Work the host queued for a drafter's passes: stream operations (kernel launches, copies,
/// graph launches: what the host pays per call) and synchronisations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    pub ops: u64,
    pub syncs: u64,
    /// Passes run as a graph replay, and graphs captured.
    pub replays: u64,
    pub captures: u64,
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

/// A DFlash drafter's per-sequence memory on the GPU. Its passes must always be given the
/// same target and weights (the captured graphs hold their addresses).
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
    /// Two regions of `layout.words` words: the block pass's, then a projection's.
    meta: DeviceBuffer,
    /// The regions' pinned sources, by [`Region`].
    meta_host: [PinnedBuffer; 2],
    top: DeviceBuffer,
    top_host: PinnedBuffer,
    /// Block passes captured, by (rows, top-k).
    block_graphs: HashMap<(usize, usize), Graph>,
    /// Projections of device rows captured, by (rows, source).
    project_graphs: HashMap<(usize, Source), Graph>,
    /// Whether passes are captured and replayed as graphs (on by default; off: the same
    /// kernels launched one by one, for comparisons).
    pub use_graphs: bool,
    /// Copies from the projection's pinned memory (its meta region, `feat_host`) or the
    /// block pass's (its meta region, `top_host`) queued since the last synchronisation.
    project_queued: bool,
    block_queued: bool,
    counts: PassCounts,
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
            meta: gpu.alloc(2 * layout.words * 4)?,
            meta_host: [gpu.pinned(layout.words * 4)?, gpu.pinned(layout.words * 4)?],
            top: gpu.alloc(top_words * 4)?,
            top_host: gpu.pinned(top_words * 4)?,
            block_graphs: HashMap::new(),
            project_graphs: HashMap::new(),
            use_graphs: true,
            project_queued: false,
            block_queued: false,
            counts: PassCounts::default(),
            gpu,
        };
        st.kv.fill(0)?;
        st.gpu.synchronize()?;
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

    /// The work queued so far.
    pub fn counts(&self) -> PassCounts {
        self.counts
    }

    /// Drops the captured graphs (the next passes capture them again).
    pub fn drop_graphs(&mut self) {
        self.block_graphs.clear();
        self.project_graphs.clear();
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

    /// Byte offset of word `word` of `region` in the meta buffers.
    fn meta_offset(&self, region: Region, word: usize) -> usize {
        let base = match region {
            Region::Block => 0,
            Region::Project => self.layout.words,
        };
        (base + word) * 4
    }

    fn meta_at(&self, region: Region, word: usize) -> u64 {
        self.meta.at(self.meta_offset(region, word))
    }

    /// Waits for the stream when a queued copy may still read the pinned memory a pass of
    /// `region` is about to overwrite.
    fn settle(&mut self, region: Region) -> Result<()> {
        let queued = match region {
            Region::Block => self.block_queued,
            Region::Project => self.project_queued,
        };
        if queued {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.gpu.synchronize()?;
        self.counts.syncs += 1;
        self.project_queued = false;
        self.block_queued = false;
        Ok(())
    }

    /// Writes `words` into `region`'s pinned meta (no copy of it may be queued).
    fn put_meta(&mut self, region: Region, words: &[u32]) {
        self.meta_host[region as usize].put_u32s(0, words);
    }

    /// Queues the copy of `region`'s pinned meta to its part of the device's.
    fn copy_meta(&self, region: Region) -> Result<()> {
        self.meta.write_async(
            self.meta_offset(region, 0),
            &self.meta_host[region as usize],
            self.layout.words * 4,
        )
    }

    /// The q/k/v epilogue of `n` rows of layer `li` (RoPE positions from `region`'s meta;
    /// keys and values into the slots after the context).
    fn qkv_post(
        &self,
        t: &CudaModel,
        w: &DFlashWeights,
        li: usize,
        n: usize,
        region: Region,
    ) -> Result<()> {
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
            batch: self.meta_at(region, 0),
            pos: self.meta_at(region, self.layout.rope_pos),
            k_cache,
            v_cache,
            max_slots: self.max_slots,
        })
    }

    /// Checks that `n` more context rows fit.
    fn check_room(&self, n: usize) -> Result<()> {
        if self.positions.len() + n > self.max_len {
            return Err(Error::Invalid(format!(
                "DFlash context full: {} + {n} rows > {}",
                self.positions.len(),
                self.max_len
            )));
        }
        Ok(())
    }

    /// Projects `positions.len()` committed tokens' features (`feature_width` values each,
    /// from the host) into context rows after those held. Queued: the next block pass's
    /// synchronisation covers it.
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
        self.check_room(positions.len())?;
        self.gpu.bind()?;
        for (feats, pos) in features
            .chunks(APPEND_ROWS * width)
            .zip(positions.chunks(APPEND_ROWS))
        {
            self.settle(Region::Project)?;
            let bits: Vec<u32> = feats.iter().map(|x| x.to_bits()).collect();
            self.feat_host.put_u32s(0, &bits);
            let words = append_meta(&self.layout, self.positions.len(), pos);
            self.put_meta(Region::Project, &words);
            self.project_queued = true;
            self.feat.write_async(0, &self.feat_host, bits.len() * 4)?;
            self.copy_meta(Region::Project)?;
            let ops = self.record_project(t, w, pos.len())?;
            self.counts.ops += 2 + ops;
            self.positions.extend_from_slice(pos);
        }
        Ok(())
    }

    /// Whether [`DFlashState::append_device`] reads `view`'s rows: the target's state on
    /// this GPU, recording drafter `w`'s taps first in each row.
    pub fn reads(&self, w: &DFlashWeights, view: &TapView) -> bool {
        let taps = &w.config.taps;
        Arc::ptr_eq(&view.gpu, &self.gpu)
            && view.hidden == w.config.hidden
            && view.layers.len() >= taps.len()
            && view.layers[..taps.len()] == taps[..]
    }

    /// Projects the features of tokens at `positions` into context rows after those held:
    /// rows `rows` of the target's last pass as `view` recorded them, gathered on the device
    /// (nothing crosses to the host). Queued as [`DFlashState::append`]; captured as a graph
    /// per (rows, source) up to [`GRAPH_APPEND_ROWS`] rows.
    pub fn append_device(
        &mut self,
        t: &CudaModel,
        w: &DFlashWeights,
        view: &TapView,
        rows: &[usize],
        positions: &[usize],
    ) -> Result<()> {
        if !self.reads(w, view) {
            return Err(Error::Invalid(format!(
                "DFlash: recorded layers {:?} of width {} on another GPU or not the drafter's {:?}",
                view.layers, view.hidden, w.config.taps
            )));
        }
        if rows.len() != positions.len() {
            return Err(Error::Invalid(format!(
                "DFlash: {} recorded rows for {} tokens",
                rows.len(),
                positions.len()
            )));
        }
        if let Some(r) = rows.iter().find(|&&r| r >= view.rows) {
            return Err(Error::Invalid(format!(
                "DFlash: recorded row {r} of a pass of {} rows",
                view.rows
            )));
        }
        self.check_room(positions.len())?;
        let src = Source {
            ptr: view.ptr,
            ld: view.layers.len() * view.hidden,
        };
        self.gpu.bind()?;
        for (rs, pos) in rows.chunks(APPEND_ROWS).zip(positions.chunks(APPEND_ROWS)) {
            self.settle(Region::Project)?;
            let words = gather_meta(&self.layout, self.positions.len(), pos, rs);
            self.put_meta(Region::Project, &words);
            self.project_queued = true;
            let n = rs.len();
            if self.use_graphs && n <= GRAPH_APPEND_ROWS {
                if !self.project_graphs.contains_key(&(n, src)) {
                    let g = capture(&self.gpu, || {
                        self.copy_meta(Region::Project)?;
                        self.record_gathered(t, w, n, src).map(|_| ())
                    })?;
                    self.counts.captures += 1;
                    self.project_graphs.insert((n, src), g);
                }
                self.project_graphs[&(n, src)].launch()?;
                self.counts.ops += 1;
                self.counts.replays += 1;
            } else {
                self.copy_meta(Region::Project)?;
                let ops = self.record_gathered(t, w, n, src)?;
                self.counts.ops += 1 + ops;
            }
            self.positions.extend_from_slice(pos);
        }
        Ok(())
    }

    /// Queues the gather of `n` recorded rows (indices in the projection's meta) into the
    /// features and their projection. Returns the operations queued.
    fn record_gathered(
        &self,
        t: &CudaModel,
        w: &DFlashWeights,
        n: usize,
        src: Source,
    ) -> Result<u64> {
        let width = w.config.taps.len() * w.config.hidden;
        t.kernels.gather_rows(
            src.ptr,
            src.ld,
            self.meta_at(Region::Project, self.layout.tokens),
            n,
            width,
            self.feat.ptr(),
        )?;
        Ok(1 + self.record_project(t, w, n)?)
    }

    /// Queues the projection of the `n` feature rows in `feat` (positions and the context's
    /// length in the projection's meta) into the context slots. Returns the operations
    /// queued.
    fn record_project(&self, t: &CudaModel, w: &DFlashWeights, n: usize) -> Result<u64> {
        let c = &w.config;
        let h = c.hidden;
        let kvd = c.n_kv_heads * c.head_dim;
        let width = c.taps.len() * h;
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
            // The query heads of this call rotate the q scratch: unused.
            self.qkv_post(t, w, li, n, Region::Project)?;
        }
        Ok(2 + 2 * w.layers.len() as u64)
    }

    /// One block pass rooted at `root` (position `pos`): each of block rows `1..=rows`'s
    /// `top_k` best ids among `0..head_rows` with log-probabilities, most likely first. One
    /// graph launch (captured per (rows, top_k)) and one synchronisation, which also covers
    /// the projections queued before it.
    pub fn block(
        &mut self,
        t: &CudaModel,
        w: &DFlashWeights,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let words = self.block_words(t, w, root, pos, rows, top_k)?;
        let top_k = self.top_k(top_k);
        Ok(candidates_from_words(&words, rows, top_k))
    }

    /// The candidates' count [`DFlashState::block`] selects for `top_k` asked.
    fn top_k(&self, top_k: usize) -> usize {
        top_k.clamp(1, MAX_DRAFT_TOP_K).min(self.head_rows - 1)
    }

    /// [`DFlashState::block`]'s words as the device left them (per row its (id, logit)
    /// pairs in no order, then per row [`TOP2_WORDS`]), for comparisons.
    pub fn block_words(
        &mut self,
        t: &CudaModel,
        w: &DFlashWeights,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<u32>> {
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
        let top_k = self.top_k(top_k);
        let context = self.positions.len();
        self.gpu.bind()?;
        self.settle(Region::Block)?;
        let words = block_meta(&self.layout, context, root, c.mask_token, pos, b);
        self.put_meta(Region::Block, &words);
        self.block_queued = true;
        if self.use_graphs {
            if !self.block_graphs.contains_key(&(rows, top_k)) {
                let g = capture(&self.gpu, || {
                    self.record_block(t, w, rows, top_k).map(|_| ())
                })?;
                self.counts.captures += 1;
                self.block_graphs.insert((rows, top_k), g);
            }
            self.block_graphs[&(rows, top_k)].launch()?;
            self.counts.ops += 1;
            self.counts.replays += 1;
        } else {
            let ops = self.record_block(t, w, rows, top_k)?;
            self.counts.ops += ops;
        }
        self.sync()?;
        let n_words = rows * (2 * top_k + TOP2_WORDS);
        Ok(self.top_host.get_u32s(0, n_words))
    }

    /// Queues a block pass of `rows` scored rows and `top_k` candidates each, from the meta
    /// copy to the candidates' copy to pinned memory. Returns the operations queued.
    fn record_block(
        &self,
        t: &CudaModel,
        w: &DFlashWeights,
        rows: usize,
        top_k: usize,
    ) -> Result<u64> {
        let c = &w.config;
        let b = c.block_size;
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd, ffn) = (c.n_heads * hd, c.n_kv_heads * hd, c.intermediate);
        let k = &t.kernels;
        let batch = self.meta_at(Region::Block, 0);
        self.copy_meta(Region::Block)?;
        k.embed(
            t.embed_table(),
            self.meta_at(Region::Block, self.layout.tokens),
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
            self.qkv_post(t, w, li, b, Region::Block)?;
            let (k_cache, v_cache) = self.caches(w, li);
            let seen = self.meta_at(Region::Block, self.layout.seen);
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
                batch,
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
        // Every row's top-k in one grid, then every row's best logit and mass.
        k.rows_top_k(
            self.logits.ptr(),
            self.head_rows,
            self.head_rows,
            rows,
            top_k,
            self.top.ptr(),
        )?;
        k.row_top2(
            self.logits.ptr(),
            self.head_rows,
            self.head_rows,
            rows,
            self.top.at(rows * 2 * top_k * 4),
        )?;
        let n_words = rows * (2 * top_k + TOP2_WORDS);
        self.top.read_async(0, &self.top_host, n_words * 4)?;
        Ok(7 + 9 * w.layers.len() as u64)
    }
}

impl Drop for DFlashState {
    fn drop(&mut self) {
        // Queued copies read pinned memory freed with the state.
        if self.project_queued || self.block_queued {
            let _ = self.gpu.synchronize();
        }
    }
}

/// Captures `record` as a graph on `gpu`'s stream, without dependent launch if the driver
/// cannot capture it (as the target's passes do).
fn capture(gpu: &Arc<Gpu>, record: impl Fn() -> Result<()>) -> Result<Graph> {
    match Graph::capture(gpu, &record) {
        Ok(g) => Ok(g),
        Err(e) if gpu.dependent_launch() => {
            eprintln!("note: capturing without dependent launch ({e})");
            gpu.set_dependent_launch(false);
            Graph::capture(gpu, record)
        }
        Err(e) => Err(e),
    }
}
