//! The CUDA runtime kasoku needs, over the driver API that `cudarc` loads at run time: a
//! device with its context and one stream ([`Gpu`]), device and pinned host memory
//! ([`DeviceBuffer`], [`PinnedBuffer`]), modules compiled by NVRTC ([`compile`]), kernel
//! launches, CUDA graphs captured from the stream ([`Graph`]) and event timing ([`Timer`]).
//!
//! Every call's result is checked and turned into an [`Error`] naming the call. Nothing here
//! touches the driver before [`Gpu::open`] (or [`device_count`]) has found it loadable, so a
//! machine without CUDA gets an error, never a panic.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::driver::sys;

pub mod compile;
mod graph;

pub use graph::Graph;

/// What can go wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable driver or device (the CPU backend should be used instead).
    #[error("no usable CUDA device: {0}")]
    Unavailable(String),
    #[error("CUDA call {call} failed: {code}")]
    Driver { call: &'static str, code: String },
    #[error("NVRTC could not compile kasoku's kernels: {0}")]
    Compile(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Turns a driver result into an [`Error`] naming `call`.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it null).
    let code = unsafe {
        if sys::cuGetErrorName(r, &mut name) == sys::CUresult::CUDA_SUCCESS && !name.is_null() {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    Err(Error::Driver { call, code })
}

/// Whether the driver library can be loaded, and the number of devices it sees.
pub fn device_count() -> Result<usize> {
    // SAFETY: only probes whether the library loads; loads nothing it keeps.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Unavailable(
            "the CUDA driver library (libcuda.so) was not found".into(),
        ));
    }
    // SAFETY: the library is present; cuInit may be called any number of times.
    unsafe {
        check("cuInit", sys::cuInit(0)).map_err(|e| Error::Unavailable(e.to_string()))?;
        let mut n = 0;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
        Ok(n.max(0) as usize)
    }
}

/// One GPU: its primary context and the stream every kernel of kasoku runs on.
pub struct Gpu {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    pub multiprocessors: usize,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    /// Launch kernels with programmatic dependent launch (each may start while the one
    /// before it drains; every kernel waits for its predecessor's results first).
    pdl: std::sync::atomic::AtomicBool,
}

