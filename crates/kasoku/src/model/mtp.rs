//! `MtpHead`: Qwen3.5's built-in multi-token-prediction block, a one-layer drafter that reads
//! the target's final-normed hidden states (research/qwen35.md §8).
//!
//! ```text
//! e  = enorm(embed(x_{p+1}))          hh = hnorm(h_p)            (h_p: hidden of position p)
//! x  = eh_proj([e | hh])              embedding first, then hidden; [H, 2H]
//! x += attn(attn_norm(x))             gated full attention with its own KV cache
//! x += mlp(post_attention_norm(x))    dense SwiGLU
//! m  = shared_head_norm(x)            the hidden a chained step reads
//! logits = head(m)                    the trunk's LM head (and embedding above)
//! ```
//!
//! Tensors under GGUF names at the extra block `blk.{n_layers}` (`nextn.eh_proj`, `nextn.enorm`,
//! `nextn.hnorm`, `nextn.shared_head_norm`, and a trunk-style attention layer + MLP). HF
//! checkpoints keep `mtp.*` names; a renaming view ([`crate::format::hf_names::mtp_name`]) shows
//! them under the GGUF names, so the layer parts load with the trunk's own loaders. HF norms
//! are `(1 + w)` (`ModelConfig::norm_offset_one`); GGUF has the +1 folded in.
//!
//! Positions: MTP cache row `j` holds the pair (token `x_{j+1}`, hidden `h_j`) and is rotated at
//! position `j` (vLLM's convention: the hidden's position; RoPE is relative, so llama.cpp's
//! `j + 1` gives the same outputs).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::backend::{Backend, Buf, BufVec, CopyRows, Cpu, KvStore, MatMul, WeightInfo};
use crate::format::hf_names::mtp_name;
use crate::format::{Claims, RawTensor, SourceOrigin, TensorSource};
use crate::kernels::rope::Rope;

use super::batch::{Output, Pass};
use super::config::{Arch, ModelConfig};
use super::mixer::{Attention, Mixer};
use super::mlp::Mlp;
use super::run::{head_logits, run_layers, Buffers, Taps, CHUNK};
use super::scratch::{carve, rows, Scratch};
use super::state::{LayerState, ModelState};
use super::trace::{NoTrace, Op, Trace};
use super::transformer::{Layer, Model};
use super::{weights, ModelError, RmsNorm};

/// The weights of the MTP block (one layer).
pub struct MtpHead<B: Backend = Cpu> {
    /// `nextn.eh_proj` (HF `mtp.fc`): `[hidden, 2 · hidden]`.
    pub(crate) eh_proj: B::Weight,
    /// `nextn.enorm` (HF `mtp.pre_fc_norm_embedding`).
    pub(crate) enorm: RmsNorm<B>,
    /// `nextn.hnorm` (HF `mtp.pre_fc_norm_hidden`).
    pub(crate) hnorm: RmsNorm<B>,
    /// A decoder block of the trunk's kind: gated attention (`attn_norm`, its own KV cache)
    /// and the MLP (`post_attention_norm`, HF `post_attention_layernorm`).
    pub(crate) layer: Layer<B>,
    /// `nextn.shared_head_norm` (HF `mtp.norm`).
    pub(crate) out_norm: RmsNorm<B>,
    hidden: usize,
    /// The block's index, `blk.{n_layers}` (for traces).
    index: usize,
    /// The backend its weights were packed for (its states' memory).
    backend: B,
}

impl<B: Backend> MtpHead<B> {
    /// Loads the MTP block of `source` (a model of `config`) if it has one: `Ok(None)` when the
    /// source has no `mtp.*` and no `blk.{n_layers}.*` tensors. Loading is strict over the MTP
    /// tensors: a missing, misshapen or unknown one is an error.
    pub fn load(
        b: &B,
        config: &ModelConfig,
        source: &dyn TensorSource,
        rope: Arc<Rope>,
    ) -> Result<Option<MtpHead<B>>, ModelError> {
        let view = MtpView::new(source, config);
        if view.names.is_empty() {
            return Ok(None);
        }
        let err = |e: ModelError| ModelError::Config {
            source_path: source.path().display().to_string(),
            reason: format!(
                "multi-token-prediction head (HF mtp.* = GGUF blk.{}.*): {e}",
                config.n_layers
            ),
        };
        if config.arch != Arch::Qwen35 {
            return Err(err(ModelError::Unsupported(format!(
                "an MTP block for {:?}",
                config.arch
            ))));
        }
        Self::load_view(b, config, &view, rope)
            .map(Some)
            .map_err(err)
    }

