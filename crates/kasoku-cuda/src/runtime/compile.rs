//! Kernels as CUDA C source, compiled at run time by NVRTC into machine code for the device
//! present (`sm_XY` of its compute capability; no PTX left for the driver to JIT, so an NVRTC
//! newer than the driver still works), loaded as a module, once per process and device.
//!
//! NVRTC is found where the CUDA toolkit or its Python wheel puts it: `$KASOKU_NVRTC` (a path
//! to `libnvrtc.so*`), `$CUDA_PATH`/`$CUDA_HOME` `lib64`, `/usr/local/cuda/lib64`, the Python
//! wheel `nvidia-cuda-nvrtc` under the interpreter's site-packages, then the loader's own
//! search path. The library is loaded once and kept.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc;

use super::{check, Error, Gpu, Result};

/// Libraries loaded ahead of cudarc's own lookup (kept for the life of the process).
static PRELOADED: OnceLock<std::result::Result<Vec<libloading::Library>, String>> = OnceLock::new();

/// Directories that may hold NVRTC.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib64"));
            dirs.push(Path::new(&v).join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    // The pip wheel (nvidia-cuda-nvrtc) in any Python's site-packages we can see.
    for root in ["/opt/torch/.venv/lib", "/usr/local/lib", "/usr/lib"] {
        if let Ok(entries) = std::fs::read_dir(root) {
            for e in entries.flatten() {
                let p = e.path();
                if p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
                {
                    for site in ["site-packages", "dist-packages"] {
                        dirs.push(p.join(site).join("nvidia/cu13/lib"));
                        dirs.push(p.join(site).join("nvidia/cuda_nvrtc/lib"));
                    }
                }
            }
        }
    }
    dirs
}

/// Finds and loads NVRTC (and its builtins library beside it) so that cudarc's lookup by
/// name finds the loaded copy. Errors say where it looked.
pub fn load_nvrtc() -> Result<()> {
    let loaded = PRELOADED.get_or_init(|| {
        let mut files: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("KASOKU_NVRTC") {
            files.push(p.into());
        }
        for d in candidate_dirs() {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                files.push(d.join(name));
            }
        }
        let mut libs = Vec::new();
        for f in files.iter().filter(|f| f.is_file()) {
            let dir = f.parent().unwrap_or(Path::new("."));
            // The builtins first: libnvrtc opens it by name when compiling.
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt.") {
                        // SAFETY: loading a shared library runs its initialisers; NVRTC's
                        // builtins library has none with side effects beyond itself.
                        if let Ok(l) = unsafe { open_global(&e.path()) } {
                            libs.push(l);
                        }
                    }
                }
            }
            // SAFETY: as above, for NVRTC itself.
            if let Ok(l) = unsafe { open_global(f) } {
                libs.push(l);
                return Ok(libs);
            }
        }
        // SAFETY: probes cudarc's own candidate names on the loader's search path.
        if unsafe { nvrtc::is_culib_present() } {
            return Ok(libs);
        }
        Err(format!(
            "NVRTC (libnvrtc.so) not found; set KASOKU_NVRTC to its path or install the CUDA \
             toolkit or the nvidia-cuda-nvrtc wheel (looked in {:?})",
            candidate_dirs()
        ))
    });
    match loaded {
        // SAFETY: as above.
        Ok(_) if unsafe { nvrtc::is_culib_present() } => Ok(()),
        Ok(_) => Err(Error::Unavailable(
            "NVRTC was loaded from a path but cudarc cannot find it by name".into(),
        )),
        Err(e) => Err(Error::Unavailable(e.clone())),
    }
}

/// # Safety
/// Runs the library's initialisers.
unsafe fn open_global(path: &Path) -> std::result::Result<libloading::Library, String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: forwarded to the caller.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
            .map(Into::into)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(unix))]
    {
        // SAFETY: forwarded to the caller.
        unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())
    }
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    load_nvrtc()?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: out-pointers to locals; NVRTC is loaded.
    let r = unsafe { nvrtc::nvrtcVersion(&mut a, &mut b) };
    nvrtc_check("nvrtcVersion", r, "")?;
    Ok((a, b))
}

fn nvrtc_check(call: &str, r: nvrtc::nvrtcResult, log: &str) -> Result<()> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Compile(format!("{call}: {r:?}\n{log}")))
    }
}

