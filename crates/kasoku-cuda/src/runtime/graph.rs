//! CUDA graphs: the kernels (and pinned-memory copies) of one forward pass captured from the
//! stream once per batch shape, then replayed with one launch. Kernel parameters are fixed at
//! capture, so everything that changes between passes lives in device memory the pass reads
//! (the batch description, filled by a captured copy from pinned host memory).

use std::sync::Arc;

use cudarc::driver::sys;

use super::{check, Gpu, Result};

/// An instantiated graph.
pub struct Graph {
    gpu: Arc<Gpu>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles are driver objects; launches go through the owning Gpu's stream.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures what `record` queues on `gpu`'s stream (nothing runs during capture).
    pub fn capture(gpu: &Arc<Gpu>, record: impl FnOnce() -> Result<()>) -> Result<Graph> {
        gpu.bind()?;
        // SAFETY: the stream belongs to the current context; capture ends below on every path.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                gpu.stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })?;
        let recorded = record();
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above; out-pointer to a local.
        let ended = check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(gpu.stream(), &mut graph)
        });
        recorded?;
        ended?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just captured; out-pointer to a local.
        if let Err(e) = check("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        }) {
            // SAFETY: destroy the graph we own.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Graph {
            gpu: gpu.clone(),
            graph,
            exec,
        })
    }

    /// Queues one replay on the stream.
    pub fn launch(&self) -> Result<()> {
        // SAFETY: an instantiated graph of this context, on its stream.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, self.gpu.stream())
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created in `capture`; destroyed once.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}
