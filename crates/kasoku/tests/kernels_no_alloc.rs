//! Kernels allocate nothing in steady state: once a kernel has run with some shapes, running it
//! again with the same shapes allocates no memory on the calling thread or on the pool's
//! workers (what a decode step and a verify pass need). A counting global allocator checks it
//! for every kernel a forward pass uses: matmul on every format family at 1 and 8 rows (and
//! several matrices in one job), attention (plain and tree), Gated DeltaNet (recurrent,
//! chunked, tree, replay), conv1d (plain, tree, commit), RoPE, RMSNorm and the activations.
//!
//! This binary holds one test, so nothing else runs while it counts.

mod counting_alloc;

use counting_alloc::counted;
use half::{bf16, f16};
use kasoku::kernels::activation::{sigmoid_gate, silu, swiglu_inplace};
use kasoku::kernels::attention::{
    attend, attention, AttnArgs, AttnGeometry, BlockQ8_0, KvHeads, Stored, TreeRows,
};
use kasoku::kernels::conv1d::{causal_conv1d_silu, tree_conv1d_silu, tree_conv_commit, ConvTaps};
use kasoku::kernels::gated_delta::tree::{replay, tree_recurrent};
use kasoku::kernels::gated_delta::{
    chunked, gated_delta, gates, l2norm_heads, recurrent, GdnDims, GdnInputs, HeadMap,
};
use kasoku::kernels::matmul::{matmul, matmul_many, MatMulWeight};
use kasoku::kernels::norm::{rmsnorm, rmsnorm_inplace};
use kasoku::kernels::rope::{Rope, RopeLayout, RopeScaling};
use kasoku::kernels::threads;
use kasoku::quant::DType;

/// Runs `f` once to warm up, then again counting; returns the second run's allocations.
fn allocations(mut f: impl FnMut()) -> usize {
    f();
    counted(f).1
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A `rows × cols` matrix of `dtype` with small finite scales and random codes.
fn matrix(dtype: DType, rows: usize, cols: usize, seed: u64) -> MatMulWeight {
    let v = values(rows * cols, seed);
    let bytes: Vec<u8> = match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => {
            let len = rows * dtype.bytes_for(cols).unwrap();
            let mut b: Vec<u8> = (0..len).map(|i| (i * 131 + seed as usize) as u8).collect();
            // Finite f16 scales where each format keeps them.
            let scales: &[usize] = match dtype {
                DType::Q6K => &[208],
                DType::Q4K | DType::Q5K => &[0, 2],
                DType::Q4_1 | DType::Q5_1 => &[0, 2],
                _ => &[0],
            };
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                for &o in scales {
                    blk[o..o + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                }
            }
            b
        }
    };
    MatMulWeight::new(dtype, rows, cols, &bytes).unwrap()
}

