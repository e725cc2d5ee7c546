//! The kernel dispatch table's root: which instruction set the SIMD kernels use, detected once
//! per process at first use and overridable with the `KILN_KERNELS` environment variable.
//!
//! Nothing is chosen at compile time: the crate builds for the baseline target, every SIMD
//! function carries `#[target_feature(enable = ...)]`, and it is only called after [`Isa`]
//! detection said the CPU has those features.
//!
//! `KILN_KERNELS` values: `reference` or `portable` force the portable scalar kernels, `avx2`
//! caps the choice at AVX2+FMA, `auto` (or unset) takes the best the CPU has. An ISA asked for
//! but missing falls back to the best available one; an unknown value is ignored. Either way
//! [`Dispatch::describe`] says what happened.

use std::sync::OnceLock;

/// An instruction-set level the kernels are written for, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, any CPU: the reference twin of every SIMD kernel.
    Portable,
    /// x86-64 AVX2 + FMA (256-bit vectors, 16 registers).
    Avx2Fma,
    /// x86-64 AVX-512 F + VL (and AVX2 + FMA): 512-bit vectors, 32 registers, mask registers.
    Avx512,
}

impl Isa {
    /// Whether this level runs the 8-bit dot products of AVX-512 VNNI (`vpdpbusd`, with
    /// AVX-512 BW): the integer GEMM's fast path. A capability within [`Isa::Avx512`],
    /// not a level of its own.
    pub fn has_int8_dot(self) -> bool {
        self == Isa::Avx512 && self.is_supported() && has_vnni()
    }

    /// Whether this level runs byte permutes across 64-byte tables (`vpermi2b` of AVX-512
    /// VBMI, with BW): the 8-bit table lookups' fast path. A capability within
    /// [`Isa::Avx512`], as [`Isa::has_int8_dot`].
    pub fn has_byte_permute(self) -> bool {
        self == Isa::Avx512 && self.is_supported() && has_vbmi()
    }

    /// Every level, portable first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2Fma, Isa::Avx512];

    /// Short name as shown by `kiln info` and benchmarks (`portable`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2Fma => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the kernels of this level.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2Fma => has_avx2_fma(),
            Isa::Avx512 => has_avx512(),
        }
    }

    /// The best level this CPU supports.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Portable)
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    has_avx2_fma() && std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vl")
}

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_vnni() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_vbmi() -> bool {
    std::arch::is_x86_feature_detected!("avx512vbmi") && std::arch::is_x86_feature_detected!("avx512bw")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_vbmi() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2_fma() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512() -> bool {
    false
}

/// Why the active level was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// `KILN_KERNELS` unset or `auto`: the best detected level.
    Detected,
    /// `KILN_KERNELS` asked for this level (or a cap at it) and the CPU has it.
    Forced(String),
    /// `KILN_KERNELS` asked for a level the CPU lacks (or an unknown value): the detected one.
    Ignored(String),
}

/// The process-wide kernel choice: the active level, the best the CPU has, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub isa: Isa,
    pub detected: Isa,
    pub choice: Choice,
}

impl Dispatch {
    /// Resolves a `KILN_KERNELS` value (None: unset) against the detected level.
    pub fn resolve(env: Option<&str>, detected: Isa) -> Dispatch {
        let value = env.map(|s| s.trim().to_ascii_lowercase());
        let wanted = match value.as_deref() {
            None | Some("") | Some("auto") => None,
            Some("reference") | Some("portable") | Some("scalar") => Some(Isa::Portable),
            Some("avx2") => Some(Isa::Avx2Fma),
            Some("avx512") => Some(Isa::Avx512),
            Some(_) => {
                return Dispatch {
                    isa: detected,
                    detected,
                    choice: Choice::Ignored(value.unwrap_or_default()),
                };
            }
        };
        match (wanted, value) {
            (Some(w), Some(v)) if w <= detected => Dispatch {
                isa: w,
                detected,
                choice: Choice::Forced(v),
            },
            (Some(_), Some(v)) => Dispatch {
                isa: detected,
                detected,
                choice: Choice::Ignored(v),
            },
            _ => Dispatch {
                isa: detected,
                detected,
                choice: Choice::Detected,
            },
        }
    }

    /// One line for `kiln info` and benchmark headers, e.g. `avx512 (detected)` or
    /// `portable (KILN_KERNELS=reference; CPU has avx512)`.
    pub fn describe(&self) -> String {
        match &self.choice {
            Choice::Detected => format!("{} (detected)", self.isa.name()),
            Choice::Forced(v) => format!(
                "{} (KILN_KERNELS={v}; CPU has {})",
                self.isa.name(),
                self.detected.name()
            ),
            Choice::Ignored(v) => format!(
                "{} (detected; KILN_KERNELS={v} ignored: unknown or unsupported here)",
                self.isa.name()
            ),
        }
    }
}

static DISPATCH: OnceLock<Dispatch> = OnceLock::new();

/// The process-wide choice, made at the first call (reads `KILN_KERNELS` once).
pub fn dispatch() -> &'static Dispatch {
    DISPATCH.get_or_init(|| {
        let env = std::env::var("KILN_KERNELS").ok();
        Dispatch::resolve(env.as_deref(), Isa::detect())
    })
}

/// The active level: what `sgemm` and the other dispatched kernels run.
pub fn active() -> Isa {
    dispatch().isa
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_switch() {
        let d = Dispatch::resolve(Some("reference"), Isa::Avx512);
        assert_eq!(d.isa, Isa::Portable);
        assert!(d.describe().starts_with("portable (KILN_KERNELS=reference"));
        assert_eq!(Dispatch::resolve(Some("Portable"), Isa::Avx2Fma).isa, Isa::Portable);
        assert_eq!(Dispatch::resolve(None, Isa::Avx512).isa, Isa::Avx512);
        assert_eq!(Dispatch::resolve(Some("auto"), Isa::Avx2Fma).isa, Isa::Avx2Fma);
        assert_eq!(Dispatch::resolve(Some("avx2"), Isa::Avx512).isa, Isa::Avx2Fma);
        // Asking for more than the CPU has, or for nonsense, keeps the detected level.
        let d = Dispatch::resolve(Some("avx512"), Isa::Avx2Fma);
        assert_eq!(d.isa, Isa::Avx2Fma);
        assert!(matches!(d.choice, Choice::Ignored(_)));
        assert_eq!(Dispatch::resolve(Some("fast"), Isa::Portable).isa, Isa::Portable);
    }

    #[test]
    fn detection_is_consistent() {
        assert!(Isa::Portable.is_supported());
        let best = Isa::detect();
        assert!(best.is_supported());
        assert!(dispatch().isa <= best);
        if Isa::Avx512.is_supported() {
            assert!(Isa::Avx2Fma.is_supported());
        }
    }
}
