//! `kasoku-cuda-check`: the GPU machine's checks and benchmark (tools/gpu_run.sh runs it).
//!
//! ```text
//! kasoku-cuda-check kernels                      every kernel against the CPU backend
//! kasoku-cuda-check topk                         the top-K selection against the host's
//! kasoku-cuda-check packed                       the packed tensor-core products against mma.cu
//! kasoku-cuda-check fixtures DIR                 tests/fixtures through the GPU
//! kasoku-cuda-check spec MODEL.gguf [N]          speculative == plain on the GPU
//! kasoku-cuda-check spec-draft TARGET DRAFT [N]  the same with a draft model on the GPU
//! kasoku-cuda-check session MODEL.gguf [N]       the engine's DeviceSession on the GPU
//! kasoku-cuda-check dflash TARGET.gguf DIR [N]    a DFlash drafter on the GPU: marginals vs
//!                                                the CPU's, speculative == plain
//! kasoku-cuda-check synth SHAPE SCHEME OUT.gguf  a random-weight GGUF (shape: 1.5b, 0.5b,
//!                                                qwen3.5-2b)
//! kasoku-cuda-check bench MODEL.gguf [quick]     tg128, pp512, verify curve k = 1..64
//!                                                (quick: those three alone, to compare
//!                                                switches in one run)
//! kasoku-cuda-check bench-draft TARGET DRAFT     tokens/s with a draft model on the GPU
//! kasoku-cuda-check attn MODEL.gguf              the attention kernel alone, by context
//!                                                length, rows and kernel
//! kasoku-cuda-check pass MODEL.gguf DEPTH K REPS  REPS verifications of K chain tokens
//!                                                after DEPTH (for a profiler)
//! kasoku-cuda-check compile ARCH                 the kernels compiled for ARCH (e.g. sm_90)
//!                                                into the disk cache (KASOKU_CUDA_CACHE):
//!                                                needs NVRTC, not a GPU
//! ```
//! Each prints its lines and exits 1 if a check failed.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kasoku::model::TokenTree;
use kasoku_cuda::checks::{self, Report};
use kasoku_cuda::kernels::{Kernels, MmaPlan};
use kasoku_cuda::model::Skip;
use kasoku_cuda::runtime::{compile, Gpu, Timer};
use kasoku_cuda::synth;
use kasoku_cuda::CudaModel;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    if arg(0) == "synth" {
        let scheme: synth::Scheme = arg(2).parse().map_err(anyhow::Error::msg)?;
        let t = Instant::now();
        let out = Path::new(arg(3));
        let (name, bytes) = match arg(1) {
            "1.5b" => (
                synth::QWEN25_15B.name,
                synth::write(out, &synth::QWEN25_15B, scheme, 1),
            ),
            "0.5b" => (
                synth::QWEN25_05B.name,
                synth::write(out, &synth::QWEN25_05B, scheme, 1),
            ),
            "qwen3.5-2b" => (
                synth::QWEN35_2B.name,
                synth::hybrid::write(out, &synth::QWEN35_2B, scheme, 1),
            ),
            s => bail!("unknown shape {s} (1.5b, 0.5b, qwen3.5-2b)"),
        };
        let bytes = bytes.map_err(anyhow::Error::msg)?;
        println!(
            "synth {name} {:?}: {bytes} tensor bytes in {:.1} s",
            scheme,
            t.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    if arg(0) == "compile" {
        // The GPU machine then loads the cached code instead of spending its time compiling
        // (tools/gpu_run.sh stages the cache beside the binary).
        let t = Instant::now();
        let source = kasoku_cuda::kernels::source();
        let cubin = compile::compile_cached(&source, arg(1))?;
        println!(
            "compiled for {} in {:.1} s: {} bytes of machine code, NVRTC {:?}",
            arg(1),
            t.elapsed().as_secs_f64(),
            cubin.len(),
            compile::nvrtc_version()?
        );
        return Ok(());
    }
    let gpu = Gpu::open(0).context("opening cuda:0")?;
    let (free, total) = gpu.memory()?;
    println!(
        "device: {} (sm_{}{}, {} SMs, {:.1}/{:.1} GiB free), NVRTC {:?}",
        gpu.name,
        gpu.capability.0,
        gpu.capability.1,
        gpu.multiprocessors,
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64,
        compile::nvrtc_version()?
    );
    let report = match arg(0) {
        "kernels" => {
            let t = Instant::now();
            let k = Kernels::new(&gpu)?;
            println!(
                "kernels compiled and loaded in {:.2} s",
                t.elapsed().as_secs_f64()
            );
            checks::kernels(&k)?
        }
        "topk" => checks::top_k_checks(&Kernels::new(&gpu)?)?,
        "packed" => checks::mma_packed_checks(&Kernels::new(&gpu)?)?,
        "fixtures" => {
            let dir = Path::new(arg(1));
            let mut rep = Report::default();
            for (sub, file, tol) in [
                ("llama/tiny", "model-f32.gguf", 5e-3),
                ("llama/tiny", "model-q8_0.gguf", 5e-2),
                ("llama/tiny", "model-q4_0.gguf", 1e-1),
                ("llama/tiny_rope_llama3", "model-f32.gguf", 5e-3),
                ("qwen2/tiny", "model-f32.gguf", 5e-3),
                ("qwen3/tiny", "model-f32.gguf", 5e-3),
                ("qwen3_5/tiny", "model-f32.gguf", 5e-3),
            ] {
                let d = dir.join(sub);
                if !d.join(file).exists() {
                    println!("note: {sub}/{file} absent");
                    continue;
                }
                match checks::fixture(&gpu, &d, file, tol) {
                    Ok(r) => rep.merge(r),
                    Err(e) => rep.merge(Report {
                        lines: vec![format!("FAIL fixture {sub}/{file}: {e}")],
                        failures: 1,
                    }),
                }
            }
            rep
        }
        "spec" => {
            let n: usize = arg(2).parse().unwrap_or(64);
            // A prompt that repeats itself, so prompt lookup has something to draft.
            let m = CudaModel::load(&gpu, arg(1))?;
            let vocab = m.config.vocab as u32;
            drop(m);
            let base: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % vocab).collect();
            let prompt: Vec<u32> = base
                .iter()
                .chain(&base)
                .chain(&base[..20])
                .copied()
                .collect();
            checks::speculative(&gpu, Path::new(arg(1)), &prompt, n)?
        }
        "spec-draft" => {
            let n: usize = arg(3).parse().unwrap_or(64);
            let m = CudaModel::load(&gpu, arg(1))?;
            let vocab = m.config.vocab as u32;
            drop(m);
            // A prompt with some repetition (the draft model has more to go on than that).
            let base: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % vocab).collect();
            let prompt: Vec<u32> = base.iter().chain(&base[..20]).copied().collect();
            checks::draft_speculative(&gpu, Path::new(arg(1)), Path::new(arg(2)), &prompt, n)?
        }
        "session" => {
            let n: usize = arg(2).parse().unwrap_or(64);
            let m = CudaModel::load(&gpu, arg(1))?;
            let vocab = m.config.vocab as u32;
            drop(m);
            let base: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % vocab).collect();
            let prompt: Vec<u32> = base.iter().chain(&base).copied().collect();
            checks::session(&gpu, Path::new(arg(1)), &prompt, n)?
        }
        "dflash" => {
            let n: usize = arg(3).parse().unwrap_or(48);
            checks::dflash_checks(&gpu, Path::new(arg(1)), Path::new(arg(2)), n)?
        }
        "bench" => {
            bench(&gpu, Path::new(arg(1)), arg(2) == "quick")?;
            Report::default()
        }
        "bench-draft" => {
            bench_draft(&gpu, Path::new(arg(1)), Path::new(arg(2)))?;
            Report::default()
        }
        "attn" => {
            bench_attention(&gpu, Path::new(arg(1)))?;
            Report::default()
        }
        "pass" => {
            let num = |i: usize| -> Result<usize> {
                arg(i)
                    .parse()
                    .with_context(|| format!("argument {i}: a number, not '{}'", arg(i)))
            };
            passes(&gpu, Path::new(arg(1)), num(2)?, num(3)?, num(4)?)?;
            Report::default()
        }
        other => {
            bail!(
                "unknown command '{other}' (kernels, topk, fixtures, spec, spec-draft, session, dflash, synth, bench, bench-draft, attn, pass)"
            )
        }
    };
    for l in &report.lines {
        println!("{l}");
    }
    println!(
        "{} checks, {} failed",
        report
            .lines
            .iter()
            .filter(|l| l.starts_with("ok") || l.starts_with("FAIL"))
            .count(),
        report.failures
    );
    if report.failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Decode tg128, prefill pp512 and the verify curve, timed with CUDA events around graph
