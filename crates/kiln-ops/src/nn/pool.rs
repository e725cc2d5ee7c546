//! Pooling: `MaxPool` (opset 1–22, with the Indices output), `AveragePool` (opset 1–22),
//! `LpPool` (opset 1–22), `GlobalAveragePool`, `GlobalMaxPool`, `GlobalLpPool` (opset 1–22)
//! and `MaxUnpool` (opset 9–22), per <https://onnx.ai/onnx/operators/onnx__MaxPool.html> and
//! the sibling pages.
//!
//! Values are pooled in f64 (exact for the integer types MaxPool takes) and converted back.

use super::{AutoPad, from_f64s, input_shape, numel, pads_attr, spatial_attr, tensor_type, window_dims, window_geom};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};
use kiln_tensor::{DType, Tensor};

/// What a windowed pool computes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub enum PoolKind {
    /// MaxPool; `storage_order` 1 numbers the Indices output column-major.
    Max { storage_order: bool },
    /// AveragePool.
    Average { count_include_pad: bool },
    /// LpPool: `(sum |x|^p)^(1/p)` over the window.
    Lp { p: f64 },
}

/// MaxPool / AveragePool / LpPool with attributes applied.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Pool {
    pub kind: PoolKind,
    pub auto_pad: AutoPad,
    pub ceil_mode: bool,
    pub dilations: Vec<usize>,
    pub kernel_shape: Vec<usize>,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

impl Pool {
    /// MaxPool, AveragePool or LpPool, by kind.
    pub fn name(&self) -> &'static str {
        match self.kind {
            PoolKind::Max { .. } => "MaxPool",
            PoolKind::Average { .. } => "AveragePool",
            PoolKind::Lp { .. } => "LpPool",
        }
    }
}

/// Kept as a name for the LpPool flavour of [`Pool`].
pub type LpPool = Pool;

/// Where a window tap lands in one dim.
#[derive(Clone, Copy)]
enum Tap {
    In(usize),
    /// In the explicit padding.
    Pad,
    /// Past the padded input (only with ceil_mode).
    Beyond,
}

fn check_dtype(kind: PoolKind, d: DType) -> Result<()> {
    let ok = match kind {
        PoolKind::Max { .. } => matches!(
            d,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I8 | DType::U8
        ),
        _ => matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16),
    };
    if ok {
        Ok(())
    } else {
        Err(OpError::UnsupportedDType { index: 0, got: d })
    }
}

/// The taps of output position `o` in one dim of `(input, k, stride, pad_begin, pad_end)`:
/// the input range read, and how many taps fall inside the padded extent (for
/// `count_include_pad`; taps past it exist only with ceil_mode).
fn taps(o: usize, (size, k, s, pb, pe): (usize, usize, usize, usize, usize)) -> (usize, usize, usize) {
    let start = o * s; // in padded coordinates
    let lo = start.max(pb) - pb;
    let hi = (start + k).min(pb + size).saturating_sub(pb).max(lo);
    let counted = (start + k).min(pb + size + pe).saturating_sub(start);
    (lo, hi, counted)
}

/// MaxPool (Y only) or AveragePool over 2-D f32 planes without dilation: the window of each
/// output clipped to the input, in the reference's order (Max keeps the first valid tap unless
/// a later one is greater, so NaN handling matches; an empty window gives NaN).
/// Whether any element is NaN (vectorised).
fn has_nan(v: &[f32]) -> bool {
    kiln_kernels::simd::vectorize(|| v.iter().fold(false, |a, x| a | x.is_nan()))
}

/// `out[x] = max over rows r0..r1 of plane[row][x]` (no NaNs in the plane), vectorised.
fn max_rows(plane: &[f32], iw: usize, r0: usize, r1: usize, out: &mut [f32]) {
    kiln_kernels::simd::vectorize(|| {
        if let Some(first) = plane.get(r0 * iw..(r0 + 1) * iw) {
            out.copy_from_slice(first);
        }
        for row in r0 + 1..r1 {
            if let Some(src) = plane.get(row * iw..(row + 1) * iw) {
                kiln_kernels::vector::max_into(out, src);
            }
        }
    });
}

