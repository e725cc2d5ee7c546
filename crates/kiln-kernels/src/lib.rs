//! kiln-kernels: numeric kernels on raw slices and dimensions.
//!
//! - `gemm`: the scalar reference GEMM (any strides, any numeric type) that MatMul, Gemm and
//!   convolution lower to today, and the oracle the fast paths are tested against;
//! - `conv`: im2col/col2im layout helpers of convolution;
//! - `dwconv`, `grouped`: the inner kernels of channels-last depthwise and grouped
//!   convolution;
//! - `fp`: denormals flushed to zero during a run (MXCSR FTZ/DAZ);
//! - `hint`: cache prefetch hints (no-ops off x86-64);
//! - `isa`: the dispatch choice (AVX-512, AVX2+FMA or portable), detected once per process,
//!   forced to portable with `KILN_KERNELS=reference`;
//! - `sgemm`: the f32 GEMM with our own microkernels over prepacked B panels and a fused
//!   epilogue (bias, residual, activation), one kernel set per `isa` level;
//! - `alloc`: `CachingAlloc`, a global allocator that keeps freed large blocks for the next
//!   run (installed by the kiln binary);
//! - `pool`: the compute thread pool (`parallel_for` over the current pool; workers spin
//!   only while a run is active);
//! - `simd`: `vectorize`, which runs a closure compiled for the active level (the ops'
//!   memory-bound loops);
//! - `slab`: the block of the memory plan's tensors per run state, handed out as claimed,
//!   never-overlapping regions;
//! - `stop`: a run's stop condition (cancel flags, deadline), checked between work chunks;
//! - `transpose`: the f32 matrix transpose (8 x 8 register blocks on x86);
//! - `vector`: row kernels of memory-bound ops (softmax, layer-norm statistics).
//!
//! - `winograd`: F(4x4, 3x3) convolution over 36 GEMMs (weights transformed and packed at
//!   compile time).
//!
//! This is the only crate with `unsafe` and intrinsics; every SIMD function is
//! `#[target_feature]` and reached only after detection.

pub mod alloc;
pub mod conv;
#[cfg(test)]
mod conv_testkit;
pub mod dwconv;
pub mod fp;
pub mod gemm;
pub mod grouped;
mod hint;
pub mod igemm;
pub mod isa;
pub mod lut;
pub mod planar;
pub mod pool;
pub mod qdwconv;
pub mod quant;
pub mod recycle;
pub mod sgemm;
pub mod simd;
pub mod slab;
pub mod stem;
pub mod stop;
pub mod transpose;
pub mod vector;
pub mod winograd;
