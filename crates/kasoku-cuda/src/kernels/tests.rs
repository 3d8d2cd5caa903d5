//! CPU-side tests of the launchers: parameter layouts match the CUDA structs, shape checks,
//! grid sizes; and (where NVRTC is present, e.g. `tools/nvrtc_check.sh`) the sources compile.

use super::*;

#[test]
fn parameter_blocks_have_the_cuda_layout() {
    // struct MatSeg: 3 pointers, a long long, 4 ints, 2 pointers = 64 bytes; MatArgs: 3 segs,
    // 3 pointers, 5 ints (4 bytes of padding), 3 pointers, 3 long longs = 288 bytes, 8-aligned.
    assert_eq!(std::mem::size_of::<MatSeg>(), 64);
    assert_eq!(std::mem::offset_of!(MatSeg, best), 48);
    assert_eq!(std::mem::offset_of!(MatSeg, packed), 56);
    assert_eq!(std::mem::size_of::<MatArgs>(), 368);
    assert_eq!(std::mem::offset_of!(MatArgs, norm_count), 312);
    assert_eq!(std::mem::offset_of!(MatArgs, norm_eps), 352);
    assert_eq!(std::mem::offset_of!(MatArgs, glu_count), 288);
    assert_eq!(std::mem::align_of::<MatArgs>(), 8);
    assert_eq!(std::mem::offset_of!(MatArgs, x), 192);
    assert_eq!(std::mem::offset_of!(MatArgs, xs), 208);
    assert_eq!(std::mem::offset_of!(MatArgs, ldx), 228);
    assert_eq!(std::mem::offset_of!(MatArgs, split), 232);
    assert_eq!(std::mem::offset_of!(MatArgs, pre), 240);
    assert_eq!(std::mem::offset_of!(MatArgs, pre_len), 264);
    assert_eq!(std::mem::offset_of!(MatArgs, stream_stages), 360);
    assert_eq!(std::mem::size_of::<BatchDesc>(), 16);
    // struct PostArgs: 5 pointers, 6 ints/floats = 64 bytes.
    assert_eq!(std::mem::size_of::<PostArgs>(), 64);
    assert_eq!(std::mem::offset_of!(PostArgs, kv_ld), 40);
    assert_eq!(std::mem::offset_of!(PostArgs, on), 56);
    // struct GdnShape: 6 ints.
    assert_eq!(std::mem::size_of::<GdnShape>(), 24);
    assert_eq!(std::mem::offset_of!(GdnShape, grouped), 20);
}

#[test]
fn gated_delta_net_shapes_the_kernels_cannot_take_are_refused_with_the_reason() {
    let qwen35_9b = GdnShape {
        nk: 16,
        nv: 32,
        dk: 128,
        dv: 128,
        kernel: 4,
        grouped: 0,
    };
    qwen35_9b.check().unwrap();
    assert_eq!(qwen35_9b.conv_dim(), 8192);
    assert_eq!(qwen35_9b.state_len(), 32 * 128 * 128);
    assert_eq!(qwen35_9b.conv_state_len(), 3 * 8192);
    for bad in [
        GdnShape {
            dk: 256,
            ..qwen35_9b
        },
        GdnShape {
            nv: 24,
            nk: 16,
            ..qwen35_9b
        },
        GdnShape {
            kernel: 1,
            ..qwen35_9b
        },
        GdnShape {
            dv: 512,
            ..qwen35_9b
        },
    ] {
        let e = bad.check().unwrap_err().to_string();
        assert!(e.contains("Gated DeltaNet geometry"), "{e}");
    }
}

