//! `QLinearConv` as its plan says ([`QConvPlan`]): channels-last, the exact int32 sums of
//! each block of output pixels by the integer GEMM (X's rows as they are for a 1x1
//! stride-1 convolution, else its windows, padding filled with X's zero point so it adds
//! nothing), the weights packed once, requantized to 8 bits in the micro-tiles: in the
//! reference's f64 arithmetic, or in f32 for a node that replaced a QDQ graph. Channels-first plans run the
//! op's own path; either way the plan's clamp (a fused Relu or Clip) applies last.

use super::QConvPlan;
use crate::error::{OpError, Result};
use crate::quant::QLinearConv;
use crate::quant::integer::conv_requant;
use crate::quant::linear::int_range;
use crate::recurrent::num::{in_shape, tt};
use crate::value::{Args, Dim, InferInput, ValueType};
use crate::{Outputs, util};
use kiln_kernels::igemm::{
    ConvScratch, ConvWindow, IgemmError, Int8, MAX_EXACT_DEPTH, PackedB, Packing, Requantize, Scales, TwinParams,
    conv_requant_serial, conv_rows_requant_serial, igemm_requant_serial,
};
use kiln_kernels::quant::{Q8, Sum, requantize_row, requantize_row_f32};
use kiln_tensor::{DType, Element, Tensor};
use std::sync::Mutex;

/// Bytes of im2col rows (and of i32 sums) per block of output pixels: both within L2.
const BLOCK_BYTES: usize = 256 * 1024;
/// Largest padded copy of X's rows one block of a convolution read from such a copy on the
/// AMX tiles makes (it stays in L2 while the tiles read each row for every kernel row).
const FLAT_COPY_BYTES: usize = 512 * 1024;
/// Fewest rows per block when the packed weights are larger than [`BLOCK_BYTES`].
const MIN_ROWS_BIG_B: usize = 128;
/// Most values of a kernel row copied out per output pixel (`Depth::Rows`): a 1-D kernel of
/// 1,024 taps over one channel.
const MAX_ROW_RUN: usize = 1024;

/// The channels-last kernel of a QLinearConv of `c` input channels into `m` by W `[m, cg, kh,
/// kw]` in `group`s, or `None` when it has none. The `layout` pass asks this before giving a
/// QLinearConv a channels-last plan.
pub fn channels_last_kind(group: usize, [c, m, cg]: [usize; 3]) -> Option<QConvKind> {
    if group == 1 && cg == c {
        Some(QConvKind::Dense)
    } else if group == c && m == c && cg == 1 && c > 1 {
        Some(QConvKind::Depthwise)
    } else if group > 1 && cg * group == c && m % group == 0 && m > 0 {
        Some(QConvKind::Grouped)
    } else {
        None
    }
}

/// How a channels-last QLinearConv runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QConvKind {
    /// One GEMM of the windows by all the weights.
    Dense,
    /// One input channel per group and output channel: the tap loops.
    Depthwise,
    /// Several channels per group: per group, the GEMM of its channels' windows (read in
    /// place from X's pixels) by its weights, into its columns of Y.
    Grouped,
}

pub(crate) fn eval(op: &QLinearConv, plan: &QConvPlan, args: &Args<'_>) -> Result<Outputs> {
    if !plan.channels_last {
        let mut out = op.eval(args)?;
        if let Some((lo, hi)) = plan.clamp
            && let Some(v) = out.first_mut()
        {
            let Some(t) = v.as_tensor() else { return Ok(out) };
            *v = clamp_tensor(t, lo, hi)?.into();
        }
        return Ok(out);
    }
    let x = args.tensor(0)?;
    let zy = args.opt_tensor(7)?;
    let odt = zy.map_or(x.dtype(), Tensor::dtype);
    let (y, summed) = match (x.dtype(), odt) {
        (DType::U8, DType::U8) => run::<u8, u8>(op, plan, args)?,
        (DType::U8, DType::I8) => run::<u8, i8>(op, plan, args)?,
        (DType::I8, DType::U8) => run::<i8, u8>(op, plan, args)?,
        (DType::I8, DType::I8) => run::<i8, i8>(op, plan, args)?,
        (got, _) => return Err(OpError::UnsupportedDType { index: 0, got }),
    };
    match plan.residual {
        // The sum the blocks could not make in place (other types or shapes, per-channel
        // parameters, a depthwise convolution): the QLinearAdd itself, on the output.
        Some(res) if !summed => {
            let y = crate::Value::from(y);
            let at = |i: usize| args.value(RESIDUAL_INPUTS + i);
            let inputs = [Some(&y), at(0), at(1), at(2), at(3), at(4), at(5), at(6)];
            crate::quant::QLinearAdd { relu: res.relu }.eval(&Args::new(&inputs))
        }
        _ => Ok(smallvec::smallvec![y.into()]),
    }
}

/// The first of a fused residual sum's inputs ([`super::QResidual`]).
const RESIDUAL_INPUTS: usize = 9;

/// A fused residual sum made in place on each block of output pixels: `y = Q(DQ(y) +
/// DQ(r))`, as `QLinearAdd`'s one-pass arithmetic (the same bits).
struct Residual<'a, O> {
    values: &'a [O],
    /// Y's scale and zero point as the sum dequantizes it.
    own: (f32, f32),
    /// R's.
    of_r: (f32, f32),
    /// The sum's.
    out: (f32, f32),
    /// The fused Relu's floor: the sum's zero point.
    floor: Option<f32>,
}

impl<'a, O: Quantized> Residual<'a, O> {
    /// The sum of a plan with a residual, when it can be made in place on Y `[N, OH, OW,
    /// M]`: R of that shape and Y's type, the sum of Y's type too, every scale and zero point
    /// one value. `None` otherwise (the op then adds afterwards).
    fn of(plan: &QConvPlan, args: &Args<'a>, shape: &[usize]) -> Result<Option<Residual<'a, O>>> {
        use crate::quant::qadd::{scale, zero};
        let Some(res) = plan.residual else { return Ok(None) };
        let at = |i: usize| RESIDUAL_INPUTS + i;
        let r = args.tensor(at(2))?;
        let zt = args.opt_tensor(at(6))?;
        let out_type = zt.map_or(DType::U8, Tensor::dtype);
        if r.shape() != shape || r.dtype() != O::DTYPE || out_type != O::DTYPE {
            return Ok(None);
        }
        let (Some(sc), Some(sr), Some(so)) = (
            scale(args.tensor(at(0))?),
            scale(args.tensor(at(3))?),
            scale(args.tensor(at(5))?),
        ) else {
            return Ok(None);
        };
        let (Some(zc), Some(zr), Some(zo)) = (zero(args.opt_tensor(at(1))?), zero(args.opt_tensor(at(4))?), zero(zt))
        else {
            return Ok(None);
        };
        Ok(Some(Residual {
            values: r.as_slice::<O>()?,
            own: (sc, zc),
            of_r: (sr, zr),
            out: (so, zo),
            floor: res.relu.then_some(zo),
        }))
    }

    /// The sum as the output stage makes it, for Y's elements from `first` on (R then has
    /// Y's layout); `None` when the map is not bounded (then [`Residual::apply`] adds after).
    fn in_stage(&self, first: usize) -> Option<kiln_kernels::igemm::ResidualSum<'a>> {
        let map = kiln_kernels::quant::SumMap::of(self.own, self.of_r, self.out);
        kiln_kernels::igemm::ResidualSum::new(self.values.get(first..)?, map, self.floor)
    }

    /// The sum on `out`, Y's elements from `first` on.
    fn apply(&self, first: usize, out: &mut [O]) {
        let Some(r) = self.values.get(first..first + out.len()) else {
            return;
        };
        let b = kiln_kernels::quant::Operand {
            values: r,
            scale: self.of_r.0,
            zero_point: self.of_r.1,
        };
        kiln_kernels::quant::add_dequantized_in_place(out, self.own, b, self.out, self.floor);
    }
}

/// A channels-last plan's output type: `[N, OH, OW, M]` for X `[N, H, W, C]`.
pub(crate) fn infer(op: &QLinearConv, plan: &QConvPlan, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
    if !plan.channels_last {
        return op.infer(inputs);
    }
    let dt = match plan.residual {
        // The sum's type: its zero point's, u8 without one (QLinearAdd's).
        Some(_) => util::input_dtype(inputs, RESIDUAL_INPUTS + 6).or(Some(DType::U8)),
        None => util::input_dtype(inputs, 7).or_else(|| util::input_dtype(inputs, 0)),
    };
    let nchw = in_shape(inputs, 0).and_then(|s| match s.as_slice() {
        [n, h, w, c] => Some(vec![n.clone(), c.clone(), h.clone(), w.clone()]),
        _ => None,
    });
    let shape = op
        .conv
        .infer_shape(nchw, in_shape(inputs, 3))
        .map(|s| match s.as_slice() {
            [n, m, oh, ow] => vec![n.clone(), oh.clone(), ow.clone(), m.clone()],
            _ => s,
        });
    Ok(vec![tt(dt, shape.map(|s: Vec<Dim>| s))])
}

/// An 8-bit output element.
trait Quantized: Element + Q8 + Int8 + Default + kiln_kernels::recycle::Recycled {}

impl Quantized for u8 {}

impl Quantized for i8 {}