/// replays (each pass ends with its one synchronisation, which the wall clock also sees).
fn bench(gpu: &std::sync::Arc<Gpu>, path: &Path, quick: bool) -> Result<()> {
    let t = Instant::now();
    let m = CudaModel::load(gpu, path)?;
    let name = path.file_name().unwrap().to_string_lossy();
    println!(
        "bench {name}: loaded in {:.1} s, {} weight bytes per token, block formats on {}",
        t.elapsed().as_secs_f64(),
        m.weight_bytes,
        match m.kernels.mma_plan() {
            MmaPlan::Off => "dp4a (matvec.cu)".to_string(),
            MmaPlan::All => "tensor cores (mma.cu)".to_string(),
            MmaPlan::AtLeast(b) => format!("tensor cores from {} MiB a matrix, else dp4a", b >> 20),
        } + &if m.kernels.packs() {
            format!(
                " (Q4_K and Q6_K packed: {} bytes of copies)",
                m.packed_bytes
            )
        } else {
            String::new()
        }
    );
    let vocab = m.config.vocab as u32;
    let toks = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed)) % vocab)
            .collect()
    };
    let mut st = m.new_state(4200)?;
    let timer = Timer::new(gpu)?;

    let pdl_default = gpu.dependent_launch();
    // The read bandwidth a token's weights stream at: measured on the H200 (gpu_anchor.md),
    // the H100 SXM's rated 3.35 TB/s.
    let peak_bw = if gpu.name.contains("H100") {
        3.35e12
    } else {
        4.35e12
    };
    let ceiling = peak_bw / m.weight_bytes as f64;
    let tg = |st: &mut kasoku_cuda::CudaState, steps: usize| -> Result<f64> {
        st.drop_graphs();
        let mut tg = Vec::new();
        for _ in 0..4 {
            st.reset();
            let mut tok = st.prefill(&m, &[1])?;
            if st.skip & Skip::HEAD != 0 {
                tok = 1;
            }
            let t = Instant::now();
            for _ in 0..steps {
                tok = st.step(&m, tok)?;
                // Without the head there is no next token (u32::MAX): feed a fixed one.
                if st.skip & Skip::HEAD != 0 {
                    tok = 1;
                }
            }
            tg.push(t.elapsed().as_secs_f64());
        }
        tg.remove(0);
        Ok(steps as f64 / median(tg))
    };
    // pp512: a fresh state each time; the layers' products on the prefill GEMM (the
    // default), then on matvec.
    let prompt = toks(512, 1);
    let gemm_default = st.gemm_rows;
    for rows in [gemm_default, None] {
        st.gemm_rows = rows;
        let mut pp = Vec::new();
        for rep in 0..4 {
            st.reset();
            timer.start()?;
            st.prefill(&m, &prompt)?;
            let ms = timer.stop_ms()? as f64;
            if rep > 0 {
                pp.push(ms);
            }
        }
        let pp_ms = median(pp);
        println!(
            "pp512 ({}): {:.2} ms, {:.0} tokens/s",
            if st.uses_gemm(prompt.len()) {
                "prefill GEMM on"
            } else {
                "prefill GEMM off: matvec"
            },
            pp_ms,
            512.0 / pp_ms * 1e3
        );
        if gemm_default.is_none() || quick {
            break;
        }
    }
    st.gemm_rows = gemm_default;
    if !quick {
        // What each kernel class costs inside a pp512 pass: the pass without it.
        let pp = |st: &mut kasoku_cuda::CudaState| -> Result<f64> {
            let mut ms = Vec::new();
            for rep in 0..4 {
                st.reset();
                timer.start()?;
                st.prefill(&m, &prompt)?;
                if rep > 0 {
                    ms.push(timer.stop_ms()? as f64);
                }
            }
            Ok(median(ms))
        };
        let full = pp(&mut st)?;
        for (what, bits) in [
            ("attention (+q/k/v epilogue)", Skip::ATTENTION),
            ("rmsnorm + swiglu", Skip::ELEMENTWISE),
            ("layer products", Skip::PRODUCTS),
        ] {
            st.skip = bits;
            let without = pp(&mut st)?;
            st.skip = 0;
            println!(
                "  pp512 cost of {what}: {:.2} ms of {full:.2} ms",
                full - without
            );
        }
    }
    if quick {
        let tps = tg(&mut st, 128)?;
        println!(
            "tg128: {:.1} tokens/s ({:.3} ms/token; {:.1}% of the {:.2} TB/s ceiling {:.0} t/s)",
            tps,
            1e3 / tps,
            100.0 * tps / ceiling,
            peak_bw * 1e-12,
            ceiling
        );
        return verify_curve(&m, &mut st, &[1, 512], &toks);
    }
    for (what, us, flops) in m.profile_gemm(&st, 512, 20)? {
        let rate = if flops > 0.0 {
            format!(", {:.1} TFLOP/s", flops / us * 1e-6)
        } else {
            String::new()
        };
        println!("  gemm {what}: {us:.1} us{rate}");
    }

    // tg128 from an empty context (as llama-bench): one token, then 128 greedy steps; without
    // programmatic dependent launch, with it, and with it and L2 prefetch of the next product's
    // weights (the default).
    for (pdl, prefetch) in [(false, false), (true, true), (true, false)] {
        gpu.set_dependent_launch(pdl);
        st.prefetch = prefetch;
        let tps = tg(&mut st, 128)?;
        println!(
            "tg128 (dependent launch {}, prefetch {}): {:.1} tokens/s ({:.3} ms/token; {:.1}% of the {:.2} TB/s ceiling {:.0} t/s)",
            if gpu.dependent_launch() { "on" } else { "off" },
            if prefetch { "on" } else { "off" },
            tps,
            1e3 / tps,
            100.0 * tps / ceiling,
            peak_bw * 1e-12,
            ceiling
        );
    }
    // What each kernel class costs inside the captured step: the step without it (kernels
    // apart, as a class cannot be left out of a fused kernel).
    let fused = (st.fuse_post, st.fuse_glu, st.fuse_norm);
    (st.fuse_post, st.fuse_glu, st.fuse_norm) = (false, false, false);
    let full = tg(&mut st, 64)?;
    println!("tg64 with each kernel apart (unfused): {full:.1} tokens/s");
    for (what, bits) in [
        ("attention (+q/k/v epilogue)", Skip::ATTENTION),
        ("the q/k/v epilogue", Skip::QKV_EPILOGUE),
        ("rmsnorm + swiglu", Skip::ELEMENTWISE),
        ("layer products", Skip::PRODUCTS),
        ("head", Skip::HEAD),
        ("everything but the embedding", 15),
    ] {
        st.skip = bits;
        let tps = tg(&mut st, 64)?;
        println!(
            "  in-graph cost of {what}: {:.1} us of {:.1} us per step",
            1e6 / full - 1e6 / tps,
            1e6 / full
        );
    }
    st.skip = 0;
    (st.fuse_post, st.fuse_glu, st.fuse_norm) = fused;
    gpu.set_dependent_launch(pdl_default);
    st.drop_graphs();
    // The same steps without graphs: what the launches cost.
    st.use_graphs = false;
    st.reset();
    let mut tok = st.prefill(&m, &[1])?;
    let t = Instant::now();
    for _ in 0..32 {
        tok = st.step(&m, tok)?;
    }
    println!(
        "tg32 without graphs: {:.1} tokens/s",
        32.0 / t.elapsed().as_secs_f64()
    );
    st.use_graphs = true;

    // Speculative decoding with prompt lookup against plain decoding, on a prompt that
    // repeats itself (random weights: whatever acceptance the model's own output allows).
    let base: Vec<u32> = toks(40, 11);
    let prompt: Vec<u32> = base
        .iter()
        .chain(&base)
        .chain(&base[..20])
        .copied()
        .collect();
    for (budget, depth) in [(0usize, 0usize), (8, 8), (16, 16), (32, 16)] {
        let mut ts = Vec::new();
        let mut line = String::new();
        for _ in 0..3 {
            st.reset();
            let t = Instant::now();
            let (tokens, info) = if budget == 0 {
                (
                    kasoku_cuda::generate_plain(&m, &mut st, &prompt, 256)?,
                    String::from("plain"),
                )
            } else {
                let mut d = kasoku::spec::ngram::NgramDrafter::default();
                let r = kasoku_cuda::generate_speculative(
                    &m, &mut st, &prompt, 256, &mut d, budget, depth,
                )?;
                let info = format!(
                    "n-gram budget {budget}: {} passes, {}/{} drafts accepted",
                    r.passes, r.accepted, r.drafted
                );
                (r.tokens, info)
            };
            ts.push(t.elapsed().as_secs_f64());
            line = format!("{info}, {} tokens", tokens.len());
        }
        let s = median(ts);
        println!(
            "generate 256 ({line}): {:.1} tokens/s (prefill included)",
            256.0 / s
        );
    }

    // Where a decode step's time goes (each kernel alone, launched back to back).
    st.reset();
    st.prefill(&m, &toks(512, 5))?;
    for (what, us, bytes) in m.profile_step(&mut st, 50)? {
        let bw = if bytes > 0 {
            format!(", {:.0} GB/s", bytes as f64 / us * 1e-3)
        } else {
            String::new()
        };
        println!("  kernel {what}: {us:.1} us{bw}");
    }
    println!(
        "  per step: {} layers of the above ({} attention, {} Gated DeltaNet)",
        m.config.n_layers, m.attn_layers, m.gdn_layers
    );

    verify_curve(&m, &mut st, &[1, 512, 4000], &toks)
}