#[test]
fn every_kernel_name_is_a_kernel_of_the_source_and_every_kernel_is_named() {
    // The identifier before the parameters of each `extern "C" __global__` definition.
    let src = source();
    let kernels: Vec<String> = src
        .split("extern \"C\" __global__")
        .skip(1)
        .map(|rest| {
            let rest = match rest.find("__launch_bounds__(") {
                Some(at) if at < rest.find('{').unwrap_or(usize::MAX) => {
                    let after = &rest[at..];
                    &after[after.find(')').unwrap() + 1..]
                }
                _ => rest,
            };
            let head = &rest[..rest.find('(').unwrap()];
            head.split_whitespace().last().unwrap().to_string()
        })
        .collect();
    for name in NAMES {
        assert!(kernels.iter().any(|k| k == name), "{name} is not a kernel");
    }
    for k in &kernels {
        assert!(NAMES.contains(&k.as_str()), "kernel {k} is not loaded");
    }
}

#[test]
fn matrices_the_kernels_cannot_read_are_refused_with_the_reason() {
    assert!(check_matrix(DType::Q4K, 2, 256, 288).is_ok());
    let e = check_matrix(DType::Q4K, 2, 128, 144)
        .unwrap_err()
        .to_string();
    assert!(e.contains("whole blocks"), "{e}");
    let e = check_matrix(DType::Q8_0, 3, 64, 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected 204"), "{e}");
    assert!(check_matrix(DType::F16, 1, 12, 24).is_err());
    assert_eq!(check_matrix(DType::F32, 4, 16, 256).unwrap(), 64);
}

#[test]
fn matvec_arguments_cover_every_segment_row() {
    let seg = |rows| MatSeg {
        rows,
        ..MatSeg::default()
    };
    let x = |ld| Acts {
        x: 64,
        xq: 128,
        xs: 256,
        ld,
    };
    let (a, blocks) = matvec_args(&[seg(10), seg(3), seg(3)], x(256), 4, 256).unwrap();
    assert_eq!((a.nseg, a.n, a.cols, a.xq), (3, 4, 256, 128));
    assert_eq!(blocks, 3); // 5 + 2 + 2 pairs of rows, 4 warps a block
                           // Five rows: two 4-row tiles, pairs of weight rows again (the 8-row
                           // kernel, which takes four a warp, only when asked for).
    let (_, blocks) = matvec_args(&[seg(10), seg(3), seg(3)], x(256), 5, 256).unwrap();
    assert_eq!(blocks, 3);
    assert_eq!(matvec_rows_per_warp(5), 2);
    assert!(matvec_args(&[], x(256), 1, 256).is_err());
    assert!(matvec_args(&[seg(1); 4], x(256), 1, 256).is_err());
    assert!(matvec_args(&[seg(1)], x(240), 1, 256).is_err());
    // Row r of the activations: f32 at 4 bytes, int8 at 1, block scales at 16 per 32 values.
    let r = x(256).from_row(3);
    assert_eq!(
        (r.x, r.xq, r.xs),
        (64 + 3 * 1024, 128 + 3 * 256, 256 + 3 * 8 * 16)
    );
    assert_eq!(argmax_id(u64::MAX - 41), 41);
}

#[test]
fn the_tensor_core_plan_picks_matrices_by_format_and_size_never_by_rows() {
    let seg = |fmt, rows: i32, row_bytes: i64| MatSeg {
        w: 0,
        y: 0,
        bias: 0,
        row_bytes,
        fmt,
        rows,
        ldy: rows,
        accumulate: 0,
        best: 0,
        packed: 0,
    };
    let q4k = DType::Q4K.ggml_id() as i32;
    let f16 = DType::F16.ggml_id() as i32;
    // The 1.5B shape: a head of 151,936 Q6_K-sized rows, a gate of 8,960 Q4_K rows, q of 1,536.
    let head = seg(q4k, 151_936, 1260);
    let gate = seg(q4k, 8960, 864);
    let q = seg(q4k, 1536, 864);
    let big = MmaPlan::AtLeast(64 << 20);
    assert!(big.takes(&head) && !big.takes(&gate) && !big.takes(&q));
    let mid = MmaPlan::AtLeast(4 << 20);
    assert!(mid.takes(&head) && mid.takes(&gate) && !mid.takes(&q));
    assert!(MmaPlan::All.takes(&q) && !MmaPlan::Off.takes(&head));
    // Float formats stay on matvec.cu whatever their size.
    assert!(!MmaPlan::All.takes(&seg(f16, 151_936, 3072)));
}

#[test]
fn attention_chunks_follow_positions() {
    assert_eq!(attention_chunks(0), 1);
    assert_eq!(attention_chunks(63), 1);
    assert_eq!(attention_chunks(64), 2);
}

#[test]
fn attention_grids_follow_the_shape_and_the_cache_only() {
    let call = |n, n_heads, n_kv_heads, chunks| AttnCall {
        q: 0,
        k_cache: 0,
        v_cache: 0,
        max_slots: 0,
        n,
        n_heads,
        n_kv_heads,
        head_dim: 128,
        scale: 1.0,
        batch: 0,
        pos: 0,
        path: 0,
        part_ml: 0,
        part_o: 0,
        chunks,
        arrivals: 0,
        out: 0,
        out_q: 0,
        out_s: 0,
        post: PostArgs::default(),
    };
    // attn_partial: a block per query head; attn_group: per KV head and ATTG_HEADS of its
    // query heads (GQA 6: one; 14: two; 1: one per head). Splits: the cache's chunks, at
    // most ATT_BLOCKS, whatever the rows' lengths.
    assert_eq!(attention_grid(&call(1, 12, 2, 5), false), (1, 12, 5));
    assert_eq!(attention_grid(&call(1, 12, 2, 5), true), (1, 2, 5));
    assert_eq!(attention_grid(&call(3, 28, 2, 70), true), (3, 4, 32));
    assert_eq!(attention_grid(&call(9, 4, 4, 33), true), (9, 4, 32));
    assert_eq!(attention_grid(&call(2, 32, 8, 1), true), (2, 8, 1));
    assert_eq!(attention_grid(&call(2, 64, 4, 1), true), (2, 8, 1));
    // The grouped kernel's blocks of query heads never outnumber the arrival counts (one
    // per row and query head).
    for (nh, nkv) in [(12, 2), (28, 2), (4, 4), (64, 4), (40, 8), (9, 1)] {
        let (_, y, _) = attention_grid(&call(1, nh, nkv, 1), true);
        assert!(y as usize <= nh);
    }
    // attn_rows: groups of `rows` rows (the last one partial), a block per query head, the
    // same splits as attn_partial.
    assert_eq!(attention_rows_grid(&call(16, 12, 2, 9), 4), (4, 12, 9));
    assert_eq!(attention_rows_grid(&call(17, 12, 2, 70), 4), (5, 12, 32));
    assert_eq!(attention_rows_grid(&call(3, 12, 2, 1), 16), (1, 12, 1));
}

#[test]
fn every_format_is_readable_at_its_block_size() {
    for d in DType::ALL {
        assert!(matvec_supports(d, 256), "{d}");
    }
}

/// The kernel sources compile with NVRTC for Hopper (and the device's own architecture where
/// one is present). Skipped, with a note, where NVRTC is not installed (CI).
#[test]
fn kernels_compile_with_nvrtc() {
    match crate::runtime::compile::load_nvrtc() {
        Err(e) => eprintln!("note: NVRTC not found, kernel compilation not checked: {e}"),
        Ok(()) => {
            let v = crate::runtime::compile::nvrtc_version().unwrap();
            for arch in ["sm_90", "sm_80"] {
                let cubin = crate::runtime::compile::compile_cubin(&source(), arch)
                    .unwrap_or_else(|e| panic!("{arch}: {e}"));
                assert!(cubin.len() > 1000);
                eprintln!(
                    "NVRTC {}.{}: {arch} cubin of {} bytes",
                    v.0,
                    v.1,
                    cubin.len()
                );
            }
        }
    }
}

#[test]
fn matvec_tiles_follow_the_row_count() {
    assert_eq!(matvec_kernel(1), "matvec_1");
    assert_eq!(matvec_kernel(2), "matvec_2");
    assert_eq!(matvec_kernel(3), "matvec_4");
    // Tiles of at most 4 rows by default; the 8-row kernel when asked for.
    assert_eq!(matvec_kernel(5), "matvec_4");
    assert_eq!(matvec_kernel(64), "matvec_4");
    assert_eq!(matvec_kernel_capped(5, 8), "matvec_8");
    assert_eq!(matvec_kernel_capped(64, 8), "matvec_8");
    assert_eq!(matvec_kernel_capped(16, 4), "matvec_4");
    assert_eq!(matvec_kernel_capped(3, 2), "matvec_2");
    assert_eq!(matvec_kernel_capped(1, 4), "matvec_1");
    for name in ["matvec_1", "matvec_2", "matvec_4", "matvec_8"] {
        assert!(NAMES.contains(&name));
    }
}

#[test]
fn long_rows_are_split_over_warps_by_format_and_width_only() {
    let seg = |dtype: DType| MatSeg {
        fmt: dtype.ggml_id() as i32,
        rows: 10,
        ..MatSeg::default()
    };
    // Units per row: Q4_K 32 values, Q6_K 64, floats 8.
    assert_eq!(matvec_split(&[seg(DType::Q4K)], 1536), 1);
    assert_eq!(matvec_split(&[seg(DType::Q4K)], 8960), 4);
    assert_eq!(matvec_split(&[seg(DType::Q6K)], 8960), 2);
    assert_eq!(matvec_split(&[seg(DType::F32)], 1536), 2);
    // One call takes the split of its shortest-unit matrix.
    assert_eq!(matvec_split(&[seg(DType::Q4K), seg(DType::Q6K)], 8960), 2);
    // The grid grows with the split: 5 pairs of rows at 4 warps a pair, 4 warps a block.
    let (a, blocks) = matvec_args(
        &[seg(DType::Q4K)],
        Acts {
            ld: 8960,
            ..Acts::default()
        },
        1,
        8960,
    )
    .unwrap();
    assert_eq!((a.split, blocks), (4, 5));
}

#[test]
fn tensor_core_products_take_block_formats_in_16_row_tiles_split_by_width() {
    let seg = |dtype: DType, rows| MatSeg {
        fmt: dtype.ggml_id() as i32,
        rows,
        ..MatSeg::default()
    };
    let acts = |ld| Acts {
        ld,
        ..Acts::default()
    };
    assert_eq!(mma_kernel(1), "mma_1");
    assert_eq!(mma_kernel(8), "mma_1");
    assert_eq!(mma_kernel(9), "mma_2");
    assert_eq!(mma_kernel(16), "mma_2");
    assert_eq!(mma_kernel(17), "mma_4");
    assert_eq!(mma_kernel(64), "mma_8");
    for name in ["mma_1", "mma_2", "mma_4", "mma_8"] {
        assert!(NAMES.contains(&name));
    }
    // One warp per super-block of 256 values, 1..=16: the 1.5B model's 1536 and 8960 widths;
    // a partial super-block (legacy formats) counts whole.
    assert_eq!(mma_split(64, 1), 1);
    assert_eq!(mma_split(512, 1), 2);
    assert_eq!(mma_split(896, 1), 4);
    assert_eq!(mma_split(1536, 1), 6);
    assert_eq!(mma_split(8960, 1), 16);
    assert_eq!(mma_split(1536, 2), 3);
    assert_eq!(mma_split(1536, 4), 2);
    // q/k/v of 1536 + 256 + 256 rows: 96 + 16 + 16 tiles; a partial tile counts whole.
    let segs = [
        seg(DType::Q4K, 1536),
        seg(DType::Q4K, 256),
        seg(DType::Q6K, 250),
    ];
    let (a, grid) = mma_args(&segs, acts(1536), 3, 1536).unwrap();
    assert_eq!((a.split, a.nseg, grid), (6, 3, 128));
    // Stage rows: Q6_K's 210 bytes from any even address take 15 lines (odd); Q4_K's 144
    // aligned ones 9; Q8_0's 272 bytes (17 lines) when aligned, else 19.
    assert_eq!(a.stream_stage_bytes, 240);
    let aligned = |dtype: DType, row_bytes: i64| MatSeg {
        fmt: dtype.ggml_id() as i32,
        w: 256,
        row_bytes,
        ..MatSeg::default()
    };
    assert_eq!(mma_stride(&[aligned(DType::Q4K, 864)]), 144);
    assert_eq!(mma_stride(&[aligned(DType::Q5K, 1056)]), 176);
    assert_eq!(mma_stride(&[aligned(DType::Q8_0, 1632)]), 272);
    assert_eq!(mma_stride(&[aligned(DType::Q8_0, 34 * 28)]), 304);
    assert_eq!(mma_stride(&[aligned(DType::Q4_1, 960)]), 176);
    // One super-block a warp at 1536: one stage; at 8960, 16 warps of 2-3 super-blocks: as
    // many stages as the budget holds, at least one.
    assert_eq!(a.stream_stages, 1);
    assert_eq!(mma_shared(&a), 6 * 16 * 240);
    assert_eq!(mma_stages(8960, 16, 144, MMA_SHARED_MAX), 2);
    assert_eq!(mma_stages(8960, 16, 304, MMA_SHARED_MAX), 1);
    assert_eq!(mma_stages(8960 * 4, 16, 144, 1 << 20), 4);
    const { assert!(16 * 16 * 304 <= MMA_SHARED_MAX) };
    // Float formats stay on the FMA kernel.
    assert!(!is_block_format(DType::F16.ggml_id() as i32));
    assert!(is_block_format(DType::Q8_0.ggml_id() as i32));
    let e = mma_args(&[seg(DType::BF16, 16)], acts(256), 1, 256).unwrap_err();
    assert!(e.to_string().contains("block formats only"), "{e}");
}

#[test]
fn top_k_keys_take_the_bits_of_the_largest_id() {
    assert_eq!(id_bits(1), 1);
    assert_eq!(id_bits(2), 1);
    assert_eq!(id_bits(3), 2);
    assert_eq!(id_bits(256), 8);
    assert_eq!(id_bits(257), 9);
    assert_eq!(id_bits(151_936), 18);
    assert!(NAMES.contains(&"top_k_select"));
    assert!(source().contains("top_k_select"));
}

/// sample.cu's radix select transcribed step for step (keys, 11-bit digits from the top, the
/// digit holding the need-th key, the final `>= prefix` test), so that its logic is checked
/// against the host sampler's selection where no GPU is (the GPU check `topk` runs the kernel).
fn top_k_select_transcribed(row: &[f32], count: usize) -> Vec<(u32, u32)> {
    let vocab = row.len();
    let id_bits = id_bits(vocab);
    let id_mask: u32 = if id_bits >= 32 {
        u32::MAX
    } else {
        (1 << id_bits) - 1
    };
    let key = |i: usize| {
        let b = row[i].to_bits();
        let up = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
        ((up as u64) << id_bits) | ((!(i as u32)) & id_mask) as u64
    };
    let (mut prefix, mut need, mut shift, mut done) = (0u64, count as u32, 32 + id_bits, false);
    while shift > 0 && !done {
        let width = shift.min(11);
        let lo = shift - width;
        let hi_mask = if shift >= 64 { 0 } else { !0u64 << shift };
        let mut hist = vec![0u32; 2048];
        for i in 0..vocab {
            let k = key(i);
            if k & hi_mask == prefix {
                hist[((k >> lo) as u32 & ((1 << width) - 1)) as usize] += 1;
            }
        }
        let mut above = 0;
        for d in (0..2048).rev() {
            let c = hist[d];
            if above + c >= need {
                prefix |= (d as u64) << lo;
                need -= above;
                done = c == need;
                break;
            }
            above += c;
        }
        shift = lo;
    }
    let sel_mask = if shift >= 64 { 0 } else { !0u64 << shift };
    (0..vocab)
        .filter(|&i| key(i) & sel_mask >= prefix)
        .map(|i| (i as u32, row[i].to_bits()))
        .collect()
}

#[test]
fn the_radix_select_of_sample_cu_selects_as_the_host_sampler() {
    let mut x: u64 = 0x1234_5678_9ABC_DEF1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let special = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
    ];
    for vocab in [2usize, 3, 300, 2049, 40_000] {
        for kind in 0..3 {
            let row: Vec<f32> = (0..vocab)
                .map(|_| {
                    let r = next();
                    match kind {
                        0 => (r >> 40) as f32 / (1u64 << 20) as f32 - 8.0,
                        1 => ((r >> 20) % 50) as f32 * 0.25,
                        _ if r % 31 == 0 => special[(r >> 8) as usize % special.len()],
                        _ => 1.0,
                    }
                })
                .collect();
            for count in [1usize, 2, 40, 299, 1024]
                .into_iter()
                .filter(|&c| c < vocab)
            {
                let mut got = top_k_select_transcribed(&row, count);
                let all = row
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l))
                    .collect();
                let mut want: Vec<(u32, u32)> = kasoku::sampler::top_k_of(all, count)
                    .into_iter()
                    .map(|(i, l)| (i, l.to_bits()))
                    .collect();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "vocab {vocab}, kind {kind}, count {count}");
            }
        }
    }
}