/// `out[x] = sum over rows r0..r1 of plane[row][x]` in f32, vectorised (zeros for no rows).
fn sum_rows(plane: &[f32], iw: usize, r0: usize, r1: usize, out: &mut [f32]) {
    kiln_kernels::simd::vectorize(|| {
        out.fill(0.0);
        for row in r0..r1 {
            if let Some(src) = plane.get(row * iw..(row + 1) * iw) {
                for (o, &v) in out.iter_mut().zip(src) {
                    *o += v;
                }
            }
        }
    });
}

fn pool2d_f32(
    kind: PoolKind,
    x: &[f32],
    planes: usize,
    geo: [(usize, usize, usize, usize, usize); 2],
    out: [usize; 2],
) -> Vec<f32> {
    let (ih, iw) = (geo[0].0, geo[1].0);
    let (oh, ow) = (out[0], out[1]);
    let mut y = vec![0.0f32; planes * oh * ow];
    let cols: Vec<(usize, usize, usize)> = (0..ow).map(|o| taps(o, geo[1])).collect();
    let rows: Vec<(usize, usize, usize)> = (0..oh).map(|o| taps(o, geo[0])).collect();
    kiln_kernels::pool::for_each_chunk_mut(&mut y, (oh * ow).max(1), &|p, yp| {
        let Some(plane) = x.get(p * ih * iw..(p + 1) * ih * iw) else {
            return;
        };
        if matches!(kind, PoolKind::Max { .. }) && iw > 0 && !has_nan(plane) {
            // Without NaNs the maximum does not depend on the order of the taps: the
            // window's rows are first reduced column by column (vectorised), then each
            // output takes the maximum of its columns of that row.
            let mut colmax = vec![f32::NEG_INFINITY; iw];
            for (yrow, &(r0, r1, _)) in yp.chunks_mut(ow.max(1)).zip(&rows) {
                if r0 == r1 {
                    yrow.fill(f32::NAN);
                    continue;
                }
                max_rows(plane, iw, r0, r1, &mut colmax);
                for (o, &(c0, c1, _)) in yrow.iter_mut().zip(&cols) {
                    *o = match colmax.get(c0..c1) {
                        Some(seg) if !seg.is_empty() => seg.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                        _ => f32::NAN,
                    };
                }
            }
            return;
        }
        if let (PoolKind::Average { count_include_pad }, true) = (kind, iw > 0) {
            // The window's rows summed column by column (vectorised, in f32), then each
            // output sums its columns of that row: at most kh*kw f32 additions per output
            // instead of the reference's f64 (relative differences of a few ulps of the sum
            // of |x|; NaN and infinities propagate alike).
            let mut colsum = vec![0.0f32; iw];
            for (yrow, &(r0, r1, rc)) in yp.chunks_mut(ow.max(1)).zip(&rows) {
                sum_rows(plane, iw, r0, r1, &mut colsum);
                for (o, &(c0, c1, cc)) in yrow.iter_mut().zip(&cols) {
                    let sum: f32 = colsum.get(c0..c1).unwrap_or(&[]).iter().sum();
                    let div = if count_include_pad {
                        rc * cc
                    } else {
                        (r1 - r0) * (c1 - c0)
                    };
                    *o = if div == 0 { f32::NAN } else { sum / div as f32 };
                }
            }
            return;
        }
        // The exact tap-order loop (planes with NaNs).
        for (yrow, &(r0, r1, rc)) in yp.chunks_mut(ow.max(1)).zip(&rows) {
            for (o, &(c0, c1, cc)) in yrow.iter_mut().zip(&cols) {
                *o = match kind {
                    PoolKind::Max { .. } => {
                        // The first tap, then any greater one (as the reference: a NaN first
                        // tap stays, later NaNs are skipped); NaN for an empty window.
                        let mut best = if r0 < r1 && c0 < c1 {
                            plane.get(r0 * iw + c0).copied().unwrap_or(f32::NAN)
                        } else {
                            f32::NAN
                        };
                        for row in r0..r1 {
                            for &v in plane.get(row * iw + c0..row * iw + c1).unwrap_or(&[]) {
                                if v > best {
                                    best = v;
                                }
                            }
                        }
                        best
                    }
                    PoolKind::Average { count_include_pad } => {
                        let mut sum = 0.0f64;
                        for row in r0..r1 {
                            sum += plane
                                .get(row * iw + c0..row * iw + c1)
                                .unwrap_or(&[])
                                .iter()
                                .map(|&v| f64::from(v))
                                .sum::<f64>();
                        }
                        let div = if count_include_pad {
                            rc * cc
                        } else {
                            (r1 - r0) * (c1 - c0)
                        };
                        if div == 0 { f32::NAN } else { (sum / div as f64) as f32 }
                    }
                    PoolKind::Lp { .. } => f32::NAN,
                };
            }
        }
    });
    y
}

