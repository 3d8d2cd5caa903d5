//! CPU-side tests of the launchers: parameter layouts match the CUDA structs, shape checks,
//! grid sizes; and (where NVRTC is present, e.g. `tools/nvrtc_check.sh`) the sources compile.

use super::*;

#[test]
fn parameter_blocks_have_the_cuda_layout() {
    // struct MatSeg: 3 pointers, a long long, 4 ints = 48 bytes; MatArgs: 3 segs, a pointer,
    // 4 ints = 168 bytes, 8-aligned.
    assert_eq!(std::mem::size_of::<MatSeg>(), 48);
    assert_eq!(std::mem::size_of::<MatArgs>(), 168);
    assert_eq!(std::mem::align_of::<MatArgs>(), 8);
    assert_eq!(std::mem::offset_of!(MatArgs, x), 144);
    assert_eq!(std::mem::offset_of!(MatArgs, ldx), 164);
    assert_eq!(std::mem::size_of::<BatchDesc>(), 16);
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
    let (a, blocks) = matvec_args(&[seg(10), seg(3), seg(3)], 64, 5, 256, 256).unwrap();
    assert_eq!((a.nseg, a.n, a.cols), (3, 5, 256));
    assert_eq!(blocks, 4); // 16 rows, 4 warps a block
    assert!(matvec_args(&[], 0, 1, 256, 256).is_err());
    assert!(matvec_args(&[seg(1); 4], 0, 1, 256, 256).is_err());
    assert!(matvec_args(&[seg(1)], 0, 1, 256, 255).is_err());
}

#[test]
fn attention_chunks_follow_positions() {
    assert_eq!(attention_chunks(0), 1);
    assert_eq!(attention_chunks(63), 1);
    assert_eq!(attention_chunks(64), 2);
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
