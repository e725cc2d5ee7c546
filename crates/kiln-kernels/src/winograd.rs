//! Winograd F(4x4, 3x3) convolution in f32 (Lavin & Gray, "Fast Algorithms for Convolutional
//! Neural Networks", 2016): each 4x4 output tile is `A^T [ (G g G^T) .* (B^T d B) ] A` over
//! a 6x6 input tile `d`, so a 3x3 stride-1 convolution takes 36 multiplies per 16 outputs per
//! channel pair instead of 144 (4x fewer). The 36 element-wise products over all channel
//! pairs are 36 GEMMs: `M_xi (tiles x M) = V_xi (tiles x C) * U_xi (C x M)`, on the f32
//! GEMM with `U` packed once at compile time ([`pack_weights`]).
//!
//! Layout: the input (channels-first `C x H x W`, or channels-last `H x W x C`) is copied to
//! channels-last with zero padding, so each transform works on blocks of 16 channels (one
//! vector; compiled for the active level) with its rows spelled out, the zero coefficients
//! left out, and a tile's values kept in small fixed arrays; `V` is `[36][tiles][C]`, the
//! products `[36][tiles][M]`, and the output transform writes `M x OH x OW` or `OH x OW x M`,
//! the residual and activation applied by each task to the pixels it wrote.
//!
//! Threads: channels-last layers whose weights are small against their data split by tiles,
//! each thread taking a contiguous range of tiles through every phase, so that it reads only
//! what it wrote; the others split each phase (input transform by tiles, the 36 products by
//! position, output transform by tile rows or channel groups). See
//! `Winograd::split_by_tiles` for the trade and its measurements.
//!
//! Accuracy: the transforms use the interpolation points 0, +-1, +-2 (entries up to 8 in
//! `A^T`, 5 in `B^T`), which amplify rounding: the error is about 10-100 ulp of the output's
//! magnitude, against a few ulp for the direct method. Measured on random data and on
//! ResNet-50's layers: max |winograd - direct| / max |direct| below 1e-5 (tests bound it at
//! 1e-4); the bar for Winograd layers is 1e-3 relative.

use crate::pool;
use crate::sgemm::{AMatrix, Act, BLayout, Epilogue, PackedB, PackedBRef, SgemmError, residual_act, sgemm};
use crate::simd::{Kernel, vectorize_kernel};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// Output tile side (F(4x4, 3x3)).
pub const TILE: usize = 4;
/// Input tile side: `TILE + 3 - 1`.
pub const ALPHA: usize = 6;
/// Transform positions (`ALPHA^2`): the number of GEMMs.
pub const POSITIONS: usize = ALPHA * ALPHA;

/// The input transform `B^T`; [`bt6`] spells out its rows (the test checks them).
#[cfg_attr(not(test), allow(dead_code))]
const BT: [[f32; 6]; 6] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];

const G: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// The output transform `A^T`; [`at4`] spells out its rows (the test checks them).
#[cfg_attr(not(test), allow(dead_code))]
const AT: [[f32; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// Floats of the packed weights of an `m x c x 3 x 3` convolution: 36 packed `c x m` B
/// matrices of `layout`, one after the other.
pub fn packed_weights_len(layout: BLayout, m: usize, c: usize) -> Option<usize> {
    layout.packed_len(c, m)?.checked_mul(POSITIONS)
}

/// Transforms and packs `w` (`m x c x 3 x 3`, row-major): for each position `xi`, the `c x m`
/// matrix `U_xi[c][m] = (G w[m][c] G^T)[xi]` (computed in f64, rounded once) as a packed B.
pub fn pack_weights(w: &[f32], m: usize, c: usize, layout: BLayout) -> Result<Vec<f32>, SgemmError> {
    let need = m
        .checked_mul(c)
        .and_then(|v| v.checked_mul(9))
        .ok_or(SgemmError::TooLarge)?;
    if w.len() < need {
        return Err(SgemmError::ShortSlice {
            what: "W",
            need,
            got: w.len(),
        });
    }
    let mn = m.checked_mul(c).ok_or(SgemmError::TooLarge)?;
    let mut u = vec![vec![0.0f32; mn]; POSITIONS];
    for (mi, filters) in w.chunks_exact(c * 9).take(m).enumerate() {
        for (ci, g) in filters.chunks_exact(9).enumerate() {
            // t = G g (6x3), then u = t G^T (6x6).
            let mut t = [[0.0f64; 3]; 6];
            for (i, row) in t.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = (0..3).map(|k| G[i][k] * f64::from(g[k * 3 + j])).sum();
                }
            }
            for i in 0..6 {
                for j in 0..6 {
                    let v: f64 = (0..3).map(|k| t[i][k] * G[j][k]).sum();
                    u[i * 6 + j][ci * m + mi] = v as f32;
                }
            }
        }
    }
    let mut out = Vec::with_capacity(packed_weights_len(layout, m, c).ok_or(SgemmError::TooLarge)?);
    for ux in &u {
        let p = PackedB::pack(layout, c, m, ux, crate::gemm::MatLayout::row_major(m))?;
        out.extend_from_slice(p.view().data());
    }
    Ok(out)
}

