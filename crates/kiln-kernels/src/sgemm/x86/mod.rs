//! x86-64 kernels: AVX-512 (Zen 4, Ice Lake and later) and AVX2+FMA, each a set of tile
//! microkernels and a vectorised epilogue; the shared activation math is in `math.rs`.

#[macro_use]
mod math;
// The polynomial coefficients are quoted with the digits of their sources.
#[allow(clippy::excessive_precision)]
pub(crate) mod avx2;
#[allow(clippy::excessive_precision)]
pub(crate) mod avx512;
