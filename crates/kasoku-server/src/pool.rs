//! The generation side of the server: the shared engine (model, prefix cache, metrics), a
//! FIFO queue of jobs bounded in length, and `--parallel` worker threads that each own a
//! session (a `Generator`: on the CPU or on a device, see `target`) and run jobs to
//! completion, streaming events back to the request's handler. A job whose handler has gone
//! (client disconnected) stops at its next token, or is skipped if it has not started.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kasoku::engine::{EngineError, Flow, GenerateOptions, GenerationStats, Generator, PrefixCache};
use kasoku_grammar::{GrammarError, Grammars};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::Speculation;
use crate::error::ApiError;
use crate::logprobs::Entry;
use crate::metrics::{add, Metrics};
use crate::output::{Delta, Output, ThinkTokens};
use crate::prompt::ControlText;
use crate::target::{new_session, Target, TextSide};
use crate::tool_calls::ToolSyntax;

/// Everything the requests share: weights, tokenizer, cache, counters.
pub struct Engine {
    /// Tokenizer, template, defaults: the text side.
    pub model: TextSide,
    /// Where the passes run.
    pub target: Target,
    /// The name /v1/models reports.
    pub id: String,
    /// Context per session.
    pub ctx: usize,
    pub stop_tokens: Vec<u32>,
    pub think: Option<ThinkTokens>,
    pub cache: Option<Mutex<PrefixCache>>,
    pub metrics: Metrics,
    /// Speculative decoding settings, and the draft model shared by every session.
    pub speculation: Speculation,
    /// The vocabulary's control-token spellings, kept as text in what clients write.
    pub control: ControlText,
    /// Names a request's `model` may use.
    pub names: Vec<String>,
    /// Prompt bytes per context token beyond which a prompt is refused untokenized.
    pub prompt_bytes_per_token: usize,
    /// Constrained decoding over the model's vocabulary, prepared on first use.
    pub grammars: OnceLock<Result<Grammars, GrammarError>>,
}

impl Engine {
    /// The grammar compiler (built on the first request that needs one).
    pub fn grammars(&self) -> Result<&Grammars, ApiError> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(&self.model.tokenizer, self.model.vocab, &self.stop_tokens)
            })
            .as_ref()
            .map_err(|e| ApiError::bad_request("grammar_unavailable", e.to_string()))
    }
}

/// One request's generation work.
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub stop: Vec<String>,
    /// The prompt ends inside an open `<think>` block.
    pub in_thinking: bool,
    /// Parse tool calls out of the answer, in this syntax.
    pub tools: Option<ToolSyntax>,
    /// Makes the ids of this answer's tool calls.
    pub call_id_prefix: String,
    /// Reuse and store prefixes in the prefix cache (when the server has one).
    pub use_cache: bool,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// What a worker tells the handler.
#[derive(Debug)]
pub enum Event {
    Delta(Delta),
    Done(Box<Done>),
    Error(ApiError),
}

/// The end of a generation.
#[derive(Debug)]
pub struct Done {
    /// `stop`, `length` or `tool_calls`.
    pub finish: &'static str,
    /// The stop string that ended the answer, if one did.
    pub stop_sequence: Option<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stats: GenerationStats,
    pub queue_time: Duration,
}

/// The queue and its workers.
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
    capacity: usize,
    running: AtomicUsize,
    sessions: usize,
    /// No more jobs come: workers finish the queue and exit.
    closed: AtomicBool,
    /// The server is stopping: new jobs are refused.
    stopping: AtomicBool,
    /// Running jobs end at their next token (the shutdown grace is over).
    cut: AtomicBool,
}

