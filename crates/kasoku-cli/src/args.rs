//! Command-line arguments of every `kasoku` subcommand.

use clap::{Args, Parser, Subcommand};
use kasoku::model::KvType;

#[derive(Parser, Debug)]
#[command(
    name = "kasoku",
    version,
    about = "Fast local LLM inference on your own machine"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate from a prompt (-m), or chat interactively without -m.
    Run(RunArgs),
    /// Print next-token logits at every position of a token sequence, as JSON.
    Logits {
        /// GGUF file, Hugging Face directory, or a known model name.
        #[arg(long)]
        model: String,
        /// Comma-separated token ids, e.g. 3,17,99.
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
        #[arg(long)]
        threads: Option<usize>,
        /// cpu, cuda or cuda:N (default: the GPU when one is usable, else the CPU; the
        /// choice is printed to stderr). The GPU runs GGUF files of dense models.
        #[arg(long)]
        device: Option<kasoku_cuda::Device>,
    },
    /// Describe a checkpoint: architecture, hyper-parameters, tensors, tokenizer, template.
    Inspect {
        /// GGUF file, Hugging Face directory, or a known model name.
        path: String,
        /// List every tensor.
        #[arg(long)]
        tensors: bool,
    },
    /// Measure one engine run: prefill, decode and the multi-row verify curve (JSON output).
    Bench(BenchArgs),
    /// Serve a model over an OpenAI-compatible HTTP API.
    Serve(crate::serve::ServeArgs),
    /// Measure OpenAI-compatible endpoints with one deterministic streaming chat request.
    BenchClient(crate::bench_client::BenchClientArgs),
    /// Convert a checkpoint to kasoku's own formats (M: 4-bit, L: 8-bit, after a rotation).
    Quantize(crate::quantize::QuantizeArgs),
    /// Download known models into the cache (lists them without names).
    Fetch {
        names: Vec<String>,
        #[arg(long)]
        list: bool,
        /// Re-hash every cached model (ignoring earlier checks), remove the ones that do not
        /// match and the leftovers of interrupted fetches; exit 1 if any was corrupt.
        #[arg(long)]
        verify: bool,
    },
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// GGUF file, Hugging Face directory, or a known model name (default: qwen2.5-coder-0.5b, fetched on first use).
    #[arg(long)]
    pub model: Option<String>,
    /// The prompt; without it, an interactive chat starts.
    #[arg(short = 'm', long = "message")]
    pub message: Option<String>,
    /// System prompt for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Feed the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Turn the model's thinking on, where its template supports it.
    #[arg(long)]
    pub think: bool,
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 512)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub penalty_last_n: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past the model's end-of-text tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Context length (default: the model's own, shortened only when memory cannot hold it).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// How the KV cache stores keys and values: f32, f16 or q8_0 (llama.cpp's block format).
    #[arg(long, default_value = "f16")]
    pub cache_type: KvType,
    /// Quantize the matrices to kasoku's formats as the model loads: m, l or mixed (see
    /// `kasoku quantize`).
    #[arg(long, value_parser = crate::quantize::parse_scheme)]
    pub quantize: Option<kasoku::quant::kasoku::Scheme>,
    /// Print only the answer, no statistics or progress.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// cpu, cuda or cuda:N (default: the GPU when one is usable and runs this request, else
    /// the CPU; the statistics say which). The GPU runs GGUF files of dense models, greedy (with
    /// prompt lookup) or sampled.
    #[arg(long)]
    pub device: Option<kasoku_cuda::Device>,
    #[command(flatten)]
    pub spec: crate::spec_args::SpecArgs,
}

impl RunArgs {
    /// `--model`, or the default model when it is not given.
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or(kasoku_fetch::DEFAULT_MODEL)
    }
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// GGUF file, Hugging Face directory, or a known model name.
    #[arg(long)]
    pub model: String,
    /// cpu (default) or cuda / cuda:N: where the passes run.
    #[arg(long)]
    pub device: Option<kasoku_cuda::Device>,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens to generate for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Forward-pass sizes for the verify curve, comma-separated (`none` or empty: skip it).
    #[arg(long, default_value = "1,2,4,8,16")]
    pub verify: String,
    /// Print where a decode step's time goes, per kernel kind.
    #[arg(long)]
    pub profile: bool,
    #[arg(long)]
    pub threads: Option<usize>,
    /// How the KV cache stores keys and values: f32, f16 or q8_0.
    #[arg(long, default_value = "f16")]
    pub cache_type: KvType,
    /// Positions already in the cache when decode steps and the verify curve are timed
    /// (e.g. 8192 to measure decoding deep into a long context).
    #[arg(long, default_value_t = crate::bench::CONTEXT)]
    pub context: usize,
    /// Write the result as JSON to this file (also printed).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Instead: generate `--gen-tokens` (greedy) for each prompt of this JSON-lines file
    /// (`{"prompt": "..."}` per line, fed without a template) with the decoding strategy below.
    #[arg(long)]
    pub prompts: Option<std::path::PathBuf>,
    /// With --prompts: several strategies side by side, taking turns prompt by prompt so that a
    /// drifting machine affects them alike, e.g. `none,ngram,draft,auto,auto+draft`. A strategy
    /// gets the --draft model only when it is `draft` or ends in `+draft`.
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    #[command(flatten)]
    pub spec: crate::spec_args::SpecArgs,
}