/// A u8/i8 tensor with every value clamped to `[lo, hi]`.
fn clamp_tensor(t: &Tensor, lo: i32, hi: i32) -> Result<Tensor> {
    fn go<T: Quantized + TryFrom<i32>>(t: &Tensor, lo: i32, hi: i32) -> Result<Tensor> {
        let v: Vec<T> = t
            .as_slice::<T>()?
            .iter()
            .map(|&q| T::try_from(q.widen().clamp(lo, hi)).unwrap_or(q))
            .collect();
        Ok(Tensor::from_vec(t.shape().to_vec(), v)?)
    }
    match t.dtype() {
        DType::U8 => go::<u8>(t, lo, hi),
        DType::I8 => go::<i8>(t, lo, hi),
        got => Err(OpError::UnsupportedDType { index: 0, got }),
    }
}

/// The depth of a stride-2 convolution run as a stride-1 one over X's 2 x 2 blocks
/// ([`space_to_depth`], [`s2d_weights`]), when that pays: on the AMX tiles, no dilation, a
/// kernel larger than one pixel, fewer than 64 channels, and the blocks' window (`ceil(kh /
/// 2) x ceil(kw / 2)` taps of `4 c` channels) read in place by the tiles (whole 64-channel
/// chunks, or kernel rows as `igemm::conv_row_run` pads them) at most twice as deep as the
/// original window. Depends on the weights' shape and the attributes only (B is packed for
/// it once).
fn s2d_depth(
    isa: kiln_kernels::isa::Isa,
    stride: (usize, usize),
    dilation: (usize, usize),
    (kh, kw): (usize, usize),
    c: usize,
) -> Option<usize> {
    // Only channels the tiles would not take by taps (an image's three, 16 or 32): a wider
    // X's windows are copied for the tiles already, and almost twice the depth costs more
    // (ResNet's stride-2 3x3 layers of 128-512 channels 1.45 -> 2.2 ms).
    if stride != (2, 2) || dilation != (1, 1) || (kh == 1 && kw == 1) || c == 0 || c >= 64 {
        return None;
    }
    let (kh2, kw2, c2) = (kh.div_ceil(2), kw.div_ceil(2), 4 * c);
    let depth = if c2.is_multiple_of(64) {
        kh2 * kw2 * c2
    } else {
        let probe = ConvWindow {
            batch: 1,
            input: (kh2, kw2),
            channels: c2,
            pixel_stride: c2,
            kernel: (kh2, kw2),
            output: (1, 1),
            stride: (1, 1),
            dilation: (1, 1),
            pad: (0, 0),
        };
        kh2 * kiln_kernels::igemm::conv_row_run(isa, &probe)?
    };
    (kiln_kernels::igemm::requant_on_tiles(isa, depth) && depth <= 2 * kh * kw * c).then_some(depth)
}

/// X `[n, h, w, c]` padded by `pad` (top, left; the rest up to `h2 x w2` blocks) with `zero`
/// and cut into 2 x 2 blocks of pixels: `out[b][y][x]` holds the padded input's pixels
/// `(2y + a, 2x + e)` for `a, e` in `0..2`, in that order, `c` values each. A stride-2
/// convolution over X is then a stride-1 one over `out` with [`s2d_weights`].
fn space_to_depth<T: Copy>(
    x: &[T],
    (n, h, w, c): (usize, usize, usize, usize),
    (ph, pw): (usize, usize),
    (h2, w2): (usize, usize),
    zero: T,
    out: &mut [T],
) {
    let pixel = 4 * c;
    for (i, block) in out.chunks_exact_mut(pixel.max(1)).take(n * h2 * w2).enumerate() {
        let (b, y, xb) = (i / (h2 * w2), (i / w2) % h2, i % w2);
        for (q, dst) in block.chunks_exact_mut(c.max(1)).enumerate() {
            let (iy, ix) = ((2 * y + q / 2).checked_sub(ph), (2 * xb + q % 2).checked_sub(pw));
            let src = iy
                .zip(ix)
                .filter(|&(iy, ix)| iy < h && ix < w)
                .and_then(|(iy, ix)| x.get(((b * h + iy) * w + ix) * c..((b * h + iy) * w + ix + 1) * c));
            match src {
                // A few channels element by element: a library copy call per pixel of three
                // values costs more than the copy.
                Some(s) if c < 16 => dst.iter_mut().zip(s).for_each(|(d, &v)| *d = v),
                Some(s) => dst.copy_from_slice(s),
                None => dst.fill(zero),
            }
        }
    }
}

/// The weights `[m, c, kh, kw]` of a stride-2 convolution as those of the stride-1 one over
/// [`space_to_depth`]'s blocks: `[m, 4 c, ceil(kh / 2), ceil(kw / 2)]`, channel `(2 a + e) c
/// + ch` of tap `(ky, kx)` the original's `(2 ky + a, 2 kx + e)`, or the column's zero point
/// (a product of nothing) past the kernel.
fn s2d_weights<W: Int8 + Element + Default>(w: &Tensor, zw: Option<&Tensor>) -> Option<Tensor> {
    let &[m, c, kh, kw] = w.shape() else { return None };
    let src = w.as_slice::<W>().ok()?;
    let z: &[W] = match zw {
        None => &[],
        Some(z) => z.as_slice::<W>().ok()?,
    };
    let (kh2, kw2) = (kh.div_ceil(2), kw.div_ceil(2));
    let mut v = Vec::with_capacity(m * 4 * c * kh2 * kw2);
    for j in 0..m {
        let zero = z.get(j).or(z.first()).copied().unwrap_or_default();
        for q in 0..4 {
            for ch in 0..c {
                for ky2 in 0..kh2 {
                    for kx2 in 0..kw2 {
                        let (ky, kx) = (2 * ky2 + q / 2, 2 * kx2 + q % 2);
                        v.push(if ky < kh && kx < kw {
                            *src.get(((j * c + ch) * kh + ky) * kw + kx)?
                        } else {
                            zero
                        });
                    }
                }
            }
        }
    }
    Tensor::from_vec(vec![m, 4 * c, kh2, kw2], v).ok()
}

/// Output channels `cols` of W `[m, c, kh, kw]` (all of them, or one group's) as the GEMM's B
/// `[(ky, kx, ci), cols]` with `cp >= c` channels per tap (those past `c` hold the column's
/// zero point: a zero weight), with their zero points.
/// Output channels `cols` of W `[M, C, kH, kW]` packed for the window depth `[ky][kx][c]`
/// with `c` padded to `cp` by the weights' zero point (`Depth::Taps`), or `[ky][kx * C + c]`
/// padded to `cp` (`Depth::Rows`: a kernel row's taps as one run of channels), by `pack`
/// ([`PackedB::pack`], or [`PackedB::pack_for_sums`] for int32 sums alone).
pub(crate) fn pack_weights<W: Int8 + Element + Default>(
    w: &Tensor,
    zw: Option<&Tensor>,
    depth: Depth,
    cols: std::ops::Range<usize>,
    pack: Pack<W>,
) -> Option<PackedB> {
    let &[m, c, kh, kw] = w.shape() else { return None };
    let src = w.as_slice::<W>().ok()?;
    let (cp, taps_x) = match depth {
        Depth::Taps(cp) => (cp, kw),
        Depth::Rows(cp) => (cp, 1),
    };
    let k = cp * kh * taps_x;
    let z = match zw {
        None => &[][..],
        Some(z) if z.len() == 1 => z.as_slice::<W>().ok()?,
        Some(z) if z.len() == m => z.as_slice::<W>().ok()?.get(cols.clone())?,
        Some(_) => return None,
    };
    let zero = |j: usize| z.get(j).or(z.first()).copied().unwrap_or_default();
    let n = cols.len();
    let mut b = Vec::with_capacity(k * n);
    for ky in 0..kh {
        for tx in 0..taps_x {
            for slot in 0..cp {
                let (kx, ci, real) = match depth {
                    Depth::Taps(_) => (tx, slot, slot < c),
                    Depth::Rows(_) => (slot / c.max(1), slot % c.max(1), slot < kw * c),
                };
                for (jj, j) in cols.clone().enumerate() {
                    b.push(if real {
                        *src.get(((j * c + ci) * kh + ky) * kw + kx)?
                    } else {
                        zero(jj)
                    });
                }
            }
        }
    }
    pack(&b, k, n, z).ok()
}

/// A packing of B: [`PackedB::pack`] or [`PackedB::pack_for_sums`].
pub(crate) type Pack<W> = fn(&[W], usize, usize, &[W]) -> std::result::Result<PackedB, kiln_kernels::igemm::IgemmError>;

/// How a window's depth is laid out for the quads tile: see [`pack_weights`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Depth {
    /// `[ky][kx][c]`, `c` padded to this many channels.
    Taps(usize),
    /// `[ky][kx * C + c]`, padded to this many values: X's kernel rows copied out per output
    /// pixel ([`fold_rows`]), the window then `kh x 1` over them.
    Rows(usize),
}