/// One image's Winograd convolution: `c` input channels of `ih x iw`, `m` output channels of
/// `oh x ow`, 3x3 kernel, stride 1, leading pads `ph`, `pw`, dilation `dilation`.
///
/// Dilated (channels-last only): with dilation `(dh, dw)`, the outputs of rows `a, a + dh, ..`
/// and columns `b, b + dw, ..` read only the input rows `a - ph + dh k` and columns
/// `b - pw + dw k`: an undilated 3x3 convolution over that sub-grid. Each of the `dh x dw`
/// classes runs as one ([`Lattice`]), its input read from the sub-grid and its outputs
/// written in place, so a dilated layer gets Winograd's 4x fewer multiplies too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Winograd {
    pub c: usize,
    pub m: usize,
    pub ih: usize,
    pub iw: usize,
    pub oh: usize,
    pub ow: usize,
    pub ph: usize,
    pub pw: usize,
    /// X is `ih x iw x c` and Y `oh x ow x m` (else `c x ih x iw` and `m x oh x ow`).
    pub channels_last: bool,
    /// Rows and columns between the taps (`[1, 1]`: undilated); above 1 only channels-last.
    pub dilation: [usize; 2],
}

/// The outputs one pass of the transforms computes: all of them, or with dilation one class
/// of rows `a, a + dh, ..` and columns `b, b + dw, ..` (see [`Winograd`]). Its output `(i, j)`
/// is the pixel `first + i row_step + j col_step`; its padded input `(py, px)` is input row
/// `row0 + dh py`, column `col0 + dw px` (zero outside the input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lattice {
    oh: usize,
    ow: usize,
    row0: isize,
    col0: isize,
    first: usize,
    row_step: usize,
    col_step: usize,
}

impl Lattice {
    /// Tile rows and columns.
    fn tiles(&self) -> (usize, usize) {
        (self.oh.div_ceil(TILE), self.ow.div_ceil(TILE))
    }
}

impl Winograd {
    /// The classes of outputs the transforms run over one at a time: one (all outputs) when
    /// undilated, else `dh x dw`, the largest first; `None` when a dilation is 0 or the
    /// geometry does not fit an `isize`.
    fn lattices(&self) -> Option<impl Iterator<Item = Lattice> + '_> {
        let [dh, dw] = self.dilation;
        if dh == 0 || dw == 0 {
            return None;
        }
        let signed = |v: usize| isize::try_from(v).ok();
        let (ph, pw) = (signed(self.ph)?, signed(self.pw)?);
        signed(self.ih.max(self.iw).checked_add(dh.max(dw).checked_mul(3)?)?)?;
        let row_step = dh.checked_mul(self.ow)?;
        Some((0..dh).flat_map(move |a| {
            (0..dw).map(move |b| Lattice {
                oh: self.oh.saturating_sub(a).div_ceil(dh),
                ow: self.ow.saturating_sub(b).div_ceil(dw),
                row0: a as isize - ph,
                col0: b as isize - pw,
                first: a * self.ow + b,
                row_step,
                col_step: dw,
            })
        }))
    }

    /// Tile rows and columns of the largest class of outputs (all of them when undilated).
    pub fn tiles(&self) -> (usize, usize) {
        self.lattices().and_then(|mut l| l.next()).map_or((0, 0), |l| l.tiles())
    }

    /// Scratch floats [`Self::run`] needs (a padded copy of a channels-first input, V and the
    /// products of the largest class of outputs).
    pub fn scratch_len(&self) -> Option<usize> {
        let (th, tw) = self.tiles();
        let t = th.checked_mul(tw)?;
        // Channels-first input is copied to channels-last with its padding; channels-last is
        // read in place.
        let (pad_h, pad_w) = (th * TILE + 2, tw * TILE + 2);
        let xpad = if self.channels_last {
            0
        } else {
            pad_h.checked_mul(pad_w)?.checked_mul(self.c)?
        };
        let v = t.checked_mul(self.c)?.checked_mul(POSITIONS)?;
        let p = t.checked_mul(self.m)?.checked_mul(POSITIONS)?;
        xpad.checked_add(v)?.checked_add(p)
    }

    /// `y = act(conv(x) + bias + residual)` for one image (`x`: `c x ih x iw`, `y` and the
    /// residual: `m x oh x ow`, or all channels-last, see [`Self::channels_last`]), with `u`
    /// from [`pack_weights`] in `layout`. The residual and the activation are applied by each
    /// output-transform task to the rows it just wrote. `scratch` is grown to at least
    /// [`Self::scratch_len`] (never shrunk). Returns false (with `y` unspecified) when a slice does not fit
    /// the geometry.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        x: &[f32],
        u: &[f32],
        layout: BLayout,
        bias: Option<&[f32]>,
        residual: Option<&[f32]>,
        act: Option<Act>,
        prelu: Option<&[f32]>,
        y: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> bool {
        let (c, m) = (self.c, self.m);
        let (th, tw) = self.tiles();
        let t = th * tw;
        let Some(upacked) = layout.packed_len(c, m) else {
            return false;
        };
        let Some(lattices) = self.lattices() else { return false };
        if x.len() < c * self.ih * self.iw
            || y.len() < m * self.oh * self.ow
            || u.len() < upacked * POSITIONS
            || bias.is_some_and(|b| b.len() < m)
            || prelu.is_some_and(|p| p.len() != m)
            || residual.is_some_and(|r| r.len() < m * self.oh * self.ow)
            || c == 0
            || m == 0
            || t == 0
            || (self.dilation != [1, 1] && !self.channels_last)
        {
            return false;
        }
        let y = RawOut {
            ptr: y.as_mut_ptr(),
            len: m * self.oh * self.ow,
        };
        for lat in lattices {
            let ctx = Ctx {
                conv: self,
                lat,
                u,
                upacked,
                layout,
                bias,
                residual,
                act,
                prelu,
                y,
            };
            if !ctx.run(x, scratch) {
                return false;
            }
        }
        true
    }

    /// The channels-last input `x` as the class `lat` reads it (see [`Lattice`]).
    fn source<'a>(&self, lat: &Lattice, x: &'a [f32]) -> Source<'a> {
        let [dh, dw] = self.dilation;
        Source {
            x,
            ih: self.ih,
            iw: self.iw,
            row0: lat.row0,
            col0: lat.col0,
            dh,
            dw,
        }
    }

    /// Whether channels-last on `threads` threads splits a class of `tiles` tiles by tiles
    /// ([`Ctx::by_tiles`]) rather than by phases. By phases, each thread reads about half of what the other wrote (V,
    /// then the products); by tiles, each thread reads all 36 packed weight matrices instead
    /// of its share. Data another core wrote costs far more to read than weights both cores
    /// only read: on this 2-vCPU VM, splitting 56x56x64 and 28x28x128 layers by tiles was
    /// faster both when the two vCPUs shared a cache and (much faster, ~1.4x) when the host
    /// placed them apart; 14x14x256 layers (16 tiles, 256 KB of weights per position) were ~7%
    /// slower by tiles in the first case. Hence by tiles when the data a thread would exchange
    /// (`tiles / threads x (c + m)` per position) is at least a quarter of the weights it
    /// would read in addition (`c x m` per position).
    fn split_by_tiles(&self, tiles: usize, threads: usize) -> bool {
        let exchanged = (tiles / threads.max(1)).saturating_mul(self.c + self.m);
        exchanged.saturating_mul(4) >= self.c.saturating_mul(self.m)
    }
}