/// The attention kernel alone (CUDA events around 50 launches) at context lengths from 1 to
/// 4,000: one row with the fused q/k/v epilogue (a decode step), 1, 2, 16 and 64 chain rows
/// (verifications), by each decode kernel.
fn bench_attention(gpu: &std::sync::Arc<Gpu>, path: &Path) -> Result<()> {
    let m = CudaModel::load(gpu, path)?;
    let vocab = m.config.vocab as u32;
    let mut st = m.new_state(4200)?;
    println!("attention alone, us per launch: (rows, fused epilogue) by kernel");
    for depth in [1usize, 64, 256, 512, 1024, 2048, 4000] {
        st.reset();
        let prompt: Vec<u32> = (0..depth as u32).map(|i| (i * 7919 + 3) % vocab).collect();
        st.prefill(&m, &prompt)?;
        for grouped in [false, true] {
            let rows = m.kernels.attention_rows();
            let name = match (grouped, rows) {
                (true, _) => "attn_group".to_string(),
                (false, 1) => "attn_partial".to_string(),
                // Passes of several rows run attn_rows (KASOKU_CUDA_ATTN_ROWS).
                (false, r) => format!("attn_rows/{r}"),
            };
            let mut line = format!("depth {depth:>4} {name:<12}");
            for (n, fused) in [(1, true), (1, false), (2, false), (16, false), (64, false)] {
                let us = m.profile_attention(&mut st, n, fused, grouped, 50)?;
                line += &format!(" n{n}{}={us:.1}", if fused { "f" } else { "" });
            }
            println!("{line}");
        }
    }
    Ok(())
}