/// Kernel rows `kw` wide (stride `sw`, dilation `dw`, left padding `pw`) of X `[rows, wd, c]`
/// copied out per output column: `out[row][ox]` is X's `kw` pixels of that window row (the
/// zero point `pad` outside X) followed by `pad` up to `cf` values.
#[allow(clippy::too_many_arguments)]
fn fold_rows<T: Copy>(
    xs: &[T],
    wd: usize,
    c: usize,
    (kw, sw, dw, pw): (usize, usize, usize, usize),
    ow: usize,
    cf: usize,
    pad: T,
    out: &mut [T],
) {
    let c = c.max(1);
    // Each slot's tap column offset and channel, or `None` for the padding after the taps;
    // element by element (no library call per few-byte run).
    let slots: Vec<Option<(usize, usize)>> = (0..cf).map(|s| (s < kw * c).then(|| ((s / c) * dw, s % c))).collect();
    let span = kw.saturating_sub(1) * dw;
    for (dst_row, src_row) in out
        .chunks_exact_mut((ow * cf).max(1))
        .zip(xs.chunks_exact((wd * c).max(1)))
    {
        for (ox, dst) in dst_row.chunks_exact_mut(cf.max(1)).enumerate() {
            let x0 = (ox * sw) as isize - pw as isize;
            if x0 >= 0 && x0.unsigned_abs() + span < wd {
                let first = x0.unsigned_abs() * c;
                // Adjacent taps (no dilation): one run of `kw * c` values, then the padding.
                let run = kw * c;
                if dw == 1
                    && run <= dst.len()
                    && let Some(src) = src_row.get(first..first + run)
                {
                    let (head, tail) = dst.split_at_mut(run);
                    head.copy_from_slice(src);
                    tail.fill(pad);
                    continue;
                }
                for (d, slot) in dst.iter_mut().zip(&slots) {
                    *d = slot
                        .and_then(|(dx, ch)| src_row.get(first + dx * c + ch))
                        .copied()
                        .unwrap_or(pad);
                }
            } else {
                for (d, slot) in dst.iter_mut().zip(&slots) {
                    let at = slot.and_then(|(dx, ch)| {
                        let ix = usize::try_from(x0 + dx as isize).ok().filter(|&ix| ix < wd)?;
                        src_row.get(ix * c + ch)
                    });
                    *d = at.copied().unwrap_or(pad);
                }
            }
        }
    }
}

fn scalar_zero_point<T: Int8 + Element>(args: &Args<'_>, index: usize) -> Result<i32> {
    match args.opt_tensor(index)? {
        None => Ok(0),
        Some(z) if z.len() == 1 => Ok(z.as_slice::<T>()?.first().map_or(0, |v| v.widen())),
        Some(z) => Err(OpError::input_shape(index, "one zero point", z.shape())),
    }
}