/// Most taps one spatial axis of a pooling window table may hold (16 Mi: 256 MiB; a real
/// model's are thousands).
const MAX_TAPS: usize = 1 << 24;

/// A `kernel_shape` of another length than X's `n` spatial axes.
fn kernel_per_axis(kernel: &[usize], n: usize) -> OpError {
    OpError::attribute(
        "kernel_shape",
        format!("{n} values, one per spatial axis of X"),
        format!("{kernel:?}"),
    )
}

impl Pool {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        check_dtype(self.kind, x.dtype())?;
        let xs = x.shape();
        if xs.len() < 3 {
            return Err(OpError::input_shape(0, "[N, C, spatial...]", xs));
        }
        let n = xs.len() - 2;
        if self.kernel_shape.len() != n {
            return Err(kernel_per_axis(&self.kernel_shape, n));
        }
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dil = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let pads = pads_attr(&self.pads, n)?;
        let spatial = &xs[2..];
        let mut out = Vec::with_capacity(n);
        let mut tables: Vec<Vec<Tap>> = Vec::with_capacity(n);
        for i in 0..n {
            let (k, s, d) = (self.kernel_shape[i], strides[i], dil[i]);
            let g = window_geom(xs, i + 2, k, s, d, pads[i], pads[i + n], self.auto_pad, self.ceil_mode)?;
            // One tap per output position and kernel element: bounded before it is built (a
            // kernel of 2^30 over one output asked for 12 GiB).
            let taps = g.out.checked_mul(k).filter(|&t| t <= MAX_TAPS).ok_or_else(|| {
                OpError::too_large(
                    "pooling window taps (output positions x kernel elements on one axis)",
                    format!("{} x {k}, more than {MAX_TAPS}", g.out),
                )
            })?;
            let mut t = Vec::with_capacity(taps);
            for o in 0..g.out {
                for kk in 0..k {
                    let c = (o * s + kk * d) as isize - g.pad_begin as isize;
                    t.push(if c >= 0 && (c as usize) < spatial[i] {
                        Tap::In(c as usize)
                    } else if c < (spatial[i] + g.pad_end) as isize {
                        Tap::Pad
                    } else {
                        Tap::Beyond
                    });
                }
            }
            out.push(g.out);
            tables.push(t);
        }
        let planes = xs[0] * xs[1];
        let fast_kind = match self.kind {
            PoolKind::Max { .. } => !args.output_wanted(1),
            PoolKind::Average { .. } => true,
            PoolKind::Lp { .. } => false,
        };
        // 8-bit MaxPool (QOperator models) on the f32 kernel: every 8-bit value is exact in f32
        // and a maximum is one of its inputs, so converting there and back changes nothing.
        let widened: Option<Vec<f32>> = match (self.kind, x.dtype(), fast_kind) {
            (PoolKind::Max { .. }, DType::U8, true) => {
                Some(x.as_slice::<u8>()?.iter().map(|&v| f32::from(v)).collect())
            }
            (PoolKind::Max { .. }, DType::I8, true) => {
                Some(x.as_slice::<i8>()?.iter().map(|&v| f32::from(v)).collect())
            }
            _ => None,
        };
        let f32_input = match &widened {
            Some(v) => Ok(v.as_slice()),
            None => x.as_slice::<f32>(),
        };
        if let (Ok(xv), true, 2, true) = (f32_input, fast_kind, n, dil.iter().all(|&d| d == 1)) {
            let geo: Vec<(usize, usize, usize, usize, usize)> = (0..2)
                .map(|i| {
                    let g = window_geom(
                        xs,
                        i + 2,
                        self.kernel_shape[i],
                        strides[i],
                        1,
                        pads[i],
                        pads[i + n],
                        self.auto_pad,
                        self.ceil_mode,
                    )?;
                    Ok((spatial[i], self.kernel_shape[i], strides[i], g.pad_begin, g.pad_end))
                })
                .collect::<Result<_>>()?;
            let mut yshape = xs[..2].to_vec();
            yshape.extend(&out);
            numel(&yshape)?;
            let y = pool2d_f32(self.kind, xv, planes, [geo[0], geo[1]], [out[0], out[1]]);
            let t = match x.dtype() {
                DType::U8 => Tensor::from_vec(yshape, y.iter().map(|&v| v as u8).collect::<Vec<u8>>())?,
                DType::I8 => Tensor::from_vec(yshape, y.iter().map(|&v| v as i8).collect::<Vec<i8>>())?,
                _ => Tensor::from_vec(yshape, y)?,
            };
            return Ok(smallvec::smallvec![Value::Tensor(t)]);
        }
        let isz = numel(spatial)?;
        let osz = numel(&out)?;
        let mut yshape = xs[..2].to_vec();
        yshape.extend(&out);
        let total = numel(&yshape)?;
        let xd = x.to_f64_vec();
        let mut y = vec![0.0f64; total];
        let mut idx_out = vec![
            0i64;
            if matches!(self.kind, PoolKind::Max { .. }) {
                total
            } else {
                0
            }
        ];
        // Row-major and column-major strides of the spatial input.
        let mut rstr = vec![1usize; n];
        for i in (0..n.saturating_sub(1)).rev() {
            rstr[i] = rstr[i + 1] * spatial[i + 1];
        }
        let mut cstr = vec![1usize; n];
        for i in 1..n {
            cstr[i] = cstr[i - 1] * spatial[i - 1];
        }
        let k = &self.kernel_shape;
        let mut oidx = vec![0usize; n];
        let mut kidx = vec![0usize; n];
        // Taps visited: a stop (`kiln_kernels::stop`) is answered every 64Ki of them, so a
        // run's time limit holds inside a large window too; the rest of Y is then left as
        // it is (the run is ending with the limit's error).
        let mut visited = 0usize;
        'planes: for pl in 0..planes {
            let src = &xd[pl * isz..(pl + 1) * isz];
            oidx.iter_mut().for_each(|v| *v = 0);
            for o in 0..osz {
                kidx.iter_mut().for_each(|v| *v = 0);
                let mut best: Option<(f64, usize, usize)> = None;
                let (mut sum, mut counted, mut valid) = (0.0f64, 0usize, 0usize);
                loop {
                    visited += 1;
                    if visited.is_multiple_of(1 << 16) && kiln_kernels::stop::requested() {
                        break 'planes;
                    }
                    let mut pos = Some((0usize, 0usize));
                    let mut beyond = false;
                    for i in 0..n {
                        match tables[i][oidx[i] * k[i] + kidx[i]] {
                            Tap::In(c) => {
                                if let Some((r, cm)) = pos.as_mut() {
                                    *r += c * rstr[i];
                                    *cm += c * cstr[i];
                                }
                            }
                            Tap::Pad => pos = None,
                            Tap::Beyond => {
                                pos = None;
                                beyond = true;
                            }
                        }
                    }
                    if !beyond {
                        counted += 1;
                    }
                    if let Some((r, cm)) = pos {
                        let v = src[r];
                        valid += 1;
                        match self.kind {
                            PoolKind::Max { .. } => {
                                if best.is_none_or(|(b, _, _)| v > b) {
                                    best = Some((v, r, cm));
                                }
                            }
                            PoolKind::Average { .. } => sum += v,
                            PoolKind::Lp { p } => sum += v.abs().powf(p),
                        }
                    }
                    if !step(&mut kidx, k) {
                        break;
                    }
                }
                let yi = pl * osz + o;
                y[yi] = match self.kind {
                    PoolKind::Max { storage_order } => match best {
                        Some((v, r, cm)) => {
                            idx_out[yi] = (pl * isz + if storage_order { cm } else { r }) as i64;
                            v
                        }
                        None => {
                            idx_out[yi] = -1;
                            f64::NAN
                        }
                    },
                    PoolKind::Average { count_include_pad } => {
                        let div = if count_include_pad { counted } else { valid };
                        if div == 0 { f64::NAN } else { sum / div as f64 }
                    }
                    PoolKind::Lp { p } => sum.powf(1.0 / p),
                };
                step(&mut oidx, &out);
            }
        }
        let mut res = vec![Value::Tensor(from_f64s(x.dtype(), yshape.clone(), &y)?)];
        if matches!(self.kind, PoolKind::Max { .. }) {
            res.push(Value::Tensor(Tensor::from_vec(yshape, idx_out)?));
        }
        Ok(res.into())
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let shape = match input_shape(inputs, 0) {
            Some(xs) if xs.len() >= 3 => {
                let n = xs.len() - 2;
                if self.kernel_shape.len() != n {
                    return Err(kernel_per_axis(&self.kernel_shape, n));
                }
                let strides = spatial_attr(&self.strides, n, 1, "strides")?;
                let dil = spatial_attr(&self.dilations, n, 1, "dilations")?;
                let pads = pads_attr(&self.pads, n)?;
                let mut s = xs[..2].to_vec();
                s.extend(window_dims(
                    &xs,
                    &self.kernel_shape,
                    &strides,
                    &dil,
                    &pads,
                    self.auto_pad,
                    self.ceil_mode,
                )?);
                Some(s)
            }
            _ => None,
        };
        let mut out = vec![tensor_type(dtype, shape.clone())];
        if matches!(self.kind, PoolKind::Max { .. }) {
            out.push(tensor_type(Some(DType::I64), shape));
        }
        Ok(out)
    }
}