    fn load_view(
        b: &B,
        config: &ModelConfig,
        view: &MtpView,
        rope: Arc<Rope>,
    ) -> Result<MtpHead<B>, ModelError> {
        let n = config.n_layers;
        if view
            .names
            .keys()
            .any(|k| k.starts_with(&format!("blk.{}.", n + 1)))
        {
            return Err(ModelError::Unsupported(
                "more than one MTP layer (only mtp.layers.0 / blk.{n_layers} is supported)".into(),
            ));
        }
        let claims = Claims::new(view);
        let (h, eps) = (config.hidden, config.rms_eps);
        let norm = |part: &str| {
            RmsNorm::load(
                b,
                &claims,
                &format!("blk.{n}.{part}.weight"),
                h,
                eps,
                config.norm_offset_one,
            )
        };
        let head = MtpHead {
            eh_proj: weights::matrix(
                b,
                &claims,
                &format!("blk.{n}.nextn.eh_proj.weight"),
                h,
                2 * h,
            )?,
            enorm: norm("nextn.enorm")?,
            hnorm: norm("nextn.hnorm")?,
            layer: Layer {
                attn_norm: norm("attn_norm")?,
                mixer: Mixer::Attention(Attention::load(b, &claims, n, config, rope)?),
                ffn_norm: norm("post_attention_norm")?,
                mlp: Mlp::load(b, &claims, n, h, config.ffn)?,
            },
            out_norm: norm("nextn.shared_head_norm")?,
            hidden: h,
            index: n,
            backend: b.clone(),
        };
        claims.finish()?;
        Ok(head)
    }

    /// An empty state (the MTP attention layer's KV cache) with room for `max_len` rows.
    pub fn new_state(&self, max_len: usize) -> ModelState<B> {
        ModelState::new(&self.backend, std::slice::from_ref(&self.layer), max_len)
    }

    /// Runs `n = tokens.len()` rows. Row `i` pairs `tokens[i]` with `hidden` row `i` (`n × H`):
    /// the target's final-normed hidden state of the position before `tokens[i]`, or for a
    /// chained step the MTP's own previous output hidden. The rows are appended to `state` and
    /// rotated at positions `state.len()..`: the position of the hidden row (so `tokens[i]`
    /// sits one further). Leaves in `out` the hidden rows to chain from (`out.hidden`,
    /// `n × H`, after the MTP's output norm) and the logits (`out.logits`, `n × vocab`, the
    /// trunk's head) for the token after each row's token.
    ///
    /// Bad input (token out of range, wrong lengths, no room, a foreign state) is an error and
    /// leaves the state untouched. `ModelState::truncate` drops rejected rows.
    pub fn run(
        &self,
        model: &Model<B>,
        state: &mut ModelState<B>,
        tokens: &[u32],
        hidden: &[f32],
        out: &mut Output,
    ) -> Result<(), ModelError> {
        self.run_traced(model, state, tokens, hidden, out, &mut NoTrace)
    }