/// The convolution's output, and whether the plan's residual sum is already in it.
fn run<T, O>(op: &QLinearConv, plan: &QConvPlan, args: &Args<'_>) -> Result<(Tensor, bool)>
where
    T: Int8 + Element + Default + FromZeroPoint + kiln_kernels::recycle::Recycled,
    O: Quantized,
{
    let (x, w) = (args.tensor(0)?, args.tensor(3)?);
    let &[n, h, wd, c] = x.shape() else {
        return Err(OpError::input_shape(
            0,
            "[N, H, W, C] (a channels-last QLinearConv)",
            x.shape(),
        ));
    };
    let &[m, cg, kh, kw] = w.shape() else {
        return Err(OpError::input_shape(3, "[M, C, kH, kW]", w.shape()));
    };
    let groups = op.conv.group.max(1);
    let Some(kind) = channels_last_kind(groups, [c, m, cg]) else {
        return Err(OpError::inputs(
            0,
            3,
            "a dense, grouped or depthwise convolution channels-last",
            x.shape(),
            w.shape(),
        ));
    };
    let g = op.conv.geometry(&[n, c, h, wd], w.shape(), 3)?;
    let (Some(&oh), Some(&ow)) = (g.out.first(), g.out.get(1)) else {
        return Err(OpError::input_shape(0, "a 2-D convolution", x.shape()));
    };
    let at = |v: &[usize], i: usize| v.get(i).copied().unwrap_or(1);
    let (sh, sw, dh, dw) = (
        at(&g.strides, 0),
        at(&g.strides, 1),
        at(&g.dilations, 0),
        at(&g.dilations, 1),
    );
    let (ph, pw) = (
        g.pad_begin.first().copied().unwrap_or(0),
        g.pad_begin.get(1).copied().unwrap_or(0),
    );
    let k = cg * kh * kw;
    if k > MAX_EXACT_DEPTH {
        return Err(OpError::input_shape(3, "windows of at most 33,024 values", w.shape()));
    }
    let zx = scalar_zero_point::<T>(args, 2)?;
    let zw = args.opt_tensor(5)?;
    let (bias, mults, zy) = conv_requant(args, m)?;
    let bias = bias.unwrap_or_else(|| vec![0.0; m]);
    let odt = O::DTYPE;
    let (mut lo, mut hi) = int_range(odt).ok_or(OpError::UnsupportedDType { index: 7, got: odt })?;
    if let Some((a, b)) = plan.clamp {
        lo = lo.max(f64::from(a));
        hi = hi.min(f64::from(b));
    }
    let requant = Requant {
        bias: &bias,
        mults: &mults,
        zy,
        range: (lo, hi),
        f32s: plan.float_requant.then(|| {
            (
                bias.iter().map(|&b| b as f32).collect(),
                mults.iter().map(|&m| m as f32).collect(),
            )
        }),
        twin: if plan.float_requant {
            None
        } else {
            TwinParams::of(&bias, &mults, zy)
        },
    };
    let xs = x.as_slice::<T>()?;
    let window = ConvWindow {
        batch: n,
        input: (h, wd),
        channels: c,
        pixel_stride: c,
        kernel: (kh, kw),
        output: (oh, ow),
        stride: (sh, sw),
        dilation: (dh, dw),
        pad: (ph, pw),
    };
    if kind == QConvKind::Depthwise {
        let taps = plan.taps.get_or_make((kh, kw), || depthwise_taps(w, zw))?;
        if kh * kw <= EXACT_F32_TAPS {
            let dw = super::depthwise::Depthwise {
                channels: c,
                input: [h, wd],
                output: [oh, ow],
                kernel: [kh, kw],
                strides: [sh, sw],
                dilations: [dh, dw],
                pad_begin: [ph, pw],
            };
            // On VNNI with the f32 requantization, at stride 1 or 2 (undilated), X's rows
            // packed as quads, four taps of a kernel row to a `vpdpbusd`, requantized in
            // registers (MobileNet-v2's 3x3 layers on an AVX-512 Xeon, one thread, in the
            // model: 56x56x144 0.23 -> 0.13 ms, 112x112x32 0.19 -> 0.11 ms against the f32
            // kernel). Otherwise strided, the integer taps read X's bytes in place; else X's
            // rows as f32 through the f32 kernel (the f64 requantization's stride-1 layers:
            // the quads with the requantization apart were within 10% of it).
            let dot = kiln_kernels::isa::active().has_int8_dot();
            // The fused band packs only the quads a stride of 2 reads (no dilation then).
            let band_stride = sw == 1 || (sw == 2 && dw.dilations[1] == 1);
            if let (true, false, true, Some((bias, mults))) = (dot, taps.quads.is_empty(), band_stride, &requant.f32s) {
                let range = (requant.range.0 as f32, requant.range.1 as f32);
                let y = depthwise_quad_bands::<T, O>(
                    xs,
                    zx,
                    (&taps.quads, &taps.sums),
                    &dw,
                    n,
                    (bias, mults, requant.zy as f32, range),
                )?;
                return Ok((y, false));
            }
            if sh * sw > 1 && dot && !taps.shorts.is_empty() {
                return Ok((
                    depthwise_i8::<T, O>(xs, zx, (&taps.ints, &taps.shorts), &dw, n, &requant)?,
                    false,
                ));
            }
            return Ok((depthwise_f32::<T, O>(xs, zx, &taps.floats, &dw, n, &requant)?, false));
        }
        return Ok((depthwise_conv::<T, O>(xs, zx, &taps.ints, &window, &requant)?, false));
    }
    let residual = Residual::<O>::of(plan, args, &[n, oh, ow, m])?;
    let summed = residual.is_some();
    if kind == QConvKind::Grouped {
        let y = grouped::<T, O>(plan, w, zw, xs, zx, &window, groups, m, &requant, residual.as_ref())?;
        return Ok((y, summed));
    }
    let pointwise = kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == wd;
    let isa = kiln_kernels::isa::active();
    // A stride-2 convolution on the AMX tiles as a stride-1 one over X's 2 x 2 blocks of
    // pixels (space to depth, the padding written out): the tiles then read its windows in
    // place from a padded copy instead of an im2col row per pixel.
    let s2d = !pointwise && s2d_depth(isa, (sh, sw), (dh, dw), (kh, kw), c).is_some();
    let blocks: Option<Vec<T>> = if s2d {
        let (kh2, kw2) = (kh.div_ceil(2), kw.div_ceil(2));
        let (h2, w2) = (oh + kh2 - 1, ow + kw2 - 1);
        let mut v = kiln_kernels::recycle::take_of::<T>(util::checked_numel(&[n, h2, w2, 4 * c])?);
        space_to_depth(xs, (n, h, wd, c), (ph, pw), (h2, w2), T::try_from_i32(zx), &mut v);
        Some(v)
    } else {
        None
    };
    let (xs, window, c, (kh, kw), (sh, sw), (ph, pw), (h, wd)) = match &blocks {
        Some(v) => {
            let (kh2, kw2) = (kh.div_ceil(2), kw.div_ceil(2));
            let (h2, w2) = (oh + kh2 - 1, ow + kw2 - 1);
            let win = ConvWindow {
                input: (h2, w2),
                channels: 4 * c,
                pixel_stride: 4 * c,
                kernel: (kh2, kw2),
                stride: (1, 1),
                pad: (0, 0),
                ..window
            };
            (&v[..], win, 4 * c, (kh2, kw2), (1, 1), (0, 0), (h2, w2))
        }
        None => (xs, window, c, (kh, kw), (sh, sw), (ph, pw), (h, wd)),
    };
    let k = kh * kw * c;
    // A few input channels (an image's three) padded to a multiple of four with the zero
    // point, and the weights with their own: the window's taps are then whole quads the VNNI
    // tile reads in place, instead of an im2col copy of `c`-value runs per pixel. The padded
    // products are `(zx - zx) * (zw - zw)`, nothing. When a kernel row's `kw * c` values fill
    // fewer quads than its taps padded one by one (one or two channels: spectrograms,
    // waveforms), each output pixel's kernel rows are copied out instead, padded as one run
    // (`Depth::Rows`): a single channel's 3-wide rows take one quad, not three.
    let small = !pointwise && c % 4 != 0 && c < 16 && isa.has_int8_dot();
    let row_run = (kw * c).next_multiple_of(4);
    // On the AMX tiles, channels not in whole 64-channel chunks: kernel rows read as runs
    // from a padded copy of X's rows (B by kernel rows), where the output rows are wide
    // enough; else the kernel rows are copied out per pixel below.
    let tile_run = if pointwise {
        None
    } else {
        kiln_kernels::igemm::conv_row_run(isa, &window)
    };
    let flat_rows = tile_run.filter(|&kr| kiln_kernels::igemm::conv_reads_flat(isa, &window, Some(kr)));
    let depth = if let Some(kr) = tile_run {
        Depth::Rows(kr)
    } else if small && row_run / 4 < kw * c.div_ceil(4) && row_run <= MAX_ROW_RUN {
        Depth::Rows(row_run)
    } else if small {
        Depth::Taps(c.next_multiple_of(4))
    } else {
        Depth::Taps(c)
    };
    // Over X's 2 x 2 blocks, the weights of the stride-1 convolution (made once, to pack).
    let packed = match w.dtype() {
        DType::U8 if s2d => plan
            .packed
            .get_or_pack(|| pack_weights::<u8>(&s2d_weights::<u8>(w, zw)?, zw, depth, 0..m, PackedB::pack)),
        DType::I8 if s2d => plan
            .packed
            .get_or_pack(|| pack_weights::<i8>(&s2d_weights::<i8>(w, zw)?, zw, depth, 0..m, PackedB::pack)),
        DType::U8 => plan
            .packed
            .get_or_pack(|| pack_weights::<u8>(w, zw, depth, 0..m, PackedB::pack)),
        DType::I8 => plan
            .packed
            .get_or_pack(|| pack_weights::<i8>(w, zw, depth, 0..m, PackedB::pack)),
        got => return Err(OpError::UnsupportedDType { index: 3, got }),
    }
    .ok_or(OpError::input_value(
        3,
        "8-bit weights with one zero point or one per output channel",
        "another",
    ))?;
    // The tiles read B only in quads (weights whose zero points leave them in i8).
    let flat_rows = flat_rows.filter(|_| matches!(packed.packing(), Packing::Quads));
    // The copy comes from the run's recycled buffers and goes back at the end.
    let pad = T::try_from_i32(zx);
    let copied: Option<Vec<T>> = match depth {
        Depth::Taps(cp) if cp == c => None,
        Depth::Rows(_) if flat_rows.is_some() => None,
        Depth::Taps(cp) => {
            let mut v = kiln_kernels::recycle::take_of::<T>(util::checked_numel(&[n, h, wd, cp])?);
            // Every element written (the buffer is stale), element by element: a library copy
            // call per pixel of three bytes costs more.
            for (dst, src) in v.chunks_exact_mut(cp).zip(xs.chunks_exact(c)) {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = src.get(i).copied().unwrap_or(pad);
                }
            }
            Some(v)
        }
        Depth::Rows(cf) => {
            let mut v = kiln_kernels::recycle::take_of::<T>(util::checked_numel(&[n, h, ow, cf])?);
            fold_rows(xs, wd, c, (kw, sw, dw, pw), ow, cf, pad, &mut v);
            Some(v)
        }
    };
    let (xs, window, k) = match (&copied, depth) {
        (None, Depth::Rows(kr)) => (xs, window, kh * kr),
        (None, _) => (xs, window, k),
        (Some(v), Depth::Taps(cp)) => (
            &v[..],
            ConvWindow {
                channels: cp,
                pixel_stride: cp,
                ..window
            },
            cp * kh * kw,
        ),
        (Some(v), Depth::Rows(cf)) => (
            &v[..],
            ConvWindow {
                input: (h, ow),
                channels: cf,
                pixel_stride: cf,
                kernel: (kh, 1),
                stride: (sh, 1),
                dilation: (dh, 1),
                pad: (ph, 0),
                ..window
            },
            cf * kh,
        ),
    };
    if packed.depth() != k || packed.columns() != m {
        return Err(OpError::input_shape(
            3,
            format!("the packed weights' {k} x {m}"),
            w.shape(),
        ));
    }
    let pixels = n * oh * ow;
    let mut y = util::out_buf::<O>(util::checked_numel(&[pixels, m])?);
    // Blocks of whole micro-tiles of rows whose im2col rows and i32 sums stay in L2; at
    // least `MIN_ROWS_BIG_B` when the weights themselves outgrow L2, since each block reads
    // all of them; about two blocks per thread when there are several threads.
    let threads = kiln_kernels::pool::current_threads().max(1);
    let mut rows = (BLOCK_BYTES / k.max(1)).min(BLOCK_BYTES / (4 * m).max(1)).clamp(8, 512);
    if k * m > BLOCK_BYTES {
        rows = rows.max(MIN_ROWS_BIG_B);
    }
    let split = if threads > 1 { 2 * threads } else { 1 };
    let rows = rows.min(pixels.div_ceil(split)).div_ceil(8) * 8;
    // Read from a padded copy on the tiles, no rows or sums are kept: one block of whole
    // output rows per thread (each block copies its input rows and streams all of B once;
    // blocks of 120 pixels cut ResNet's 14 x 14 rows into ragged runs of tile rows).
    let quads = matches!(packed.packing(), Packing::Quads);
    let flat_taps = copied.is_none() && kiln_kernels::igemm::conv_reads_flat(isa, &window, None);
    let rows = if !pointwise && (flat_rows.is_some() || (flat_taps && quads)) {
        // Whole output rows, as many as a thread's share but no more than a padded copy of
        // `FLAT_COPY_BYTES` holds (a large image's whole copy, 19 MB for a 900 x 161 x 128
        // spectrogram, would stream from memory).
        let ow = ow.max(1);
        let row_bytes = (ow + (kw - 1) * dw) * c * std::mem::size_of::<T>();
        let most = (FLAT_COPY_BYTES / row_bytes.max(1))
            .saturating_sub((kh - 1) * dh)
            .max(1);
        pixels.div_ceil(threads).div_ceil(ow).min(most) * ow
    } else if pointwise && kiln_kernels::igemm::requant_on_tiles(isa, k) && quads {
        pixels.div_ceil(threads).div_ceil(32) * 32
    } else {
        rows
    };
    over_blocks::<T, O>(&mut y, rows, m, CONV_SUMS, &|p0, r, out, scratch| {
        // The residual sum in the output stage (R's block from its first pixel on), or after.
        let sum = residual.as_ref().and_then(|res| res.in_stage(p0 * m));
        let stage = Requantize {
            sum,
            ..requant.stage(0..m)
        };
        if pointwise {
            let (acc, _) = scratch.parts(r * m, 0);
            let a = xs.get(p0 * c..).unwrap_or(&[]);
            igemm_requant_serial(isa, (r, k), a, c, zx, packed, acc, stage, out, m)?;
        } else if let Some(kr) = flat_rows {
            let pixels = p0..p0 + r;
            if !conv_rows_requant_serial(isa, &window, kr, xs, pixels, pad, packed, scratch, stage, out, m)? {
                return Err(IgemmError::Short {
                    what: "the tiles for a convolution by kernel rows",
                    got: 0,
                    want: 1,
                });
            }
        } else {
            conv_requant_serial(isa, &window, xs, p0..p0 + r, pad, packed, scratch, stage, out, m)?;
        }
        if sum.is_none()
            && let Some(res) = &residual
        {
            res.apply(p0 * m, out);
        }
        Ok(())
    })?;
    if let Some(v) = copied {
        kiln_kernels::recycle::give_of(v);
    }
    if let Some(v) = blocks {
        kiln_kernels::recycle::give_of(v);
    }
    Ok((Tensor::from_buf(vec![n, oh, ow, m], y)?, summed))
}

