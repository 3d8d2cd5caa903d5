//! `Model`: a decoder-only transformer assembled from parts (embedding, layers, output norm,
//! LM head, Qwen3.5's MTP head), loaded from a GGUF file or a Hugging Face directory. Its
//! forward pass is [`Model::run`] (`run.rs`); the methods here that return vectors are thin
//! conveniences over it.
//!
//! A model lives on a backend (`Model<B: Backend = Cpu>`): its matrices are packed by the
//! backend as they load ([`Model::load_on`]), and every pass runs the backend's kernels.
//! `Model` alone is the CPU model; `Model::<Reference>` runs the same layer loop on the f64
//! oracle.
//!
//! The mixer of each layer is attention or Gated DeltaNet per `ModelConfig::layer_kinds`.

use std::path::Path;
use std::sync::Arc;

use crate::backend::{Backend, Cpu, KvType};
use crate::format::{Checkpoint, Claims, TensorSource};
use crate::kernels::rope::Rope;
use crate::quant::Target;

use super::batch::{Batch, Logits, Output};
use super::config::{Arch, LayerKind, ModelConfig};
use super::embedding::{Embedding, EmbeddingTable};
use super::mixer::{Attention, GatedDeltaNet, Mixer};
use super::mlp::Mlp;
use super::mtp::MtpHead;
use super::run::head_logits;
use super::state::ModelState;
use super::trace::NoTrace;
use super::{weights, ModelError, RmsNorm};

/// One decoder block.
pub(crate) struct Layer<B: Backend = Cpu> {
    pub(crate) attn_norm: RmsNorm<B>,
    pub(crate) mixer: Mixer<B>,
    /// The norm before the MLP (`ffn_norm`; Qwen3.5 calls it `post_attention_norm`).
    pub(crate) ffn_norm: RmsNorm<B>,
    pub(crate) mlp: Mlp<B>,
}

impl<B: Backend> Layer<B> {
    /// The packed matrices of block `index` under their GGUF names.
    fn matrices(&self, index: usize) -> Vec<(String, &B::Weight)> {
        let name = |part: &str| format!("blk.{index}.{part}.weight");
        let mut out: Vec<(String, &B::Weight)> = match &self.mixer {
            Mixer::Attention(a) => a
                .matrices()
                .into_iter()
                .map(|(part, w)| (name(part), w))
                .collect(),
            Mixer::GatedDeltaNet(g) => g
                .matrices()
                .into_iter()
                .map(|(part, w)| (name(part), w))
                .collect(),
        };
        let m = &self.mlp;
        out.extend([
            (name("ffn_gate"), &m.gate),
            (name("ffn_up"), &m.up),
            (name("ffn_down"), &m.down),
        ]);
        out
    }
}

/// Immutable weights of a model on backend `B` (the CPU unless said); share it (`Arc`)
/// between any number of `ModelState`s.
pub struct Model<B: Backend = Cpu> {
    /// The hyper-parameters it was built from.
    pub config: ModelConfig,
    /// The backend that packed the weights and runs the passes.
    pub(crate) backend: B,
    pub(crate) embedding: Embedding,
    pub(crate) layers: Vec<Layer<B>>,
    pub(crate) output_norm: RmsNorm<B>,
    /// `output.weight`, or a packed copy of `token_embd.weight` when tied.
    pub(crate) head: B::Weight,
    /// Qwen3.5's multi-token-prediction block, when the checkpoint has one.
    pub(crate) mtp: Option<MtpHead<B>>,
    /// How new states' KV caches store keys and values ([`Model::set_kv_type`]).
    kv_type: KvType,
}