// SAFETY: driver handles may be used from any thread once the context is made current there,
// which every entry point does (`Gpu::bind`); kasoku issues work from one thread at a time.
unsafe impl Send for Gpu {}
// SAFETY: as above; the handles themselves are never mutated after creation.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens device `ordinal` (its primary context and a non-blocking stream).
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Unavailable(format!(
                "device {ordinal} asked for, {count} present"
            )));
        }
        // SAFETY: the driver is loaded and initialised (device_count); every out-pointer
        // points to a local.
        unsafe {
            let mut device = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut device, ordinal as i32))?;
            let mut ctx = std::ptr::null_mut();
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, device),
            )?;
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let mut stream = std::ptr::null_mut();
            check(
                "cuStreamCreate",
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                ),
            )?;
            let mut buf = [0 as std::ffi::c_char; 256];
            check(
                "cuDeviceGetName",
                sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device),
            )?;
            let name = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
                let mut v = 0;
                check(
                    "cuDeviceGetAttribute",
                    sys::cuDeviceGetAttribute(&mut v, a, device),
                )?;
                Ok(v)
            };
            use sys::CUdevice_attribute::*;
            let capability = (
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            );
            let multiprocessors = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
            Ok(Arc::new(Gpu {
                ordinal,
                name,
                capability,
                multiprocessors,
                device,
                ctx,
                stream,
                pdl: std::sync::atomic::AtomicBool::new(
                    std::env::var("KASOKU_CUDA_PDL").map_or(capability.0 >= 9, |v| v != "0"),
                ),
            }))
        }
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context, alive as long as `self`.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// Whether kernels launch with programmatic dependent launch (Hopper and later; on by
    /// default there, `KASOKU_CUDA_PDL=0` turns it off).
    pub fn dependent_launch(&self) -> bool {
        self.pdl.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns programmatic dependent launch on or off (ignored before compute capability 9).
    pub fn set_dependent_launch(&self, on: bool) {
        self.pdl.store(
            on && self.capability.0 >= 9,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(crate) fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream belongs to this context, alive as long as `self`.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-pointers to locals; the context is current.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// Allocates `bytes` of device memory (uninitialised).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; the context is current. 64 bytes of slack past the
        // end: kernels read 16-byte groups at unaligned addresses as aligned words, which
        // may touch up to 4 bytes after a buffer's last block.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes + 64)
        })?;
        Ok(DeviceBuffer {
            gpu: self.clone(),
            ptr,
            bytes,
        })
    }

    /// A device copy of `data` (copied synchronously, straight from wherever it lives: for
    /// weights, the file's memory map).
    pub fn upload(self: &Arc<Self>, data: &[u8]) -> Result<DeviceBuffer> {
        let buf = self.alloc(data.len())?;
        buf.write(0, data)?;
        Ok(buf)
    }

    /// A device copy of `data`.
    pub fn upload_f32(self: &Arc<Self>, data: &[f32]) -> Result<DeviceBuffer> {
        self.upload(as_bytes(data))
    }

    /// Page-locked host memory of `bytes` (for copies a graph replays).
    pub fn pinned(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuffer> {
        self.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the context is current.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut ptr, bytes.max(64), sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        // SAFETY: the allocation holds at least `bytes` bytes; zero them so reads are defined.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes.max(64)) };
        Ok(PinnedBuffer {
            gpu: self.clone(),
            ptr: ptr as *mut u8,
            bytes,
        })
    }

    /// Launches `f` on the stream. `params` holds one pointer per kernel parameter, each to a
    /// value of exactly the parameter's type.
    pub(crate) fn launch(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch_shared(f, grid, block, 0, params)
    }

    /// [`Gpu::launch`] with `shared` bytes of dynamic shared memory per block (above 48 KiB
    /// only for a function allowed more by [`Gpu::allow_shared`]).
    pub(crate) fn launch_shared(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if self.dependent_launch() {
            // SAFETY: a zeroed attribute value is valid; we set the one field this id reads.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: shared,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for cuLaunchKernel below; `config` and `attr` outlive the call.
            return check("cuLaunchKernelEx", unsafe {
                sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut())
            });
        }
        // SAFETY: `f` is a function of a module loaded in this context; the caller built
        // `params` to match its signature (the typed wrappers in `kernels`).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                shared,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

impl Gpu {
    /// How many blocks of `block` threads and `shared` bytes of dynamic shared memory of `f`
    /// one multiprocessor holds at once.
    pub(crate) fn resident_blocks(
        &self,
        f: sys::CUfunction,
        block: u32,
        shared: u32,
    ) -> Result<usize> {
        let mut n = 0;
        // SAFETY: out-pointer to a local; `f` is a function of a module loaded in this context.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                f,
                block as i32,
                shared as usize,
            )
        })?;
        Ok(n.max(1) as usize)
    }

    /// Lets `f` take up to `bytes` of dynamic shared memory per block (the default limit is
    /// 48 KiB).
    pub(crate) fn allow_shared(&self, f: sys::CUfunction, bytes: u32) -> Result<()> {
        // SAFETY: `f` is a function of a module loaded in this context.
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the stream and the retained context were created in `open`; nothing uses
        // them after `self` goes.
        unsafe {
            sys::cuCtxSetCurrent(self.ctx);
            sys::cuStreamDestroy_v2(self.stream);
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}

/// The bytes of a slice of plain numbers.
pub fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is a plain number type (f32, u32, i32, u16) without padding; the byte view
    // covers exactly the slice's memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Device memory, freed on drop.
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// The device address (for kernel parameters).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies `data` to byte `offset`, in order with the stream's work, and waits for it
    /// (a copy on the legacy stream could still be in flight when our stream's kernels run).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        self.gpu.bind()?;
        // SAFETY: the range was checked against the allocation; `data` is valid host memory
        // until the synchronisation below.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.ptr + offset as u64,
                data.as_ptr() as *const c_void,
                data.len(),
                self.gpu.stream,
            )
        })?;
        self.gpu.synchronize()
    }

    /// Copies bytes `offset..offset + out.len()` to `out`, after everything queued on the
    /// stream before.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        self.gpu.synchronize()?;
        // SAFETY: range checked; `out` is valid writable host memory.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(
                out.as_mut_ptr() as *mut c_void,
                self.ptr + offset as u64,
                out.len(),
            )
        })
    }

    /// The first `n` bytes.
    pub fn read_bytes(&self, n: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// The first `n` f32 values.
    pub fn read_f32(&self, n: usize) -> Result<Vec<f32>> {
        let mut v = vec![0f32; n];
        // SAFETY: f32 has no invalid bit patterns; the byte view covers exactly `v`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n * 4) };
        self.read(0, bytes)?;
        Ok(v)
    }

    /// `n` f32 values from element `first` on, into `out` (resized to `n`; its memory kept).
    pub fn read_f32_into(&self, first: usize, n: usize, out: &mut Vec<f32>) -> Result<()> {
        out.resize(n, 0.0);
        // SAFETY: f32 has no invalid bit patterns; the byte view covers exactly `out`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, n * 4) };
        self.read(first * 4, bytes)
    }

    /// Sets every byte to `value`, queued on the stream.
    pub fn fill(&self, value: u8) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the whole allocation.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(self.ptr, value, self.bytes, self.gpu.stream)
        })
    }

    /// Queues a copy of `len` bytes from host memory `src` (pinned: graphs replay it) to byte
    /// `offset`.
    pub fn write_async(&self, offset: usize, src: &PinnedBuffer, len: usize) -> Result<()> {
        self.check_range(offset, len)?;
        if len > src.bytes {
            return Err(Error::Invalid("pinned source too small".into()));
        }
        // SAFETY: both ranges checked; pinned memory outlives the queued copy (it lives as
        // long as the state that owns both).
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.ptr + offset as u64,
                src.ptr as *const c_void,
                len,
                self.gpu.stream,
            )
        })
    }

    /// Queues a copy of `len` bytes from byte `offset` to pinned host memory `dst`.
    pub fn read_async(&self, offset: usize, dst: &PinnedBuffer, len: usize) -> Result<()> {
        self.check_range(offset, len)?;
        if len > dst.bytes {
            return Err(Error::Invalid("pinned destination too small".into()));
        }
        // SAFETY: both ranges checked; see write_async.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.ptr as *mut c_void,
                self.ptr + offset as u64,
                len,
                self.gpu.stream,
            )
        })
    }

    /// Queues a device-to-device copy of `height` rows of `width` bytes from `src` (rows
    /// `src_pitch` bytes apart) to byte `offset` of this buffer (rows `dst_pitch` bytes
    /// apart). Graphs capture it as a memcpy node.
    pub fn copy_rows_from(
        &self,
        offset: usize,
        dst_pitch: usize,
        src: u64,
        src_pitch: usize,
        width: usize,
        height: usize,
    ) -> Result<()> {
        if height == 0 || width == 0 {
            return Ok(());
        }
        if width > dst_pitch || width > src_pitch {
            return Err(Error::Invalid(format!(
                "rows of {width} bytes between pitches {src_pitch} and {dst_pitch}"
            )));
        }
        self.check_range(offset, (height - 1) * dst_pitch + width)?;
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: self.ptr + offset as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch,
            WidthInBytes: width,
            Height: height,
        };
        // SAFETY: the destination range was checked; the source is device memory the caller
        // owns for as long as the copy is queued (or a graph replays it).
        check("cuMemcpy2DAsync", unsafe {
            sys::cuMemcpy2DAsync_v2(&copy, self.gpu.stream)
        })
    }

    /// Queues a device-to-device copy of `len` bytes from `src` to byte `offset`.
    pub fn copy_from(&self, offset: usize, src: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check_range(offset, len)?;
        // SAFETY: the destination range was checked; the source is device memory the caller
        // owns while the copy is queued.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(self.ptr + offset as u64, src, len, self.gpu.stream)
        })
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::Invalid(format!(
                "copy of {len} bytes at {offset} into a buffer of {}",
                self.bytes
            )));
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context; freed once.
        unsafe {
            sys::cuCtxSetCurrent(self.gpu.ctx);
            sys::cuMemFree_v2(self.ptr);
        }
    }
}

