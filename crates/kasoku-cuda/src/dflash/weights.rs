//! A DFlash drafter's weights on the GPU: read from its checkpoint directory (`config.json`
//! and `model.safetensors`, the layout `kasoku::model::dflash` documents) and uploaded as
//! they are stored (F32, F16 or BF16 matrices: the matvec kernels read them directly; norm
//! vectors as f32). A matrix in kasoku's own formats (a drafter `kasoku quantize` wrote, as
//! the shipped ones are) is dequantized on the host and uploaded as F16: a drafter's matrices
//! are small, and its guesses need not match the CPU's bit for bit. Loading is strict: every
//! tensor the network needs, with its shape, and no other. The embedding and the LM head are
//! the target's and are not here.

use std::path::Path;
use std::sync::Arc;

use kasoku::format::{HfCheckpoint, QuantizedTensor, TensorSource};
use kasoku::kernels::rope::{Rope, RopeLayout, RopeScaling};
use kasoku::model::dflash::DFlashConfig;
use kasoku::quant::{dequantize, DType};

use crate::kernels::{matvec_supports, DeviceMatrix};
use crate::runtime::{DeviceBuffer, Error, Gpu, Result};
use crate::CudaModel;

/// One draft layer's weights.
pub struct DraftLayerWeights {
    pub input_norm: DeviceBuffer,
    pub q: DeviceMatrix,
    pub k: DeviceMatrix,
    pub v: DeviceMatrix,
    pub o: DeviceMatrix,
    pub q_norm: DeviceBuffer,
    pub k_norm: DeviceBuffer,
    pub post_norm: DeviceBuffer,
    pub gate: DeviceMatrix,
    pub up: DeviceMatrix,
    pub down: DeviceMatrix,
}

/// A DFlash drafter's weights and hyper-parameters on one GPU (share it between sequences).
pub struct DFlashWeights {
    pub config: DFlashConfig,
    pub fc: DeviceMatrix,
    pub hidden_norm: DeviceBuffer,
    pub norm: DeviceBuffer,
    pub layers: Vec<DraftLayerWeights>,
    /// RoPE's inverse frequencies (`head_dim / 2`, NeoX halves).
    pub inv_freq: DeviceBuffer,
}

/// The names and shapes (`[rows, cols]`, or `[len]` for a vector) of every tensor a DFlash
/// drafter of `c` holds, in the order they are uploaded.
pub fn expected_tensors(c: &DFlashConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, ffn) = (c.hidden, c.head_dim, c.intermediate);
    let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
    let mut v = vec![
        ("fc.weight".to_string(), vec![h, c.taps.len() * h]),
        ("hidden_norm.weight".to_string(), vec![h]),
        ("norm.weight".to_string(), vec![h]),
    ];
    for i in 0..c.n_layers {
        let n = |part: &str| format!("layers.{i}.{part}.weight");
        v.extend([
            (n("input_layernorm"), vec![h]),
            (n("self_attn.q_proj"), vec![qd, h]),
            (n("self_attn.k_proj"), vec![kvd, h]),
            (n("self_attn.v_proj"), vec![kvd, h]),
            (n("self_attn.o_proj"), vec![h, qd]),
            (n("self_attn.q_norm"), vec![hd]),
            (n("self_attn.k_norm"), vec![hd]),
            (n("post_attention_layernorm"), vec![h]),
            (n("mlp.gate_proj"), vec![ffn, h]),
            (n("mlp.up_proj"), vec![ffn, h]),
            (n("mlp.down_proj"), vec![h, ffn]),
        ]);
    }
    v
}

/// Checks that `source` holds exactly the tensors `c` needs, each of its shape and in a
/// format the GPU reads (matrices: F32, F16 or BF16 with whole 8-value vectors; vectors: any
/// float). The error names the tensor.
pub fn check_tensors(c: &DFlashConfig, source: &dyn TensorSource) -> Result<()> {
    let want = expected_tensors(c);
    for (name, shape) in &want {
        if let Some(q) = source.quantized(name) {
            let (rows, cols) = (q.spec.rows, q.spec.cols);
            if shape != &[rows, cols] || !matvec_supports(DType::F16, cols) {
                return Err(Error::Invalid(format!(
                    "DFlash drafter: tensor {name} has shape {:?}, expected {shape:?}",
                    [rows, cols]
                )));
            }
            continue;
        }
        let t = source
            .get(name)
            .ok_or_else(|| Error::Invalid(format!("DFlash drafter: tensor {name} is missing")))?;
        if &t.shape != shape {
            return Err(Error::Invalid(format!(
                "DFlash drafter: tensor {name} has shape {:?}, expected {shape:?}",
                t.shape
            )));
        }
        if t.dtype.is_quantized() || (shape.len() == 2 && !matvec_supports(t.dtype, shape[1])) {
            return Err(Error::Invalid(format!(
                "DFlash drafter: tensor {name} is {} (the GPU drafter takes F32, F16 or BF16)",
                t.dtype
            )));
        }
    }
    if let Some(extra) = source
        .names()
        .into_iter()
        .find(|n| !want.iter().any(|(w, _)| w == n))
    {
        return Err(Error::Invalid(format!(
            "DFlash drafter: tensor {extra} is not part of the network"
        )));
    }
    Ok(())
}