impl Model {
    /// Loads a GGUF file, or a Hugging Face directory (config.json + safetensors).
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Model::load_with(path, None)
    }

    /// [`Model::load`], storing the matrices whose format is heavier than `matrix_format` in
    /// that format (see `crate::quant::requantize`; for draft models).
    pub fn load_with(
        path: impl AsRef<Path>,
        matrix_format: Option<Target>,
    ) -> Result<Model, ModelError> {
        Model::load_on(Cpu, path, matrix_format)
    }

    /// Builds the model from `source` (tensors under GGUF names), claiming every tensor:
    /// a tensor nobody uses is an error.
    pub fn from_source(
        config: ModelConfig,
        source: &dyn TensorSource,
    ) -> Result<Model, ModelError> {
        Model::from_source_with(config, source, None)
    }

    /// [`Model::from_source`] with the matrix format of [`Model::load_with`].
    pub fn from_source_with(
        config: ModelConfig,
        source: &dyn TensorSource,
        matrix_format: Option<Target>,
    ) -> Result<Model, ModelError> {
        Model::from_source_on(Cpu, config, source, matrix_format)
    }

    /// Logits (`m × vocab`) for `m` final-normed hidden rows (`m × hidden`).
    pub fn head_logits(&self, normed: &[f32]) -> Vec<f32> {
        let mut logits = Vec::new();
        let m = normed.len() / self.config.hidden;
        head_logits(&Cpu, &self.head, normed, m, &mut logits, &mut NoTrace);
        logits
    }
}

impl<B: Backend> Model<B> {
    /// [`Model::load_with`] on `backend`, which packs the weights.
    pub fn load_on(
        backend: B,
        path: impl AsRef<Path>,
        matrix_format: Option<Target>,
    ) -> Result<Model<B>, ModelError> {
        let ckpt = Checkpoint::open(path)?;
        let config = ModelConfig::of_checkpoint(&ckpt)?;
        Model::from_source_on(backend, config, ckpt.tensors(), matrix_format)
    }

    /// [`Model::from_source_with`] on `backend`, which packs the weights.
    pub fn from_source_on(
        backend: B,
        mut config: ModelConfig,
        source: &dyn TensorSource,
        matrix_format: Option<Target>,
    ) -> Result<Model<B>, ModelError> {
        let b = &backend;
        config.validate().map_err(|reason| ModelError::Config {
            source_path: source.path().display().to_string(),
            reason,
        })?;
        let claims = Claims::new(source).with_matrix_format(matrix_format);
        let (h, eps) = (config.hidden, config.rms_eps);
        let embedding = Embedding::load(&claims, "token_embd.weight", config.vocab, h)?;

        // One RoPE table for all attention layers; GGUF Llama 3 files carry the frequency
        // factors of "llama3" scaling as a tensor.
        let freq_factors =
            weights::optional_vector(&claims, "rope_freqs.weight", config.rope_dim / 2)?;
        let rope = Arc::new(Rope::new(
            config.head_dim,
            config.rope_dim,
            config.rope_theta,
            config.rope_layout,
            &config.rope_scaling,
            freq_factors.as_deref(),
        ));

        let ffn_norm_name = if config.arch == Arch::Qwen35 {
            "post_attention_norm"
        } else {
            "ffn_norm"
        };
        let mut layers = Vec::with_capacity(config.n_layers);
        for (i, kind) in config.layer_kinds.iter().enumerate() {
            let norm = |name: &str| {
                RmsNorm::load(
                    b,
                    &claims,
                    &format!("blk.{i}.{name}.weight"),
                    h,
                    eps,
                    config.norm_offset_one,
                )
            };
            let mixer = match kind {
                LayerKind::Attention => {
                    Mixer::Attention(Attention::load(b, &claims, i, &config, rope.clone())?)
                }
                LayerKind::GatedDeltaNet => {
                    Mixer::GatedDeltaNet(GatedDeltaNet::load(b, &claims, i, &config)?)
                }
            };
            layers.push(Layer {
                attn_norm: norm("attn_norm")?,
                mixer,
                ffn_norm: norm(ffn_norm_name)?,
                mlp: Mlp::load(b, &claims, i, h, config.ffn)?,
            });
        }
        let output_norm = RmsNorm::load(
            b,
            &claims,
            "output_norm.weight",
            h,
            eps,
            config.norm_offset_one,
        )?;
        let head = match weights::optional_matrix(b, &claims, "output.weight", config.vocab, h)? {
            Some(m) => m,
            None => {
                let name = "token_embd.weight (tied head)";
                match embedding.tensor() {
                    EmbeddingTable::Raw(t) => {
                        weights::MatrixRows::new(&claims, name, t.clone(), config.vocab, h)?
                            .pack(b)?
                    }
                    EmbeddingTable::Quantized(q) => {
                        weights::MatrixRows::stored(name, q.clone()).pack(b)?
                    }
                }
            }
        };
        config.tied_embeddings = !claims.has("output.weight");
        // The multi-token-prediction block (Qwen3.5) claims its own tensors, strictly.
        let mtp = MtpHead::load(b, &config, source, rope)?;
        claims.ignore_prefix(&format!("blk.{}.", config.n_layers));
        claims.ignore_prefix("mtp.");
        claims.finish()?;
        Ok(Model {
            config,
            backend,
            embedding,
            layers,
            output_norm,
            head,
            mtp,
            kv_type: KvType::F32,
        })
    }