/// The options kasoku compiles with for `arch` (e.g. `sm_90`): no fused multiply-add
/// contraction (see kernels/common.cuh), full-precision division and square roots.
///
/// `KASOKU_CUDA_EARLY_LAUNCH=0` compiles the kernels without their early launch of the next
/// kernel (see `wait_for_predecessor` in common.cuh), for measuring what it gains.
/// `KASOKU_CUDA_TRIGGER_FIRST=1` lets the next kernel launch before this one's wait (see
/// `wait_for_predecessor`).
/// Each product warp asks L2 for its own weight rows before that wait (on an H100 it decoded
/// the 1.5B Q4_K_M shape at 687 tokens/s against 664 without); `KASOKU_CUDA_OWN_PREFETCH=0`
/// compiles the products without it.
/// `KASOKU_CUDA_MATVEC_V2=1` compiles the Q4_K/Q5_K products that issue two units' loads
/// (whole 16-byte headers) before their arithmetic.
/// `KASOKU_CUDA_TAIL_TILES=1` compiles the products whose last partial tile of activation rows
/// runs as the smallest tile that holds it (see `row_tiles` in matvec.cu).
/// `KASOKU_CUDA_MATVEC_BLOCKS=N` compiles the 2- and 4-row products to fit N blocks a
/// multiprocessor.
/// `KASOKU_CUDA_MMA_ROLLED=0` compiles the tensor-core products with their sub-block loops
/// unrolled (more spills; see mma.cu; rolled they decoded 438 tokens/s against 433 on an
/// H100, and a 16-row pass cost 1.80 single ones against 2.10).
/// `KASOKU_CUDA_STREAM=1` compiles the products that can stream their weights through
/// shared memory (used on compute capability 9.0; see `kernels::stream_layout`).
/// `KASOKU_CUDA_PTXAS_VERBOSE=1` has ptxas report each kernel's registers and shared memory,
/// printed to standard error.
pub fn options(arch: &str) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--std=c++17".into(),
        "-default-device".into(),
    ];
    if std::env::var("KASOKU_CUDA_EARLY_LAUNCH").is_ok_and(|v| v == "0") {
        o.push("-DKASOKU_NO_EARLY_LAUNCH".into());
    }
    if std::env::var("KASOKU_CUDA_TRIGGER_FIRST").is_ok_and(|v| v == "1") {
        o.push("-DKASOKU_TRIGGER_FIRST".into());
    }
    if std::env::var("KASOKU_CUDA_MATVEC_V2").is_ok_and(|v| v == "1") {
        o.push("-DKASOKU_MATVEC_V2".into());
    }
    if !std::env::var("KASOKU_CUDA_OWN_PREFETCH").is_ok_and(|v| v == "0") {
        o.push("-DKASOKU_OWN_PREFETCH".into());
    }
    if std::env::var("KASOKU_CUDA_TAIL_TILES").is_ok_and(|v| v == "1") {
        o.push("-DKASOKU_MATVEC_TAIL_TILES".into());
    }
    if std::env::var("KASOKU_CUDA_MMA_ROLLED").is_ok_and(|v| v == "0") {
        o.push("-DKASOKU_MMA_UNROLLED".into());
    }
    if let Some(n) = matvec_min_blocks() {
        o.push(format!("-DKASOKU_MATVEC_MIN_BLOCKS={n}"));
    }
    if crate::kernels::stream_asked() {
        o.push("-DKASOKU_MATVEC_STREAM".into());
    }
    if verbose_ptxas() {
        o.push("--ptxas-options=-v".into());
    }
    o
}

/// `KASOKU_CUDA_MATVEC_BLOCKS=N` (2 to 8): blocks a multiprocessor the 2- and 4-row products
/// are compiled to fit (their register budget; see `MATVEC_TILE_BOUNDS` in matvec.cu).
fn matvec_min_blocks() -> Option<u32> {
    std::env::var("KASOKU_CUDA_MATVEC_BLOCKS")
        .ok()?
        .parse()
        .ok()
        .filter(|n| (2..=8).contains(n))
}

fn verbose_ptxas() -> bool {
    std::env::var("KASOKU_CUDA_PTXAS_VERBOSE").is_ok_and(|v| v == "1")
}

/// Compiles `source` to machine code (CUBIN) for `arch`; the error carries NVRTC's log.
pub fn compile_cubin(source: &str, arch: &str) -> Result<Vec<u8>> {
    load_nvrtc()?;
    let src = CString::new(source).map_err(|_| Error::Compile("NUL in source".into()))?;
    let name = CString::new("kasoku.cu").expect("no NUL");
    let opts: Vec<CString> = options(arch)
        .into_iter()
        .map(|o| CString::new(o).expect("no NUL"))
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a live NUL-terminated string or a local out-parameter; the
    // program is destroyed on every path below.
    unsafe {
        nvrtc_check(
            "nvrtcCreateProgram",
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
            "",
        )?;
        let r = nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut log_len = 0usize;
        nvrtc::nvrtcGetProgramLogSize(prog, &mut log_len);
        let mut log = vec![0u8; log_len.max(1)];
        nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut c_char);
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .to_string();
        if verbose_ptxas() {
            eprintln!("{log}");
        }
        let out = (|| {
            nvrtc_check("nvrtcCompileProgram", r, &log)?;
            let mut size = 0usize;
            nvrtc_check(
                "nvrtcGetCUBINSize",
                nvrtc::nvrtcGetCUBINSize(prog, &mut size),
                "",
            )?;
            let mut cubin = vec![0u8; size];
            nvrtc_check(
                "nvrtcGetCUBIN",
                nvrtc::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char),
                "",
            )?;
            Ok(cubin)
        })();
        nvrtc::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// A loaded module and the functions looked up in it.