    /// [`MtpHead::run`] with every step handed to `tr`.
    pub fn run_traced<T: Trace>(
        &self,
        model: &Model<B>,
        state: &mut ModelState<B>,
        tokens: &[u32],
        hidden: &[f32],
        out: &mut Output,
        tr: &mut T,
    ) -> Result<(), ModelError> {
        let (h, n) = (self.hidden, tokens.len());
        let vocab = model.config.vocab;
        out.clear();
        if model.config.hidden != h || model.embedding.dim != h {
            return Err(ModelError::StateMismatch(format!(
                "MTP head of width {h} given a model of width {}",
                model.config.hidden
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { token: bad, vocab });
        }
        if hidden.len() != n * h {
            return Err(ModelError::StateMismatch(format!(
                "MTP: {} hidden values for {n} tokens of width {h}",
                hidden.len()
            )));
        }
        let Mixer::Attention(attn) = &self.layer.mixer else {
            unreachable!("the MTP block is an attention layer")
        };
        match &state.layers[..] {
            [LayerState::Kv(c)] if c.kv_dim() == attn.kv_dim() && c.len() == state.len => {}
            _ => {
                return Err(ModelError::StateMismatch(format!(
                    "MTP: cache rows of another layer (the layer needs {} values)",
                    attn.kv_dim()
                )))
            }
        }
        if state.len.checked_add(n).is_none_or(|e| e > state.max_len) {
            return Err(ModelError::ContextFull {
                len: state.len,
                new: n,
                max_len: state.max_len,
            });
        }
        state.discard_pending();
        for (toks, hid) in tokens.chunks(CHUNK).zip(hidden.chunks(CHUNK * h)) {
            let b = &model.backend;
            let m = self.chunk(model, state, toks, hid, tr);
            head_logits(b, &model.head, m, toks.len(), &mut out.logits, tr);
            let at = out.hidden.len();
            out.hidden.resize(at + m.len(), 0.0);
            b.read(CopyRows::whole(m, &mut out.hidden[at..]));
        }
        Ok(())
    }

    /// Runs `tokens` like [`MtpHead::run`], checking that they start at position `pos0` (the
    /// state's length), and returns `(hidden rows, logits)`.
    pub fn forward(
        &self,
        model: &Model<B>,
        state: &mut ModelState<B>,
        tokens: &[u32],
        hidden: &[f32],
        pos0: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        if pos0 != state.len() {
            return Err(ModelError::StateMismatch(format!(
                "MTP: rows start at position {pos0} but the cache holds {} positions",
                state.len()
            )));
        }
        let mut out = Output::default();
        self.run(model, state, tokens, hidden, &mut out)?;
        Ok((out.hidden, out.logits))
    }

    /// One chunk of rows: returns the normed output hidden rows (in the state's scratch).
    fn chunk<'s, T: Trace>(
        &self,
        model: &Model<B>,
        state: &'s mut ModelState<B>,
        tokens: &[u32],
        hidden: &[f32],
        tr: &mut T,
    ) -> &'s B::Buffer {
        let (h, n) = (self.hidden, tokens.len());
        let b = &model.backend;
        let op = |name| Op::new(name, Some(self.index), n);
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
        {
            let [emb, hid, e, hh, cat] = carve(work, [n * h, n * h, n * h, n * h, n * 2 * h]);
            let row_bytes = model.embedding.row_bytes();
            tr.op(op("embed").reading(n * row_bytes), || {
                model.embedding.lookup(b, tokens, emb)
            });
            b.write(CopyRows::whole(hidden, hid));
            tr.op(op("mtp_norms"), || {
                self.enorm.forward(b, emb, e);
                self.hnorm.forward(b, hid, hh);
                // Each row of `cat` is [e | hh].
                for (src, at) in [(&*e, 0), (&*hh, h)] {
                    b.copy(CopyRows {
                        src,
                        src_at: 0,
                        src_stride: h,
                        dst: &mut *cat,
                        dst_at: at,
                        dst_stride: 2 * h,
                        rows: n,
                        width: h,
                    });
                }
            });
            let x = rows(x, n * h);
            let eh = op("eh_proj")
                .matmul(self.eh_proj.format())
                .reading(self.eh_proj.size_bytes());
            tr.op(eh, || {
                b.matmul(MatMul {
                    w: &self.eh_proj,
                    x: cat,
                    n,
                    y: x,
                })
            });
        }

        let past = *len;
        positions.clear();
        positions.extend(past..past + n);
        let pass = Pass {
            n,
            past,
            positions,
            tree: None,
        };
        let taps = Taps {
            layers: &[],
            start: 0,
            out: &mut [],
        };
        let mut buffers = Buffers {
            x,
            normed,
            delta,
            work,
            prepared,
        };
        let block = std::slice::from_ref(&self.layer);
        run_layers(b, block, layers, self.index, &mut buffers, &pass, taps, tr);
        *len += n;
        let normed = rows(buffers.normed, n * h);
        let x = buffers.x.all().at(0..n * h);
        tr.op(op("output_norm"), || self.out_norm.forward(b, x, normed));
        normed
    }
}

/// The MTP tensors of a source under GGUF names: `blk.{n_layers}.*` (and beyond) as they are,
/// `mtp.*` renamed by [`mtp_name`] (names it does not know keep their spelling, so strict
/// claiming reports them).
struct MtpView<'a> {
    source: &'a dyn TensorSource,
    /// GGUF-style name → the source's name.
    names: BTreeMap<String, String>,
}

