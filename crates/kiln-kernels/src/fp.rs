//! Denormal floats during a run: flushed to zero (MXCSR's FTZ and DAZ bits), as OpenVINO does
//! by default. An x86 core that meets a denormal operand or result takes a microcode assist
//! per element (Intel: ~100 cycles): a 1x1 convolution of PP-OCRv6's detector whose residual
//! held denormals ran at 1.3 GFLOP/s where its twin ran at 35. Values below 2^-126 (f32) or
//! 2^-1022 (f64) become zero, far below any tolerance a model is judged by.
//!
//! The Session sets the bits on the calling thread for the length of a run
//! ([`FlushDenormals::enter`], restored on drop); the pool's workers set them once, at start
//! (they run nothing else). Elsewhere (portable builds) this does nothing.

/// MXCSR bits: flush-to-zero (results) and denormals-are-zero (operands).
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

#[cfg(target_arch = "x86_64")]
fn read_csr() -> u32 {
    let mut csr: u32 = 0;
    // SAFETY: `stmxcsr` stores the 32-bit MXCSR register to the address given, here a
    // live, aligned, writable u32 on this stack frame; it has no other effect.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
    }
    csr
}

#[cfg(target_arch = "x86_64")]
fn write_csr(csr: u32) {
    // SAFETY: `ldmxcsr` loads MXCSR from a live, aligned u32. The values written here are the
    // register's own with FTZ/DAZ set or restored (reserved bits untouched, so no fault);
    // they change only how denormal floats round, and kiln's kernels compute the same values
    // either way up to denormal magnitudes.
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly, preserves_flags));
    }
}

/// Denormals flushed on this thread until the guard drops (then the caller's setting again).
pub struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushDenormals {
    pub fn enter() -> FlushDenormals {
        #[cfg(target_arch = "x86_64")]
        {
            let saved = read_csr();
            write_csr(saved | FTZ_DAZ);
            FlushDenormals { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushDenormals {}
    }

    /// Whether this thread flushes denormals now.
    pub fn active() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            read_csr() & FTZ_DAZ == FTZ_DAZ
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        write_csr(self.saved);
    }
}

/// Denormals flushed on this thread from now on (the pool's workers, at start).
pub fn flush_denormals_here() {
    std::mem::forget(FlushDenormals::enter());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denormals_flush_inside_the_guard_and_not_after() {
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let half = std::hint::black_box(0.5f32);
        // A denormal result, and a denormal operand.
        let denormal = std::hint::black_box(tiny * half);
        assert!(denormal > 0.0 && !denormal.is_normal());
        {
            let _g = FlushDenormals::enter();
            if cfg!(target_arch = "x86_64") {
                assert!(FlushDenormals::active());
                assert_eq!(std::hint::black_box(tiny) * std::hint::black_box(half), 0.0);
                assert_eq!(std::hint::black_box(denormal) * std::hint::black_box(4.0f32), 0.0);
            }
        }
        assert!(!FlushDenormals::active());
        assert_eq!(std::hint::black_box(tiny) * std::hint::black_box(half), denormal);
    }
}
