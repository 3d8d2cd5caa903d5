//! The GPU model behind the engine's device interface (`kasoku::engine::DeviceModel` and
//! `DeviceState`), so that `kasoku::engine::DeviceSession` runs requests on it with the CPU
//! session's semantics: a server or the command line sees a `Generator` and nothing of CUDA.
//!
//! What crosses per pass: the argmax id of each head row (8 bytes of key each), and, only
//! when the session asks: for a sampled top-k draw, the row's top-k selection made on the
//! device (`sample.cu`: 8 bytes per candidate, 4 per gathered penalized logit); for other
//! host-sampled requests (top-k off, constraints, log-probabilities, greedy with penalties),
//! the rows it samples from, `vocab × 4` bytes each through pinned memory; for a drafter that
//! reads the target's layer outputs (DFlash) on the host, the accepted rows' taps (`taps ×
//! hidden × 4` bytes a token; nothing for the GPU's DFlash drafter, which reads them in place
//! through `DeviceState::device_taps`). Every error is the engine's `Device` error with the
//! driver's words.

use std::sync::Arc;

use kasoku::engine::{DeviceModel, DeviceState, EngineError, LogitsRow};
use kasoku::model::TokenTree;

use crate::kernels::MAX_TOP_K;
use crate::model::MAX_TREE;
use crate::{CudaModel, CudaState, Error};

fn device_error(e: Error) -> EngineError {
    EngineError::Device(e.to_string())
}

/// A model on one GPU, making a state per session.
pub struct CudaDevice {
    model: Arc<CudaModel>,
}

impl CudaDevice {
    pub fn new(model: Arc<CudaModel>) -> CudaDevice {
        CudaDevice { model }
    }

    pub fn model(&self) -> &Arc<CudaModel> {
        &self.model
    }
}

impl DeviceModel for CudaDevice {
    fn device(&self) -> String {
        format!("cuda:{}", self.model.gpu().ordinal)
    }

    fn vocab(&self) -> usize {
        self.model.config.vocab
    }

    fn max_context(&self) -> usize {
        self.model.config.max_context
    }

    fn new_state(&self, max_len: usize) -> Result<Box<dyn DeviceState>, EngineError> {
        // The caller's thread may not have the context current yet.
        self.model.gpu().bind().map_err(device_error)?;
        let state = self.model.new_state(max_len).map_err(device_error)?;
        Ok(Box::new(CudaSequence {
            model: Arc::clone(&self.model),
            state,
        }))
    }
}

/// One sequence's state with the model it runs on.
struct CudaSequence {
    model: Arc<CudaModel>,
    state: CudaState,
}

impl DeviceState for CudaSequence {
    fn len(&self) -> usize {
        self.state.len
    }

    fn max_len(&self) -> usize {
        self.state.max_len
    }

    fn max_tree(&self) -> usize {
        MAX_TREE
    }

    fn truncate(&mut self, len: usize) {
        self.state.truncate(len);
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        let m = &self.model;
        match tokens {
            // A decode step: its own captured graph.
            [t] => self.state.step(m, *t),
            _ => self.state.prefill(m, tokens),
        }
        .map_err(device_error)
    }

    fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.state
            .row_logits(&self.model, 0, out)
            .map_err(device_error)
    }

    fn node_logits(&mut self, node: usize, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.state
            .row_logits(&self.model, node, out)
            .map_err(device_error)
    }

    fn vocab(&self) -> usize {
        self.model.config.vocab
    }

    /// Sampled requests take the device's top-k selection (only the k best logits cross);
    /// `KASOKU_CUDA_TOPK=0` copies whole rows instead, for measuring.
    fn max_top_logits(&self) -> usize {
        if std::env::var("KASOKU_CUDA_TOPK").is_ok_and(|v| v == "0") {
            0
        } else {
            MAX_TOP_K
        }
    }

    fn top_logits(
        &mut self,
        row: LogitsRow,
        count: usize,
        ids: &[u32],
        top: &mut Vec<(u32, f32)>,
        gathered: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        // Row 0 is the last row of a prefill or step (the head computes only it or the one).
        let row = match row {
            LogitsRow::Last => 0,
            LogitsRow::Node(node) => node,
        };
        self.state
            .top_logits(&self.model, row, count, ids, top, gathered)
            .map_err(device_error)
    }

    fn verify(&mut self, tree: &TokenTree) -> Result<Vec<u32>, EngineError> {
        self.state.verify(&self.model, tree).map_err(device_error)
    }

    fn commit(&mut self, path: &[usize]) -> Result<(), EngineError> {
        self.state.commit(&self.model, path).map_err(device_error)
    }

    /// Recorded inside each pass (captured graphs included) by device-to-device copies.
    fn set_tap_layers(&mut self, layers: &[usize]) -> Result<(), EngineError> {
        self.state
            .set_tap_layers(&self.model, layers)
            .map_err(device_error)
    }

    /// A feed of more than `PREFILL_ROWS` tokens keeps only its last pass's rows.
    fn tap_rows(&mut self, rows: &[usize], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.state
            .tap_rows(&self.model, rows, out)
            .map_err(device_error)
    }

    /// The state's [`crate::model::TapView`]: a DFlash drafter on this GPU reads the rows in
    /// place.
    fn device_taps(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        self.state
            .device_taps()
            .map(|v| v as &(dyn std::any::Any + Send + Sync))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_model_can_be_shared_by_server_threads() {
        fn shared<T: DeviceModel + Send + Sync + 'static>() {}
        shared::<CudaDevice>();
    }
}