/// Bytes of V and the products a chunk of tiles may take ([`chunk_tiles`]).
const CHUNK_BYTES: usize = 1 << 20;
/// Fewest tiles in a chunk: each chunk reads all 36 packed weight matrices again, and a
/// product of few rows runs its GEMM tiles poorly.
const CHUNK_MIN_TILES: usize = 64;

/// Tiles channels-last Winograd takes through every phase at once (per thread): as many as
/// keep their V and products (`36 x (c + m)` floats a tile) within [`CHUNK_BYTES`], at least
/// [`CHUNK_MIN_TILES`]. All of a layer's tiles at once had written V and the products out to
/// memory and read them back: 7.8 MB each for a 32 -> 32 layer at 450 x 60 (DNSMOS).
fn chunk_tiles(c: usize, m: usize) -> usize {
    (CHUNK_BYTES / (4 * POSITIONS * (c + m).max(1))).max(CHUNK_MIN_TILES)
}

/// What the phases of one [`Winograd::run`] share: the geometry, the packed weights, the
/// epilogue and the output.
struct Ctx<'a> {
    conv: &'a Winograd,
    /// The class of outputs this pass computes.
    lat: Lattice,
    u: &'a [f32],
    /// Floats of one position's packed weights.
    upacked: usize,
    layout: BLayout,
    bias: Option<&'a [f32]>,
    residual: Option<&'a [f32]>,
    act: Option<Act>,
    /// PRelu slopes, one per output channel, after the activation (never with one).
    prelu: Option<&'a [f32]>,
    /// The whole output (`m x oh x ow` floats); tasks write the pixels of their own tiles.
    y: RawOut,
}

