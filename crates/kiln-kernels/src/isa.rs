//! The kernel dispatch table's root: which instruction set the SIMD kernels use, detected once
//! per process at first use and overridable with the `KILN_KERNELS` environment variable.
//!
//! Nothing is chosen at compile time: the crate builds for the baseline target, every SIMD
//! function carries `#[target_feature(enable = ...)]`, and it is only called after [`Isa`]
//! detection said the CPU has those features.
//!
//! `KILN_KERNELS` values: `reference` or `portable` force the portable scalar kernels, `avx2`
//! caps the choice at AVX2+FMA, `vnni` at AVX-512 without AMX tiles, `auto` (or unset) takes
//! the best the CPU has. An ISA asked for but missing falls back to the best available one;
//! an unknown value is ignored. Either way [`Dispatch::describe`] says what happened.
//!
//! AMX (the 8-bit tile multiplies of AMX-INT8) is a capability within [`Isa::Avx512`], like
//! VNNI: used when the CPU has it, Linux granted this process the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once at detection) and `KILN_KERNELS` does not
//! cap the level below it.

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

    /// Whether this level runs the integer GEMM on AMX tiles (`tdpbusd` / `tdpbssd`, 16 x 16
    /// x 64 products per instruction): AVX-512 VNNI's level on a CPU with AMX-INT8 whose
    /// tile state the OS granted, unless `KILN_KERNELS` capped the choice below it.
    pub fn has_int8_tiles(self) -> bool {
        self.has_int8_dot() && dispatch().tiles
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

/// Whether the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25) and Linux
/// granted this process the tile data state; asks for it (once per process, the grant is
/// process-wide) when the CPU has them.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let cpu = (leaf.edx >> 24) & 1 == 1 && (leaf.edx >> 25) & 1 == 1;
    cpu && crate::igemm::request_tile_state()
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_granted() -> bool {
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
    /// Whether the integer GEMM runs on AMX tiles ([`Isa::has_int8_tiles`]).
    pub tiles: bool,
}

impl Dispatch {
    /// Resolves a `KILN_KERNELS` value (None: unset) against the detected level and whether
    /// the CPU's AMX tiles are usable (`amx`).
    pub fn resolve(env: Option<&str>, detected: Isa, amx: bool) -> Dispatch {
        let value = env.map(|s| s.trim().to_ascii_lowercase());
        // (level, whether AMX may be used at it)
        let wanted = match value.as_deref() {
            None | Some("") | Some("auto") => None,
            Some("reference") | Some("portable") | Some("scalar") => Some((Isa::Portable, false)),
            Some("avx2") => Some((Isa::Avx2Fma, false)),
            Some("vnni") => Some((Isa::Avx512, false)),
            Some("avx512") => Some((Isa::Avx512, true)),
            Some(_) => None,
        };
        let (isa, tiles, choice) = match (wanted, value) {
            (Some((w, t)), Some(v)) if w <= detected => (w, t, Choice::Forced(v)),
            (_, Some(v)) if !matches!(v.as_str(), "" | "auto") => (detected, true, Choice::Ignored(v)),
            _ => (detected, true, Choice::Detected),
        };
        Dispatch {
            isa,
            detected,
            choice,
            tiles: tiles && amx && isa == Isa::Avx512,
        }
    }

    /// One line for `kiln info` and benchmark headers, e.g. `avx512 (detected)` or
    /// `portable (KILN_KERNELS=reference; CPU has avx512)`.
    pub fn describe(&self) -> String {
        let name = if self.tiles {
            format!("{}+amx", self.isa.name())
        } else {
            self.isa.name().to_string()
        };
        match &self.choice {
            Choice::Detected => format!("{name} (detected)"),
            Choice::Forced(v) => format!("{name} (KILN_KERNELS={v}; CPU has {})", self.detected.name()),
            Choice::Ignored(v) => format!("{name} (detected; KILN_KERNELS={v} ignored: unknown or unsupported here)"),
        }
    }
}

static DISPATCH: OnceLock<Dispatch> = OnceLock::new();

/// The process-wide choice, made at the first call (reads `KILN_KERNELS` once).
pub fn dispatch() -> &'static Dispatch {
    DISPATCH.get_or_init(|| {
        let env = std::env::var("KILN_KERNELS").ok();
        let detected = Isa::detect();
        // Only asked for (a system call) where the tiles could be used.
        let amx = detected == Isa::Avx512 && has_vnni() && amx_granted();
        Dispatch::resolve(env.as_deref(), detected, amx)
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
        let d = Dispatch::resolve(Some("reference"), Isa::Avx512, true);
        assert_eq!(d.isa, Isa::Portable);
        assert!(!d.tiles);
        assert!(d.describe().starts_with("portable (KILN_KERNELS=reference"));
        assert_eq!(
            Dispatch::resolve(Some("Portable"), Isa::Avx2Fma, false).isa,
            Isa::Portable
        );
        assert_eq!(Dispatch::resolve(None, Isa::Avx512, false).isa, Isa::Avx512);
        assert_eq!(Dispatch::resolve(Some("auto"), Isa::Avx2Fma, false).isa, Isa::Avx2Fma);
        assert_eq!(Dispatch::resolve(Some("avx2"), Isa::Avx512, true).isa, Isa::Avx2Fma);
        // Asking for more than the CPU has, or for nonsense, keeps the detected level.
        let d = Dispatch::resolve(Some("avx512"), Isa::Avx2Fma, false);
        assert_eq!(d.isa, Isa::Avx2Fma);
        assert!(matches!(d.choice, Choice::Ignored(_)));
        assert_eq!(Dispatch::resolve(Some("fast"), Isa::Portable, false).isa, Isa::Portable);
        // AMX tiles: where usable, unless capped below them.
        let d = Dispatch::resolve(None, Isa::Avx512, true);
        assert!(d.tiles);
        assert_eq!(d.describe(), "avx512+amx (detected)");
        assert!(Dispatch::resolve(Some("avx512"), Isa::Avx512, true).tiles);
        assert!(Dispatch::resolve(Some("fast"), Isa::Avx512, true).tiles);
        let d = Dispatch::resolve(Some("vnni"), Isa::Avx512, true);
        assert_eq!((d.isa, d.tiles), (Isa::Avx512, false));
        assert!(!Dispatch::resolve(None, Isa::Avx512, false).tiles);
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