/// `reps` verifications of a `k`-token chain after `depth` committed positions, graphs as
/// a decode step runs them (for a profiler to see each kernel of a pass); prints the
/// median wall time of a pass.
fn passes(
    gpu: &std::sync::Arc<Gpu>,
    path: &Path,
    depth: usize,
    k: usize,
    reps: usize,
) -> Result<()> {
    let m = CudaModel::load(gpu, path)?;
    let vocab = m.config.vocab as u32;
    let mut st = m.new_state(depth + 64)?;
    let prompt: Vec<u32> = (0..depth.max(1) as u32)
        .map(|i| (i * 7919 + 3) % vocab)
        .collect();
    st.prefill(&m, &prompt)?;
    let tree = TokenTree::chain(&vec![5; k]);
    let mut ts = Vec::new();
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        st.verify(&m, &tree)?;
        ts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "pass of {k} after {}: median {:.0} us over {} passes",
        depth.max(1),
        median(ts),
        reps.max(1)
    );
    Ok(())
}

/// The verify curve: a chain of k tokens after `depth` committed positions, each k's median
/// pass against a 1-token pass.
fn verify_curve(
    m: &CudaModel,
    st: &mut kasoku_cuda::CudaState,
    depths: &[usize],
    toks: &dyn Fn(usize, u32) -> Vec<u32>,
) -> Result<()> {
    for &depth in depths {
        st.reset();
        st.prefill(m, &toks(depth, 7))?;
        let mut line = format!("verify depth {depth}:");
        let mut base = 0.0;
        for k in [1usize, 2, 4, 8, 16, 32, 64] {
            let tree = TokenTree::chain(&toks(k, 3));
            let mut ts = Vec::new();
            for rep in 0..23 {
                let t = Instant::now();
                st.verify(m, &tree)?;
                if rep >= 3 {
                    ts.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            let us = median(ts);
            if k == 1 {
                base = us;
                line += &format!(" k1={us:.0}us");
            } else {
                line += &format!(" k{k}={:.2}x", us / base);
            }
        }
        println!("{line}");
    }
    Ok(())
}

/// Generation of 256 tokens with a draft model on the GPU against plain decoding and prompt
/// lookup, the same prompt and state sizes for each; and what one draft costs: the drafter's
/// passes alone, level by level. With random weights the acceptance means nothing; the cost
/// per cycle is what is measured.
fn bench_draft(gpu: &std::sync::Arc<Gpu>, target: &Path, draft: &Path) -> Result<()> {
    use kasoku::spec::draft_model::DraftModelConfig;
    use kasoku::spec::{DraftRequest, Drafter, Features};
    use kasoku_cuda::CudaDraftDrafter;
    let m = CudaModel::load(gpu, target)?;
    let d = std::sync::Arc::new(CudaModel::load(gpu, draft)?);
    println!(
        "bench draft {} for {}: {} weight bytes per draft pass ({} per target step)",
        draft.file_name().unwrap().to_string_lossy(),
        target.file_name().unwrap().to_string_lossy(),
        d.weight_bytes,
        m.weight_bytes
    );
    let vocab = m.config.vocab as u32;
    let base: Vec<u32> = (0..40u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(11)) % vocab)
        .collect();
    let prompt: Vec<u32> = base.iter().chain(&base[..20]).copied().collect();
    let ctx = 4200;
    let mut st = m.new_state(ctx)?;
    let n = 256;
    let mut plain_tokens = Vec::new();
    for (label, budget, depth) in [
        ("plain", 0usize, 0usize),
        ("n-gram", 8, 8),
        ("draft", 4, 4),
        ("draft", 8, 8),
        ("draft", 16, 8),
    ] {
        let mut ts = Vec::new();
        let mut line = String::new();
        for _ in 0..3 {
            st.reset();
            let t = Instant::now();
            let (tokens, info) = match label {
                "plain" => (
                    kasoku_cuda::generate_plain(&m, &mut st, &prompt, n)?,
                    "plain".to_string(),
                ),
                _ => {
                    let mut ngram = kasoku::spec::ngram::NgramDrafter::default();
                    let mut model_drafter;
                    let drafter: &mut dyn Drafter = if label == "n-gram" {
                        &mut ngram
                    } else {
                        model_drafter = CudaDraftDrafter::on_gpu(
                            d.clone(),
                            ctx,
                            m.config.vocab,
                            DraftModelConfig::default(),
                        )
                        .map_err(anyhow::Error::msg)?;
                        &mut model_drafter
                    };
                    let r = kasoku_cuda::generate_speculative(
                        &m, &mut st, &prompt, n, drafter, budget, depth,
                    )?;
                    let info = format!(
                        "{label} budget {budget} depth {depth}: {} passes, {:.2} tokens per pass, {}/{} drafts accepted",
                        r.passes,
                        r.tokens.len().saturating_sub(1) as f64 / r.passes.max(1) as f64,
                        r.accepted,
                        r.drafted
                    );
                    (r.tokens, info)
                }
            };
            ts.push(t.elapsed().as_secs_f64());
            if label == "plain" {
                plain_tokens = tokens.clone();
            }
            let same = if tokens == plain_tokens {
                ""
            } else {
                ", DIFFERS FROM PLAIN"
            };
            line = format!("{info}, {} tokens{same}", tokens.len());
        }
        // The first run captured the graphs; the median of three.
        let s = median(ts);
        println!(
            "generate {n} ({line}): {:.1} tokens/s (prefill included)",
            n as f64 / s
        );
    }
    // One draft alone: a fresh drafter after the prompt, the median of 20 trees.
    let mut drafter =
        CudaDraftDrafter::on_gpu(d.clone(), ctx, m.config.vocab, DraftModelConfig::default())
            .map_err(anyhow::Error::msg)?;
    drafter
        .start(&prompt, Features::default())
        .map_err(anyhow::Error::msg)?;
    let mut history = prompt.clone();
    history.push(1);
    for (budget, depth) in [(4usize, 4usize), (8, 8), (16, 8)] {
        let mut ts = Vec::new();
        let mut nodes = 0;
        for rep in 0..22 {
            let t = Instant::now();
            let tree = drafter
                .draft(&DraftRequest {
                    tokens: &history,
                    budget,
                    max_depth: depth,
                })
                .map_err(anyhow::Error::msg)?;
            if rep >= 2 {
                ts.push(t.elapsed().as_secs_f64() * 1e6);
            }
            nodes = tree.len();
        }
        println!(
            "  one draft (budget {budget}, depth {depth}): {:.0} us for a tree of {nodes} nodes",
            median(ts)
        );
    }
    Ok(())
}
