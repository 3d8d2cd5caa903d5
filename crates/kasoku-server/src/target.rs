//! Where a server's sessions run, and the text side every target shares.
//!
//! [`Target::Cpu`] is a `kasoku::Model` in memory: `--parallel` sessions over the shared
//! weights, each with its own speculator, and the shared prefix cache of CPU states.
//! [`Target::Device`] is a model on a device (a GPU, through `kasoku::engine::DeviceModel`):
//! one session, so requests wait in the queue and run one at a time; it reuses the prefix of
//! its own state (when the server has a prefix cache and the request allows it) and drafts
//! by prompt lookup, or with a drafter that runs on the device itself (a draft model on the
//! same GPU) made per session by the [`DeviceDrafter`] the binary hands over. Nothing here
//! names CUDA: the binary hands the server a device model ([`crate::Server::on_device`]).

use std::path::PathBuf;
use std::sync::Arc;

use kasoku::engine::{
    device_draft_speculator, device_speculator, DeviceModel, DeviceSession, EngineError, Generator,
    Session, SpecKind, Speculator,
};
use kasoku::format::hf_config::GenerationDefaults;
use kasoku::model::Model;
use kasoku::spec::Drafter;
use kasoku::tokenizer::{ChatTemplate, Tokenizer};

use crate::pool::Engine;

/// What turns requests into tokens and back, whatever runs the passes.
pub struct TextSide {
    /// The checkpoint it was loaded from.
    pub path: PathBuf,
    pub tokenizer: Arc<Tokenizer>,
    /// `None` when the checkpoint ships no chat template (then only raw prompts work).
    pub template: Option<Arc<ChatTemplate>>,
    /// Sampling defaults from generation_config.json (HF directories only).
    pub defaults: Option<GenerationDefaults>,
    /// Rows of the model's embedding: token ids below it are valid.
    pub vocab: usize,
}

/// Where the passes run.
pub enum Target {
    /// The CPU, sessions sharing these weights.
    Cpu(Arc<Model>),
    /// A device; one session, drafting with the device's own drafter when there is one.
    Device(Arc<dyn DeviceModel>, Option<DeviceDrafter>),
}

/// Makes a drafter that runs on the device (a draft model on the same GPU) for a session of
/// the given context; the server makes one per session, for speculation `draft` and `auto`.
pub type DeviceDrafter = Arc<dyn Fn(usize) -> Result<Box<dyn Drafter>, EngineError> + Send + Sync>;

/// The speculator of a device session of `ctx` tokens: the device's own drafter for `draft`
/// and `auto` when there is one, else what the device drafts without one (`draft_given`: a
/// draft for the CPU was configured, which the device refuses).
pub fn device_session_speculator(
    kind: SpecKind,
    drafter: Option<&DeviceDrafter>,
    draft_given: bool,
    policy: kasoku::spec::PolicyConfig,
    ctx: usize,
) -> Result<Option<Speculator>, EngineError> {
    match drafter {
        Some(make) if matches!(kind, SpecKind::Draft | SpecKind::Auto) => {
            device_draft_speculator(kind, make(ctx)?, policy)
        }
        _ => device_speculator(kind, draft_given, policy),
    }
}

impl Target {
    /// `cpu`, or the device's name (`cuda:0`).
    pub fn device(&self) -> String {
        match self {
            Target::Cpu(_) => "cpu".into(),
            Target::Device(d, _) => d.device(),
        }
    }
}

/// A model on a device, as [`crate::Server::on_device`] takes it: its passes behind
/// [`DeviceModel`] and its text side loaded on the host.
pub struct DeviceServed {
    /// The checkpoint it was loaded from.
    pub path: PathBuf,
    /// The tokenizer that came with the checkpoint.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template, when it has one.
    pub template: Option<Arc<ChatTemplate>>,
    /// Sampling defaults from generation_config.json, if any.
    pub defaults: Option<GenerationDefaults>,
    /// The weights on the device, making one state per session.
    pub model: Arc<dyn DeviceModel>,
    /// A drafter on the device for speculation `draft` and `auto` (a draft model beside the
    /// weights), made per session; None: prompt lookup only.
    pub drafter: Option<DeviceDrafter>,
}

/// The one place sessions are made: on the CPU, a session with its own speculator (drafter
/// state and budget policy) over the shared weights; on a device, a state of the server's
/// context with prompt lookup or the device's own drafter. The options were checked at startup; a
/// device that cannot make a state now is an error for the request, not a panic.
pub fn new_session(engine: &Engine) -> Result<Box<dyn Generator>, EngineError> {
    let spec = &engine.speculation;
    match &engine.target {
        Target::Cpu(model) => {
            let mut session = Session::new(Arc::clone(model), engine.ctx);
            session.set_speculator(spec.speculator(model, engine.ctx)?);
            Ok(Box::new(session))
        }
        Target::Device(model, drafter) => {
            let mut session = DeviceSession::on(model.as_ref(), engine.ctx)?;
            session.set_speculator(device_session_speculator(
                spec.kind,
                drafter.as_ref(),
                spec.draft.is_some() || spec.dflash.is_some(),
                spec.policy,
                engine.ctx,
            )?);
            Ok(Box::new(session))
        }
    }
}