    /// How the KV caches of new states store keys and values: f32 after loading (the exact
    /// math the reference tests check), else what [`Model::set_kv_type`] chose.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Makes the states created from now on store their KV caches as `kv_type` (every
    /// attention layer's, the MTP block's included). q8_0 needs a head size that is a
    /// multiple of 32 (an error says so otherwise).
    pub fn set_kv_type(&mut self, kv_type: KvType) -> Result<(), ModelError> {
        let hd = self.config.head_dim;
        if kv_type.row_bytes(hd).is_none() {
            return Err(ModelError::Unsupported(format!(
                "a {kv_type} KV cache with head size {hd} (q8_0 stores blocks of 32 values; \
                 use f16 or f32)"
            )));
        }
        let mtp = self.mtp.as_mut().map(|m| &mut m.layer);
        for layer in self.layers.iter_mut().chain(mtp) {
            if let Mixer::Attention(a) = &mut layer.mixer {
                a.kv_type = kv_type;
            }
        }
        self.kv_type = kv_type;
        Ok(())
    }

    /// Bytes of KV cache one position takes in a state (every attention layer, and the MTP
    /// block's cache, which drafting keeps as long), in [`Model::kv_type`].
    pub fn kv_bytes_per_token(&self) -> usize {
        let mtp = self.mtp.as_ref().map(|m| &m.layer);
        self.layers
            .iter()
            .chain(mtp)
            .filter_map(|l| match &l.mixer {
                Mixer::Attention(a) => a
                    .kv_type
                    .row_bytes(a.geo.head_dim)
                    .map(|row| 2 * a.geo.n_kv_heads * row),
                Mixer::GatedDeltaNet(_) => None,
            })
            .sum()
    }

    /// Qwen3.5's multi-token-prediction block, when the checkpoint has one.
    pub fn mtp(&self) -> Option<&MtpHead<B>> {
        self.mtp.as_ref()
    }

    /// The LM head (`output.weight`, or the packed embedding when tied).
    pub fn head(&self) -> &B::Weight {
        &self.head
    }

