//! `QLinearConv` as its plan says ([`QConvPlan`]): channels-last, the exact int32 sums of
//! each block of output pixels by the integer GEMM (X's rows as they are for a 1x1
//! stride-1 convolution, else an im2col of 8-bit windows, padding filled with X's zero
//! point so it adds nothing), the weights packed once, then requantized to 8 bits in the
//! reference's f64 arithmetic while the block is in cache. Channels-first plans run the
//! op's own path; either way the plan's clamp (a fused Relu or Clip) applies last.

use super::QConvPlan;
use crate::error::{OpError, Result};
use crate::quant::QLinearConv;
use crate::quant::integer::conv_requant;
use crate::quant::linear::int_range;
use crate::recurrent::num::{in_shape, tt};
use crate::value::{Args, Dim, InferInput, ValueType};
use crate::{Outputs, util};
use kiln_kernels::igemm::{Int8, MAX_EXACT_DEPTH, PackedB, igemm_serial};
use kiln_kernels::quant::{Q8, requantize_row};
use kiln_tensor::{DType, Element, Tensor};
use std::sync::Mutex;

/// Bytes of im2col rows per block of output pixels: with the block's i32 sums, within L2.
const BLOCK_BYTES: usize = 96 * 1024;

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
    let y = match (x.dtype(), odt) {
        (DType::U8, DType::U8) => run::<u8, u8>(op, plan, args)?,
        (DType::U8, DType::I8) => run::<u8, i8>(op, plan, args)?,
        (DType::I8, DType::U8) => run::<i8, u8>(op, plan, args)?,
        (DType::I8, DType::I8) => run::<i8, i8>(op, plan, args)?,
        (got, _) => return Err(OpError::UnsupportedDType { index: 0, got }),
    };
    Ok(smallvec::smallvec![y.into()])
}