#[test]
fn streamed_products_take_tiles_of_a_blocks_rows_in_as_many_stages_as_fit() {
    let seg = |fmt: i32, rows: i32, row_bytes: i64| MatSeg {
        fmt,
        rows,
        row_bytes,
        ..MatSeg::default()
    };
    let args = |segs: &[MatSeg], split: i32| {
        let mut a = MatArgs {
            nseg: segs.len() as i32,
            split,
            ..MatArgs::default()
        };
        a.seg[..segs.len()].copy_from_slice(segs);
        a
    };
    // gate|up of the 1.5B (Q4_K, 1536 columns: 864 bytes a row), a pair per warp: tiles of 8
    // rows (6,912 bytes, + 32 for the 16-byte widening), 7 stages in 48 KiB, 2 × 1,120 tiles.
    let gate_up = args(&[seg(12, 8960, 864), seg(12, 8960, 864)], 1);
    assert_eq!(stream_layout(&gate_up, 48 * 1024), Some((7, 6944, 2240)));
    // Its Q6_K down projection (8,960 columns: 7,350 bytes a row), 2 warps a pair: 4-row tiles
    // of 29,400 bytes take 2 stages even past the budget; an odd row count rounds up.
    let down = args(&[seg(14, 1535, 7350)], 2);
    assert_eq!(stream_layout(&down, 48 * 1024), Some((2, 29440, 384)));
    // Rows too long for two stages: the plain kernel.
    let wide = args(&[seg(0, 64, 4 * 18944)], 4);
    assert_eq!(stream_layout(&wide, 48 * 1024), None);
    // Stages never exceed what matvec.cu has barriers for.
    let tiny = args(&[seg(8, 64, 34)], 1);
    assert_eq!(
        stream_layout(&tiny, 48 * 1024).map(|l| l.0),
        Some(STREAM_MAX_STAGES as i32)
    );
}

#[test]
fn a_fused_swiglu_never_writes_into_its_own_int8_input() {
    let acts = |xq: u64, xs: u64| Acts {
        x: 0x1000,
        xq,
        xs,
        ld: 64,
    };
    // The model's shared scratch for both: refused (the race behind FUSE_GLU's failure).
    assert!(glu_output_separate(acts(0x2000, 0x3000), acts(0x2000, 0x3000)).is_err());
    assert!(glu_output_separate(acts(0x2000, 0x3000), acts(0x4000, 0x3000)).is_err());
    // Buffers of its own, or no int8 output at all: fine.
    assert!(glu_output_separate(acts(0x2000, 0x3000), acts(0x4000, 0x5000)).is_ok());
    assert!(glu_output_separate(acts(0x2000, 0x3000), acts(0, 0)).is_ok());
}