impl Ctx<'_> {
    /// The transforms and products of one class of outputs (all of them when undilated).
    fn run(&self, x: &[f32], scratch: &mut Vec<f32>) -> bool {
        let w = self.conv;
        let (c, m) = (w.c, w.m);
        let (th, tw) = self.lat.tiles();
        let t = th * tw;
        if t == 0 {
            return true;
        }
        let Some(len) = w.scratch_len() else { return false };
        let threads = pool::current_threads().clamp(1, t);
        if w.channels_last && (threads == 1 || w.split_by_tiles(t, threads)) {
            return self.by_tiles(x, threads, scratch);
        }
        // V and the products are overwritten whole, and the padded input is zeroed below.
        let scratch = crate::recycle::scratch(scratch, len);
        let (pad_h, pad_w) = (th * TILE + 2, tw * TILE + 2);
        let (xpad, rest) = scratch.split_at_mut(if w.channels_last { 0 } else { pad_h * pad_w * c });
        let (v, prod) = rest.split_at_mut(POSITIONS * t * c);
        // A smaller class of outputs than the largest uses the front of the scratch.
        let Some(prod) = prod.get_mut(..POSITIONS * t * m) else {
            return false;
        };
        // Channels-first: a channels-last copy with zero padding, xpad[(y * pad_w + x) * c + ci].
        xpad.fill(0.0);
        for (ci, plane) in x
            .chunks_exact((w.ih * w.iw).max(1))
            .take(if w.channels_last { 0 } else { c })
            .enumerate()
        {
            for (iy, row) in plane.chunks_exact(w.iw.max(1)).enumerate() {
                let py = iy + w.ph;
                if py >= pad_h {
                    break;
                }
                for (ix, &val) in row.iter().enumerate() {
                    let px = ix + w.pw;
                    if px >= pad_w {
                        break;
                    }
                    xpad[(py * pad_w + px) * c + ci] = val;
                }
            }
        }
        let src = if w.channels_last {
            w.source(&self.lat, x)
        } else {
            Source {
                x: xpad,
                ih: pad_h,
                iw: pad_w,
                row0: 0,
                col0: 0,
                dh: 1,
                dw: 1,
            }
        };
        // The input transform in parallel over tile ranges: each task writes its tiles' rows
        // of every position.
        let vout = RawOut {
            ptr: v.as_mut_ptr(),
            len: v.len(),
        };
        let per = t.div_ceil(threads);
        pool::parallel_for(threads, &|i| {
            vectorize_kernel(InputTransform {
                src,
                v: vout,
                c,
                rows: t,
                first: 0,
                tiles: i * per..((i + 1) * per).min(t),
                tw,
            });
        });
        let v: &[f32] = v;
        // The 36 products, one GEMM each, in parallel over positions, claimed a few at a time
        // (a thread slowed by the host does fewer).
        let failed = std::sync::atomic::AtomicBool::new(false);
        pool::for_each_chunk_balanced(prod, t * m, &|xi, out| {
            if !self.product(xi, v, t, out) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let prod: &[f32] = prod;
        if w.channels_last {
            // Output transform in parallel over tile rows: each task owns 4 whole rows of y.
            pool::parallel_for(th, &|ty| {
                // SAFETY: task `ty` alone writes the pixels of tile row `ty`.
                unsafe { self.output_tiles(prod, t, 0, ty * tw..((ty + 1) * tw).min(t)) };
            });
            return true;
        }
        // Output transform in parallel over channel groups: each task owns whole planes of y.
        let plane = w.oh * w.ow;
        let per = m.div_ceil(threads).max(1);
        // SAFETY: channels-first runs one class of outputs (undilated), whose transform alone
        // writes the output, in disjoint planes per task; nothing else touches it meanwhile.
        let Some(y) = (unsafe { self.y.slice(0..m * plane) }) else {
            return false;
        };
        pool::for_each_chunk_mut(y, per * plane, &|g, ys| {
            let m0 = g * per;
            let m1 = (m0 + per).min(m);
            vectorize_kernel(OutputTransform {
                prod,
                dst: Dst::Planes(ys),
                bias: self.bias,
                m,
                m0,
                m1,
                rows: t,
                first: 0,
                tiles: 0..t,
                tw,
                lat: self.lat,
            });
            let at = g * per * plane;
            residual_act(ys, self.residual.and_then(|r| r.get(at..at + ys.len())), self.act);
            if let (Some(p), true) = (self.prelu, plane > 0) {
                for (ys, &s) in ys.chunks_exact_mut(plane).zip(p.get(m0..m1).unwrap_or(&[])) {
                    crate::vector::prelu_one(ys, s);
                }
            }
        });
        true
    }

    /// Product `xi`: `out (rows x m) = V_xi (rows x c) * U_xi`, `v` holding `rows` tiles per
    /// position. False when a slice does not fit.
    fn product(&self, xi: usize, v: &[f32], rows: usize, out: &mut [f32]) -> bool {
        let (c, m) = (self.conv.c, self.conv.m);
        let (Some(a), Some(b)) = (
            v.get(xi * rows * c..(xi + 1) * rows * c),
            self.u.get(xi * self.upacked..(xi + 1) * self.upacked),
        ) else {
            return false;
        };
        let Ok(b) = PackedBRef::new(self.layout, c, m, b) else {
            return false;
        };
        sgemm(rows, AMatrix::row_major(a, c), b, out, m, &Epilogue::NONE).is_ok()
    }

    /// Channels-last, with each of `groups` threads taking a contiguous range of tiles
    /// through every phase, a chunk at a time ([`chunk_tiles`]): their input transform, the
    /// 36 products and the output transform, residual and activation. A thread reads only
    /// what it wrote, besides the input rows at the edge of its range (see
    /// [`Winograd::split_by_tiles`]). Group `g` works in the `g`-th equal part of `scratch`
    /// (which only grows), so a thread writes the same lines layer after layer; carved at
    /// offsets that followed each layer's size, half its writes went to lines the other
    /// core had written last. ResNet-18, 2 threads, 53 alternating `kiln bench` rounds, p50:
    /// 13.37 -> 13.28 ms with the vCPUs near, 17.56 -> 17.26 far apart. One group runs inline.
    fn by_tiles(&self, x: &[f32], groups: usize, scratch: &mut Vec<f32>) -> bool {
        let w = self.conv;
        let (c, m) = (w.c, w.m);
        let (th, tw) = self.lat.tiles();
        let t = th * tw;
        let groups = groups.max(1);
        let bound = |g: usize| g * t / groups;
        // The largest group's V and products, a chunk of its tiles at a time.
        let most = (0..groups).map(|g| bound(g + 1) - bound(g)).max().unwrap_or(0);
        let chunk = chunk_tiles(c, m).min(most).max(1);
        let Some(need) = chunk.checked_mul(POSITIONS * (c + m)) else {
            return false;
        };
        // Each group's part at a fixed fraction of the scratch (which only grows), so the
        // same thread writes the same lines layer after layer.
        let part = need.max(scratch.len() / groups).next_multiple_of(16);
        let Some(total) = part.checked_mul(groups) else {
            return false;
        };
        let parts: smallvec::SmallVec<[Mutex<&mut [f32]>; 4]> = crate::recycle::scratch(scratch, total)
            .chunks_mut(part)
            .map(Mutex::new)
            .collect();
        let failed = AtomicBool::new(false);
        pool::parallel_for(groups, &|g| {
            let (first, n) = (bound(g), bound(g + 1).saturating_sub(bound(g)));
            let Some(part) = parts.get(g) else { return };
            let mut buf = part.lock().unwrap_or_else(PoisonError::into_inner);
            if n == 0 {
                return;
            }
            // The group's tiles a chunk at a time through every phase, so that V and the
            // products stay in L2 between the phases (see `chunk_tiles`); equal chunks (a
            // remainder of a few tiles made a GEMM of a few rows).
            let size = n.div_ceil(n.div_ceil(chunk));
            for from in (first..first + n).step_by(size) {
                let k = size.min(first + n - from);
                let Some(s) = buf.get_mut(..POSITIONS * k * (c + m)) else {
                    failed.store(true, Ordering::Relaxed);
                    return;
                };
                let (vg, pg) = s.split_at_mut(POSITIONS * k * c);
                vectorize_kernel(InputTransform {
                    src: w.source(&self.lat, x),
                    v: RawOut {
                        ptr: vg.as_mut_ptr(),
                        len: vg.len(),
                    },
                    c,
                    rows: k,
                    first: from,
                    tiles: from..from + k,
                    tw,
                });
                let products = pg
                    .chunks_exact_mut((k * m).max(1))
                    .take(POSITIONS)
                    .enumerate()
                    .all(|(xi, out)| self.product(xi, vg, k, out));
                if !products {
                    failed.store(true, Ordering::Relaxed);
                    return;
                }
                // Tile row by tile row, so each row's pixels get their residual while in cache.
                let mut tile = from;
                while tile < from + k {
                    let end = ((tile / tw + 1) * tw).min(from + k);
                    // SAFETY: group `g` alone owns tiles `first .. first + n`, hence their pixels.
                    unsafe { self.output_tiles(pg, k, from, tile..end) };
                    tile = end;
                }
            }
        });
        !failed.load(Ordering::Relaxed)
    }

    /// Channels-last output transform of `tiles` (within one tile row), from the products
    /// `prod` (`rows` tiles per position, starting at tile `first`), then the residual and
    /// activation over the pixels written.
    ///
    /// # Safety
    /// No one else reads or writes the output pixels of `tiles` during the call.
    unsafe fn output_tiles(&self, prod: &[f32], rows: usize, first: usize, tiles: std::ops::Range<usize>) {
        let (lat, m) = (self.lat, self.conv.m);
        let tw = lat.tiles().1;
        let Some(ty) = (tiles.start < tiles.end).then(|| tiles.start / tw) else {
            return;
        };
        vectorize_kernel(OutputTransform {
            prod,
            dst: Dst::Pixels(self.y),
            bias: self.bias,
            m,
            m0: 0,
            m1: m,
            rows,
            first,
            tiles: tiles.clone(),
            tw,
            lat,
        });
        if self.residual.is_none() && self.act.is_none() && self.prelu.is_none() {
            return;
        }
        let x0 = (tiles.start - ty * tw) * TILE;
        let x1 = ((tiles.end - ty * tw) * TILE).min(lat.ow);
        // Runs of pixels contiguous in the output: a tile row's whole width when undilated
        // in columns, else one pixel at a time.
        let run = if lat.col_step == 1 {
            x1.saturating_sub(x0).max(1)
        } else {
            1
        };
        for oy in ty * TILE..((ty + 1) * TILE).min(lat.oh) {
            for ox in (x0..x1).step_by(run) {
                let o0 = (lat.first + oy * lat.row_step + ox * lat.col_step) * m;
                let o1 = o0 + (run.min(x1 - ox)) * m;
                // SAFETY: these pixels belong to `tiles` (the caller's alone); `slice` checks
                // the range against the buffer.
                let Some(seg) = (unsafe { self.y.slice(o0..o1) }) else {
                    return;
                };
                residual_act(seg, self.residual.and_then(|r| r.get(o0..o1)), self.act);
                if let Some(p) = self.prelu {
                    crate::vector::prelu_channels(seg, p);
                }
            }
        }
    }
}

/// Channels per block of the transforms: one 512-bit vector. A block's values live in small
/// fixed arrays the compiler keeps in registers or L1, instead of passes over whole channel
/// rows (a load, multiply, add and store per coefficient, which had made the transforms a
/// third of a 56x56x64 layer's time).
const L: usize = 16;

type Block = [f32; L];

/// `out[i] = sum_r BT[i][r] d[r]` lane by lane, the zero coefficients left out.
#[inline(always)]
fn bt6(d: &[Block; 6], out: &mut [Block; 6]) {
    for k in 0..L {
        let [d0, d1, d2, d3, d4, d5] = [d[0][k], d[1][k], d[2][k], d[3][k], d[4][k], d[5][k]];
        out[0][k] = 4.0 * d0 - 5.0 * d2 + d4;
        out[1][k] = -4.0 * d1 - 4.0 * d2 + d3 + d4;
        out[2][k] = 4.0 * d1 - 4.0 * d2 - d3 + d4;
        out[3][k] = -2.0 * d1 - d2 + 2.0 * d3 + d4;
        out[4][k] = 2.0 * d1 - d2 - 2.0 * d3 + d4;
        out[5][k] = 4.0 * d1 - 5.0 * d3 + d5;
    }
}

/// `out[i] = sum_a AT[i][a] m[a]` lane by lane, the zero coefficients left out.
#[inline(always)]
fn at4(m: &[Block; 6], out: &mut [Block; 4]) {
    for k in 0..L {
        let [m0, m1, m2, m3, m4, m5] = [m[0][k], m[1][k], m[2][k], m[3][k], m[4][k], m[5][k]];
        out[0][k] = m0 + m1 + m2 + m3 + m4;
        out[1][k] = m1 - m2 + 2.0 * m3 - 2.0 * m4;
        out[2][k] = m1 + m2 + 4.0 * m3 + 4.0 * m4;
        out[3][k] = m1 - m2 + 8.0 * m3 - 8.0 * m4 + m5;
    }
}

/// The first pass of a tile's transform: for each of the 6 columns `q`, `f` over the column's
/// 6 blocks (row `r` read by `read(r, q, ..)`), into `out[q]`. `out` is the caller's, made
/// once per task: a 1-2 KiB array made (zeroed) and returned per block had compiled to a
/// `memset` and a `memmove` call per channel block.
#[inline(always)]
fn columns<const N: usize>(
    read: impl Fn(usize, usize, &mut Block),
    f: impl Fn(&[Block; 6], &mut [Block; N]),
    out: &mut [[Block; N]; 6],
) {
    for (q, oq) in out.iter_mut().enumerate() {
        let mut col = [[0.0f32; L]; 6];
        for (r, cr) in col.iter_mut().enumerate() {
            read(r, q, cr);
        }
        f(&col, oq);
    }
}

/// [`columns`] over the blocks of `n` values at `src[base + off(r, q) ..]`, `off` growing
/// with `r` and `q`. When all 36 blocks are whole and inside `src` (one check, at the
/// largest offset), each is one unaligned vector load; otherwise each goes through [`load`]
/// (zeros past `n` or past the end). Per block, the checks and index arithmetic had
/// spilled to the stack in the transforms' inner loops.
#[inline(always)]
fn columns_at<const N: usize>(
    src: &[f32],
    base: usize,
    off: impl Fn(usize, usize) -> usize,
    n: usize,
    f: impl Fn(&[Block; 6], &mut [Block; N]),
    out: &mut [[Block; N]; 6],
) {
    if n == L && base + off(5, 5) + L <= src.len() {
        let p = src.as_ptr().wrapping_add(base);
        // SAFETY: `base + off(r, q) + L <= base + off(5, 5) + L <= src.len()` (checked).
        columns(
            |r, q, d| *d = unsafe { p.add(off(r, q)).cast::<Block>().read_unaligned() },
            f,
            out,
        );
    } else {
        columns(|r, q, d| load(src.get(base + off(r, q)..).unwrap_or(&[]), n, d), f, out);
    }
}

/// `dst[..n] = src[..n]`, zeros after (a block from a channel run of `n <= L` values).
#[inline(always)]
fn load(src: &[f32], n: usize, dst: &mut Block) {
    // A whole block as one fixed-size copy: a slice copy of a run-time length `n` compiled
    // to a `memmove` call per block (the transforms spent a third of their time there).
    if n == L
        && let Some(Ok(s)) = src.get(..L).map(<&Block>::try_from)
    {
        *dst = *s;
        return;
    }
    *dst = [0.0; L];
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
}

/// Copies `vals` to `dst`: a whole block as one fixed-size (unaligned) store, where a copy of
/// a run-time length compiled to a `memmove` call per block.
///
/// # Safety
/// `dst .. dst + vals.len()` is writable and no one else reads or writes it during the call;
/// `vals` does not overlap it.
#[inline(always)]
unsafe fn put(dst: *mut f32, vals: &[f32]) {
    // SAFETY: the caller's contract.
    unsafe {
        match <&Block>::try_from(vals) {
            Ok(block) => dst.cast::<Block>().write_unaligned(*block),
            Err(_) => crate::vector::copy_run(std::slice::from_raw_parts_mut(dst, vals.len()), vals),
        }
    }
}

/// A buffer tasks write disjoint parts of through a shared pointer: `V` in the parallel input
/// transform (each task its tiles' rows), the output in the output transform (each task its
/// tiles' pixels). The buffer is borrowed mutably by [`Winograd::run`] throughout.
#[derive(Clone, Copy)]
struct RawOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: tasks sharing a RawOut write disjoint ranges (they own disjoint tiles) and nobody
// reads what another task writes until all are done.
unsafe impl Send for RawOut {}
// SAFETY: as above.
unsafe impl Sync for RawOut {}

impl RawOut {
    /// Copies `vals` to `ptr[o .. o + vals.len()]`; nothing when that is out of range.
    ///
    /// # Safety
    /// No one else reads or writes that range during the call.
    #[inline(always)]
    unsafe fn write(self, o: usize, vals: &[f32]) {
        if o.checked_add(vals.len()).is_some_and(|end| end <= self.len) {
            // SAFETY: the range is inside the buffer (checked), which outlives every task; the
            // caller guarantees exclusive access to it.
            unsafe { put(self.ptr.add(o), vals) }
        }
    }

    /// `ptr[r]` as a slice; `None` when out of range.
    ///
    /// # Safety
    /// No one else reads or writes that range while the slice lives.
    unsafe fn slice<'a>(self, r: std::ops::Range<usize>) -> Option<&'a mut [f32]> {
        (r.start <= r.end && r.end <= self.len).then(|| {
            // SAFETY: the range is inside the buffer (checked), which outlives every task, and
            // the caller guarantees exclusive access to it.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
        })
    }
}

/// Where the input transform reads: padded pixel `(py, px)` is the channels-last pixel
/// `(row0 + dh py, col0 + dw px)` of `x` (`ih x iw x c`), zero outside it. The input itself
/// when channels-last (no copy: a padded copy of a 450 x 60 x 32 input had taken an eighth
/// of its layer's time), its padded channels-last copy when channels-first.
#[derive(Clone, Copy)]
struct Source<'a> {
    x: &'a [f32],
    ih: usize,
    iw: usize,
    row0: isize,
    col0: isize,
    dh: usize,
    dw: usize,
}

