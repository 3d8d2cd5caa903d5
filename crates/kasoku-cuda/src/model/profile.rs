//! Timings of a model's parts on their own, for finding where a pass's time goes
//! (`kasoku-cuda-check` uses them): one decode step's kernels one by one, the attention kernel
//! by context length, and the prefill GEMM's products by tile shape.

use super::*;

impl CudaModel {
    /// Times each kernel of one decode step of layer 0 (and the head) on its own, `reps`
    /// launches each: (what, microseconds per launch, weight bytes it reads). For finding
    /// where a step's time goes; the state must hold at least one position.
    pub fn profile_step(
        &self,
        st: &mut CudaState,
        reps: usize,
    ) -> Result<Vec<(String, f64, usize)>> {
        let k = &self.kernels;
        let c = &self.config;
        let (h, hd) = (c.hidden, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
        // The first attention layer (Qwen3.5's first layers are Gated DeltaNet ones).
        let (l, a) = self
            .layers
            .iter()
            .find_map(|l| l.attention().map(|a| (l, a)))
            .ok_or_else(|| Error::Invalid("profile_step: no attention layer".into()))?;
        let (post, call) = self.profile_attention_args(st, 1)?;
        let timer = crate::runtime::Timer::new(self.gpu())?;
        let mut out = Vec::new();
        let mut time = |what: &str, bytes: usize, f: &dyn Fn() -> Result<()>| -> Result<()> {
            f()?;
            timer.start()?;
            for _ in 0..reps {
                f()?;
            }
            let us = timer.stop_ms()? as f64 * 1e3 / reps as f64;
            out.push((what.to_string(), us, bytes));
            Ok(())
        };
        let acts = |x: &DeviceBuffer, ld: usize| Acts {
            x: x.ptr(),
            xq: st.xq.ptr(),
            xs: st.xs.ptr(),
            ld,
        };
        let normed = acts(&st.normed, h);
        time("rmsnorm (+int8)", 0, &|| {
            k.rmsnorm(st.x.ptr(), l.attn_norm.ptr(), c.rms_eps, h, 1, normed)
        })?;
        time(
            "matvec q|k|v",
            a.wq.buf.len() + a.wk.buf.len() + a.wv.buf.len(),
            &|| {
                k.matvec(
                    &[
                        a.wq.seg(st.q.ptr(), q_dim, None, false),
                        a.wk.seg(st.k.ptr(), kv_dim, None, false),
                        a.wv.seg(st.v.ptr(), kv_dim, None, false),
                    ],
                    normed,
                    1,
                    h,
                )
            },
        )?;
        time("qkv epilogue", 0, &|| k.qkv_post(&post))?;
        let att = acts(&st.att, q_dim);
        time(
            &format!("attention at {} cached (+int8)", st.len),
            0,
            &|| k.attention(&call),
        )?;
        time("matvec o (+residual)", a.wo.buf.len(), &|| {
            k.matvec(&[a.wo.seg(st.normed.ptr(), h, None, true)], att, 1, q_dim)
        })?;
        time("matvec gate|up", l.gate.buf.len() + l.up.buf.len(), &|| {
            k.matvec(
                &[
                    l.gate.seg(st.g.ptr(), c.ffn, None, false),
                    l.up.seg(st.u.ptr(), c.ffn, None, false),
                ],
                normed,
                1,
                h,
            )
        })?;
        let g = acts(&st.g, c.ffn);
        time("swiglu (+int8)", 0, &|| {
            k.swiglu(st.g.ptr(), st.u.ptr(), c.ffn, g)
        })?;
        time("matvec down (+residual)", l.down.buf.len(), &|| {
            k.matvec(&[l.down.seg(st.normed.ptr(), h, None, true)], g, 1, c.ffn)
        })?;
        let hm = self.head();
        time("matvec head (+argmax)", hm.buf.len(), &|| {
            let mut seg = hm.seg(st.logits.ptr(), c.vocab, None, false);
            seg.best = st.best.ptr();
            k.matvec(&[seg], normed, 1, h)
        })?;
        // Qwen3.5: the first Gated DeltaNet layer's kernels (its state is overwritten).
        let first_gdn = self.layers.iter().find_map(|l| match &l.mixer {
            Mixer::DeltaNet(d, gi) => Some((d, *gi)),
            Mixer::Attention(_) => None,
        });
        if let Some((d, gi)) = first_gdn {
            for (what, bytes, f) in st.delta_net_steps(self, d, gi, normed)? {
                time(what, bytes, &*f)?;
            }
        }
        for n in [2usize, 4, 8, 16, 32, 64] {
            time(
                &format!("matvec gate|up at {n} rows"),
                l.gate.buf.len() + l.up.buf.len(),
                &|| {
                    k.matvec(
                        &[
                            l.gate.seg(st.g.ptr(), c.ffn, None, false),
                            l.up.seg(st.u.ptr(), c.ffn, None, false),
                        ],
                        normed,
                        n,
                        h,
                    )
                },
            )?;
        }
        Ok(out)
    }
}

impl CudaModel {
    /// Times the first attention layer's attention kernel on its own at the state's length:
    /// `n` chain rows after the committed positions (`fused`: one row with the q/k/v epilogue
    /// inside, as a decode step runs it), by `attn_partial` or (`grouped`) `attn_group`,
    /// `reps` launches. Microseconds per launch. For finding how attention's cost grows with
    /// the context; the state's caches are overwritten at its end.
    pub fn profile_attention(
        &self,
        st: &mut CudaState,
        n: usize,
        fused: bool,
        grouped: bool,
        reps: usize,
    ) -> Result<f64> {
        let k = &self.kernels;
        let (post, mut call) = self.profile_attention_args(st, n)?;
        if fused {
            call.post = PostArgs::fused(&post);
        }
        let timer = crate::runtime::Timer::new(self.gpu())?;
        k.attention_by(&call, grouped)?;
        timer.start()?;
        for _ in 0..reps {
            k.attention_by(&call, grouped)?;
        }
        Ok(timer.stop_ms()? as f64 * 1e3 / reps as f64)
    }

