//! Portable kernels: plain Rust tiles of 4 x 16 over the same packing as the SIMD ones, and
//! the reference epilogue (activations computed in f64 as the standalone operators do).

use super::Act;
use super::driver::{Ahead, Kernels, TileEpi, TileFn};

const MR: usize = 4;
const NR: usize = 16;

/// # Safety
/// The [`TileFn`] contract with `MR = 4`, `NR = 16` (any CPU).
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize>(
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    bs: usize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    first: bool,
    _epi: Option<&TileEpi>,
    _ahead: Ahead,
) {
    let mut acc = [[0.0f32; NR]; R];
    for p in 0..kc {
        // SAFETY: the TileFn contract: `NR` floats at `b + p*bs`.
        let bv = unsafe { &*b.add(p * bs).cast::<[f32; NR]>() };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: the TileFn contract: `a + i*ars + p*acs` readable for `i < R`, `p < kc`.
            let x = unsafe { *a.add(i * ars + p * acs) };
            for (s, &y) in row.iter_mut().zip(bv) {
                *s += x * y;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: the TileFn contract: `nr` writable (and, unless `first`, initialised)
        // floats at `c + i*ldc` for `i < R`.
        let out = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), nr) };
        for (o, &s) in out.iter_mut().zip(row) {
            *o = if first { s } else { *o + s };
        }
    }
}

static TILES: [TileFn; MR] = [tile::<1>, tile::<2>, tile::<3>, tile::<4>];

/// The reference epilogue on one row segment.
pub(crate) fn epi(
    row: &mut [f32],
    row_bias: Option<f32>,
    col_bias: Option<&[f32]>,
    resid: Option<&[f32]>,
    act: Option<Act>,
) {
    if let Some(b) = row_bias {
        row.iter_mut().for_each(|x| *x += b);
    }
    if let Some(b) = col_bias {
        row.iter_mut().zip(b).for_each(|(x, &b)| *x += b);
    }
    if let Some(r) = resid {
        row.iter_mut().zip(r).for_each(|(x, &r)| *x += r);
    }
    if let Some(act) = act {
        act.apply_scalar_slice(row);
    }
}

pub(crate) fn kernels() -> Kernels {
    Kernels {
        mr: MR,
        nr: NR,
        kc: super::KC,
        tiles: &TILES,
        column: None,
        half: &[],
        quarter: &[],
        narrow: &[],
        fused: false,
        prelu: false,
        prefetch: true,
        stream_b: false,
        epi,
    }
}