    /// Every packed weight matrix of the trunk, in forward order, under its GGUF name
    /// (`blk.0.attn_qkv` when q, k and v are stacked into one; `output.weight` for the head,
    /// tied or not): for byte counts, formats and matrix benchmarks.
    pub fn matrices(&self) -> Vec<(String, &B::Weight)> {
        let mut out: Vec<(String, &B::Weight)> = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.matrices(i))
            .collect();
        out.push(("output.weight".into(), &self.head));
        out
    }

    /// An empty state that can hold up to `max_len` positions.
    pub fn new_state(&self, max_len: usize) -> ModelState<B> {
        ModelState::new(&self.backend, &self.layers, max_len)
    }

    /// Appends `tokens` at positions `state.len..` and returns their logits (`Logits::All`:
    /// `tokens.len() × vocab`, `Logits::Last`: `vocab`, or nothing for no tokens): a
    /// [`Model::run`] of a chain into a fresh [`Output`].
    /// Invalid input (unknown token, too long, foreign state) is an error and leaves the
    /// state untouched.
    pub fn forward(
        &self,
        state: &mut ModelState<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let mut out = Output::default();
        self.run(state, &Batch::chain(tokens).logits(logits), &mut out)?;
        Ok(out.logits)
    }

    /// Appends `tokens` like [`Model::forward`] and returns their final hidden states after the
    /// output norm (`tokens.len() × hidden`): what MTP / DFlash drafters read. Turn rows into
    /// logits with [`Model::head_logits`].
    pub fn forward_hidden(
        &self,
        state: &mut ModelState<B>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self.forward_taps(state, tokens, &[])?.0)
    }

    /// [`Model::forward_hidden`], plus the outputs of the decoder layers `taps` (0-based,
    /// before the final norm) for every token: `tokens.len() × taps.len() × hidden`, token
    /// by token (what DFlash-style drafters condition on).
    pub fn forward_taps(
        &self,
        state: &mut ModelState<B>,
        tokens: &[u32],
        taps: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let mut out = Output::default();
        let batch = Batch::chain(tokens)
            .logits(Logits::None)
            .hidden(true)
            .taps(taps);
        self.run(state, &batch, &mut out)?;
        Ok((out.hidden, out.taps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::SourceKind;
    use crate::model::run::CHUNK;
    use crate::model::testing::{
        kasoku_sized_config, random_weights, reference_forward, rel_diff, tiny_config, MemSource,
        Rng,
    };
    use crate::quant::DType;

    const TOL: f64 = 1e-4;

    fn variants() -> Vec<(&'static str, ModelConfig)> {
        vec![
            (
                "llama gguf (interleaved rope)",
                tiny_config(Arch::Llama, SourceKind::Gguf),
            ),
            (
                "llama hf (neox rope)",
                tiny_config(Arch::Llama, SourceKind::Hf),
            ),
            (
                "qwen2 (qkv bias, untied)",
                tiny_config(Arch::Qwen2, SourceKind::Gguf),
            ),
            (
                "qwen3 (qk norm, head_dim != hidden/heads)",
                tiny_config(Arch::Qwen3, SourceKind::Gguf),
            ),
            (
                "qwen35 gguf attention (gate, partial rope)",
                tiny_config(Arch::Qwen35, SourceKind::Gguf),
            ),
            (
                "qwen35 hf attention ((1+w) norms)",
                tiny_config(Arch::Qwen35, SourceKind::Hf),
            ),
        ]
    }

    fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|_| ((rng.next() + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32)
            .collect()
    }

    fn build(cfg: &ModelConfig, seed: u64) -> (Model, MemSource) {
        let src = random_weights(cfg, seed);
        (Model::from_source(cfg.clone(), &src).unwrap(), src)
    }

    #[test]
    fn batched_forward_matches_f64_reference() {
        for (what, cfg) in variants() {
            let (model, src) = build(&cfg, 1);
            let toks = tokens(13, cfg.vocab, 2);
            let want = reference_forward(&cfg, &src, &toks);
            let mut st = model.new_state(64);
            let got = model.forward(&mut st, &toks, Logits::All).unwrap();
            let d = rel_diff(&got, &want);
            assert!(d < TOL, "{what}: batched vs reference rel diff {d}");
            assert_eq!(st.len, toks.len());
        }
    }

    #[test]
    fn token_by_token_equals_batched() {
        for (what, cfg) in variants() {
            let (model, _) = build(&cfg, 3);
            let toks = tokens(10, cfg.vocab, 4);
            let mut batched = model.new_state(32);
            let all = model.forward(&mut batched, &toks, Logits::All).unwrap();
            let mut one = model.new_state(32);
            for (i, &t) in toks.iter().enumerate() {
                let l = model.forward(&mut one, &[t], Logits::Last).unwrap();
                let want: Vec<f64> = all[i * cfg.vocab..(i + 1) * cfg.vocab]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let d = rel_diff(&l, &want);
                assert!(d < TOL, "{what}: position {i}: {d}");
            }
            // Prefill then a batch on top of the cache.
            let mut mixed = model.new_state(32);
            model.forward(&mut mixed, &toks[..4], Logits::Last).unwrap();
            let rest = model.forward(&mut mixed, &toks[4..], Logits::All).unwrap();
            let want: Vec<f64> = all[4 * cfg.vocab..].iter().map(|&v| v as f64).collect();
            assert!(rel_diff(&rest, &want) < TOL, "{what}: prefill + batch");
        }
    }

    #[test]
    fn requantized_matrices_take_the_asked_format_and_stay_close() {
        for (what, cfg) in variants() {
            let src = random_weights(&cfg, 11);
            let toks = tokens(9, cfg.vocab, 12);
            let want = reference_forward(&cfg, &src, &toks);
            let mut diffs = Vec::new();
            for to in [DType::Q8_0, DType::Q4_0] {
                let model = Model::from_source_with(cfg.clone(), &src, Some(to.into())).unwrap();
                for layer in &model.layers {
                    for m in [&layer.mlp.gate, &layer.mlp.up, &layer.mlp.down] {
                        // Rows that 32-value blocks do not divide keep their format.
                        let want = if m.cols % 32 == 0 { to } else { DType::F32 };
                        assert_eq!(m.dtype(), Some(want), "{what}: {}x{}", m.rows, m.cols);
                    }
                }
                assert_eq!(model.head.dtype(), Some(to), "{what}");
                let mut st = model.new_state(32);
                let got = model.forward(&mut st, &toks, Logits::All).unwrap();
                diffs.push(rel_diff(&got, &want));
            }
            // Eight-bit weights stay close to the f32 model; four-bit ones move further (on
            // random weights, whose logits are all noise, far), but stay finite.
            let (q8, q4) = (diffs[0], diffs[1]);
            assert!(q8 > 1e-5 && q8 < 0.05, "{what}: Q8_0 rel diff {q8}");
            assert!(
                q4 > 4.0 * q8 && q4 < 1.0,
                "{what}: Q4_0 rel diff {q4} (Q8_0: {q8})"
            );
        }
    }

    /// Quantized to kasoku's formats as it loads (a model wide enough for them: columns of
    /// 64 and 128): every layer matrix, the head and the embedding take the recipe's format,
    /// and the logits stay close to the f32 model's (L closer than M, mixed between; on random
    /// weights, whose logits are all noise, M moves far but stays finite).
    #[test]
    fn kasoku_formats_quantized_at_load_take_the_recipe_and_stay_close() {
        use crate::kernels::matmul::WeightFormat;
        use crate::quant::kasoku::{Format, Recipe, Scheme};
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
            let cfg = kasoku_sized_config(arch, SourceKind::Gguf);
            let src = random_weights(&cfg, 21);
            let toks = tokens(11, cfg.vocab, 9);
            let want = reference_forward(&cfg, &src, &toks);
            let diff = |recipe: Recipe| {
                let model =
                    Model::from_source_with(cfg.clone(), &src, Some(Target::Kasoku(recipe)))
                        .unwrap();
                for layer in &model.layers {
                    let m = &layer.mlp;
                    let (plain, fine) = match recipe.scheme {
                        Scheme::M => (Format::M, Format::M),
                        Scheme::L => (Format::L, Format::L),
                        Scheme::Mixed => (Format::M, Format::L),
                    };
                    assert_eq!(m.gate.format(), WeightFormat::Kasoku(plain));
                    assert_eq!(m.down.format(), WeightFormat::Kasoku(fine));
                    let spec = m.gate.kasoku_spec().unwrap();
                    assert_eq!(spec.rotation.is_some(), recipe.rotate);
                    assert_eq!(spec.rotation, m.up.kasoku_spec().unwrap().rotation);
                }
                assert_eq!(model.head.format(), WeightFormat::Kasoku(Format::L));
                let mut st = model.new_state(32);
                let got = model.forward(&mut st, &toks, Logits::All).unwrap();
                assert!(got.iter().all(|v| v.is_finite()));
                rel_diff(&got, &want)
            };
            let l = diff(Recipe::new(Scheme::L));
            let m = diff(Recipe::new(Scheme::M));
            let mixed = diff(Recipe::new(Scheme::Mixed));
            let m_plain = diff(Recipe {
                rotate: false,
                ..Recipe::new(Scheme::M)
            });
            let l_plain = diff(Recipe {
                rotate: false,
                ..Recipe::new(Scheme::L)
            });
            // The random weights are uniform, which a rotation makes Gaussian: for them (unlike
            // real, heavy-tailed weights) it doubles the squared error of both formats.
            for (what, d) in [("L", l), ("unrotated L", l_plain)] {
                assert!(d > 1e-5 && d < 0.1, "{arch:?}: {what} rel diff {d}");
            }
            assert!(m > 2.0 * l && m < 0.6, "{arch:?}: M rel diff {m} (L {l})");
            assert!(mixed < m && m_plain < 0.6, "{arch:?}: {mixed} {m_plain}");
        }
    }

    /// The fused epilogues (the norms, attention and SwiGLU writing the rotated int8
    /// activations of kasoku's formats) give the unfused path's logits bit for bit: a prompt
    /// longer than a chunk, decode steps and a token tree, with M, mixed (q/k in M, v in L:
    /// separate projections sharing one prepared input) and unrotated L.
    #[test]
    fn fused_epilogues_give_the_unfused_logits_bit_for_bit() {
        use crate::kernels::fused::force;
        use crate::model::TreeBuilder;
        use crate::quant::kasoku::{Recipe, Scheme};
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
            let cfg = kasoku_sized_config(arch, SourceKind::Gguf);
            let src = random_weights(&cfg, 23);
            let toks = tokens(CHUNK + 20, cfg.vocab, 5);
            let mut tree = TreeBuilder::new(toks[3]);
            let a = tree.add(0, 7);
            tree.add_chain(a, &[1, 2, 3]);
            tree.add(0, 9);
            let (tree, _) = tree.build();
            for recipe in [
                Recipe::new(Scheme::M),
                Recipe::new(Scheme::Mixed),
                Recipe {
                    rotate: false,
                    ..Recipe::new(Scheme::L)
                },
            ] {
                let model =
                    Model::from_source_with(cfg.clone(), &src, Some(Target::Kasoku(recipe)))
                        .unwrap();
                let run = |fused: bool| {
                    force(Some(fused));
                    for l in &model.layers {
                        assert_eq!(l.mixer.prepared_input(&Cpu).is_some(), fused);
                        assert_eq!(l.mlp.prepared_input(&Cpu).is_some(), fused);
                    }
                    let mut st = model.new_state(CHUNK + 64);
                    let mut all = model.forward(&mut st, &toks, Logits::All).unwrap();
                    for t in [4, 5] {
                        all.extend(model.forward(&mut st, &[t], Logits::Last).unwrap());
                    }
                    all.extend(model.verify(&mut st, &tree, true).unwrap().logits);
                    force(None);
                    all
                };
                let (fused, unfused) = (run(true), run(false));
                assert!(
                    fused.len() == unfused.len()
                        && fused
                            .iter()
                            .zip(&unfused)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{arch:?} {recipe:?}: fused and unfused logits differ"
                );
            }
        }
    }

    #[test]
    fn long_input_runs_in_chunks() {
        let cfg = tiny_config(Arch::Qwen3, SourceKind::Gguf);
        let (model, src) = build(&cfg, 5);
        let toks = tokens(CHUNK + 37, cfg.vocab, 6);
        let want = reference_forward(&cfg, &src, &toks);
        let mut st = model.new_state(1024);
        let got = model.forward(&mut st, &toks, Logits::All).unwrap();
        assert!(rel_diff(&got, &want) < TOL);
        let mut st2 = model.new_state(1024);
        let last = model.forward(&mut st2, &toks, Logits::Last).unwrap();
        assert!(rel_diff(&last, &want[(toks.len() - 1) * cfg.vocab..]) < TOL);
    }

    #[test]
    fn two_states_on_one_model_are_independent() {
        let cfg = tiny_config(Arch::Llama, SourceKind::Gguf);
        let (model, _) = build(&cfg, 7);
        let model = std::sync::Arc::new(model);
        let (a, b) = (tokens(8, cfg.vocab, 8), tokens(8, cfg.vocab, 9));
        let solo = |t: &[u32]| {
            let mut s = model.new_state(16);
            model.forward(&mut s, t, Logits::All).unwrap()
        };
        let (want_a, want_b) = (solo(&a), solo(&b));
        let (mut sa, mut sb) = (model.new_state(16), model.new_state(16));
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        for i in 0..8 {
            got_a.extend(model.forward(&mut sa, &a[i..i + 1], Logits::All).unwrap());
            got_b.extend(model.forward(&mut sb, &b[i..i + 1], Logits::All).unwrap());
        }
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        assert!(rel_diff(&got_a, &f(&want_a)) < TOL);
        assert!(rel_diff(&got_b, &f(&want_b)) < TOL);
        // And from two threads at once.
        let m2 = model.clone();
        let a2 = a.clone();
        let th = std::thread::spawn(move || {
            let mut s = m2.new_state(16);
            m2.forward(&mut s, &a2, Logits::All).unwrap()
        });
        let rb = solo(&b);
        assert_eq!(th.join().unwrap(), want_a);
        assert_eq!(rb, want_b);
    }

    #[test]
    fn bad_input_is_an_error_and_leaves_the_state_alone() {
        let cfg = tiny_config(Arch::Llama, SourceKind::Gguf);
        let (model, _) = build(&cfg, 10);
        let mut st = model.new_state(4);
        model.forward(&mut st, &[1, 2], Logits::Last).unwrap();
        let e = model
            .forward(&mut st, &[1, cfg.vocab as u32], Logits::Last)
            .unwrap_err();
        assert!(
            matches!(e, ModelError::TokenOutOfRange { token, .. } if token == cfg.vocab as u32),
            "{e}"
        );
        let e = model
            .forward(&mut st, &[1, 2, 3], Logits::Last)
            .unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::ContextFull {
                    len: 2,
                    new: 3,
                    max_len: 4
                }
            ),
            "{e}"
        );
        assert_eq!(st.len, 2);
        assert_eq!(
            model.forward(&mut st, &[3, 4], Logits::Last).unwrap().len(),
            cfg.vocab
        );
        assert!(model
            .forward(&mut st, &[], Logits::Last)
            .unwrap()
            .is_empty());
        let other = Model::from_source(
            tiny_config(Arch::Qwen3, SourceKind::Gguf),
            &random_weights(&tiny_config(Arch::Qwen3, SourceKind::Gguf), 1),
        )
        .unwrap();
        let mut foreign = other.new_state(8);
        assert!(matches!(
            model.forward(&mut foreign, &[1], Logits::Last),
            Err(ModelError::StateMismatch(_))
        ));
    }

    #[test]
    fn loading_is_strict() {
        let cfg = tiny_config(Arch::Llama, SourceKind::Gguf);
        let mut src = random_weights(&cfg, 11);
        src.add_f32("blk.0.mystery.weight", &[2], &[1.0, 2.0]);
        let e = Model::from_source(cfg.clone(), &src)
            .err()
            .expect("unclaimed tensor must fail");
        assert!(e.to_string().contains("blk.0.mystery.weight"), "{e}");

        let mut src = random_weights(&cfg, 11);
        src.tensors.retain(|t| t.name != "blk.1.attn_k.weight");
        let e = Model::from_source(cfg.clone(), &src)
            .err()
            .expect("missing tensor must fail");
        assert!(e.to_string().contains("blk.1.attn_k.weight"), "{e}");

        let mut src = random_weights(&cfg, 11);
        let t = src
            .tensors
            .iter_mut()
            .find(|t| t.name == "blk.0.ffn_up.weight")
            .unwrap();
        t.shape = vec![cfg.hidden, cfg.ffn];
        let e = Model::from_source(cfg.clone(), &src)
            .err()
            .expect("wrong shape must fail");
        assert!(e.to_string().contains("blk.0.ffn_up.weight"), "{e}");

        // Untied: output.weight is used and the config says so.
        let mut cfg2 = cfg.clone();
        cfg2.tied_embeddings = false;
        let src = random_weights(&cfg2, 12);
        let m = Model::from_source(cfg.clone(), &src).unwrap();
        assert!(!m.config.tied_embeddings);
    }

    #[test]
    fn hidden_states_then_head_equal_logits() {
        let cfg = tiny_config(Arch::Qwen3, SourceKind::Gguf);
        let (model, _) = build(&cfg, 13);
        let toks = tokens(6, cfg.vocab, 14);
        let mut a = model.new_state(8);
        let want = model.forward(&mut a, &toks, Logits::All).unwrap();
        let mut b = model.new_state(8);
        let hidden = model.forward_hidden(&mut b, &toks).unwrap();
        assert_eq!(hidden.len(), toks.len() * cfg.hidden);
        assert_eq!(b.len, toks.len());
        assert_eq!(model.head_logits(&hidden), want);
    }

    #[test]
    fn model_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Model>();
        check::<ModelState>();
    }
}