/// Page-locked host memory, freed on drop.
pub struct PinnedBuffer {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `bytes` bytes allocated and zeroed at creation.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    /// Writes `v` as little-endian 32-bit words from word `at`.
    pub fn put_u32s(&mut self, at: usize, v: &[u32]) {
        let s = self.as_mut_slice();
        for (k, x) in v.iter().enumerate() {
            s[(at + k) * 4..(at + k + 1) * 4].copy_from_slice(&x.to_le_bytes());
        }
    }

    /// `n` f32 values from word `at` into `out` (resized to `n`; its memory kept).
    pub fn get_f32s_into(&self, at: usize, n: usize, out: &mut Vec<f32>) {
        let bytes = &self.as_slice()[at * 4..(at + n) * 4];
        out.clear();
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }

    /// Reads `n` 32-bit words from word `at`.
    pub fn get_u32s(&self, at: usize, n: usize) -> Vec<u32> {
        let s = self.as_slice();
        (0..n)
            .map(|k| {
                let b = &s[(at + k) * 4..(at + k + 1) * 4];
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            })
            .collect()
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc; freed once.
        unsafe {
            sys::cuCtxSetCurrent(self.gpu.ctx);
            sys::cuMemFreeHost(self.ptr as *mut c_void);
        }
    }
}

/// Times work on the stream with a pair of events.
pub struct Timer {
    gpu: Arc<Gpu>,
    start: sys::CUevent,
    end: sys::CUevent,
}

impl Timer {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Timer> {
        gpu.bind()?;
        let (mut start, mut end) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: out-pointers to locals; the context is current.
        unsafe {
            check("cuEventCreate", sys::cuEventCreate(&mut start, 0))?;
            check("cuEventCreate", sys::cuEventCreate(&mut end, 0))?;
        }
        Ok(Timer {
            gpu: gpu.clone(),
            start,
            end,
        })
    }

    /// Marks the start (queued on the stream).
    pub fn start(&self) -> Result<()> {
        // SAFETY: events and stream of this context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.start, self.gpu.stream)
        })
    }

    /// Marks the end, waits for it and returns the milliseconds between the marks.
    pub fn stop_ms(&self) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: events and stream of this context; out-pointer to a local.
        unsafe {
            check(
                "cuEventRecord",
                sys::cuEventRecord(self.end, self.gpu.stream),
            )?;
            check("cuEventSynchronize", sys::cuEventSynchronize(self.end))?;
            check(
                "cuEventElapsedTime",
                sys::cuEventElapsedTime_v2(&mut ms, self.start, self.end),
            )?;
        }
        Ok(ms)
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: created in `new`; destroyed once.
        unsafe {
            sys::cuEventDestroy_v2(self.start);
            sys::cuEventDestroy_v2(self.end);
        }
    }
}
