//! The GPU checks (kasoku_cuda::checks) as tests: every kernel against the CPU backend, the
//! transformers fixtures through the GPU, speculative == plain (prompt lookup, a draft model
//! on the GPU). Each skips with a note where
//! no CUDA device (or NVRTC) is usable, as in CI; on the GPU machine, tools/gpu_run.sh runs
//! the same checks through the kasoku-cuda-check binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kasoku_cuda::checks::{self, Report};
use kasoku_cuda::{select_device, Device, Gpu};

fn gpu() -> Option<Arc<Gpu>> {
    match select_device(None) {
        Ok((Device::Cuda(i), _)) => Some(Gpu::open(i).expect("a usable device opens")),
        Ok((_, why)) => {
            eprintln!("note: no GPU, skipped: {}", why.unwrap_or_default());
            None
        }
        Err(e) => {
            eprintln!("note: no GPU, skipped: {e}");
            None
        }
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn assert_ok(r: Report) {
    for l in &r.lines {
        eprintln!("{l}");
    }
    assert_eq!(r.failures, 0, "{} GPU check(s) failed", r.failures);
}

#[test]
fn every_kernel_matches_the_cpu_backend() {
    if let Some(g) = gpu() {
        let k = kasoku_cuda::kernels::Kernels::new(&g).unwrap();
        assert_ok(checks::kernels(&k).unwrap());
    }
}

#[test]
fn fixtures_through_the_gpu() {
    if let Some(g) = gpu() {
        for (sub, file) in [
            ("llama/tiny", "model-f32.gguf"),
            ("qwen2/tiny", "model-f32.gguf"),
            ("qwen3/tiny", "model-f32.gguf"),
            ("qwen3_5/tiny", "model-f32.gguf"),
        ] {
            assert_ok(checks::fixture(&g, &fixtures().join(sub), file, 5e-3).unwrap());
        }
    }
}

#[test]
fn speculative_equals_plain_on_the_gpu() {
    if let Some(g) = gpu() {
        let prompt: Vec<u32> = (0..30u32)
            .chain(0..30)
            .map(|i| (i * 37 + 5) % 384)
            .collect();
        for rel in ["llama/tiny/model-f32.gguf", "qwen3_5/tiny/model-f32.gguf"] {
            let model = fixtures().join(rel);
            assert_ok(checks::speculative(&g, &model, &prompt, 40).unwrap());
        }
    }
}

#[test]
fn draft_model_speculation_equals_plain_on_the_gpu() {
    if let Some(g) = gpu() {
        let prompt: Vec<u32> = (0..30u32).map(|i| (i * 37 + 5) % 384).collect();
        let target = fixtures().join("llama/tiny/model-f32.gguf");
        let draft = fixtures().join("llama/tiny/model-q4_0.gguf");
        assert_ok(checks::draft_speculative(&g, &target, &draft, &prompt, 40).unwrap());
    }
}
