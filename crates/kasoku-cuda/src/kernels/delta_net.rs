//! Launchers of the Gated DeltaNet kernels (`delta_net.cu`): the conv and head preparation,
//! the recurrence over a chain or a tree (with a chain's conv-state advance), the gated output
//! norm, and the commit of an accepted tree path. Shapes are checked before anything
//! is queued.

use super::{p, quant_targets, Acts, Kernels};
use crate::runtime::{Error, Result};

/// The most a key head holds (GDN_MAX_DK in delta_net.cu: the recurrence keeps a state column
/// in registers, four values a lane).
pub const GDN_MAX_DK: usize = 128;
/// The largest head the conv kernel takes (GDN_MAX_HEAD).
pub const GDN_MAX_HEAD: usize = 256;

/// One Gated DeltaNet layer's geometry (`struct GdnShape` in delta_net.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnShape {
    pub nk: i32,
    pub nv: i32,
    pub dk: i32,
    pub dv: i32,
    /// Conv taps (K).
    pub kernel: i32,
    /// 1: value head `h` reads key head `h / (nv/nk)` (Hugging Face order); 0: `h % nk`
    /// (GGUF order).
    pub grouped: i32,
}

impl GdnShape {
    /// Channels of the conv: `2·nk·dk + nv·dv`.
    pub fn conv_dim(&self) -> usize {
        (2 * self.nk * self.dk + self.nv * self.dv) as usize
    }

    /// `nk·dk`.
    pub fn key_dim(&self) -> usize {
        (self.nk * self.dk) as usize
    }

    /// `nv·dv`.
    pub fn value_dim(&self) -> usize {
        (self.nv * self.dv) as usize
    }

    /// f32 values of one layer's recurrent state: `nv × dv × dk`.
    pub fn state_len(&self) -> usize {
        (self.nv * self.dv * self.dk) as usize
    }

    /// f32 values of one layer's conv state: `(K−1) × conv_dim`.
    pub fn conv_state_len(&self) -> usize {
        (self.kernel as usize - 1) * self.conv_dim()
    }

    /// Whether the kernels take this geometry; the reason when they do not.
    pub fn check(&self) -> Result<()> {
        let ok = self.nk > 0
            && self.nv > 0
            && self.nv % self.nk == 0
            && self.dk > 0
            && self.dv > 0
            && self.dk as usize <= GDN_MAX_DK
            && self.dv as usize <= GDN_MAX_HEAD
            && self.kernel >= 2;
        if !ok {
            return Err(Error::Invalid(format!(
                "Gated DeltaNet geometry {self:?}: the GPU kernels take key heads of at most \
                 {GDN_MAX_DK}, value heads of at most {GDN_MAX_HEAD}, nv a multiple of nk and \
                 a conv of at least 2 taps"
            )));
        }
        Ok(())
    }
}

/// Parameters of [`Kernels::gdn_conv`] (device addresses).
#[derive(Clone, Copy, Debug)]
pub struct GdnConv {
    pub shape: GdnShape,
    pub n: usize,
    /// The pass's q|k|v projections, `n × conv_dim`.
    pub mixed: u64,
    /// Taps, `conv_dim × K`.
    pub taps: u64,
    pub conv_state: u64,
    /// Per row the β then α projections (`n × 2·nv`).
    pub ba: u64,
    pub ssm_a: u64,
    pub dt_bias: u64,
    /// `1/sqrt(dk)`.
    pub q_scale: f32,
    pub batch: u64,
    pub pos: u64,
    pub path: u64,
    /// Out: the prepared rows (`n × conv_dim`) and gates (`n × 2·nv`).
    pub qkv: u64,
    pub gates: u64,
}

/// Parameters of [`Kernels::gdn_recurrence`].
#[derive(Clone, Copy, Debug)]
pub struct GdnRecurrence {
    pub shape: GdnShape,
    pub qkv: u64,
    pub gates: u64,
    /// The layer's recurrent state (advanced by a chain, read by a tree).
    pub state: u64,
    pub batch: u64,
    pub pos: u64,
    pub path: u64,
    /// Out: `n × nv·dv` each.
    pub out: u64,
    pub deltas: u64,
    /// The pass's conv inputs and the layer's conv state (a chain advances it past them).
    pub mixed: u64,
    pub conv_state: u64,
}