/// A grouped convolution channels-last: per block of output pixels and per group, the
/// integer GEMM of the group's channels of each window (read in place from X's pixels, `c`
/// apart) by the group's packed weights, requantized into the group's columns of Y.
#[allow(clippy::too_many_arguments)]
fn grouped<T, O>(
    plan: &QConvPlan,
    w: &Tensor,
    zw: Option<&Tensor>,
    xs: &[T],
    zx: i32,
    win: &ConvWindow,
    groups: usize,
    m: usize,
    requant: &Requant<'_>,
    residual: Option<&Residual<'_, O>>,
) -> Result<Tensor>
where
    T: Int8 + Element + Default + FromZeroPoint,
    O: Quantized,
{
    let c = win.channels;
    let (cg, mg) = (c / groups.max(1), m / groups.max(1));
    let gwin = ConvWindow {
        channels: cg,
        pixel_stride: c,
        ..*win
    };
    let k = gwin.depth();
    let pack = |g: usize| match w.dtype() {
        DType::U8 => pack_weights::<u8>(w, zw, Depth::Taps(cg), g * mg..(g + 1) * mg, PackedB::pack),
        DType::I8 => pack_weights::<i8>(w, zw, Depth::Taps(cg), g * mg..(g + 1) * mg, PackedB::pack),
        _ => None,
    };
    let packed = plan
        .groups
        .get_or_pack(|| (0..groups).map(pack).collect())
        .filter(|p| p.len() == groups && p.iter().all(|b| b.depth() == k && b.columns() == mg))
        .ok_or(OpError::input_value(
            3,
            "8-bit weights with one zero point or one per output channel",
            "another",
        ))?;
    let pixels = win.pixels();
    let mut y = util::out_buf::<O>(util::checked_numel(&[pixels, m])?);
    let pad = T::try_from_i32(zx);
    let isa = kiln_kernels::isa::active();
    // Blocks of whole micro-tiles of rows whose sums (one group's at a time) and outputs
    // stay in cache; about two blocks per thread when there are several threads.
    let threads = kiln_kernels::pool::current_threads().max(1);
    let split = if threads > 1 { 2 * threads } else { 1 };
    let rows = (BLOCK_BYTES / (2 * m).max(1)).clamp(8, 512);
    let rows = rows.min(pixels.div_ceil(split)).div_ceil(8) * 8;
    over_blocks::<T, O>(&mut y, rows, m, CONV_SUMS, &|p0, r, out, scratch| {
        let mut summed = residual.is_none();
        for (g, b) in packed.iter().enumerate() {
            let xg = xs.get(g * cg..).unwrap_or_default();
            let Some(yg) = out.get_mut(g * mg..) else { break };
            // The residual sum in the stage, R from the group's first column (Y's layout).
            let sum = residual.and_then(|res| res.in_stage(p0 * m + g * mg));
            summed |= sum.is_some();
            let stage = Requantize {
                sum,
                ..requant.stage(g * mg..(g + 1) * mg)
            };
            conv_requant_serial(isa, &gwin, xg, p0..p0 + r, pad, b, scratch, stage, yg, m)?;
        }
        if !summed && let Some(res) = residual {
            res.apply(p0 * m, out);
        }
        Ok(())
    })?;
    let (n, (oh, ow)) = (win.batch, win.output);
    Ok(Tensor::from_buf(vec![n, oh, ow, m], y)?)
}

/// Runs `each(first pixel, pixels, their rows of Y, this thread's scratch)` over blocks of
/// `rows` output pixels (or rows of a product) of `y` (`m` channels each), over the pool;
/// the first failure is the op's error, input 0 expected to be `what`.
pub(crate) fn over_blocks<T: FromZeroPoint, O: Send>(
    y: &mut [O],
    rows: usize,
    m: usize,
    what: &'static str,
    each: &(dyn Fn(usize, usize, &mut [O], &mut ConvScratch<T>) -> std::result::Result<(), IgemmError> + Sync),
) -> Result<()> {
    let failure: Mutex<Option<OpError>> = Mutex::new(None);
    kiln_kernels::pool::for_each_chunk_mut(y, rows * m, &|i, out| {
        let r = out.len() / m.max(1);
        // This thread's scratch (every element is written before it is read).
        if let Err(e) = T::with_scratch(|scratch| each(i * rows, r, out, scratch))
            && let Ok(mut f) = failure.lock()
        {
            f.get_or_insert(OpError::input_value(0, what, e.to_string()));
        }
    });
    match failure.into_inner().ok().flatten() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a convolution's X must be for [`over_blocks`]' kernels.
const CONV_SUMS: &str = "a convolution whose exact sums fit int32";

thread_local! {
    /// Each thread's convolution scratch, per 8-bit type.
    static SCRATCH_U8: std::cell::RefCell<ConvScratch<u8>> = std::cell::RefCell::new(ConvScratch::default());
    static SCRATCH_I8: std::cell::RefCell<ConvScratch<i8>> = std::cell::RefCell::new(ConvScratch::default());
}

/// An 8-bit X element: its padding value, and this thread's convolution scratch of its type.
pub(crate) trait FromZeroPoint: Sized + Copy + Default {
    /// The padding value: X's zero point in X's type.
    fn try_from_i32(v: i32) -> Self;
    /// Runs `f` on this thread's scratch.
    fn with_scratch<R>(f: impl FnOnce(&mut ConvScratch<Self>) -> R) -> R;
}

impl FromZeroPoint for u8 {
    fn try_from_i32(v: i32) -> u8 {
        v.clamp(0, 255) as u8
    }
    fn with_scratch<R>(f: impl FnOnce(&mut ConvScratch<u8>) -> R) -> R {
        SCRATCH_U8.with_borrow_mut(f)
    }
}

impl FromZeroPoint for i8 {
    fn try_from_i32(v: i32) -> i8 {
        v.clamp(-128, 127) as i8
    }
    fn with_scratch<R>(f: impl FnOnce(&mut ConvScratch<i8>) -> R) -> R {
        SCRATCH_I8.with_borrow_mut(f)
    }
}

/// The requantization of one convolution: per output channel bias and multiplier, the
/// output zero point and the clamped range.
struct Requant<'a> {
    bias: &'a [f64],
    mults: &'a [f64],
    zy: f64,
    range: (f64, f64),
    /// The bias and multipliers in f32, for the plan's f32 requantization.
    f32s: Option<(Vec<f32>, Vec<f32>)>,
    /// For the f64 requantization, its f32 twin: the VNNI tile's f32 arithmetic with f64
    /// where it could round otherwise.
    twin: Option<TwinParams>,
}

impl Requant<'_> {
    /// The micro-tiles' stage for output channels `cols`: in f32 as the QDQ graph this node
    /// replaced computed it, or in the f64 of the QLinearConv reference (empty parameters for
    /// channels out of range, which the kernels refuse).
    fn stage(&self, cols: std::ops::Range<usize>) -> Requantize<'_> {
        let scales = match &self.f32s {
            Some((bias, mult)) => Scales::F32 {
                bias: bias.get(cols.clone()).unwrap_or_default(),
                mult: mult.get(cols).unwrap_or_default(),
                zero_point: self.zy as f32,
            },
            None => Scales::F64 {
                bias: self.bias.get(cols.clone()).unwrap_or_default(),
                mult: self.mults.get(cols.clone()).unwrap_or_default(),
                zero_point: self.zy,
                twin: self.twin.as_ref().map(|t| t.columns(cols)),
            },
        };
        Requantize {
            scales,
            range: (self.range.0 as i32, self.range.1 as i32),
            sum: None,
        }
    }

    /// One output pixel's channels from their exact sums (i32, or f32 holding integers).
    fn row<A: Sum, O: Quantized>(&self, acc: &[A], out: &mut [O]) {
        match &self.f32s {
            Some((bias, mults)) => {
                let (lo, hi) = self.range;
                requantize_row_f32(acc, bias, mults, self.zy as f32, (lo as f32, hi as f32), out);
            }
            None => requantize_row(acc, self.bias, self.mults, self.zy, self.range, out),
        }
    }

    /// A run of output pixels' channels (`acc` and `out` whole pixels), in one call.
    fn pixels<A: Sum, O: Quantized>(&self, acc: &[A], out: &mut [O]) {
        match &self.f32s {
            Some((bias, mults)) => {
                let (lo, hi) = self.range;
                kiln_kernels::quant::requantize_pixels_f32(
                    acc,
                    bias,
                    mults,
                    self.zy as f32,
                    (lo as f32, hi as f32),
                    out,
                );
            }
            None => kiln_kernels::quant::requantize_pixels(acc, self.bias, self.mults, self.zy, self.range, out),
        }
    }
}

/// One output row of [`depthwise_conv`]: per pixel, blocks of [`LANES`] channels
/// summed over the live taps in registers, then requantized.
struct DepthwiseRow<'a, T, O> {
    xs: &'a [T],
    zx: i32,
    taps: &'a [i32],
    win: &'a ConvWindow,
    /// The row's first output pixel over the batch.
    p0: usize,
    out: &'a mut [O],
    acc: &'a mut [i32],
    requant: &'a Requant<'a>,
}

