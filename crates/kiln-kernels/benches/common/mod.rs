//! Helpers both kernel benches share: deterministic operands and the kernel levels to run.

use kiln_kernels::isa::{self, Isa};

/// Deterministic values in [-1, 1).
pub fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The best level of this CPU, and with `KILN_BENCH_ALL_ISAS=1` every lower level it supports
/// (down to the portable reference), best first.
pub fn levels() -> Vec<Isa> {
    let all = std::env::var("KILN_BENCH_ALL_ISAS").is_ok_and(|v| v == "1");
    let best = isa::active();
    Isa::ALL
        .into_iter()
        .rev()
        .filter(|&i| i.is_supported() && (i == best || all))
        .collect()
}