/// Parameters of [`Kernels::gdn_commit`]: every GDN layer's states and the rows of the tree
/// each verified, `layers` of each at the given strides (f32 values).
#[derive(Clone, Copy, Debug)]
pub struct GdnCommit {
    pub shape: GdnShape,
    pub layers: usize,
    pub state: u64,
    pub state_stride: usize,
    pub conv_state: u64,
    pub conv_stride: usize,
    pub mixed: u64,
    pub mixed_stride: usize,
    pub qkv: u64,
    pub qkv_stride: usize,
    pub gates: u64,
    pub gates_stride: usize,
    pub deltas: u64,
    pub deltas_stride: usize,
    /// Device address of the path's node indices (i32), root first.
    pub path: u64,
    pub len: usize,
}

/// Blocks per row of `gdn_out`: one per value head where heads hold whole int8 blocks of 32
/// (each normalizes and quantizes its own), else one for the row.
pub fn gdn_out_blocks_per_row(shape: GdnShape) -> usize {
    if shape.dv % 32 == 0 {
        shape.nv as usize
    } else {
        1
    }
}

impl Kernels {
    /// The conv + SiLU of a pass's rows and their heads' preparation (see delta_net.cu
    /// `gdn_conv`).
    pub fn gdn_conv(&self, a: &GdnConv) -> Result<()> {
        a.shape.check()?;
        if a.n == 0 {
            return Ok(());
        }
        let s = a.shape;
        self.launch(
            "gdn_conv",
            (a.n as u32, (2 * s.nk + s.nv) as u32, 1),
            128,
            &mut [
                p(&s),
                p(&a.mixed),
                p(&a.taps),
                p(&a.conv_state),
                p(&a.ba),
                p(&a.ssm_a),
                p(&a.dt_bias),
                p(&a.q_scale),
                p(&a.batch),
                p(&a.pos),
                p(&a.path),
                p(&a.qkv),
                p(&a.gates),
            ],
        )
    }

    /// The gated delta rule over a pass's rows, and a chain's conv-state advance past them
    /// (see delta_net.cu `gdn_recurrence`; after [`Kernels::gdn_conv`] of the same rows).
    pub fn gdn_recurrence(&self, a: &GdnRecurrence) -> Result<()> {
        a.shape.check()?;
        let s = a.shape;
        self.launch(
            "gdn_recurrence",
            (s.nv as u32 + 1, (s.dv as u32).div_ceil(4), 1),
            128,
            &mut [
                p(&s),
                p(&a.qkv),
                p(&a.gates),
                p(&a.state),
                p(&a.batch),
                p(&a.pos),
                p(&a.path),
                p(&a.out),
                p(&a.deltas),
                p(&a.mixed),
                p(&a.conv_state),
            ],
        )
    }

    /// Per row and value head of `o` (`n × nv·dv`): RMSNorm with `w` (dv values) times
    /// silu(z), in place, and the rows' int8 blocks into `out.xq`/`out.xs` when set.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_out(
        &self,
        shape: GdnShape,
        o: u64,
        z: u64,
        w: u64,
        eps: f32,
        n: usize,
        out: Acts,
    ) -> Result<()> {
        shape.check()?;
        let (xq, xs) = quant_targets(out, shape.value_dim())?;
        if n == 0 {
            return Ok(());
        }
        self.launch(
            "gdn_out",
            (n as u32, gdn_out_blocks_per_row(shape) as u32, 1),
            128,
            &mut [p(&shape), p(&o), p(&z), p(&w), p(&eps), p(&xq), p(&xs)],
        )
    }

    /// Keeps the accepted path of the tree the GDN layers verified last: each layer's
    /// recurrent state replays the path's updates, its conv state takes the path's last
    /// inputs.
    pub fn gdn_commit(&self, a: &GdnCommit) -> Result<()> {
        a.shape.check()?;
        if a.len == 0 || a.layers == 0 {
            return Ok(());
        }
        let s = a.shape;
        let len = a.len as i32;
        let stride = |v: usize| v as i64;
        let (ss, qs, gs, ds, cs, ms) = (
            stride(a.state_stride),
            stride(a.qkv_stride),
            stride(a.gates_stride),
            stride(a.deltas_stride),
            stride(a.conv_stride),
            stride(a.mixed_stride),
        );
        self.launch(
            "gdn_commit_state",
            (s.nv as u32, (s.dv as u32).div_ceil(4), a.layers as u32),
            128,
            &mut [
                p(&s),
                p(&a.state),
                p(&ss),
                p(&a.qkv),
                p(&qs),
                p(&a.gates),
                p(&gs),
                p(&a.deltas),
                p(&ds),
                p(&a.path),
                p(&len),
            ],
        )?;
        self.launch(
            "gdn_commit_conv",
            (s.conv_dim().div_ceil(128) as u32, a.layers as u32, 1),
            128,
            &mut [
                p(&s),
                p(&a.conv_state),
                p(&cs),
                p(&a.mixed),
                p(&ms),
                p(&a.path),
                p(&len),
            ],
        )
    }
}