impl<T: Int8, O: Quantized> kiln_kernels::simd::Kernel for DepthwiseRow<'_, T, O> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let DepthwiseRow {
            xs,
            zx,
            taps,
            win,
            p0,
            out,
            acc,
            requant,
        } = self;
        let (c, (kh, kw)) = (win.channels, win.kernel);
        let mut live: Vec<(usize, usize)> = Vec::with_capacity(kh * kw);
        for (ox, orow) in out.chunks_exact_mut(c).enumerate() {
            live.clear();
            let origin = win.origin(p0 + ox);
            for ky in 0..kh {
                for kx in 0..kw {
                    if let Some(src) = win.tap(origin, ky, kx) {
                        live.push((src, (ky * kw + kx) * c));
                    }
                }
            }
            let mut j0 = 0;
            while j0 + LANES <= c {
                let mut a = [0i32; LANES];
                for &(src, t) in &live {
                    let (Some(xr), Some(wr)) = (xs.get(src + j0..src + j0 + LANES), taps.get(t + j0..t + j0 + LANES))
                    else {
                        continue;
                    };
                    for ((a, &xv), &wv) in a.iter_mut().zip(xr).zip(wr) {
                        *a += (xv.widen() - zx) * wv;
                    }
                }
                if let Some(d) = acc.get_mut(j0..j0 + LANES) {
                    d.copy_from_slice(&a);
                }
                j0 += LANES;
            }
            if j0 < c {
                let rest = acc.get_mut(j0..c).unwrap_or_default();
                rest.iter_mut().for_each(|a| *a = 0);
                for &(src, t) in &live {
                    let (Some(xr), Some(wr)) = (xs.get(src + j0..src + c), taps.get(t + j0..t + c)) else {
                        continue;
                    };
                    for ((a, &xv), &wv) in rest.iter_mut().zip(xr).zip(wr) {
                        *a += (xv.widen() - zx) * wv;
                    }
                }
            }
            requant.row(acc, orow);
        }
    }
}

/// Taps up to which the f32 depthwise kernel sums 8-bit products exactly: each product of
/// two values in [-255, 255] is at most 65,025 in magnitude, and f32 holds every integer below
/// 2^24, so 258 of them; 256 keeps a margin.
const EXACT_F32_TAPS: usize = 256;

kiln_kernels::scratch_kinds! {
    /// [`depthwise_f32`]'s ring of input rows as f32 `x - zx` and one output row's sums (per
    /// thread).
    DwIn: Vec<f32>;
    DwOut: Vec<f32>;
    /// [`depthwise_i8`]'s sums of one output row (per thread).
    DwSums: Vec<i32>;
}

/// Output pixels x taps x channels under which a depthwise layer runs on the calling thread
/// alone (as the f32 layer does: splitting a small one costs more than it saves).
const DW_SERIAL_MACS: usize = 1 << 18;

/// Which input row each slot of a band's ring holds (the f32 and the quad depthwise paths
/// keep a band's input rows converted in a ring of `(kh - 1) * dh + 1` slots, so that no two
/// rows of one window share a slot).
struct InputRing {
    held: Vec<usize>,
}

impl InputRing {
    fn new(dw: &super::depthwise::Depthwise) -> InputRing {
        InputRing {
            held: vec![usize::MAX; (dw.kernel[0].max(1) - 1) * dw.dilations[0] + 1],
        }
    }

    /// Output row `oy`'s kernel rows as slots in `at` (`None` in the padding), `fill(slot,
    /// iy)` converting input row `iy` into a slot that does not hold it yet; `false` when a
    /// fill failed.
    fn rows(
        &mut self,
        dw: &super::depthwise::Depthwise,
        oy: usize,
        at: &mut Vec<Option<usize>>,
        mut fill: impl FnMut(usize, usize) -> bool,
    ) -> bool {
        let (h, kh, sh, dh, ph) = (
            dw.input[0],
            dw.kernel[0],
            dw.strides[0],
            dw.dilations[0],
            dw.pad_begin[0],
        );
        let slots = self.held.len().max(1);
        at.clear();
        for ky in 0..kh {
            let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&iy| iy < h) else {
                at.push(None);
                continue;
            };
            let slot = iy % slots;
            at.push(Some(slot));
            if self.held.get(slot) == Some(&iy) {
                continue;
            }
            if !fill(slot, iy) {
                return false;
            }
            if let Some(t) = self.held.get_mut(slot) {
                *t = iy;
            }
        }
        true
    }
}

/// The depthwise convolution on the f32 channels-last kernel (`Depthwise::nhwc_row`): X's
/// values minus its zero point and W's minus theirs are small integers, so every f32 sum is
/// the exact integer sum (at most [`EXACT_F32_TAPS`] taps), requantized as the integer
/// paths' sums are. Bands of output rows over the pool; each band converts the input rows
/// its windows read into a ring (each row once per band) and requantizes each output row
/// while its sums are in L1, so no image-sized f32 tensor is written.
fn depthwise_f32<T, O>(
    xs: &[T],
    zx: i32,
    tf: &[f32],
    dw: &super::depthwise::Depthwise,
    n: usize,
    requant: &Requant<'_>,
) -> Result<Tensor>
where
    T: Int8 + Element,
    O: Quantized,
{
    let c = dw.channels;
    let ([_, w], [_, ow]) = (dw.input, dw.output);
    let ([kh, _], [dh, _]) = (dw.kernel, dw.dilations);
    let row_len = w * c;
    // Distinct input rows of one window: no two share a slot of the ring.
    let slots = (kh.max(1) - 1) * dh + 1;
    let zf = zx as f32;
    depthwise_bands(xs, dw, n, tf.len() / c.max(1), |src, oy0, out: &mut [O]| {
        let mut ring = kiln_kernels::recycle::lend::<DwIn>();
        let mut sums = kiln_kernels::recycle::lend::<DwOut>();
        ring.clear();
        ring.resize(slots * row_len, 0.0);
        sums.clear();
        sums.resize(ow * c, 0.0);
        let mut ring_rows = InputRing::new(dw);
        let mut windows = kiln_kernels::recycle::lend::<super::depthwise::RowWindows>();
        let mut at = Vec::with_capacity(kh);
        for (r, orow) in out.chunks_mut(ow * c).enumerate() {
            let oy = oy0 + r;
            let filled = ring_rows.rows(dw, oy, &mut at, |slot, iy| {
                let (Some(from), Some(to)) = (
                    src.get(iy * row_len..(iy + 1) * row_len),
                    ring.get_mut(slot * row_len..(slot + 1) * row_len),
                ) else {
                    return false;
                };
                kiln_kernels::simd::vectorize(|| {
                    for (f, &v) in to.iter_mut().zip(from) {
                        *f = v.widen() as f32 - zf;
                    }
                });
                true
            });
            if !filled {
                return false;
            }
            let clamp = kiln_kernels::dwconv::Clamp::NONE;
            if !dw.nhwc_row(&mut windows, &ring, |iy| iy % slots, tf, None, clamp, oy, &mut sums) {
                return false;
            }
            requant.pixels(&sums, orow);
        }
        true
    })
}

/// The depthwise convolution summed in i32 from X's bytes in place
/// (`kiln_kernels::qdwconv`): per output row, each run of pixels sharing a window
/// (`Depthwise::row_spans`) starts from `-zx` times the sum of its window's taps (X's zero
/// point taken out once, not per value; taps in the padding are not in the window: padding
/// is X's zero point), then the row is requantized. Rows in bands over the pool, as
/// [`depthwise_f32`]; a band makes each window's start once, the first time it meets the
/// window (its rows share a few: the interior's and each border column's, others only at the
/// top and bottom), not once per row.
fn depthwise_i8<T, O>(
    xs: &[T],
    zx: i32,
    (taps, shorts): (&[i32], &[i16]),
    dw: &super::depthwise::Depthwise,
    n: usize,
    requant: &Requant<'_>,
) -> Result<Tensor>
where
    T: Int8 + Element,
    O: Quantized,
{
    let c = dw.channels;
    let ow = dw.output[1];
    let signed = T::OFFSET != 0;
    depthwise_bands(xs, dw, n, taps.len() / c.max(1), |src, oy0, out: &mut [O]| {
        let x = T::bytes(src);
        let mut sums = kiln_kernels::recycle::lend::<DwSums>();
        sums.clear();
        sums.resize(ow * c, 0);
        // The starts made so far, by their window's tap offsets.
        let mut starts: Vec<(Vec<usize>, Vec<i32>)> = Vec::new();
        let mut windows = kiln_kernels::recycle::lend::<super::depthwise::RowWindows>();
        for (r, orow) in out.chunks_mut(ow * c).enumerate() {
            let ok = dw.row_spans(
                &mut windows,
                |iy| iy,
                oy0 + r,
                |span| {
                    let key = span.window.iter().map(|&(_, wo)| wo);
                    let made = starts.iter().position(|(k, _)| k.iter().copied().eq(key.clone()));
                    let at = match made {
                        Some(at) => at,
                        None => {
                            let mut start = vec![0i32; c];
                            for wo in key.clone() {
                                let Some(t) = taps.get(wo..wo + c) else {
                                    return false;
                                };
                                for (v, &t) in start.iter_mut().zip(t) {
                                    *v = v.wrapping_sub(t);
                                }
                            }
                            start.iter_mut().for_each(|v| *v = v.wrapping_mul(zx));
                            starts.push((key.collect(), start));
                            starts.len() - 1
                        }
                    };
                    let (Some((_, init)), Some(out)) =
                        (starts.get(at), sums.get_mut(span.pixels.start * c..span.pixels.end * c))
                    else {
                        return false;
                    };
                    kiln_kernels::qdwconv::QPixels {
                        x,
                        signed,
                        w: shorts,
                        init,
                        window: span.window,
                        base: span.base,
                        step: span.step,
                        c,
                    }
                    .run(out)
                },
            );
            if !ok {
                return false;
            }
            requant.pixels(&sums, orow);
        }
        true
    })
}

