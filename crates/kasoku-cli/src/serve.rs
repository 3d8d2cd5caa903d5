//! `kasoku serve`: its flags, turned into a `kasoku_server::ServerConfig`, and the device the
//! sessions run on (`--device`: a GPU model handed to `Server::on_device`, or the CPU model to
//! `Server::new`); the server itself (routes, queue, sessions) is the `kasoku-server` crate.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kasoku::engine;
use kasoku::model::KvType;
use kasoku_server::{DeviceServed, PrefixCacheConfig, Server, ServerConfig, Speculation};

/// Arguments of `kasoku serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// GGUF file, Hugging Face directory, or a known model name.
    #[arg(long)]
    pub model: String,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Turn the prefix cache off (every request recomputes its whole prompt).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Prefix cache memory budget in MiB.
    #[arg(long, default_value_t = 1024)]
    pub prefix_cache_mb: usize,
    /// Prompt tokens between prefix cache snapshots of recurrent (hybrid) models.
    #[arg(long, default_value_t = engine::prefix_cache::DEFAULT_BLOCK)]
    pub prefix_cache_block: usize,
    /// Require `Authorization: Bearer KEY` on every /v1 route.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sessions generating at once (default: 1 per 4 cores, at least 1).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Requests waiting beyond the running ones before new ones get 503.
    #[arg(long, default_value_t = 64)]
    pub queue_size: usize,
    /// Context length per session (default: the model's own, shortened only when memory
    /// cannot hold every session's; a length that cannot fit is refused).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// How the KV caches store keys and values: f32, f16 or q8_0 (llama.cpp's block format).
    #[arg(long, default_value = "f16")]
    pub cache_type: KvType,
    /// Quantize the matrices to kasoku's formats as the model loads: m, l or mixed (see
    /// `kasoku quantize`).
    #[arg(long, value_parser = crate::quantize::parse_scheme)]
    pub quantize: Option<kasoku::quant::kasoku::Scheme>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Name reported by /v1/models (default: the model file's stem).
    #[arg(long)]
    pub alias: Option<String>,
    /// A web origin (http://host:port, or * for any) whose pages may call the server
    /// (repeatable). Without it, requests carrying a browser's Origin are refused (403).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// A host name (NAME or NAME:PORT) requests may address the server by, besides localhost,
    /// loopback addresses and the bound address (repeatable; e.g. behind a reverse proxy).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Connections open at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers; also the longest a kept-alive
    /// connection may idle.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub body_timeout: f64,
    /// Memory, in MiB, that all request bodies being received may take together (503 beyond).
    #[arg(long, default_value_t = 64)]
    pub body_memory_mb: usize,
    /// Seconds running generations may go on after SIGTERM/SIGINT before they are ended
    /// (streams get a final chunk with finish_reason "length" and [DONE]).
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub shutdown_grace: f64,
    /// Where the sessions run: cpu, cuda or cuda:N (default: the first GPU when one is usable
    /// and runs this model and these settings, else the CPU; startup and /metrics say which).
    /// On a GPU one request runs at a time and the others queue.
    #[arg(long)]
    pub device: Option<kasoku_cuda::Device>,
    /// Speculative decoding for every session (usage reports `spec_verify_ct`, the target
    /// passes, and `spec_accepted_tokens`).
    #[command(flatten)]
    pub spec: crate::spec_args::SpecArgs,
}

/// A `--...-timeout` value as a duration (a clear error for a negative or absurd one).
fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero() || flag == "--shutdown-grace")
        .with_context(|| format!("{flag} {secs}: expected a positive number of seconds"))
}

impl ServeArgs {
    /// The server configuration these flags describe (the draft model already loaded).
    fn config(&self, draft: Option<kasoku::engine::DraftSource>) -> anyhow::Result<ServerConfig> {
        use kasoku::engine::DraftSource;
        let (draft, dflash) = match draft {
            Some(DraftSource::Model(d)) => (Some(d), None),
            Some(DraftSource::DFlash(d)) => (None, Some(d)),
            None => (None, None),
        };
        Ok(ServerConfig {
            context: self.ctx_size,
            sessions: self.parallel,
            queue_size: self.queue_size,
            prefix_cache: (!self.no_prefix_cache).then_some(PrefixCacheConfig {
                budget_bytes: self.prefix_cache_mb << 20,
                block_tokens: self.prefix_cache_block,
            }),
            api_key: self.api_key.clone(),
            max_body_bytes: self.max_body_bytes,
            max_connections: self.max_connections,
            header_timeout: seconds("--header-timeout", self.header_timeout)?,
            body_timeout: seconds("--body-timeout", self.body_timeout)?,
            body_memory_bytes: self.body_memory_mb << 20,
            cors_origins: self.cors_origins.clone(),
            allowed_hosts: self.allowed_hosts.clone(),
            shutdown_grace: seconds("--shutdown-grace", self.shutdown_grace)?,
            model_id: self.alias.clone(),
            // The name given on the command line ("smollm2-135m") is one a client may use.
            aliases: vec![self.model.clone()],
            speculation: Speculation {
                kind: self.spec.spec,
                draft,
                dflash,
                policy: self.spec.policy(),
            },
            handle_signals: true,
            ..ServerConfig::default()
        })
    }
}

pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let gpu = crate::run_gpu::pick(args.device, &args.model, false, &|path| {
        crate::run_gpu::unsupported_settings(
            path,
            args.spec.spec,
            args.spec.draft.as_deref(),
            true,
            args.cache_type,
            args.quantize.is_some(),
        )
        .or_else(|| {
            (args.parallel.is_some_and(|n| n > 1))
                .then(|| "the GPU serves one request at a time (--parallel 1)".into())
        })
    })?;
    let server = match gpu {
        Some(m) => {
            let spec = args.spec.with_shipped_drafter(&args.model, false);
            let drafter = crate::draft_gpu::load_for(&spec, &m, false)?
                .map(|draft| crate::draft_gpu::session_drafter(&m, draft));
            let served = DeviceServed {
                path: m.path.clone(),
                tokenizer: m.tokenizer.clone(),
                template: m.template.clone(),
                defaults: None,
                model: m.device.clone(),
                drafter,
            };
            Server::on_device(
                served,
                args.config(None)?,
                crate::run_gpu::DEFAULT_GPU_CONTEXT,
            )?
        }
        None => {
            let model = crate::run::load(
                &args.model,
                args.threads,
                args.cache_type,
                args.quantize,
                false,
            )?;
            let spec = args.spec.with_shipped_drafter(&args.model, false);
            let draft = spec.load_draft(&model.model, args.cache_type, false)?;
            Server::new(model, args.config(draft)?)?
        }
    };
    if let Some(note) = server.context_note() {
        eprintln!("note: {note}");
    }
    let addr = format!("{}:{}", args.host, args.port);
    let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
    eprintln!(
        "kasoku serve: '{}' on http://{} (device {}, {} session(s), context {}, prefix cache {})",
        server.model_id(),
        listener.local_addr()?,
        server.device(),
        server.sessions(),
        server.context(),
        match (args.no_prefix_cache, server.device().as_str()) {
            (true, _) => "off".to_string(),
            (false, "cpu") => format!("{} MiB", args.prefix_cache_mb),
            (false, _) => "the session's own".to_string(),
        }
    );
    server.serve(listener)?;
    eprintln!("kasoku serve: stopped");
    Ok(())
}