struct InputTransform<'a> {
    src: Source<'a>,
    v: RawOut,
    c: usize,
    /// Tiles in V (its row count per position).
    rows: usize,
    /// The tile in V's first row (V holds tiles `first .. first + rows`).
    first: usize,
    /// The tiles this task transforms.
    tiles: std::ops::Range<usize>,
    tw: usize,
}

impl Kernel for InputTransform<'_> {
    type Output = ();
    /// For each tile: `B^T d B` over channel blocks, written to `V[xi][tile - first]`.
    #[inline(always)]
    fn run(self) {
        let (c, src) = (self.c, self.src);
        let mut s = [[[0.0f32; L]; 6]; 6];
        // V's rows of one position are `pos` floats apart.
        let pos = self.rows * c;
        // Input floats between a tile's rows and between its columns.
        let (rstep, qstep) = (src.dh * src.iw * c, src.dw * c);
        // The tiles' input pixel (row, column) of padded (r, q), when inside the input.
        let inside = |iy: isize, ix: isize| {
            (usize::try_from(iy).ok().filter(|&iy| iy < src.ih)).zip(usize::try_from(ix).ok().filter(|&ix| ix < src.iw))
        };
        for tile in self.tiles.clone() {
            let (ty, tx) = (tile / self.tw, tile % self.tw);
            let Some(row_of) = tile.checked_sub(self.first) else {
                continue;
            };
            // The input pixel under the tile's padded (0, 0), and under its (5, 5).
            let iy = src.row0 + (src.dh * ty * TILE) as isize;
            let ix = src.col0 + (src.dw * tx * TILE) as isize;
            let last = inside(iy + (5 * src.dh) as isize, ix + (5 * src.dw) as isize);
            // The whole tile inside the input: read in place, else pixel by pixel.
            let base = inside(iy, ix)
                .filter(|_| last.is_some())
                .map(|(y, x)| (y * src.iw + x) * c);
            // The tile's 36 rows of V, checked once for all its blocks.
            let first_out = row_of * c;
            if (POSITIONS - 1) * pos + first_out + c > self.v.len {
                continue;
            }
            let mut c0 = 0;
            while c0 < c {
                let n = (c - c0).min(L);
                // s[q][i] = sum_r BT[i][r] d[r][q]
                match base {
                    Some(base) => columns_at(src.x, base + c0, |r, q| r * rstep + q * qstep, n, bt6, &mut s),
                    None => columns(
                        |r, q, d| match inside(iy + (r * src.dh) as isize, ix + (q * src.dw) as isize) {
                            Some((y, x)) => load(src.x.get((y * src.iw + x) * c + c0..).unwrap_or(&[]), n, d),
                            None => *d = [0.0; L],
                        },
                        bt6,
                        &mut s,
                    ),
                }
                // V[i][j] = sum_q s[q][i] BT[j][q]
                let dst = self.v.ptr.wrapping_add(first_out + c0);
                for i in 0..6 {
                    let row: [Block; 6] = std::array::from_fn(|q| s[q][i]);
                    let mut v = [[0.0f32; L]; 6];
                    bt6(&row, &mut v);
                    for (j, vj) in v.iter().enumerate() {
                        let xi = i * 6 + j;
                        // SAFETY: row (xi, tile) belongs to this task alone (tasks own
                        // disjoint tile ranges), and `xi pos + first_out + c0 + n <= 35 pos +
                        // first_out + c <= v.len` (checked above); `vj` is local.
                        unsafe { put(dst.add(xi * pos), vj.get(..n).unwrap_or(vj)) };
                    }
                }
                c0 += n;
            }
        }
    }
}