impl Pool {
    /// Starts `sessions` workers; at most `capacity` jobs wait beyond the running ones.
    pub fn start(engine: Arc<Engine>, sessions: usize, capacity: usize) -> Pool {
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            capacity,
            running: AtomicUsize::new(0),
            sessions: sessions.max(1),
            closed: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            cut: AtomicBool::new(false),
        });
        for i in 0..shared.sessions {
            let (shared, engine) = (Arc::clone(&shared), Arc::clone(&engine));
            std::thread::Builder::new()
                .name(format!("kasoku-session-{i}"))
                .spawn(move || worker(&shared, &engine))
                .expect("spawn a session thread");
        }
        Pool { shared }
    }

    /// Queues a job, or refuses it (503) when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let mut queue = self.shared.lock();
        if self.shared.stopping.load(Ordering::Relaxed) {
            return Err(shutting_down());
        }
        // Jobs that idle sessions are about to take do not count as waiting.
        let idle = self
            .shared
            .sessions
            .saturating_sub(self.shared.running.load(Ordering::Relaxed));
        if queue.len() >= self.shared.capacity + idle {
            return Err(ApiError::overloaded(format!(
                "the server is busy: {} requests are waiting; retry later",
                queue.len()
            )));
        }
        queue.push_back(job);
        drop(queue);
        self.shared.ready.notify_one();
        Ok(())
    }

    pub fn queue_depth(&self) -> usize {
        self.shared.lock().len()
    }

    pub fn running(&self) -> usize {
        self.shared.running.load(Ordering::Relaxed)
    }

    pub fn sessions(&self) -> usize {
        self.shared.sessions
    }

    /// The server is stopping: refuses new jobs and answers the waiting ones 503; running
    /// ones go on (until [`Pool::cut`]).
    pub fn stop_taking(&self) {
        let waiting: Vec<Job> = {
            let mut queue = self.shared.lock();
            self.shared.stopping.store(true, Ordering::Relaxed);
            queue.drain(..).collect()
        };
        for job in waiting {
            let _ = job.events.send(Event::Error(shutting_down()));
        }
    }

    /// Ends every running job at its next token (or prefill block): each finishes with
    /// `finish_reason: "length"`, its text so far delivered.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::Relaxed);
    }

    /// Lets the workers exit once the queue is empty (the server is stopping).
    pub fn close(&self) {
        let _queue = self.shared.lock();
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.ready.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn worker(shared: &Shared, engine: &Engine) {
    // Made in this thread (a device binds its context to it) before any job; made again for
    // the next job after a failure, which that job is told of.
    let mut session: Option<Box<dyn Generator>> = new_session(engine).ok();
    loop {
        let job = {
            let mut queue = shared.lock();
            loop {
                if let Some(job) = queue.pop_front() {
                    shared.running.fetch_add(1, Ordering::Relaxed);
                    break job;
                }
                if shared.closed.load(Ordering::Relaxed) {
                    return;
                }
                queue = shared.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        if job.events.is_closed() {
            add(&engine.metrics.requests_cancelled, 1);
        } else {
            engine.metrics.queue_wait.observe(job.arrived.elapsed());
            if session.is_none() {
                match new_session(engine) {
                    Ok(s) => session = Some(s),
                    Err(e) => {
                        add(&engine.metrics.requests_error, 1);
                        let _ = job.events.send(Event::Error(ApiError::internal(format!(
                            "cannot start a session: {e}"
                        ))));
                    }
                }
            }
            if let Some(s) = session.as_mut() {
                let cut = || shared.cut.load(Ordering::Relaxed);
                let ran = catch_unwind(AssertUnwindSafe(|| run(engine, s.as_mut(), &job, &cut)));
                if ran.is_err() {
                    add(&engine.metrics.requests_error, 1);
                    let _ = job.events.send(Event::Error(ApiError::internal(
                        "generation failed unexpectedly (the engine panicked); the session was reset",
                    )));
                    session = None;
                }
            }
        }
        shared.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The answer to work that arrives or waits while the server stops.
fn shutting_down() -> ApiError {
    ApiError {
        code: Some("shutting_down"),
        ..ApiError::overloaded("the server is shutting down")
    }
}

/// Runs one job; `cut()` true ends it early (the server is stopping).
fn run(engine: &Engine, session: &mut dyn Generator, job: &Job, cut: &dyn Fn() -> bool) {
    let started = Instant::now();
    let queue_time = started - job.arrived;
    let tx = &job.events;
    let mut output = Output::new(
        &engine.model.tokenizer,
        engine.think,
        job.in_thinking,
        &job.stop,
        job.tools.clone().map(|s| (s, job.call_id_prefix.as_str())),
    );
    let mut cancelled = false;
    let was_cut = std::cell::Cell::new(false);
    let cut = || {
        let now = cut();
        was_cut.set(was_cut.get() || now);
        now
    };
    let cache = engine.cache.as_ref().filter(|_| job.use_cache);
    let result = session.generate_until(
        cache,
        &job.prompt,
        &job.options,
        &|| tx.is_closed() || cut(),
        &mut |emitted| {
            if tx.is_closed() {
                cancelled = true;
                return Flow::Stop;
            }
            let mut delta = output.push(emitted.token);
            if let Some(lp) = emitted.logprobs {
                delta.logprobs.push(Entry::new(&engine.model.tokenizer, lp));
            }
            if !delta.is_empty() {
                let _ = tx.send(Event::Delta(delta));
            }
            if output.done() || cut() {
                Flow::Stop
            } else {
                Flow::Continue
            }
        },
    );
    let m = &engine.metrics;
    let generation = match result {
        Ok(g) => g,
        Err(e) => {
            add(&m.requests_error, 1);
            let _ = tx.send(Event::Error(engine_error(e)));
            return;
        }
    };
    if cancelled || tx.is_closed() {
        add(&m.requests_cancelled, 1);
        return;
    }
    let tail = output.finish();
    if !tail.is_empty() {
        let _ = tx.send(Event::Delta(tail));
    }
    let stats = generation.stats;
    add(&m.requests_ok, 1);
    add(&m.prompt_tokens, stats.prompt_tokens);
    add(&m.cached_tokens, stats.cached_tokens);
    add(&m.completion_tokens, generation.tokens.len());
    add(&m.decode_passes, stats.decode_passes);
    add(&m.decode_tokens, stats.decode_tokens);
    m.time_to_first_token
        .observe(queue_time + stats.time_to_first_token);
    m.request_duration.observe(job.arrived.elapsed());
    let finish = if !output.calls().is_empty() {
        "tool_calls"
    } else if output.done() {
        "stop"
    } else if was_cut.get() {
        // Cut short by the server stopping: as if max_tokens had been reached.
        "length"
    } else {
        generation.finish.as_str()
    };
    let _ = tx.send(Event::Done(Box::new(Done {
        finish,
        stop_sequence: output.stop_sequence().map(str::to_string),
        prompt_tokens: job.prompt.len(),
        completion_tokens: generation.tokens.len(),
        stats,
        queue_time,
    })));
}

/// Engine errors as API errors: bad input is a 400, the rest a 500.
fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::PromptTooLong { .. } => {
            ApiError::bad_request("context_length_exceeded", e.to_string())
        }
        EngineError::Param(p) => ApiError::invalid(p.name, p.to_string()),
        EngineError::EmptyPrompt => ApiError::bad_request("empty_prompt", e.to_string()),
        other => ApiError::internal(format!("generation failed: {other}")),
    }
}
