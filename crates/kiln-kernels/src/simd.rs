//! Compiler-vectorised code at the best instruction set: [`vectorize`] runs a closure inside a
//! function compiled for AVX-512 (or AVX2+FMA) when the dispatch table chose that level.
//!
//! The crates build for the baseline x86-64 target (SSE2), so a plain loop elsewhere is
//! vectorised 4 floats wide without FMA. Calling it through `vectorize` lets LLVM inline the
//! closure into a `#[target_feature]` function and vectorise it 16 wide, but LLVM inlines only
//! small closures: a closure around a loop nest (or one calling `#[inline(always)]` helpers,
//! which makes it large) stays a call compiled for the baseline, and the wrapper then does
//! nothing. Loop nests therefore go through [`vectorize_kernel`] with a [`Kernel`] whose `run`
//! is `#[inline(always)]` (the depthwise rows, the Winograd transforms); `vectorize` is for
//! one-loop bodies (softmax scaling, layer-norm rows, MaxPool row maxima, the NaN scan, the
//! residual add). Checked on the binary: every `run_avx512` instance holds its loop, none is
//! a bare jump. Either way the result is that of the same Rust code. The GEMM has its own
//! hand-written kernels.

use crate::isa::{self, Isa};

/// Runs `f` compiled for the active level (see the module docs). Results are those of the
/// same Rust code: only the instruction selection differs (LLVM may contract `a * b + c`
/// into an FMA only where the source asks for `mul_add`, so rounding is unchanged).
#[inline]
pub fn vectorize<R>(f: impl FnOnce() -> R) -> R {
    vectorize_kernel(Closure(f))
}

/// A loop nest to compile per level: implement `run` with `#[inline(always)]` (LLVM then
/// must inline it into the `#[target_feature]` caller, where a closure, when large, may be
/// left as a call compiled for the baseline).
pub trait Kernel {
    type Output;
    fn run(self) -> Self::Output;
}

impl<R, F: FnOnce() -> R> Kernel for Closure<F> {
    type Output = R;
    #[inline(always)]
    fn run(self) -> R {
        (self.0)()
    }
}

/// A closure as a [`Kernel`] (what [`vectorize`] passes on).
pub struct Closure<F>(pub F);

/// Runs `k` compiled for the active level, like [`vectorize`], with the inlining guaranteed
/// by `K::run`'s `#[inline(always)]`.
#[inline]
pub fn vectorize_kernel<K: Kernel>(k: K) -> K::Output {
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // SAFETY: `isa::active()` returns Avx512 only when CPUID reported AVX-512 F + VL,
            // AVX2 and FMA.
            unsafe { run_avx512(k) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => {
            // SAFETY: as above, for AVX2 and FMA.
            unsafe { run_avx2(k) }
        }
        _ => k.run(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512<K: Kernel>(k: K) -> K::Output {
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<K: Kernel>(k: K) -> K::Output {
    k.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_the_closure_once_with_its_result() {
        let mut calls = 0;
        let v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let s = vectorize(|| {
            calls += 1;
            v.iter().map(|x| x * 2.0).sum::<f32>()
        });
        assert_eq!(calls, 1);
        assert_eq!(s, 9900.0);
    }
}
