//! kasoku on NVIDIA GPUs.
//!
//! The same binary runs with or without CUDA: nothing is linked against CUDA at build time.
//! The driver (`libcuda.so`) and NVRTC (`libnvrtc.so`) are loaded when a GPU is asked for, and
//! the kernels (CUDA C in `kernels/`) are compiled by NVRTC for the device present, once per
//! process. Where either library is missing, [`select_device`] says so and the caller runs
//! on the CPU.
//!
//! Why `cudarc` (0.19, features `driver`, `nvrtc`, `dynamic-loading`, `cuda-13000`): it is the
//! maintained Rust binding of the CUDA driver API and NVRTC, it loads both with `dlopen` at
//! run time (so CI builds without a toolkit), and its 13.0 bindings match the H200 machines'
//! driver 580 / CUDA 13.0; we use its raw `sys` layer (our own small RAII types in
//! [`runtime`]) because a forward pass is captured into a CUDA graph with plain device
//! addresses as kernel parameters, which its safe layer's per-buffer event tracking would
//! only slow down. The alternatives: shipping PTX built by `nvcc` (needs a toolkit at build
//! time, and PTX newer than the driver does not load), or writing the `dlopen` bindings by
//! hand (what cudarc already is).
//!
//! Layers: [`runtime`] (device, memory, NVRTC, graphs, timing), [`kernels`] (sources and
//! typed launchers), [`model`] (a dense decoder on the GPU: weights, KV cache, passes,
//! verification and commit, greedy plain and speculative decoding), [`device`] (that model
//! behind the engine's `DeviceModel`, so `kasoku::engine::DeviceSession` serves requests on it),
//! [`draft`] (a draft model on the GPU drafting for the target there). `checks` holds the
//! GPU-against-CPU checks that the test suite and `kasoku-cuda-check` run.

pub mod checks;
pub mod device;
pub mod dflash;
pub mod draft;
pub mod kernels;
pub mod model;
pub mod runtime;
pub mod synth;

pub use device::CudaDevice;
pub use draft::CudaDraftDrafter;
pub use model::{
    generate_greedy, generate_plain, generate_speculative, CudaModel, CudaState, Drafting, SpecRun,
};
pub use runtime::{Error, Gpu};

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(Device::Cuda)
                    .map_err(|_| format!("bad device '{s}': expected cpu, cuda or cuda:N")),
                None => Err(format!(
                    "unknown device '{s}': expected cpu, cuda or cuda:N"
                )),
            },
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The device to run on: `asked` if given (an error if it is a GPU that cannot be used),
/// else the first GPU when one is usable (driver, device and NVRTC all present), else the CPU
/// with the reason. Returns the device and, for the CPU fallback, why no GPU.
pub fn select_device(asked: Option<Device>) -> Result<(Device, Option<String>), Error> {
    select_with(asked, || {
        let n = runtime::device_count()?;
        if n == 0 {
            return Err(Error::Unavailable("the driver sees no device".into()));
        }
        runtime::compile::load_nvrtc()?;
        Ok(n)
    })
}

/// [`select_device`] with the probe of usable GPUs given (for tests).
pub fn select_with(
    asked: Option<Device>,
    probe: impl FnOnce() -> Result<usize, Error>,
) -> Result<(Device, Option<String>), Error> {
    match asked {
        Some(Device::Cpu) => Ok((Device::Cpu, None)),
        Some(Device::Cuda(i)) => {
            let n = probe()?;
            if i >= n {
                return Err(Error::Unavailable(format!(
                    "cuda:{i} asked for, {n} device(s) present"
                )));
            }
            Ok((Device::Cuda(i), None))
        }
        None => match probe() {
            Ok(_) => Ok((Device::Cuda(0), None)),
            Err(e) => Ok((Device::Cpu, Some(e.to_string()))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn the_default_is_the_gpu_when_usable_else_the_cpu_with_the_reason() {
        let none = || Err(Error::Unavailable("no driver".into()));
        let (d, why) = select_with(None, none).unwrap();
        assert_eq!(d, Device::Cpu);
        assert!(why.unwrap().contains("no driver"));
        assert_eq!(
            select_with(None, || Ok(2)).unwrap(),
            (Device::Cuda(0), None)
        );
        // Asking for a GPU that is not there is an error, not a silent fallback.
        assert!(select_with(Some(Device::Cuda(0)), none).is_err());
        assert!(select_with(Some(Device::Cuda(2)), || Ok(2)).is_err());
        assert_eq!(
            select_with(Some(Device::Cuda(1)), || Ok(2)).unwrap().0,
            Device::Cuda(1)
        );
        assert_eq!(select_with(Some(Device::Cpu), none).unwrap().0, Device::Cpu);
    }

    #[test]
    fn this_machine_without_cuda_falls_back_to_the_cpu_without_panicking() {
        // On a machine with a GPU this picks it; without one (CI), the CPU and a reason.
        let (d, why) = select_device(None).unwrap();
        if d == Device::Cpu {
            eprintln!("no GPU here: {}", why.unwrap_or_default());
        }
    }
}