/// Advances a row-major multi-index; false after the last.
pub(crate) fn step(idx: &mut [usize], dims: &[usize]) -> bool {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return true;
        }
        idx[d] = 0;
    }
    false
}

/// What a global pooling computes over each (N, C) plane.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub enum GlobalPoolKind {
    Average,
    Max,
    Lp { p: f64 },
}

impl GlobalPoolKind {
    /// One plane's `n` values reduced.
    pub(crate) fn reduce(&self, s: impl Iterator<Item = f64>, n: usize) -> f64 {
        match self {
            GlobalPoolKind::Average => s.sum::<f64>() / n as f64,
            GlobalPoolKind::Max => s.fold(f64::NEG_INFINITY, f64::max),
            GlobalPoolKind::Lp { p } => s.map(|v| v.abs().powf(*p)).sum::<f64>().powf(1.0 / p),
        }
    }
}

/// GlobalAveragePool / GlobalMaxPool / GlobalLpPool: one value per (N, C) plane. Run
/// channels-last under a [`crate::fast::PoolPlan`] (`fast/pool_nhwc.rs`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub struct GlobalPool {
    pub kind: GlobalPoolKind,
}

impl GlobalPool {
    /// The pooling of this kind.
    pub fn new(kind: GlobalPoolKind) -> GlobalPool {
        GlobalPool { kind }
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            GlobalPoolKind::Average => "GlobalAveragePool",
            GlobalPoolKind::Max => "GlobalMaxPool",
            GlobalPoolKind::Lp { .. } => "GlobalLpPool",
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        match x.dtype() {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {}
            d => return Err(OpError::UnsupportedDType { index: 0, got: d }),
        }
        let xs = x.shape();
        if xs.len() < 2 {
            return Err(OpError::input_shape(0, "[N, C, ...]", xs));
        }
        let planes = xs[0] * xs[1];
        let isz = numel(&xs[2..])?;
        let mut yshape = kiln_tensor::Shape::from_slice(&xs[..2]);
        yshape.extend(std::iter::repeat_n(1, xs.len() - 2));
        // Each plane reduced in f64; f32 is read in place (no widened copy of X).
        if let Ok(xd) = x.as_slice::<f32>() {
            let y: Vec<f32> = (0..planes)
                .map(|p| xd.get(p * isz..(p + 1) * isz).unwrap_or(&[]))
                .map(|s| match self.kind {
                    // The common case: a vectorised sum (16 partial f64 sums).
                    GlobalPoolKind::Average => (kiln_kernels::vector::sum_f64(s) / isz as f64) as f32,
                    kind => kind.reduce(s.iter().map(|&v| f64::from(v)), isz) as f32,
                })
                .collect();
            return Ok(smallvec::smallvec![Value::Tensor(Tensor::from_vec(yshape, y)?)]);
        }
        let xd = x.to_f64_vec();
        let y: Vec<f64> = (0..planes)
            .map(|p| xd.get(p * isz..(p + 1) * isz).unwrap_or(&[]))
            .map(|s| self.kind.reduce(s.iter().copied(), isz))
            .collect();
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(x.dtype(), yshape, &y)?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let shape = input_shape(inputs, 0).filter(|s| s.len() >= 2).map(|s| {
            let mut o = s[..2].to_vec();
            o.extend(std::iter::repeat_n(Dim::Fixed(1), s.len() - 2));
            o
        });
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// `MaxUnpool`: scatter pooled values back to the positions their indices name.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct MaxUnpool {
    pub kernel_shape: Vec<usize>,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

impl MaxUnpool {
    fn inferred(&self, xs: &[usize]) -> Result<Vec<usize>> {
        let n = xs.len().saturating_sub(2);
        if xs.len() < 3 {
            return Err(OpError::input_shape(0, "[N, C, spatial...]", xs));
        }
        if self.kernel_shape.len() != n {
            return Err(kernel_per_axis(&self.kernel_shape, n));
        }
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let pads = pads_attr(&self.pads, n)?;
        let mut s = xs[..2].to_vec();
        for i in 0..n {
            let full = xs[i + 2].saturating_sub(1) * strides[i] + self.kernel_shape[i];
            s.push(full.checked_sub(pads[i] + pads[i + n]).ok_or_else(|| {
                OpError::attribute(
                    "pads",
                    format!("at most {full} in all on spatial axis {i}"),
                    format!("{:?}", self.pads),
                )
            })?);
        }
        Ok(s)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let ind = args.tensor(1)?;
        let xs = x.shape();
        if ind.shape() != xs {
            return Err(OpError::inputs(
                0,
                1,
                "X and indices of the same shape",
                xs,
                ind.shape(),
            ));
        }
        let inferred = self.inferred(xs)?;
        let out_shape = match args.opt_tensor(2)? {
            Some(t) => {
                let v = util::read_i64s(t, 2, "output_shape")?;
                let s = v
                    .iter()
                    .map(|&d| util::dim(d, 2, "output_shape"))
                    .collect::<Result<Vec<_>>>()?;
                if s.len() != inferred.len() || s.iter().zip(&inferred).any(|(a, b)| a < b) {
                    return Err(OpError::input_value(
                        2,
                        format!("a shape of rank {}, at least {inferred:?}", inferred.len()),
                        format!("{s:?}"),
                    ));
                }
                s
            }
            None => inferred.clone(),
        };
        let n_inf = numel(&inferred)?;
        let total = numel(&out_shape)?;
        let xd = x.to_f64_vec();
        let idx = ind
            .to_i64_vec()
            .ok_or_else(|| OpError::input_value(1, "integer indices", format!("a {} tensor", ind.dtype())))?;
        let mut flat = vec![0.0f64; n_inf];
        for (&i, &v) in idx.iter().zip(&xd) {
            let iu = usize::try_from(i)
                .ok()
                .filter(|&u| u < n_inf)
                .ok_or_else(|| OpError::IndexOutOfRange { index: i, size: n_inf })?;
            flat[iu] = v;
        }
        // Place the inferred-shape result at the origin of the (possibly larger) output.
        let mut y = vec![0.0f64; total];
        let ostr = kiln_tensor::strides_of(&out_shape);
        let mut mi = vec![0usize; inferred.len()];
        for v in flat {
            let off: usize = mi.iter().zip(&ostr).map(|(a, b)| a * b).sum();
            y[off] = v;
            step(&mut mi, &inferred);
        }
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(x.dtype(), out_shape, &y)?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        if let Some(t) = util::const_tensor(inputs, 2) {
            let v = util::read_i64s(t, 2, "output_shape")?;
            let s = v
                .iter()
                .map(|&d| util::dim(d, 2, "output_shape").map(Dim::Fixed))
                .collect::<Result<Vec<_>>>()?;
            return Ok(vec![tensor_type(dtype, Some(s))]);
        }
        if crate::util::present(inputs, 2) {
            return Ok(vec![util::dtype_only(dtype)]);
        }
        let shape = inputs
            .first()
            .and_then(|i| i.ty.tensor())
            .and_then(|t| t.fixed_shape())
            .and_then(|s| self.inferred(&s).ok())
            .map(|s| s.into_iter().map(Dim::Fixed).collect());
        Ok(vec![tensor_type(dtype, shape)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(op: &Pool, x: Tensor) -> Vec<Value> {
        let xv = Value::Tensor(x);
        let ins = [Some(&xv)];
        op.eval(&Args::new(&ins)).unwrap().into_vec()
    }

    /// Fuzz finding (load_program): a window of 2^30 elements over a padded axis asked for a
    /// 12 GiB tap table before pooling anything; now a TooLarge error.
    #[test]
    fn a_huge_window_is_refused_before_its_tap_table() {
        let op = Pool {
            kind: PoolKind::Average {
                count_include_pad: true,
            },
            auto_pad: AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![],
            kernel_shape: vec![1 << 30],
            pads: vec![(1 << 30) - 1, 0],
            strides: vec![],
        };
        let x = Value::Tensor(Tensor::from_vec(vec![1, 1, 4], vec![1f32; 4]).unwrap());
        let ins = [Some(&x)];
        match op.eval(&Args::new(&ins)) {
            Err(OpError::TooLarge { what, .. }) => assert!(what.contains("taps"), "{what}"),
            other => panic!("{other:?}"),
        }
    }

    /// 8-bit MaxPool through the f32 kernel: the same values as the f32 pool of the same data.
    #[test]
    fn eight_bit_max_pool_matches_f32() {
        let op = Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: AutoPad::NotSet,
            ceil_mode: true,
            dilations: vec![],
            kernel_shape: vec![3, 3],
            pads: vec![1, 1, 1, 1],
            strides: vec![2, 2],
        };
        let shape = vec![1, 2, 7, 6];
        let u: Vec<u8> = (0..84).map(|i| ((i * 97) % 256) as u8).collect();
        let s: Vec<i8> = u.iter().map(|&v| v as i8).collect();
        let f = |v: Vec<f32>| run(&op, Tensor::from_vec(shape.clone(), v).unwrap());
        let want_u = f(u.iter().map(|&v| f32::from(v)).collect());
        let want_s = f(s.iter().map(|&v| f32::from(v)).collect());
        let got_u = run(&op, Tensor::from_vec(shape.clone(), u).unwrap());
        let got_s = run(&op, Tensor::from_vec(shape.clone(), s).unwrap());
        let as_f = |v: &Value| v.as_tensor().unwrap().to_f64_vec();
        assert_eq!(got_u[0].as_tensor().unwrap().dtype(), DType::U8);
        assert_eq!(as_f(&got_u[0]), as_f(&want_u[0]));
        assert_eq!(got_s[0].as_tensor().unwrap().dtype(), DType::I8);
        assert_eq!(as_f(&got_s[0]), as_f(&want_s[0]));
    }

    fn pool(kind: PoolKind) -> Pool {
        Pool {
            kind,
            auto_pad: AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![],
            kernel_shape: vec![2, 2],
            pads: vec![],
            strides: vec![],
        }
    }

    #[test]
    fn max_pool_with_indices() {
        // 3x3 [[1,2,3],[4,9,6],[7,8,5]], 2x2 kernel stride 1: every window holds the 9.
        let x = Tensor::from_vec(vec![1, 1, 3, 3], vec![1.0f32, 2., 3., 4., 9., 6., 7., 8., 5.]).unwrap();
        let r = run(&pool(PoolKind::Max { storage_order: false }), x);
        assert_eq!(r[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[9.0; 4]);
        assert_eq!(r[1].as_tensor().unwrap().as_slice::<i64>().unwrap(), &[4; 4]);
    }

    #[test]
    fn average_pool_pads_excluded_or_counted() {
        // 2x2 ones, kernel 2 pad 1 each side → 3x3; corner windows see one real element.
        let x = Tensor::from_vec(vec![1, 1, 2, 2], vec![4.0f32; 4]).unwrap();
        let mut p = pool(PoolKind::Average {
            count_include_pad: false,
        });
        p.pads = vec![1, 1, 1, 1];
        let y = run(&p, x.clone());
        assert_eq!(y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[4.0; 9]);
        p.kind = PoolKind::Average {
            count_include_pad: true,
        };
        let y = run(&p, x);
        assert_eq!(
            y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(),
            &[1., 2., 1., 2., 4., 2., 1., 2., 1.]
        );
    }

    /// The 2-D f32 path (MaxPool without Indices, AveragePool) against the general one (MaxPool
    /// with Indices wanted; AveragePool on f64) over pads, strides, ceil_mode and kernels.
    #[test]
    fn fast_2d_path_matches_general_path() {
        let (h, w) = (7usize, 6usize);
        let vals: Vec<f32> = (0..2 * h * w).map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0).collect();
        let x32 = Tensor::from_vec(vec![1, 2, h, w], vals.clone()).unwrap();
        let x64 = Tensor::from_vec(vec![1, 2, h, w], vals.iter().map(|&v| f64::from(v)).collect::<Vec<_>>()).unwrap();
        let mut cases = 0;
        for (kh, kw) in [(1, 1), (2, 3), (3, 3)] {
            for stride in [1usize, 2, 3] {
                for pad in [0usize, 1, 2] {
                    if pad >= kh.max(kw) {
                        continue;
                    }
                    for ceil_mode in [false, true] {
                        let mut p = pool(PoolKind::Max { storage_order: false });
                        p.kernel_shape = vec![kh, kw];
                        p.strides = vec![stride, stride];
                        p.pads = vec![pad, 0, 0, pad];
                        p.ceil_mode = ceil_mode;
                        let xv = Value::Tensor(x32.clone());
                        let ins = [Some(&xv)];
                        let general = p.eval(&Args::new(&ins)).unwrap();
                        let fast = p.eval(&Args::new(&ins).with_wanted(1)).unwrap();
                        assert_eq!(general.len(), 2);
                        assert_eq!(fast.len(), 1);
                        let (f, g) = (fast[0].as_tensor().unwrap(), general[0].as_tensor().unwrap());
                        assert_eq!(f.shape(), g.shape());
                        let bits = |t: &Tensor| {
                            t.as_slice::<f32>()
                                .unwrap()
                                .iter()
                                .map(|v| v.to_bits())
                                .collect::<Vec<_>>()
                        };
                        assert_eq!(bits(f), bits(g), "max {kh}x{kw} s{stride} p{pad} ceil {ceil_mode}");
                        for include in [false, true] {
                            p.kind = PoolKind::Average {
                                count_include_pad: include,
                            };
                            let f = run(&p, x32.clone());
                            let g = run(&p, x64.clone());
                            let (f, g) = (f[0].as_tensor().unwrap(), g[0].as_tensor().unwrap());
                            assert_eq!(f.shape(), g.shape());
                            for (a, b) in f.to_f64_vec().iter().zip(g.to_f64_vec()) {
                                assert!(
                                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()),
                                    "avg {a} vs {b}"
                                );
                            }
                            cases += 1;
                        }
                        p.kind = PoolKind::Max { storage_order: false };
                    }
                }
            }
        }
        assert!(cases > 60, "{cases}");
    }

    /// A plane with NaNs takes the exact tap-order loop: same NaN placement as the general path.
    #[test]
    fn max_pool_with_nans_keeps_the_reference_order() {
        let mut v: Vec<f32> = (0..36).map(|i| (i * 7 % 11) as f32).collect();
        v[7] = f32::NAN;
        v[20] = f32::NAN;
        let x = Tensor::from_vec(vec![1, 1, 6, 6], v).unwrap();
        let mut p = pool(PoolKind::Max { storage_order: false });
        p.kernel_shape = vec![3, 3];
        p.strides = vec![2, 2];
        p.pads = vec![1, 1, 1, 1];
        let xv = Value::Tensor(x);
        let ins = [Some(&xv)];
        let general = p.eval(&Args::new(&ins)).unwrap();
        let fast = p.eval(&Args::new(&ins).with_wanted(1)).unwrap();
        let bits = |v: &Value| {
            v.as_tensor()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|f| f.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&fast[0]), bits(&general[0]));
        assert!(
            fast[0]
                .as_tensor()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .any(|f| f.is_nan())
        );
    }
}