/// The depthwise convolution four taps of a kernel row to a `vpdpbusd`, the f32
/// requantization fused (`kiln_kernels::qdwconv::QuadBand`, the taps i8): each input row a
/// band's windows read is packed once into quads (a channel's bytes of four neighbouring
/// columns in a dword, the padding X's zero point), a band's blocks of 16 channels summed and
/// requantized in registers, the block's packed rows in L1. X's zero point comes out once:
/// every window holds `kh * kw` values, so each sum starts from `-zx` times its channel's sum
/// of taps. Bands of output rows over the pool, as the other depthwise paths.
fn depthwise_quad_bands<T, O>(
    xs: &[T],
    zx: i32,
    (quads, tap_sums): (&[i8], &[i32]),
    dw: &super::depthwise::Depthwise,
    n: usize,
    (bias, mult, zy, range): (&[f32], &[f32], f32, (f32, f32)),
) -> Result<Tensor>
where
    T: Int8 + Element,
    O: Quantized,
{
    use kiln_kernels::qdwconv::{QUAD, QuadBand, QuadRequant, quad_code};
    let c = dw.channels;
    let signed = T::OFFSET != 0;
    let fill = zx as u8;
    let code = i32::from(quad_code(fill, signed));
    let init: Vec<i32> = tap_sums.iter().map(|&s| s.wrapping_mul(-code)).collect();
    depthwise_bands(xs, dw, n, quads.len() / (QUAD * c.max(1)), |src, oy0, out: &mut [O]| {
        QuadBand {
            x: T::bytes(src),
            signed,
            fill,
            input: dw.input,
            output: dw.output,
            c,
            kernel: dw.kernel,
            strides: dw.strides,
            dilations: dw.dilations,
            pad: dw.pad_begin,
            taps: quads,
            init: &init,
            requant: QuadRequant {
                bias,
                mult,
                zero_point: zy,
                range,
            },
        }
        .run(oy0, out)
    })
}

/// A channels-last depthwise layer's output, image by image, in bands of output rows over
/// the pool (the calling thread alone for a small layer): `band(x, oy0, out)` fills the rows
/// from `oy0` on of `out` from image `x`, `false` when a shape did not fit.
fn depthwise_bands<T, O>(
    xs: &[T],
    dw: &super::depthwise::Depthwise,
    n: usize,
    taps: usize,
    band_rows: impl Fn(&[T], usize, &mut [O]) -> bool + Sync,
) -> Result<Tensor>
where
    T: Int8 + Element,
    O: Quantized,
{
    let c = dw.channels;
    let ([h, w], [oh, ow]) = (dw.input, dw.output);
    let (ipix, opix) = (h * w * c, oh * ow * c);
    let mut y = util::out_buf::<O>(util::checked_numel(&[n, oh, ow, c])?);
    let band = super::depthwise::row_band(oh, opix * taps, DW_SERIAL_MACS, 2);
    let failed = std::sync::atomic::AtomicBool::new(false);
    for b in 0..n {
        let (Some(src), Some(dst)) = (xs.get(b * ipix..(b + 1) * ipix), y.get_mut(b * opix..(b + 1) * opix)) else {
            break;
        };
        let run = |i: usize, out: &mut [O]| {
            if !band_rows(src, i * band, out) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        };
        if band >= oh {
            run(0, dst);
        } else {
            kiln_kernels::pool::for_each_chunk_mut(dst, band * ow * c, &run);
        }
    }
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(OpError::input_shape(
            0,
            "a depthwise convolution's shapes",
            &[n, h, w, c],
        ));
    }
    Ok(Tensor::from_buf(vec![n, oh, ow, c], y)?)
}

/// Channels per register block of the depthwise loop (one 512-bit vector of i32).
const LANES: usize = 16;

/// A depthwise W `[c, 1, kh, kw]` as `[tap][c]` i32 values with their zero points taken out.
fn depthwise_taps(w: &Tensor, zw: Option<&Tensor>) -> Result<Vec<i32>> {
    let &[c, _, kh, kw] = w.shape() else {
        return Err(OpError::input_shape(3, "[C, 1, kH, kW]", w.shape()));
    };
    let wv: Vec<i32> = w.to_f64_vec().into_iter().map(|v| v as i32).collect();
    let zv: Vec<i32> = zw.map_or_else(|| vec![0], |z| z.to_f64_vec().into_iter().map(|v| v as i32).collect());
    if !(zv.len() == 1 || zv.len() == c) {
        return Err(OpError::input_shape(
            5,
            format!("1 or {c} zero points"),
            zw.map_or(&[][..], |z| z.shape()),
        ));
    }
    let taps = kh * kw;
    let mut out = vec![0i32; taps * c];
    for ch in 0..c {
        let z = zv.get(ch).or(zv.first()).copied().unwrap_or(0);
        for t in 0..taps {
            if let (Some(o), Some(&v)) = (out.get_mut(t * c + ch), wv.get(ch * taps + t)) {
                *o = v - z;
            }
        }
    }
    Ok(out)
}