#[test]
fn kernels_allocate_nothing_once_warmed_up() {
    threads::set_threads(4);
    // The counter sees allocations, on this thread and on the workers.
    assert_eq!(allocations(|| drop(std::hint::black_box(vec![1u8; 10]))), 1);
    let on_workers = allocations(|| {
        threads::parallel_for(64, |_| drop(std::hint::black_box(vec![1u8; 10])));
    });
    assert_eq!(on_workers, 64);

    let mut failures = Vec::new();
    let mut check = |name: &str, count: usize| {
        if count != 0 {
            failures.push(format!("{name}: {count} allocations"));
        }
    };

    // Matrix products: every family, one and eight rows; 8192 columns make eight rows go
    // through the legacy formats' parallel activation quantizer.
    let formats = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];
    for (i, &dtype) in formats.iter().enumerate() {
        for cols in [512, 8192] {
            let w = matrix(dtype, 72, cols, i as u64);
            for n in [1, 8] {
                let x = values(n * cols, 7);
                let mut y = vec![0f32; n * w.rows];
                check(
                    &format!("matmul {dtype} {cols} columns, {n} rows"),
                    allocations(|| matmul(&w, &x, n, &mut y)),
                );
            }
        }
    }
    let ws = [
        matrix(DType::Q4K, 96, 512, 1),
        matrix(DType::Q6K, 32, 512, 2),
        matrix(DType::Q8_0, 40, 512, 3),
        matrix(DType::F16, 8, 512, 4),
    ];
    let refs: Vec<&MatMulWeight> = ws.iter().collect();
    for n in [1, 8] {
        let x = values(n * 512, 8);
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
        let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        check(
            &format!("matmul_many, {n} rows"),
            allocations(|| matmul_many(&refs, &x, n, &mut ys)),
        );
    }

    // Attention over a cache of 300 positions: one row, eight rows, a tree of eight nodes.
    let geo = AttnGeometry {
        n_heads: 12,
        n_kv_heads: 2,
        head_dim: 128,
    };
    let past = 300;
    let cache: Vec<Vec<f32>> = (0..2).map(|h| values((past + 8) * 128, 20 + h)).collect();
    let keys: Vec<&[f32]> = cache.iter().map(|h| &h[..]).collect();
    for n in [1, 8] {
        let q = values(n * 12 * 128, 9);
        let mut out = vec![0f32; q.len()];
        check(
            &format!("attention, {n} rows"),
            allocations(|| attention(geo, &q, &keys, &keys, past, 0.088, &mut out)),
        );
    }
    let parents = [usize::MAX, 0, 1, 1, 0, 4, 5, usize::MAX];
    let q = values(8 * 12 * 128, 10);
    let mut out = vec![0f32; q.len()];
    let args = AttnArgs {
        geo,
        q: &q,
        keys: KvHeads::F32(&keys),
        values: KvHeads::F32(&keys),
        past,
        scale: 0.088,
        tree: Some(TreeRows {
            parents: &parents,
            first: 0,
        }),
    };
    check("tree attention", allocations(|| attend(&args, &mut out)));
    // Over f16 and q8_0 caches.
    let halves: Vec<Vec<f16>> = cache.iter().map(|h| stored(h)).collect();
    let blocks: Vec<Vec<BlockQ8_0>> = cache.iter().map(|h| stored(h)).collect();
    let halves: Vec<&[f16]> = halves.iter().map(|h| &h[..]).collect();
    let blocks: Vec<&[BlockQ8_0]> = blocks.iter().map(|h| &h[..]).collect();
    for (name, heads) in [
        ("f16", KvHeads::F16(&halves)),
        ("q8_0", KvHeads::Q8_0(&blocks)),
    ] {
        let args = AttnArgs {
            keys: heads,
            values: heads,
            ..args
        };
        check(
            &format!("tree attention over a {name} cache"),
            allocations(|| attend(&args, &mut out)),
        );
    }

    // Gated DeltaNet: decode, a verify-sized and a prefill-sized batch, a tree, a replay.
    let dims = GdnDims {
        nk: 2,
        nv: 4,
        dk: 64,
        dv: 64,
        map: HeadMap::Grouped,
    };
    let n = 32;
    let mut q = values(n * 2 * 64, 11);
    let mut k = values(n * 2 * 64, 12);
    check(
        "l2norm_heads",
        allocations(|| l2norm_heads(&mut q, 64, 0.125)),
    );
    l2norm_heads(&mut k, 64, 1.0);
    let v = values(n * 4 * 64, 13);
    let (a, b) = (values(n * 4, 14), values(n * 4, 15));
    let (ssm_a, dt_bias) = (vec![-0.5f32; 4], values(4, 16));
    let (mut g, mut beta) = (vec![0f32; n * 4], vec![0f32; n * 4]);
    check(
        "gates",
        allocations(|| gates(&a, &b, &ssm_a, &dt_bias, &mut g, &mut beta)),
    );
    let inputs = |t: usize| GdnInputs {
        q: &q[..t * 128],
        k: &k[..t * 128],
        v: &v[..t * 256],
        g: &g[..t * 4],
        beta: &beta[..t * 4],
    };
    let mut state = values(dims.state_len(), 17);
    let mut o = vec![0f32; n * 256];
    for t in [1, 8, 32] {
        check(
            &format!("gated_delta, {t} tokens"),
            allocations(|| gated_delta(&dims, &inputs(t), t, &mut state, &mut o[..t * 256])),
        );
        check(
            &format!("gated_delta recurrent, {t} tokens"),
            allocations(|| recurrent(&dims, &inputs(t), t, &mut state, &mut o[..t * 256])),
        );
    }
    check(
        "gated_delta chunked",
        allocations(|| chunked(&dims, &inputs(32), 32, 16, &mut state, &mut o)),
    );
    let mut deltas = vec![0f32; 8 * 256];
    check(
        "gated_delta tree",
        allocations(|| {
            tree_recurrent(
                &dims,
                &inputs(8),
                &parents,
                &state,
                &mut o[..8 * 256],
                &mut deltas,
            )
        }),
    );
    check(
        "gated_delta replay",
        allocations(|| replay(&dims, &mut state, &k[..128], &g[..4], &deltas[..256])),
    );

    // The short convolution: decode, a batch, a tree and its commit.
    let ch = 384;
    let taps = ConvTaps::from_channel_major(&values(ch * 4, 18), ch, 4);
    let mut conv = vec![0f32; taps.state_len()];
    let x = values(8 * ch, 19);
    let mut y = vec![0f32; 8 * ch];
    for n in [1, 8] {
        check(
            &format!("conv1d, {n} tokens"),
            allocations(|| causal_conv1d_silu(&taps, &mut conv, &x[..n * ch], n, &mut y[..n * ch])),
        );
    }
    check(
        "tree conv1d",
        allocations(|| tree_conv1d_silu(&taps, &conv, &x, &parents, &mut y)),
    );
    check(
        "tree conv commit",
        allocations(|| tree_conv_commit(&taps, &mut conv, &x, &parents, 6)),
    );

    // RoPE, RMSNorm and the activations.
    let rope = Rope::new(128, 64, 1e6, RopeLayout::Neox, &RopeScaling::None, None);
    let mut qk = values(8 * 12 * 128, 21);
    let positions: Vec<usize> = (300..308).collect();
    check("rope", allocations(|| rope.apply(&mut qk, 12, &positions)));
    let weight = values(1536, 22);
    let mut h = values(8 * 1536, 23);
    let mut normed = vec![0f32; h.len()];
    check(
        "rmsnorm",
        allocations(|| rmsnorm(&h, &weight, 1e-6, &mut normed)),
    );
    check(
        "rmsnorm_inplace",
        allocations(|| rmsnorm_inplace(&mut h, &weight, 1e-6)),
    );
    let (mut gate, up) = (values(8960, 24), values(8960, 25));
    check("swiglu", allocations(|| swiglu_inplace(&mut gate, &up)));
    check(
        "sigmoid_gate",
        allocations(|| sigmoid_gate(&mut normed, &h)),
    );
    check(
        "silu",
        allocations(|| {
            for v in gate.iter_mut() {
                *v = silu(*v);
            }
        }),
    );

    assert!(failures.is_empty(), "{failures:#?}");
}

/// `x` stored as `S`.
fn stored<S: Stored>(x: &[f32]) -> Vec<S> {
    let mut out = vec![S::default(); x.len() / S::VALUES];
    S::store(x, &mut out);
    out
}
