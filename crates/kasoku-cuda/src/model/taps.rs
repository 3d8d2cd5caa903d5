//! What a pass leaves beside its ids: a draft model's cheaper head (only the first token ids
//! scored), the target's tapped layers for a DFlash drafter (recorded per pass, read in
//! place or copied in runs of rows), and the head's logits in place.

use super::*;

impl CudaState {
    /// Makes later passes compute the logits of token ids `0..rows` only (a draft model's
    /// cheaper head: BPE vocabularies put the frequent tokens first); the argmax ids and the
    /// rows' logits then cover those ids alone. `rows` in 1..=vocab; captured graphs are
    /// dropped.
    pub fn set_head_rows(&mut self, m: &CudaModel, rows: usize) -> Result<()> {
        if rows == 0 || rows > m.config.vocab {
            return Err(Error::Invalid(format!(
                "a head of {rows} rows (1..={})",
                m.config.vocab
            )));
        }
        self.head_rows = rows;
        self.drop_graphs();
        Ok(())
    }

    /// Makes every later pass record the outputs of decoder layers `layers` (before the final
    /// norm; in this order) for each of its rows, for [`CudaState::tap_rows`]; an empty list
    /// stops recording (and frees the buffers). Captured graphs are dropped when the list
    /// changes. Checked on an H100 through `kasoku-cuda-check dflash`.
    pub fn set_tap_layers(&mut self, m: &CudaModel, layers: &[usize]) -> Result<()> {
        if self.tap_layers() == layers {
            return Ok(());
        }
        check_tap_layers(layers, m.config.n_layers)?;
        self.drop_graphs();
        self.taps = None;
        if layers.is_empty() {
            return Ok(());
        }
        let bytes = self.rows * layers.len() * m.config.hidden * 4;
        let rows = self.gpu.alloc(bytes)?;
        self.taps = Some(TapBufs {
            layers: layers.to_vec(),
            view: TapView {
                gpu: self.gpu.clone(),
                ptr: rows.ptr(),
                layers: layers.to_vec(),
                hidden: m.config.hidden,
                rows: 0,
            },
            rows,
            picked: self.gpu.alloc(bytes)?,
            host: self.gpu.pinned(bytes)?,
        });
        Ok(())
    }

    /// The recorded rows of the last pass, for a drafter on this GPU that reads them in place
    /// (none when no layers are recorded).
    pub fn device_taps(&self) -> Option<&TapView> {
        self.taps.as_ref().map(|t| &t.view)
    }

    /// The decoder layers each pass records (empty: none).
    pub fn tap_layers(&self) -> &[usize] {
        self.taps.as_ref().map_or(&[], |t| &t.layers)
    }

    /// Queues the copies of layer `layer`'s output rows into the tap buffer, once per tap of
    /// that layer (nothing when no taps are set).
    pub(super) fn record_taps(&self, layer: usize, n: usize, h: usize) -> Result<()> {
        let Some(t) = &self.taps else {
            return Ok(());
        };
        let pitch = t.layers.len() * h * 4;
        for (j, _) in t.layers.iter().enumerate().filter(|(_, &l)| l == layer) {
            t.rows
                .copy_rows_from(j * h * 4, pitch, self.x.ptr(), h * 4, h * 4, n)?;
        }
        Ok(())
    }

    /// The recorded layer outputs of rows `rows` of the last pass (a feed's rows in order, or
    /// a verified tree's nodes, e.g. the accepted path) into `out`: `rows.len() × taps ×
    /// hidden` values, row by row, each row's taps in [`CudaState::tap_layers`]'s order.
    /// The rows are compacted on the device and copied to the host once.
    pub fn tap_rows(&self, m: &CudaModel, rows: &[usize], out: &mut Vec<f32>) -> Result<()> {
        let t = self
            .taps
            .as_ref()
            .ok_or_else(|| Error::Invalid("no layer outputs are recorded".into()))?;
        if let Some(r) = rows.iter().find(|&&r| r >= self.last_rows) {
            return Err(Error::Invalid(format!(
                "tapped row {r} of a pass of {} rows",
                self.last_rows
            )));
        }
        let row_bytes = t.layers.len() * m.config.hidden * 4;
        self.gpu.bind()?;
        for (at, run) in consecutive_runs(rows) {
            t.picked.copy_from(
                at * row_bytes,
                t.rows.at(run.start * row_bytes),
                run.len() * row_bytes,
            )?;
        }
        t.picked.read_async(0, &t.host, rows.len() * row_bytes)?;
        self.gpu.synchronize()?;
        t.host.get_f32s_into(0, rows.len() * row_bytes / 4, out);
        Ok(())
    }

    /// The head's logits of the last pass (row `r` of it at `r × vocab` floats), for kernels
    /// that read them in place.
    pub(crate) fn head_logits(&self) -> &DeviceBuffer {
        &self.logits
    }
}
