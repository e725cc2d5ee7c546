//! kiln-kernels: numeric kernels on raw slices and dimensions.
//!
//! Today this holds the scalar reference GEMM that MatMul, Gemm and convolution lower to, and
//! the im2col/col2im layout helpers of convolution; the SIMD variants and the dispatch table
//! come with the speed work, each tested against these.

pub mod conv;
pub mod gemm;