/// Where the output transform writes.
enum Dst<'a> {
    /// Channels-last: the whole output, of which the task owns its tiles' pixels.
    Pixels(RawOut),
    /// Channels-first: planes `m0..m1` of the output, the task's own.
    Planes(&'a mut [f32]),
}

struct OutputTransform<'a> {
    prod: &'a [f32],
    dst: Dst<'a>,
    bias: Option<&'a [f32]>,
    m: usize,
    m0: usize,
    m1: usize,
    /// Tiles in the products (their row count per position).
    rows: usize,
    /// The tile in the products' first row (they hold tiles `first .. first + rows`).
    first: usize,
    /// The tiles to transform.
    tiles: std::ops::Range<usize>,
    tw: usize,
    /// The class of outputs (its size, and where its pixels are channels-last).
    lat: Lattice,
}

impl Kernel for OutputTransform<'_> {
    type Output = ();
    /// For each tile: `A^T M A` over blocks of channels `m0..m1`, plus the bias, written
    /// channels-last or scattered to the planes.
    #[inline(always)]
    fn run(mut self) {
        let (oh, ow) = (self.lat.oh, self.lat.ow);
        let plane = oh * ow;
        let mut stage = [[[0.0f32; L]; 4]; 6];
        for tile in self.tiles.clone() {
            let (ty, tx) = (tile / self.tw, tile % self.tw);
            let Some(row_of) = tile.checked_sub(self.first) else {
                continue;
            };
            let at = |a: usize, b: usize| ((a * 6 + b) * self.rows + row_of) * self.m;
            let mut c0 = self.m0;
            while c0 < self.m1 {
                let n = (self.m1 - c0).min(L);
                // stage[b][i] = sum_a AT[i][a] M[a][b]
                let step = self.rows * self.m;
                columns_at(self.prod, at(0, 0) + c0, |a, b| (a * 6 + b) * step, n, at4, &mut stage);
                let mut bias = [0.0f32; L];
                load(self.bias.and_then(|b| b.get(c0..)).unwrap_or(&[]), n, &mut bias);
                for i in 0..4 {
                    let oy = ty * TILE + i;
                    if oy >= oh {
                        break;
                    }
                    // res[j] = sum_b stage[b][i] AT[j][b]
                    let row: [Block; 6] = std::array::from_fn(|b| stage[b][i]);
                    let mut res = [[0.0f32; L]; 4];
                    at4(&row, &mut res);
                    for (j, rj) in res.iter_mut().enumerate() {
                        let ox = tx * TILE + j;
                        if ox >= ow {
                            break;
                        }
                        for (v, &b) in rj.iter_mut().zip(&bias) {
                            *v += b;
                        }
                        match &mut self.dst {
                            Dst::Pixels(y) => {
                                let pixel = self.lat.first + oy * self.lat.row_step + ox * self.lat.col_step;
                                // SAFETY: pixel (oy, ox) is in this task's tile.
                                unsafe { y.write(pixel * self.m + c0, &rj[..n]) };
                            }
                            Dst::Planes(ys) => {
                                for (k, &val) in rj[..n].iter().enumerate() {
                                    if let Some(d) = ys.get_mut((c0 - self.m0 + k) * plane + oy * ow + ox) {
                                        *d = val;
                                    }
                                }
                            }
                        }
                    }
                }
                c0 += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spelled-out transforms are the matrices: each applied to the unit vectors gives
    /// the matrix's columns, in every lane.
    #[test]
    fn the_spelled_out_transforms_are_bt_and_at() {
        for r in 0..6 {
            let mut unit = [[0.0f32; L]; 6];
            unit[r] = [1.0; L];
            let mut b = [[0.0f32; L]; 6];
            bt6(&unit, &mut b);
            let mut a = [[0.0f32; L]; 4];
            at4(&unit, &mut a);
            for (i, row) in BT.iter().enumerate() {
                assert_eq!(b[i], [row[r]; L], "BT[{i}][{r}]");
            }
            for (i, row) in AT.iter().enumerate() {
                assert_eq!(a[i], [row[r]; L], "AT[{i}][{r}]");
            }
        }
    }
}