impl<'a> MtpView<'a> {
    fn new(source: &'a dyn TensorSource, config: &ModelConfig) -> MtpView<'a> {
        let model_type = match config.arch {
            Arch::Qwen35 => "qwen3_5",
            _ => "",
        };
        let mut names = BTreeMap::new();
        for name in source.names() {
            if name.starts_with("mtp.") {
                let gguf = mtp_name(model_type, &name, config.n_layers);
                names.insert(gguf.unwrap_or_else(|| name.clone()), name);
            } else if is_past_trunk(&name, config.n_layers) {
                names.insert(name.clone(), name);
            }
        }
        MtpView { source, names }
    }
}

/// `blk.N.*` with `N >= n_layers`.
fn is_past_trunk(name: &str, n_layers: usize) -> bool {
    name.strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(i, _)| i.parse::<usize>().ok())
        .is_some_and(|i| i >= n_layers)
}

impl TensorSource for MtpView<'_> {
    fn path(&self) -> &Path {
        self.source.path()
    }
    fn names(&self) -> Vec<String> {
        self.names.keys().cloned().collect()
    }
    fn get(&self, name: &str) -> Option<RawTensor> {
        let t = self.source.get(self.names.get(name)?)?;
        Some(RawTensor {
            name: name.to_string(),
            ..t
        })
    }
    fn origin(&self) -> SourceOrigin {
        self.source.origin()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::format::HfCheckpoint;
    use crate::model::golden::{argmax, fixture_dir};
    use crate::model::testing::{rel_diff, MemSource};

    const TOL: f64 = 1e-4;

    /// `reference.json` of `qwen3_5/tiny_mtp` (tools/make_mtp_fixture.py).
    struct Reference {
        tokens: Vec<u32>,
        target_hidden: Vec<f64>,
        target_next: u32,
        ingest: usize,
        steps: usize,
        /// Row j: token, input hidden, output hidden, logits.
        mtp_tokens: Vec<u32>,
        hidden_in: Vec<f64>,
        hidden_out: Vec<f64>,
        logits: Vec<f64>,
        final_draft: u32,
    }

    fn reference() -> Reference {
        let text = std::fs::read_to_string(fixture_dir("qwen3_5/tiny_mtp/reference.json"))
            .expect("read reference.json");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ids = |x: &serde_json::Value| -> Vec<u32> {
            x.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect()
        };
        let mat = |x: &serde_json::Value| -> Vec<f64> {
            x.as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect()
        };
        let m = &v["mtp"];
        Reference {
            tokens: ids(&v["tokens"]),
            target_hidden: mat(&v["target_hidden"]),
            target_next: v["target_next_token"].as_u64().unwrap() as u32,
            ingest: m["ingest_rows"].as_u64().unwrap() as usize,
            steps: m["chain_steps"].as_u64().unwrap() as usize,
            mtp_tokens: ids(&m["tokens"]),
            hidden_in: mat(&m["hidden_in"]),
            hidden_out: mat(&m["hidden_out"]),
            logits: mat(&m["logits"]),
            final_draft: m["final_draft_token"].as_u64().unwrap() as u32,
        }
    }

    fn load(path: &Path) -> Model {
        Model::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn sources() -> Vec<std::path::PathBuf> {
        let dir = fixture_dir("qwen3_5/tiny_mtp");
        vec![dir.join("model-f32.gguf"), dir]
    }

    /// Ingest (target hidden rows) then greedy chain steps (the MTP's own hidden), against the
    /// Python reference, from the HF checkpoint and from llama.cpp's GGUF conversion.
    #[test]
    fn matches_python_reference_ingest_then_chain() {
        let r = reference();
        for path in sources() {
            let what = path.display();
            let model = load(&path);
            let mtp = model.mtp.as_ref().expect("fixture has an MTP head");
            let (h, vocab, t) = (model.config.hidden, model.config.vocab, r.tokens.len());
            assert_eq!(r.ingest, t);

            let mut st = model.new_state(t);
            let target = model.forward_hidden(&mut st, &r.tokens).unwrap();
            let d = rel_diff(&target, &r.target_hidden);
            assert!(d < TOL, "{what}: target hidden differs by {d:e}");
            assert_eq!(
                argmax(&model.head_logits(&target[(t - 1) * h..])),
                r.target_next
            );

            let mut cache = mtp.new_state(1024);
            let (m, logits) = mtp
                .forward(&model, &mut cache, &r.mtp_tokens[..t], &target, 0)
                .unwrap();
            assert_eq!((m.len(), logits.len(), cache.len()), (t * h, t * vocab, t));
            let d = rel_diff(&m, &r.hidden_out[..t * h]);
            assert!(d < TOL, "{what}: ingest hidden differs by {d:e}");
            let d = rel_diff(&logits, &r.logits[..t * vocab]);
            assert!(d < TOL, "{what}: ingest logits differ by {d:e}");
            eprintln!("{what}: MTP ingest vs reference: relative max diff {d:.2e}");

            let (mut last_m, mut last_l) = (
                m[(t - 1) * h..].to_vec(),
                logits[(t - 1) * vocab..].to_vec(),
            );
            for s in 0..r.steps {
                let row = t + s;
                let draft = argmax(&last_l);
                assert_eq!(draft, r.mtp_tokens[row], "{what}: draft at step {s}");
                let d = rel_diff(&last_m, &r.hidden_in[row * h..(row + 1) * h]);
                assert!(d < TOL, "{what}: chained hidden input of step {s}: {d:e}");
                let (m, l) = mtp
                    .forward(&model, &mut cache, &[draft], &last_m, row)
                    .unwrap();
                let d = rel_diff(&m, &r.hidden_out[row * h..(row + 1) * h]);
                assert!(d < TOL, "{what}: step {s} hidden differs by {d:e}");
                let d = rel_diff(&l, &r.logits[row * vocab..(row + 1) * vocab]);
                assert!(d < TOL, "{what}: step {s} logits differ by {d:e}");
                (last_m, last_l) = (m, l);
            }
            assert_eq!(argmax(&last_l), r.final_draft);
            assert_eq!(cache.len(), t + r.steps);
        }
    }

    /// Ingest in two parts equals one; truncating the cache (rejected drafts) and running the
    /// same rows again gives the same outputs.
    #[test]
    fn split_ingest_and_truncate() {
        let r = reference();
        let model = load(&fixture_dir("qwen3_5/tiny_mtp"));
        let mtp = model.mtp.as_ref().unwrap();
        let (h, vocab) = (model.config.hidden, model.config.vocab);
        let n = r.mtp_tokens.len();
        let hid: Vec<f32> = r.hidden_in.iter().map(|&x| x as f32).collect();

        let mut whole = mtp.new_state(1024);
        let (m_all, l_all) = mtp
            .forward(&model, &mut whole, &r.mtp_tokens, &hid, 0)
            .unwrap();
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        // All rows at once (chain rows included, with their recorded inputs).
        assert!(rel_diff(&l_all, &r.logits) < TOL);
        assert!(rel_diff(&m_all, &r.hidden_out) < TOL);

        let mut parts = mtp.new_state(1024);
        let (m1, l1) = mtp
            .forward(&model, &mut parts, &r.mtp_tokens[..5], &hid[..5 * h], 0)
            .unwrap();
        let (m2, l2) = mtp
            .forward(&model, &mut parts, &r.mtp_tokens[5..], &hid[5 * h..], 5)
            .unwrap();
        assert!(rel_diff(&[m1, m2].concat(), &f(&m_all)) < 1e-5);
        assert!(rel_diff(&[l1, l2].concat(), &f(&l_all)) < 1e-5);

        // Drop the last 3 rows, then feed them again.
        parts.truncate(n - 3);
        let (m3, l3) = mtp
            .forward(
                &model,
                &mut parts,
                &r.mtp_tokens[n - 3..],
                &hid[(n - 3) * h..],
                n - 3,
            )
            .unwrap();
        assert!(rel_diff(&m3, &f(&m_all[(n - 3) * h..])) < 1e-5);
        assert!(rel_diff(&l3, &f(&l_all[(n - 3) * vocab..])) < 1e-5);
        assert_eq!(parts.len(), n);
    }

    #[test]
    fn checkpoints_without_mtp_have_none() {
        let dir = fixture_dir("qwen3_5/tiny");
        assert!(load(&dir).mtp.is_none());
        assert!(load(&dir.join("model-f32.gguf")).mtp.is_none());
    }

    #[test]
    fn bad_input_is_an_error_and_leaves_the_cache_alone() {
        let model = load(&fixture_dir("qwen3_5/tiny_mtp"));
        let mtp = model.mtp.as_ref().unwrap();
        let h = model.config.hidden;
        let mut cache = mtp.new_state(1024);
        mtp.forward(&model, &mut cache, &[1, 2], &vec![0.5; 2 * h], 0)
            .unwrap();
        let row = vec![0.5f32; h];
        let cases: Vec<(&str, Result<_, _>)> = vec![
            ("position", mtp.forward(&model, &mut cache, &[1], &row, 3)),
            (
                "hidden values",
                mtp.forward(&model, &mut cache, &[1, 2], &row, 2),
            ),
            (
                "vocabulary",
                mtp.forward(&model, &mut cache, &[model.config.vocab as u32], &row, 2),
            ),
            (
                "cache rows",
                mtp.forward(&model, &mut model.new_state(8), &[1], &row, 0),
            ),
        ];
        for (what, res) in cases {
            let e = res.err().unwrap_or_else(|| panic!("{what}: no error"));
            assert!(e.to_string().contains(what), "{what}: {e}");
        }
        assert_eq!(cache.len(), 2);
        let (m, l) = mtp.forward(&model, &mut cache, &[], &[], 2).unwrap();
        assert!(m.is_empty() && l.is_empty());
    }

    /// Every tensor of `path` in memory (under its GGUF names), and the model config.
    fn in_memory(path: &Path) -> (ModelConfig, MemSource) {
        let mut mem = MemSource::new();
        let cfg = if path.is_dir() {
            let ckpt = HfCheckpoint::open(path).unwrap();
            mem.tensors = ckpt.names().iter().map(|n| ckpt.get(n).unwrap()).collect();
            ModelConfig::from_hf(ckpt.config()).unwrap()
        } else {
            let file = crate::format::GgufFile::open(path).unwrap();
            mem.tensors = file
                .names()
                .iter()
                .map(|n| TensorSource::get(&file, n).unwrap())
                .collect();
            ModelConfig::from_gguf(&file).unwrap()
        };
        (cfg, mem)
    }

    fn load_err(cfg: &ModelConfig, src: &MemSource) -> String {
        match Model::from_source(cfg.clone(), src) {
            Ok(_) => panic!("loading must fail"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_or_missing_mtp_tensors_are_clear_errors() {
        let [gguf, hf] = <[_; 2]>::try_from(sources()).unwrap();
        let (cfg, base) = in_memory(&hf);
        assert!(Model::from_source(cfg.clone(), &base)
            .unwrap()
            .mtp
            .is_some());

        let mut src = in_memory(&hf).1;
        src.tensors
            .retain(|t| t.name != "mtp.layers.0.self_attn.k_proj.weight");
        let e = load_err(&cfg, &src);
        assert!(
            e.contains("multi-token-prediction") && e.contains("blk.4.attn_k.weight"),
            "{e}"
        );

        let mut src = in_memory(&hf).1;
        let t = src
            .tensors
            .iter_mut()
            .find(|t| t.name == "mtp.fc.weight")
            .unwrap();
        t.shape = vec![t.shape[1], t.shape[0]];
        let e = load_err(&cfg, &src);
        assert!(e.contains("blk.4.nextn.eh_proj.weight"), "{e}");

        let mut src = in_memory(&hf).1;
        src.add_f32("mtp.layers.0.mystery.weight", &[2], &[1.0, 2.0]);
        let e = load_err(&cfg, &src);
        assert!(e.contains("mtp.layers.0.mystery.weight"), "{e}");

        let mut src = in_memory(&hf).1;
        src.add_f32("mtp.layers.1.input_layernorm.weight", &[2], &[1.0, 2.0]);
        let e = load_err(&cfg, &src);
        assert!(e.contains("more than one MTP layer"), "{e}");

        let (gcfg, mut src) = in_memory(&gguf);
        assert!(Model::from_source(gcfg.clone(), &src)
            .unwrap()
            .mtp
            .is_some());
        src.tensors.retain(|t| t.name != "blk.4.nextn.hnorm.weight");
        let e = load_err(&gcfg, &src);
        assert!(e.contains("blk.4.nextn.hnorm.weight"), "{e}");
    }
}