    /// A q/k/v epilogue and an attention call on the first KV cache (the epilogue not fused)
    /// for `n` chain rows after the state's positions, as the profilers launch them; writes
    /// the batch description.
    fn profile_attention_args(&self, st: &mut CudaState, n: usize) -> Result<(QkvPost, AttnCall)> {
        let c = &self.config;
        let hd = c.head_dim;
        if n == 0 || n > MAX_TREE || st.len + n > st.max_slots {
            return Err(Error::Invalid(format!(
                "profiling attention of {n} rows after {}",
                st.len
            )));
        }
        let mut words = vec![0u32; st.layout.words];
        fill_meta(&st.layout, st.len, &vec![1; n], None, &mut words);
        st.meta_host.put_u32s(0, &words);
        st.meta.write_async(0, &st.meta_host, st.layout.words * 4)?;
        let word = |w: usize| st.meta.at(w * 4);
        let v_cache = st.kv.at(c.n_kv_heads * hd * st.max_slots * 2);
        let post = QkvPost {
            q: st.q.ptr(),
            k: st.k.ptr(),
            v: st.v.ptr(),
            n,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            rot_dim: c.rope_dim,
            interleaved: false,
            inv_freq: self.inv_freq.ptr(),
            q_norm: 0,
            k_norm: 0,
            eps: c.rms_eps,
            batch: st.meta.ptr(),
            pos: word(st.layout.pos),
            k_cache: st.kv.ptr(),
            v_cache,
            max_slots: st.max_slots,
        };
        let call = AttnCall {
            q: st.q.ptr(),
            k_cache: st.kv.ptr(),
            v_cache,
            max_slots: st.max_slots,
            n,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            batch: st.meta.ptr(),
            pos: word(st.layout.pos),
            path: word(st.layout.path),
            part_ml: st.part_ml.ptr(),
            part_o: st.part_o.ptr(),
            arrivals: st.arrivals.ptr(),
            chunks: st.chunks,
            out: st.att.ptr(),
            out_q: st.xq.ptr(),
            out_s: st.xs.ptr(),
            post: PostArgs::default(),
        };
        Ok((post, call))
    }
}

impl CudaModel {
    /// Times layer 0's gate|up and down products on the prefill GEMM at `n` activation rows
    /// (at most a prefill pass's), `reps` launches each: the expansion to f16
    /// (`gemm_prepare`), the product with each tile shape unsplit and as [`gemm_plan`] splits
    /// it, and the whole as a pass runs it. Returns (what, microseconds per launch, flops of
    /// the product; 0 for the expansion); empty where the state has no prefill GEMM. Writes
    /// the state's activation buffers (a benchmark's business only).
    ///
    /// [`gemm_plan`]: crate::kernels::gemm_plan
    pub fn profile_gemm(
        &self,
        st: &CudaState,
        n: usize,
        reps: usize,
    ) -> Result<Vec<(String, f64, f64)>> {
        let Some(bufs) = &st.gemm_bufs else {
            return Ok(Vec::new());
        };
        if n == 0 || n > st.rows {
            return Err(Error::Invalid(format!(
                "profile_gemm at {n} rows (1..={})",
                st.rows
            )));
        }
        let (k, c, l) = (&self.kernels, &self.config, &self.layers[0]);
        let acts = |b: &DeviceBuffer, ld: usize| Acts {
            x: b.ptr(),
            ld,
            ..Acts::default()
        };
        let products = [
            (
                "gate|up",
                vec![
                    l.gate.seg(st.g.ptr(), c.ffn, None, false),
                    l.up.seg(st.u.ptr(), c.ffn, None, false),
                ],
                acts(&st.normed, c.hidden),
                c.hidden,
            ),
            (
                "down (+residual)",
                vec![l.down.seg(st.x.ptr(), c.hidden, None, true)],
                acts(&st.g, c.ffn),
                c.ffn,
            ),
        ];
        let scratch = bufs.scratch();
        let timer = crate::runtime::Timer::new(self.gpu())?;
        let mut out = Vec::new();
        for (name, segs, x, cols) in &products {
            let (segs, x, cols) = (&segs[..], *x, *cols);
            let rows: usize = segs.iter().map(|s| s.rows as usize).sum();
            let what = format!("{name} ({rows}x{cols}) at {n} rows");
            let flops = 2.0 * (n * rows * cols) as f64;
            let mut time = |how: String, flops: f64, f: &dyn Fn() -> Result<()>| -> Result<()> {
                f()?;
                timer.start()?;
                for _ in 0..reps {
                    f()?;
                }
                let us = timer.stop_ms()? as f64 * 1e3 / reps as f64;
                out.push((format!("{what}, {how}"), us, flops));
                Ok(())
            };
            time("expand weights and activations to f16".into(), 0.0, &|| {
                k.gemm_prepare(segs, x, n, cols, &scratch)
            })?;
            let (planned, splits) = crate::kernels::gemm_plan(
                n,
                rows,
                cols,
                self.gpu().multiprocessors,
                scratch.part_bytes,
                GEMM_MAX_SPLITS,
            );
            for tile in GemmTile::ALL {
                let mut ways = vec![1];
                if tile == planned && splits > 1 {
                    ways.push(splits);
                }
                for s in ways {
                    time(
                        format!("product {} split {s}", tile.kernel()),
                        flops,
                        &|| k.gemm_product(segs, x, n, cols, &scratch, tile, s),
                    )?;
                }
            }
            time(
                format!("whole ({} split {splits} + expansion)", planned.kernel()),
                flops,
                &|| k.gemm(segs, x, n, cols, &scratch),
            )?;
        }
        Ok(out)
    }
}