/// The depthwise convolution channels-last: each output pixel's sums over its taps in i32,
/// vectorised along channels, then requantized; rows of output pixels over the pool.
fn depthwise_conv<T, O>(xs: &[T], zx: i32, taps: &[i32], win: &ConvWindow, requant: &Requant<'_>) -> Result<Tensor>
where
    T: Int8 + Element,
    O: Quantized,
{
    let (n, c, (oh, ow)) = (win.batch, win.channels, win.output);
    let mut y = util::out_buf::<O>(util::checked_numel(&[n, oh, ow, c])?);
    kiln_kernels::pool::for_each_chunk_mut(&mut y, ow * c, &|row, out| {
        let mut acc = vec![0i32; c];
        // One vectorised region for the whole row (a struct kernel: inlined into the
        // level's compiled copy, which a closure this size may not be).
        kiln_kernels::simd::vectorize_kernel(DepthwiseRow {
            xs,
            zx,
            taps,
            win,
            p0: row * ow,
            out,
            acc: &mut acc,
            requant,
        });
    });
    Ok(Tensor::from_buf(vec![n, oh, ow, c], y)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{AutoPad, ConvAttrs};
    use crate::value::Value;

    use crate::fast::conv_nhwc::tests::to_last as nhwc;

    /// The depthwise paths (X's bytes in place summed in i32, X's rows packed as quads with
    /// the requantization fused on VNNI, X's rows as f32 through the f32 kernel
    /// elsewhere) give the same bytes, whichever runs here: u8 and i8 X, strides, pads,
    /// dilations, kernel rows of one and two quads, a batch of two, the f32 and the f64
    /// requantization.
    #[test]
    fn depthwise_in_i32_and_in_f32_agree() {
        fn case<T: Int8 + Element>(signed: bool) {
            // (channels, (h, w), kernel, stride, pad, dilation)
            let shapes = [
                (96usize, (13usize, 11usize), 3usize, 2usize, 1usize, 1usize),
                (17, (9, 10), 3, 1, 1, 1),
                (32, (7, 7), 5, 1, 2, 1),
                (24, (8, 9), 3, 1, 2, 2),
                (5, (6, 4), 3, 2, 0, 1),
                (20, (9, 13), 7, 1, 3, 1),
            ];
            for (c, (h, w), k, st, pad, dil) in shapes {
                let n = 2;
                let span = (k - 1) * dil;
                let (oh, ow) = ((h + 2 * pad - span - 1) / st + 1, (w + 2 * pad - span - 1) / st + 1);
                let mut s = 99u64 + c as u64;
                let mut next = || {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (s >> 33) as u32
                };
                let bytes: Vec<u8> = (0..n * h * w * c).map(|_| next() as u8).collect();
                let xs = T::of_bytes(&bytes);
                // Within i8 once the zero points are out (the quads' taps are i8).
                let wq: Vec<i8> = (0..c * k * k).map(|_| ((next() % 251) as i32 - 125) as i8).collect();
                let zw: Vec<i8> = (0..c).map(|j| (j % 5) as i8 - 2).collect();
                let wt = Tensor::from_vec(vec![c, 1, k, k], wq).unwrap();
                let zt = Tensor::from_vec(vec![c], zw).unwrap();
                let taps = depthwise_taps(&wt, Some(&zt)).unwrap();
                let taps_f32: Vec<f32> = taps.iter().map(|&t| t as f32).collect();
                let shorts: Vec<i16> = taps.iter().map(|&t| i16::try_from(t).unwrap()).collect();
                let bytes8: Vec<i8> = taps.iter().map(|&t| i8::try_from(t).unwrap()).collect();
                let quads = kiln_kernels::qdwconv::pack_quad_taps(&bytes8, (k, k), c).unwrap();
                let mut tap_sums = vec![0i32; c];
                for row in taps.chunks_exact(c) {
                    tap_sums.iter_mut().zip(row).for_each(|(s, &t)| *s += t);
                }
                let dw = crate::fast::depthwise::Depthwise {
                    channels: c,
                    input: [h, w],
                    output: [oh, ow],
                    kernel: [k, k],
                    strides: [st, st],
                    dilations: [dil, dil],
                    pad_begin: [pad, pad],
                };
                let bias: Vec<f64> = (0..c).map(|j| j as f64 * 7.0 - 100.0).collect();
                let mults: Vec<f64> = (0..c).map(|j| 0.0007 + 0.00003 * j as f64).collect();
                let zx = if signed { -3 } else { 121 };
                for float in [true, false] {
                    let requant = Requant {
                        bias: &bias,
                        mults: &mults,
                        zy: 11.0,
                        range: (0.0, 255.0),
                        f32s: float.then(|| {
                            (
                                bias.iter().map(|&b| b as f32).collect(),
                                mults.iter().map(|&m| m as f32).collect(),
                            )
                        }),
                        twin: None,
                    };
                    let a = depthwise_i8::<T, u8>(xs, zx, (&taps, &shorts), &dw, n, &requant).unwrap();
                    let b = depthwise_f32::<T, u8>(xs, zx, &taps_f32, &dw, n, &requant).unwrap();
                    let fused = requant.f32s.as_ref().map(|(bias, mults)| {
                        let args = (&bias[..], &mults[..], 11.0f32, (0.0f32, 255.0f32));
                        depthwise_quad_bands::<T, u8>(xs, zx, (&quads, &tap_sums), &dw, n, args).unwrap()
                    });
                    assert_eq!(a.shape(), [n, oh, ow, c]);
                    let (a, b) = (a.as_slice::<u8>().unwrap(), b.as_slice::<u8>().unwrap());
                    let what = format!("c{c} {h}x{w} k{k} s{st} p{pad} d{dil} signed {signed} f32 {float}");
                    assert_eq!(a, b, "{what}");
                    if let Some(f) = fused {
                        assert_eq!(f.as_slice::<u8>().unwrap(), b, "quads: {what}");
                    }
                    // Not all one value: the sums reach the requantization.
                    assert!(a.iter().any(|&v| v != a[0]), "c{c}: a constant output");
                }
            }
        }
        case::<u8>(false);
        case::<i8>(true);
    }

    /// Channels-last plans (dense im2col, 1x1, depthwise on the f32 kernel and, past its exact
    /// tap count, on the i32 loop) give the reference QLinearConv's values exactly.
    #[test]
    fn channels_last_plans_match_the_reference() {
        // (channels in, channels out, group, kernel, pad, stride, (h, w)); the last two
        // depthwise layers are large enough to run in bands over the 2-thread pool.
        let cases = [
            (3usize, 5usize, 1usize, 3usize, 1usize, 2usize, (11usize, 9usize)),
            (8, 6, 1, 1, 0, 1, (11, 9)),
            (6, 6, 6, 3, 1, 1, (11, 9)),
            (4, 4, 4, 17, 8, 1, (11, 9)),
            (16, 16, 16, 3, 1, 1, (64, 72)),
            (16, 16, 16, 3, 1, 2, (97, 130)),
            // Grouped: 8 channels a group (read in place on VNNI), and 3 (copied).
            (16, 32, 2, 3, 1, 1, (11, 9)),
            (24, 12, 3, 3, 1, 2, (12, 10)),
            (12, 8, 4, 1, 0, 1, (9, 7)),
            // One or two channels: kernel rows copied out as runs (`Depth::Rows`), the
            // 5-wide one dilated by 2.
            (1, 32, 1, 3, 1, 1, (20, 17)),
            (2, 5, 1, 3, 1, 2, (11, 9)),
            (1, 7, 1, 5, 2, 2, (13, 12)),
            // Stride 2 on the AMX tiles as stride 1 over 2 x 2 blocks of pixels (a 7x7 stem
            // of three channels with weight zero points, 64 channels, 16 channels; odd sizes).
            (3, 64, 1, 7, 3, 2, (40, 38)),
            (64, 32, 1, 3, 1, 2, (20, 22)),
            (16, 24, 1, 3, 1, 2, (17, 15)),
        ];
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (ci, co, group, k, pad, stride, (h, w)) in cases {
            let n = 1usize;
            let dil = if ci == 1 && k == 5 { 2 } else { 1 };
            let mut s = 12345u64;
            let mut next = || {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 33) as u32
            };
            let x: Vec<u8> = (0..n * ci * h * w).map(|_| next() as u8).collect();
            let cg = ci / group;
            let wv: Vec<i8> = (0..co * cg * k * k).map(|_| next() as i8).collect();
            let bias: Vec<i32> = (0..co).map(|_| (next() % 2000) as i32 - 1000).collect();
            let sw: Vec<f32> = (0..co).map(|j| 0.001 + 0.0002 * j as f32).collect();
            // Weight zero points on the three-channel case (its channels padded to four on
            // VNNI, the padded weights their column's zero point) and the grouped ones (each
            // group's slice of them).
            let zwv: Vec<i8> = (0..co)
                .map(|j| {
                    if ci <= 3 || (group > 1 && group < ci) {
                        (j % 3) as i8 - 1
                    } else {
                        0
                    }
                })
                .collect();
            let t = |v: Tensor| Value::Tensor(v);
            let xs = t(Tensor::from_vec(vec![n, ci, h, w], x.clone()).unwrap());
            let xl = t(Tensor::from_vec(vec![n, h, w, ci], nhwc(&x, [n, ci, h, w])).unwrap());
            let rest = [
                t(Tensor::from_vec(vec![], vec![0.02f32]).unwrap()),
                t(Tensor::from_vec(vec![], vec![117u8]).unwrap()),
                t(Tensor::from_vec(vec![co, cg, k, k], wv).unwrap()),
                t(Tensor::from_vec(vec![co], sw).unwrap()),
                t(Tensor::from_vec(vec![co], zwv.clone()).unwrap()),
                t(Tensor::from_vec(vec![], vec![0.05f32]).unwrap()),
                t(Tensor::from_vec(vec![], vec![128u8]).unwrap()),
                t(Tensor::from_vec(vec![co], bias).unwrap()),
            ];
            let op = QLinearConv {
                conv: ConvAttrs {
                    auto_pad: AutoPad::NotSet,
                    dilations: if dil > 1 { vec![dil; 2] } else { vec![] },
                    group,
                    kernel_shape: None,
                    pads: vec![pad; 4],
                    strides: vec![stride; 2],
                },
            };
            let args = |x: &Value| -> Vec<Option<Value>> {
                std::iter::once(Some(x.clone()))
                    .chain(rest.iter().cloned().map(Some))
                    .collect()
            };
            let a = args(&xs);
            let refs: Vec<Option<&Value>> = a.iter().map(Option::as_ref).collect();
            let want = op.eval(&Args::new(&refs)).unwrap();
            let want = want[0].as_tensor().unwrap();
            let [_, _, oh, ow] = <[usize; 4]>::try_from(want.shape()).unwrap();
            let b = args(&xl);
            let refs: Vec<Option<&Value>> = b.iter().map(Option::as_ref).collect();
            let plan = QConvPlan {
                channels_last: true,
                ..QConvPlan::default()
            };
            let got = pool.install(|| eval(&op, &plan, &Args::new(&refs))).unwrap();
            let got = got[0].as_tensor().unwrap();
            assert_eq!(got.shape(), [n, oh, ow, co]);
            let wantv = nhwc(want.as_slice::<u8>().unwrap(), [n, co, oh, ow]);
            assert_eq!(
                got.as_slice::<u8>().unwrap(),
                wantv.as_slice(),
                "case {ci}->{co} g{group} k{k}"
            );
            if group != 1 {
                continue;
            }
            // The f32 requantization of QDQ graphs (fused into the GEMM's micro-tiles on
            // VNNI), against exact sums from a naive loop requantized by the row stage.
            let plan = QConvPlan {
                channels_last: true,
                float_requant: true,
                clamp: Some((20, 230)),
                ..QConvPlan::default()
            };
            let got = eval(&op, &plan, &Args::new(&refs)).unwrap();
            let got = got[0].as_tensor().unwrap().as_slice::<u8>().unwrap().to_vec();
            let (bias, mults, zy) = conv_requant(&Args::new(&refs), co).unwrap();
            let bias: Vec<f32> = bias.unwrap().iter().map(|&b| b as f32).collect();
            let mults: Vec<f32> = mults.iter().map(|&m| m as f32).collect();
            let Value::Tensor(wt) = &rest[2] else { unreachable!() };
            let wv = wt.as_slice::<i8>().unwrap();
            let xl = nhwc(&x, [n, ci, h, w]);
            let mut expect = vec![0u8; oh * ow * co];
            for oy in 0..oh {
                for ox in 0..ow {
                    let sums: Vec<i32> = (0..co)
                        .map(|o| {
                            let mut acc = 0i32;
                            for ky in 0..k {
                                for kx in 0..k {
                                    let (iy, ix) = (
                                        (oy * stride + ky * dil) as isize - pad as isize,
                                        (ox * stride + kx * dil) as isize - pad as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    for c in 0..ci {
                                        let xv = i32::from(xl[(iy as usize * w + ix as usize) * ci + c]) - 117;
                                        acc +=
                                            xv * (i32::from(wv[((o * ci + c) * k + ky) * k + kx]) - i32::from(zwv[o]));
                                    }
                                }
                            }
                            acc
                        })
                        .collect();
                    let at = (oy * ow + ox) * co;
                    requantize_row_f32(&sums, &bias, &mults, zy as f32, (20.0, 230.0), &mut expect[at..at + co]);
                }
            }
            assert_eq!(got, expect, "f32 stage, case {ci}->{co} k{k}");
        }
    }
}
