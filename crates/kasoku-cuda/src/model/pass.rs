//! One forward pass on the GPU: [`CudaState::record`] queues a pass's kernels (embedding,
//! every layer's products, norms, attention or Gated DeltaNet, the MLP, the head and its
//! argmax) for `n` rows described on the device, and [`CudaState::pass`] runs it, captured as
//! a graph per row count where it can be, with one synchronisation.

use super::*;

impl CudaState {
    /// One of a layer's products in [`CudaState::record`]: on the prefill GEMM for passes of
    /// [`CudaState::gemm_rows`] or more, else matvec (which prefetches `next` into L2 as it
    /// runs).
    pub(super) fn product(
        &self,
        m: &CudaModel,
        segs: &[MatSeg],
        x: Acts,
        n: usize,
        cols: usize,
        next: &[&DeviceMatrix],
    ) -> Result<()> {
        match &self.gemm_bufs {
            Some(b) if self.uses_gemm(n) => m.kernels.gemm(segs, x, n, cols, &b.scratch()),
            _ => m.kernels.matvec_prefetch(segs, x, n, cols, next),
        }
    }

    /// Queues one pass over the rows described in `meta` (n rows, copied from pinned memory
    /// first), ending with the ids of `head`'s rows copied to pinned memory.
    pub(super) fn record(&self, m: &CudaModel, n: usize, head: Head) -> Result<()> {
        let k = &m.kernels;
        let c = &m.config;
        let (h, hd) = (c.hidden, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
        let word = |w: usize| self.meta.at(w * 4);
        self.meta
            .write_async(0, &self.meta_host, self.layout.words * 4)?;
        // The embedding also zeroes the head's argmax keys.
        k.embed(
            &m.embed,
            word(self.layout.tokens),
            n,
            self.x.ptr(),
            self.best.ptr(),
            MAX_TREE,
        )?;
        let layer_elems = kv_dim * self.max_slots;
        let opt = |b: &Option<DeviceBuffer>| b.as_ref().map(|b| b.ptr());
        // Activations as the next product reads them: f32 and int8 blocks, one row stride.
        let acts = |x: &DeviceBuffer, ld: usize| Acts {
            x: x.ptr(),
            xq: self.xq.ptr(),
            xs: self.xs.ptr(),
            ld,
        };
        let fused_merge = hd.is_multiple_of(32);
        // SwiGLU inside the gate|up product (not with tensor-core products, not while
        // measuring kernel classes apart, not on the prefill GEMM).
        let fuse_glu = self.fuse_glu && !k.uses_mma() && self.skip == 0 && !self.uses_gemm(n);
        let skip = |what: u32| self.skip & what != 0;
        // The weights the next product reads, prefetched by the one before it.
        let prefetch = self.prefetch;
        fn next<'a>(on: bool, ms: &[&'a DeviceMatrix]) -> Vec<&'a DeviceMatrix> {
            if on {
                ms.to_vec()
            } else {
                Vec::new()
            }
        }
        // RMSNorm inside the residual products before it (few rows: the product's last block
        // normalizes them all), not while measuring kernel classes apart.
        let fuse_norm = self.fuse_norm
            && !k.uses_mma()
            && self.skip == 0
            && n <= NORM_FUSE_ROWS
            && h <= crate::kernels::NORM_MAX_DIM;
        let norm_tail = |w: &DeviceBuffer| NormTail {
            count: self.norm_count.ptr(),
            w: w.ptr(),
            eps: c.rms_eps,
            out: acts(&self.normed, h),
        };
        // Whether `normed` already holds the norm the next product reads.
        let mut normed_ready = false;
        for (li, l) in m.layers.iter().enumerate() {
            let normed = acts(&self.normed, h);
            if !normed_ready && !skip(Skip::ELEMENTWISE) {
                k.rmsnorm(self.x.ptr(), l.attn_norm.ptr(), c.rms_eps, h, n, normed)?;
            }
            match &l.mixer {
                Mixer::DeltaNet(d, gi) => {
                    let tail = fuse_norm.then(|| norm_tail(&l.ffn_norm));
                    let normed_by_tail = self.record_delta_net(m, d, *gi, normed, n, tail)?;
                    if !normed_by_tail && !skip(Skip::ELEMENTWISE) {
                        k.rmsnorm(self.x.ptr(), l.ffn_norm.ptr(), c.rms_eps, h, n, normed)?;
                    }
                }
                Mixer::Attention(a) => {
                    if !skip(Skip::PRODUCTS) {
                        self.product(
                            m,
                            &[
                                a.wq.seg(self.q.ptr(), q_dim, opt(&a.bq), false),
                                a.wk.seg(self.k.ptr(), kv_dim, opt(&a.bk), false),
                                a.wv.seg(self.v.ptr(), kv_dim, opt(&a.bv), false),
                            ],
                            normed,
                            n,
                            h,
                            &next(prefetch, &[&a.wo]),
                        )?;
                    }
                    // Qwen3.5's output gate: its own product (the q|k|v call takes three matrices).
                    let gate_out = match (&a.wg, &self.attn_gate) {
                        (Some(wg), Some(buf)) => {
                            if !skip(Skip::PRODUCTS) {
                                self.product(
                                    m,
                                    &[wg.seg(buf.ptr(), q_dim, None, false)],
                                    normed,
                                    n,
                                    h,
                                    &[],
                                )?;
                            }
                            Some(buf.ptr())
                        }
                        _ => None,
                    };
                    // Attention writes its int8 blocks itself unless a gate comes after it.
                    let merge_quant = fused_merge && gate_out.is_none();
                    let k_cache = self.kv.at(a.cache * 2 * layer_elems * 2);
                    let v_cache = self.kv.at((a.cache * 2 + 1) * layer_elems * 2);
                    let att = acts(&self.att, q_dim);
                    let post = QkvPost {
                        q: self.q.ptr(),
                        k: self.k.ptr(),
                        v: self.v.ptr(),
                        n,
                        n_heads: c.n_heads,
                        n_kv_heads: c.n_kv_heads,
                        head_dim: hd,
                        rot_dim: c.rope_dim,
                        interleaved: c.rope_layout
                            == kasoku::kernels::rope::RopeLayout::Interleaved,
                        inv_freq: m.inv_freq.ptr(),
                        q_norm: opt(&a.q_norm).unwrap_or(0),
                        k_norm: opt(&a.k_norm).unwrap_or(0),
                        eps: c.rms_eps,
                        batch: self.meta.ptr(),
                        pos: word(self.layout.pos),
                        k_cache,
                        v_cache,
                        max_slots: self.max_slots,
                    };
                    // A one-row pass rotates q and writes the new key inside attention.
                    let fused = n == 1 && self.fuse_post && !skip(Skip::QKV_EPILOGUE);
                    if !fused && !skip(Skip::ATTENTION | Skip::QKV_EPILOGUE) {
                        k.qkv_post(&post)?;
                    }
                    if !skip(Skip::ATTENTION) {
                        let call = AttnCall {
                            q: self.q.ptr(),
                            k_cache,
                            v_cache,
                            max_slots: self.max_slots,
                            n,
                            n_heads: c.n_heads,
                            n_kv_heads: c.n_kv_heads,
                            head_dim: hd,
                            scale: 1.0 / (hd as f32).sqrt(),
                            batch: self.meta.ptr(),
                            pos: word(self.layout.pos),
                            path: word(self.layout.path),
                            part_ml: self.part_ml.ptr(),
                            part_o: self.part_o.ptr(),
                            chunks: self.chunks,
                            arrivals: self.arrivals.ptr(),
                            out: self.att.ptr(),
                            out_q: if merge_quant { att.xq } else { 0 },
                            out_s: if merge_quant { att.xs } else { 0 },
                            post: if fused {
                                PostArgs::fused(&post)
                            } else {
                                PostArgs::default()
                            },
                        };
                        // Passes longer than any tree are chains: a prompt's prefill.
                        if k.uses_prefill_attention(n, hd, MAX_TREE) {
                            k.attention_prefill(&call)?;
                        } else {
                            k.attention(&call)?;
                        }
                        match gate_out {
                            Some(gate) => k.sigmoid_gate(self.att.ptr(), gate, n * q_dim, att)?,
                            None if !fused_merge => k.quantize(att, n * q_dim)?,
                            None => {}
                        }
                    }
                    let wo = a.wo.seg(self.x.ptr(), h, None, true);
                    if fuse_norm {
                        k.matvec_norm(wo, att, n, q_dim, norm_tail(&l.ffn_norm))?;
                    } else {
                        if !skip(Skip::PRODUCTS) {
                            self.product(
                                m,
                                &[wo],
                                att,
                                n,
                                q_dim,
                                &next(prefetch, &[&l.gate, &l.up]),
                            )?;
                        }
                        if !skip(Skip::ELEMENTWISE) {
                            k.rmsnorm(self.x.ptr(), l.ffn_norm.ptr(), c.rms_eps, h, n, normed)?;
                        }
                    }
                }
            }
            // The down product's input: with SwiGLU fused, its int8 blocks in their own buffers.
            let g = if fuse_glu {
                Acts {
                    x: self.g.ptr(),
                    xq: self.glu_xq.ptr(),
                    xs: self.glu_xs.ptr(),
                    ld: c.ffn,
                }
            } else {
                acts(&self.g, c.ffn)
            };
            let (gate, up) = (
                l.gate.seg(self.g.ptr(), c.ffn, None, false),
                l.up.seg(self.u.ptr(), c.ffn, None, false),
            );
            if fuse_glu {
                k.matvec_swiglu(
                    gate,
                    up,
                    normed,
                    n,
                    h,
                    GluTail {
                        counts: self.glu_count.ptr(),
                        out: g,
                    },
                )?;
            } else {
                if !skip(Skip::PRODUCTS) {
                    self.product(m, &[gate, up], normed, n, h, &next(prefetch, &[&l.down]))?;
                }
                if !skip(Skip::ELEMENTWISE) {
                    k.swiglu(self.g.ptr(), self.u.ptr(), n * c.ffn, g)?;
                }
            }
            let down = l.down.seg(self.x.ptr(), h, None, true);
            // The next norm: the next layer's, or the output norm (every row's, so only when
            // the head reads every row, or there is one).
            let next_norm = match m.layers.get(li + 1) {
                Some(nl) => Some(&nl.attn_norm),
                None if head == Head::All || n == 1 => Some(&m.output_norm),
                None => None,
            };
            match next_norm {
                Some(w) if fuse_norm => {
                    k.matvec_norm(down, g, n, c.ffn, norm_tail(w))?;
                    normed_ready = true;
                }
                _ => {
                    if !skip(Skip::PRODUCTS) {
                        let after: Vec<&DeviceMatrix> = match m.layers.get(li + 1) {
                            Some(nl) => next(prefetch, &nl.first_matrices()),
                            None => Vec::new(),
                        };
                        self.product(m, &[down], g, n, c.ffn, &after)?;
                    }
                    normed_ready = false;
                }
            }
            self.record_taps(li, n, h)?;
        }
        let (first, rows) = match head {
            Head::All => (0, n),
            Head::Last => (n - 1, 1),
        };
        let normed = acts(&self.normed, h);
        if skip(Skip::HEAD) {
            return self.best.read_async(0, &self.best_host, rows * 8);
        }
        // After a fused output norm, `normed` holds every row (first = 0 or n = 1).
        if !normed_ready {
            k.rmsnorm(
                self.x.at(first * h * 4),
                m.output_norm.ptr(),
                c.rms_eps,
                h,
                rows,
                normed,
            )?;
        }
        // The head's products also leave each row's argmax (as an ordered key) in `best`
        // (zeroed by the embedding).
        let mut seg = m.head().seg(self.logits.ptr(), c.vocab, None, false);
        seg.rows = self.head_rows as i32;
        seg.best = self.best.ptr();
        k.matvec(&[seg], normed, rows, h)?;
        self.best.read_async(0, &self.best_host, rows * 8)
    }

    /// Runs a pass of `tokens` (chain from `self.len`, or `tree`), returning the ids of the
    /// head's rows. Graph-captured when `n ≤ MAX_TREE` and graphs are on.
    pub(super) fn pass(
        &mut self,
        m: &CudaModel,
        tokens: &[u32],
        tree: Option<&TokenTree>,
        head: Head,
    ) -> Result<Vec<u32>> {
        let n = tokens.len();
        if n == 0 || n > self.rows {
            return Err(Error::Invalid(format!(
                "a pass of {n} rows (1..={})",
                self.rows
            )));
        }
        m.gpu().bind()?;
        self.start_if_empty()?;
        let layout = self.layout;
        let mut words = vec![0u32; layout.words];
        fill_meta(&layout, self.len, tokens, tree, &mut words);
        self.meta_host.put_u32s(0, &words);
        if self.use_graphs && n <= MAX_TREE {
            if !self.graphs.contains_key(&(n, head)) {
                let gpu = self.gpu.clone();
                let g = match Graph::capture(&gpu, || self.record(m, n, head)) {
                    Ok(g) => g,
                    // A driver that cannot capture dependent launches: capture plain ones.
                    Err(e) if gpu.dependent_launch() => {
                        eprintln!("note: capturing without dependent launch ({e})");
                        gpu.set_dependent_launch(false);
                        Graph::capture(&gpu, || self.record(m, n, head))?
                    }
                    Err(e) => return Err(e),
                };
                self.graphs.insert((n, head), g);
            }
            self.graphs[&(n, head)].launch()?;
        } else {
            self.record(m, n, head)?;
        }
        self.gpu.synchronize()?;
        self.last_rows = n;
        if let Some(t) = &mut self.taps {
            t.view.rows = n;
        }
        let rows = if head == Head::All { n } else { 1 };
        let keys = self.best_host.get_u32s(0, 2 * rows);
        Ok((0..rows).map(|r| argmax_id(keys[2 * r] as u64)).collect())
    }
}