/// A channels-last plan's output type: `[N, OH, OW, M]` for X `[N, H, W, C]`.
pub(crate) fn infer(op: &QLinearConv, plan: &QConvPlan, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
    if !plan.channels_last {
        return op.infer(inputs);
    }
    let dt = util::input_dtype(inputs, 7).or_else(|| util::input_dtype(inputs, 0));
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
trait Quantized: Element + Q8 + Default {
    fn widen(self) -> i32;
}

impl Quantized for u8 {
    fn widen(self) -> i32 {
        i32::from(self)
    }
}

impl Quantized for i8 {
    fn widen(self) -> i32 {
        i32::from(self)
    }
}

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

/// W `[m, c, kh, kw]` as the GEMM's B `[(ky, kx, ci), m]`, with its zero points.
fn pack_weights<W: Int8 + Element>(w: &Tensor, zw: Option<&Tensor>) -> Option<PackedB> {
    let &[m, c, kh, kw] = w.shape() else { return None };
    let src = w.as_slice::<W>().ok()?;
    let k = c * kh * kw;
    let mut b = Vec::with_capacity(k * m);
    for ky in 0..kh {
        for kx in 0..kw {
            for ci in 0..c {
                for j in 0..m {
                    b.push(*src.get(((j * c + ci) * kh + ky) * kw + kx)?);
                }
            }
        }
    }
    let z = match zw {
        None => &[][..],
        Some(z) if z.len() == 1 || z.len() == m => z.as_slice::<W>().ok()?,
        Some(_) => return None,
    };
    PackedB::pack(&b, k, m, z).ok()
}

fn scalar_zero_point<T: Int8 + Element>(args: &Args<'_>, index: usize) -> Result<i32> {
    match args.opt_tensor(index)? {
        None => Ok(0),
        Some(z) if z.len() == 1 => Ok(z.as_slice::<T>()?.first().map_or(0, |v| v.widen())),
        Some(z) => Err(OpError::input_shape(index, "one zero point", z.shape())),
    }
}

fn run<T, O>(op: &QLinearConv, plan: &QConvPlan, args: &Args<'_>) -> Result<Tensor>
where
    T: Int8 + Element + Default + FromZeroPoint,
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
    if op.conv.group.max(1) != 1 || cg != c {
        return Err(OpError::inputs(
            0,
            3,
            "a dense convolution (group 1) channels-last",
            x.shape(),
            w.shape(),
        ));
    }
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
    let k = c * kh * kw;
    if k > MAX_EXACT_DEPTH {
        return Err(OpError::input_shape(3, "windows of at most 33,024 values", w.shape()));
    }
    let zx = scalar_zero_point::<T>(args, 2)?;
    let zw = args.opt_tensor(5)?;
    let packed = match w.dtype() {
        DType::U8 => plan.packed.get_or_pack(|| pack_weights::<u8>(w, zw)),
        DType::I8 => plan.packed.get_or_pack(|| pack_weights::<i8>(w, zw)),
        got => return Err(OpError::UnsupportedDType { index: 3, got }),
    }
    .ok_or(OpError::input_value(
        3,
        "8-bit weights with one zero point or one per output channel",
        "another",
    ))?;
    if packed.depth() != k || packed.columns() != m {
        return Err(OpError::input_shape(
            3,
            format!("the packed weights' {k} x {m}"),
            w.shape(),
        ));
    }
    let (bias, mults, zy) = conv_requant(args, m)?;
    let bias = bias.unwrap_or_else(|| vec![0.0; m]);
    let odt = O::DTYPE;
    let (mut lo, mut hi) = int_range(odt).ok_or(OpError::UnsupportedDType { index: 7, got: odt })?;
    if let Some((a, b)) = plan.clamp {
        lo = lo.max(f64::from(a));
        hi = hi.min(f64::from(b));
    }
    let pixels = n * oh * ow;
    let mut y: Vec<O> = vec![O::default(); util::checked_numel(&[pixels, m])?];
    let xs = x.as_slice::<T>()?;
    let pad = T::try_from_i32(zx);
    let pointwise = kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == wd;
    // Whole micro-tiles of rows; about two blocks per thread at least.
    let threads = kiln_kernels::pool::current_threads().max(1);
    let by_cache = (BLOCK_BYTES / (k + 4 * m).max(1)).clamp(8, 512);
    let rows = by_cache.min(pixels.div_ceil(2 * threads)).div_ceil(8) * 8;
    let isa = kiln_kernels::isa::active();
    let failure: Mutex<Option<OpError>> = Mutex::new(None);
    let fail = |e: OpError| {
        if let Ok(mut f) = failure.lock() {
            f.get_or_insert(e);
        }
    };
    kiln_kernels::pool::for_each_chunk_mut(&mut y, rows * m, &|i, out| {
        let p0 = i * rows;
        let r = out.len() / m.max(1);
        let mut acc = vec![0i32; r * m];
        let mut cols: Vec<T> = Vec::new();
        let (a, lda) = if pointwise {
            (xs.get(p0 * c..).unwrap_or(&[]), c)
        } else {
            cols.resize(r * k, pad);
            for (rr, dst) in cols.chunks_exact_mut(k).enumerate() {
                let p = p0 + rr;
                let (b, oy, ox) = (p / (oh * ow), (p / ow) % oh, p % ow);
                for ky in 0..kh {
                    let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&v| v < h) else {
                        continue;
                    };
                    // Undilated windows wholly inside the row: one run of `kw * c` values.
                    let first = (ox * sw).checked_sub(pw);
                    if dw == 1
                        && let Some(ix) = first.filter(|&v| v + kw <= wd)
                    {
                        let src = ((b * h + iy) * wd + ix) * c;
                        let d = ky * kw * c;
                        if let (Some(s), Some(t)) = (xs.get(src..src + kw * c), dst.get_mut(d..d + kw * c)) {
                            t.copy_from_slice(s);
                        }
                        continue;
                    }
                    for kx in 0..kw {
                        let Some(ix) = (ox * sw + kx * dw).checked_sub(pw).filter(|&v| v < wd) else {
                            continue;
                        };
                        let src = ((b * h + iy) * wd + ix) * c;
                        let d = (ky * kw + kx) * c;
                        if let (Some(s), Some(t)) = (xs.get(src..src + c), dst.get_mut(d..d + c)) {
                            t.copy_from_slice(s);
                        }
                    }
                }
            }
            (&cols[..], k)
        };
        if let Err(e) = igemm_serial(isa, r, k, a, lda, zx, packed, &mut acc, m) {
            fail(OpError::input_value(
                0,
                "a convolution whose exact sums fit int32",
                e.to_string(),
            ));
            return;
        }
        for (orow, arow) in out.chunks_exact_mut(m).zip(acc.chunks_exact(m)) {
            requantize_row(arow, &bias, &mults, zy, (lo, hi), orow);
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(Tensor::from_vec(vec![n, oh, ow, m], y)?)
}

/// The padding value: X's zero point in X's type.
trait FromZeroPoint: Sized {
    fn try_from_i32(v: i32) -> Self;
}

impl FromZeroPoint for u8 {
    fn try_from_i32(v: i32) -> u8 {
        v.clamp(0, 255) as u8
    }
}

impl FromZeroPoint for i8 {
    fn try_from_i32(v: i32) -> i8 {
        v.clamp(-128, 127) as i8
    }
}
