//! The instruction set the CPU kernels run with, detected once per process and passed down.
//!
//! Every kernel has a portable path; some also have AVX2/FMA paths, and the matrix products
//! AVX-512 VNNI ones. The public entry points take [`Isa::detect`] and hand it to the kernel,
//! which picks its path from it; tests run every [`Isa::available`] level and compare the paths
//! (which compute the same function, most of them bit for bit: each kernel says).
//!
//! An [`Isa`] value above [`Level::Portable`] exists only on a CPU that supports it: the type
//! has no public constructor but [`Isa::detect`] and [`Isa::available`], both of which check
//! the CPU. That is what lets a kernel call its `#[target_feature]` code on the strength of an
//! `Isa` it was given (each such call's `SAFETY` comment points here).

use std::sync::OnceLock;

/// Instruction-set levels, each including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Plain Rust: any CPU.
    Portable,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// [`Level::Avx2`] plus AVX-512 F, VL and VNNI: the matrix products use `vpdpbusd` on
    /// 256-bit registers (and eight activation rows per register tile); every other kernel
    /// runs its AVX2 path.
    Avx512Vnni,
}

/// A level the running CPU supports (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa(Level);

impl Isa {
    /// The portable path, which every CPU runs.
    pub const PORTABLE: Isa = Isa(Level::Portable);

    /// The best level this CPU supports, detected on first use. `KASOKU_NO_VNNI=1` in the
    /// environment caps it at [`Level::Avx2`] (to compare the kernels on one machine).
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = if std::env::var_os("KASOKU_NO_VNNI").is_some() {
                Level::Avx2
            } else {
                Level::Avx512Vnni
            };
            Isa::available()
                .filter(|isa| isa.0 <= cap)
                .last()
                .unwrap_or(Isa::PORTABLE)
        })
    }

    /// Every level this CPU supports, lowest first (tests run each of them).
    pub fn available() -> impl Iterator<Item = Isa> {
        [Level::Portable, Level::Avx2, Level::Avx512Vnni]
            .into_iter()
            .filter(|&l| supported(l))
            .map(Isa)
    }

    /// The level.
    pub fn level(self) -> Level {
        self.0
    }

    /// Whether the AVX2, FMA and F16C instructions may be used.
    #[inline(always)]
    pub fn avx2(self) -> bool {
        self.0 >= Level::Avx2
    }

    /// Whether the AVX-512 F, VL and VNNI instructions may be used (besides AVX2's).
    #[inline(always)]
    pub fn vnni(self) -> bool {
        self.0 >= Level::Avx512Vnni
    }
}

/// Whether the running CPU supports `level`.
fn supported(level: Level) -> bool {
    match level {
        Level::Portable => true,
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => {
            supported(Level::Avx2)
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_supported_and_include_the_lower_ones() {
        let all: Vec<Isa> = Isa::available().collect();
        assert_eq!(all[0], Isa::PORTABLE);
        assert!(all.windows(2).all(|w| w[0].level() < w[1].level()));
        assert!(all.contains(&Isa::detect()));
        for isa in all {
            assert!(supported(isa.level()));
            assert_eq!(isa.vnni(), isa.level() == Level::Avx512Vnni);
            assert!(!isa.vnni() || isa.avx2());
        }
    }
}