pub struct Module {
    module: sys::CUmodule,
    functions: HashMap<&'static str, sys::CUfunction>,
}

// SAFETY: module and function handles are immutable driver objects usable from any thread
// with the context current.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `cubin` into `gpu`'s context and looks up `names`.
    pub fn load(gpu: &Gpu, cubin: &[u8], names: &[&'static str]) -> Result<Module> {
        gpu.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: `cubin` is a complete CUBIN image from NVRTC; out-pointer to a local.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, cubin.as_ptr() as *const std::ffi::c_void)
        })?;
        let mut m = Module {
            module,
            functions: HashMap::new(),
        };
        for &n in names {
            let c = CString::new(n).expect("no NUL");
            let mut f = std::ptr::null_mut();
            // SAFETY: the module is loaded; out-pointer to a local.
            check("cuModuleGetFunction", unsafe {
                sys::cuModuleGetFunction(&mut f, module, c.as_ptr())
            })
            .map_err(|e| Error::Invalid(format!("kernel {n}: {e}")))?;
            m.functions.insert(n, f);
        }
        Ok(m)
    }

    pub fn function(&self, name: &str) -> sys::CUfunction {
        *self
            .functions
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} was not looked up"))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`; unloaded once.
        unsafe {
            sys::cuModuleUnload(self.module);
        }
    }
}

/// Compiled images per (source hash, arch), so a process compiles each source once.
static CACHE: Mutex<Vec<(u64, String, Vec<u8>)>> = Mutex::new(Vec::new());

/// [`compile_cubin`] through the process-wide cache, then the disk cache
/// (`KASOKU_CUDA_CACHE`, else `~/.cache/kasoku/cuda`), then a `cuda-cache` folder beside the
/// executable (read only: code compiled on another machine and staged with the binary, e.g.
/// by tools/gpu_run.sh, so a GPU machine lent for minutes does not spend one of them in
/// NVRTC). An image is found only under its own key: the source, NVRTC's version, the options
/// and the architecture.
pub fn compile_cached(source: &str, arch: &str) -> Result<Vec<u8>> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    nvrtc_version()?.hash(&mut h);
    options(arch).hash(&mut h);
    let key = h.finish();
    if let Some((_, _, c)) = CACHE
        .lock()
        .expect("cache lock")
        .iter()
        .find(|(k, a, _)| *k == key && a == arch)
    {
        return Ok(c.clone());
    }
    // On disk too: a process that starts often (tools, tests) compiles each source once.
    let name = format!("{key:016x}-{arch}.cubin");
    let file = disk_cache_dir().map(|d| d.join(&name));
    let staged = staged_cache_dir().map(|d| d.join(&name));
    if let Some(c) = [&file, &staged]
        .into_iter()
        .flatten()
        .find_map(|f| std::fs::read(f).ok())
    {
        CACHE
            .lock()
            .expect("cache lock")
            .push((key, arch.to_string(), c.clone()));
        return Ok(c);
    }
    let cubin = compile_cubin(source, arch)?;
    if let Some(f) = &file {
        // Written whole under a temporary name, then renamed: readers never see a part.
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::create_dir_all(f.parent().expect("a parent")).is_ok()
            && std::fs::write(&tmp, &cubin).is_ok()
        {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    CACHE
        .lock()
        .expect("cache lock")
        .push((key, arch.to_string(), cubin.clone()));
    Ok(cubin)
}

/// Where compiled kernels are kept between processes: `$KASOKU_CUDA_CACHE`, else
/// `~/.cache/kasoku/cuda` (keyed by the source's hash, the architecture and NVRTC's version).
fn disk_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KASOKU_CUDA_CACHE") {
        return Some(d.into());
    }
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/kasoku/cuda"))
}

/// `cuda-cache` beside the running executable, if there is one.
fn staged_cache_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.join("cuda-cache");
    dir.is_dir().then_some(dir)
}

/// The `sm_XY` target for a compute capability.
pub fn arch_of(capability: (i32, i32)) -> String {
    format!("sm_{}{}", capability.0, capability.1)
}