impl DFlashWeights {
    /// Loads the checkpoint directory `dir` onto `target`'s GPU, checked against `target`.
    pub fn load(target: &CudaModel, dir: &Path) -> Result<DFlashWeights> {
        let invalid = |e: String| Error::Invalid(format!("DFlash drafter {}: {e}", dir.display()));
        let ckpt = HfCheckpoint::open(dir).map_err(|e| invalid(e.to_string()))?;
        let config = DFlashConfig::from_hf(ckpt.config()).map_err(invalid)?;
        check_for_target(&config, target).map_err(invalid)?;
        check_tensors(&config, &ckpt)?;
        DFlashWeights::upload(target.gpu(), config, &ckpt)
    }

    /// Uploads the tensors of `source` (checked by [`check_tensors`]).
    pub fn upload(
        gpu: &Arc<Gpu>,
        config: DFlashConfig,
        source: &dyn TensorSource,
    ) -> Result<DFlashWeights> {
        let get = |name: &str| {
            source
                .get(name)
                .ok_or_else(|| Error::Invalid(format!("DFlash drafter: tensor {name} is missing")))
        };
        let matrix = |name: &str| -> Result<DeviceMatrix> {
            let uploaded = match source.quantized(name) {
                Some(q) => {
                    let (rows, cols) = (q.spec.rows, q.spec.cols);
                    DeviceMatrix::upload(gpu, DType::F16, rows, cols, &f16_bytes(&q))
                }
                None => {
                    let t = get(name)?;
                    DeviceMatrix::upload(gpu, t.dtype, t.shape[0], t.shape[1], t.data.as_slice())
                }
            };
            uploaded.map_err(|e| Error::Invalid(format!("{name}: {e}")))
        };
        let vector = |name: &str| -> Result<DeviceBuffer> {
            let t = get(name)?;
            let mut v = vec![0f32; t.numel()];
            dequantize(t.dtype, t.data.as_slice(), &mut v);
            gpu.upload_f32(&v)
        };
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let n = |part: &str| format!("layers.{i}.{part}.weight");
            layers.push(DraftLayerWeights {
                input_norm: vector(&n("input_layernorm"))?,
                q: matrix(&n("self_attn.q_proj"))?,
                k: matrix(&n("self_attn.k_proj"))?,
                v: matrix(&n("self_attn.v_proj"))?,
                o: matrix(&n("self_attn.o_proj"))?,
                q_norm: vector(&n("self_attn.q_norm"))?,
                k_norm: vector(&n("self_attn.k_norm"))?,
                post_norm: vector(&n("post_attention_layernorm"))?,
                gate: matrix(&n("mlp.gate_proj"))?,
                up: matrix(&n("mlp.up_proj"))?,
                down: matrix(&n("mlp.down_proj"))?,
            });
        }
        let hd = config.head_dim;
        let rope = Rope::new(
            hd,
            hd,
            config.rope_theta,
            RopeLayout::Neox,
            &RopeScaling::None,
            None,
        );
        let inv: Vec<f32> = rope.inv_freq().iter().map(|&f| f as f32).collect();
        Ok(DFlashWeights {
            fc: matrix("fc.weight")?,
            hidden_norm: vector("hidden_norm.weight")?,
            norm: vector("norm.weight")?,
            layers,
            inv_freq: gpu.upload_f32(&inv)?,
            config,
        })
    }

    /// Bytes of the matrices on the device.
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.buf.len())
                    .sum::<usize>()
            })
            .sum();
        layers + self.fc.buf.len()
    }
}

/// A matrix in kasoku's own formats as F16 values in the original basis (little-endian).
pub fn f16_bytes(q: &QuantizedTensor) -> Vec<u8> {
    q.view()
        .dequantize()
        .into_iter()
        .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
        .collect()
}

/// Checks a drafter of `config` against the GPU target (its width, layers, vocabulary and
/// embedding, as the CPU loader checks them) and the GPU kernels' limits.
pub fn check_for_target(
    config: &DFlashConfig,
    target: &CudaModel,
) -> std::result::Result<(), String> {
    let t = &target.config;
    config.check_shape(t.hidden, t.n_layers, t.vocab, target.embed_table().rows)?;
    check_geometry(config)
}

/// The GPU kernels' limits on a drafter's shapes: head_dim at most
/// [`crate::kernels::MAX_HEAD_DIM`], widths the matvec kernel takes (the hidden size a
/// multiple of 32: its rows are quantized for the target's head).
pub fn check_geometry(c: &DFlashConfig) -> std::result::Result<(), String> {
    if c.head_dim > crate::kernels::MAX_HEAD_DIM {
        return Err(format!(
            "head_dim {} is above the GPU kernels' {}",
            c.head_dim,
            crate::kernels::MAX_HEAD_DIM
        ));
    }
    if !c.hidden.is_multiple_of(32)
        || !(c.n_heads * c.head_dim).is_multiple_of(32)
        || !c.intermediate.is_multiple_of(32)
    {
        return Err(format!(
            "widths hidden {}, attention {} and intermediate {} must be multiples of 32 on the GPU",
            c.hidden,
            c.n_heads * c.head_dim,
            c.intermediate
        ));
    }
    Ok(())
}
