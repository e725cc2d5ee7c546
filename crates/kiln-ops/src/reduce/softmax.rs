//! Softmax, LogSoftmax and Hardmax (<https://onnx.ai/onnx/operators/onnx__Softmax.html>),
//! opsets 1-13. Before opset 13 the input is coerced to 2-D at `axis` (default 1) and the op
//! applies to each row of `prod(shape[axis..])` elements; from opset 13 it applies along the
//! single `axis` (default -1). Hardmax sets the first maximal element of each lane to 1 and
//! the rest to 0.

use super::common::{self, floats, from_f64};
use crate::error::Result;
use crate::util;
use crate::value::{Args, InferInput, ValueType};
use kiln_tensor::Tensor;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum SoftmaxKind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Softmax {
    pub kind: SoftmaxKind,
    pub axis: i64,
    /// Opset < 13: flatten to 2-D at `axis` instead of working along one axis.
    pub coerce_2d: bool,
}

/// Applies the op to one lane of `n` values (read with `get`), writing through `put`.
pub(crate) fn softmax_lane(kind: SoftmaxKind, lane: &[f64], out: &mut [f64]) {
    let max = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match kind {
        SoftmaxKind::Hardmax => {
            // First index of the maximum (a NaN, if any, as numpy's argmax picks).
            let mut best = 0;
            for (k, &x) in lane.iter().enumerate() {
                if lane[best].is_nan() {
                    break;
                }
                if x > lane[best] || x.is_nan() {
                    best = k;
                }
            }
            for (k, o) in out.iter_mut().enumerate() {
                *o = if k == best { 1.0 } else { 0.0 };
            }
        }
        SoftmaxKind::Softmax | SoftmaxKind::LogSoftmax => {
            let shift = if max.is_finite() { max } else { 0.0 };
            // Each exponential once: kept in `out`, summed in lane order.
            for (o, &x) in out.iter_mut().zip(lane) {
                *o = (x - shift).exp();
            }
            let sum: f64 = out.iter().sum();
            if kind == SoftmaxKind::Softmax {
                out.iter_mut().for_each(|o| *o /= sum);
            } else {
                for (o, &x) in out.iter_mut().zip(lane) {
                    *o = x - shift - sum.ln();
                }
            }
        }
    }
}

/// Softmax or LogSoftmax of f32 rows of `n > 0` contiguous values, with the vectorised row
/// kernels (exponentials within a few ulp of the f64 path; sums in f32).
fn softmax_rows_f32(kind: SoftmaxKind, xs: &[f32], n: usize) -> kiln_tensor::Buf<f32> {
    let isa = kiln_kernels::isa::active();
    let mut out = crate::util::out_f32(xs.len());
    // Each row copied by the task that takes it, then worked on in place while in L1: the
    // whole input copied first had been half of a [6, 121, 6625] Softmax's time (the copy
    // and the passes each went through memory).
    kiln_kernels::pool::for_each_chunk_mut(&mut out, n, &|i, row| {
        if let Some(x) = xs.get(i * n..i * n + row.len()) {
            row.copy_from_slice(x);
        }
        match kind {
            SoftmaxKind::LogSoftmax => kiln_kernels::vector::log_softmax_row_with(isa, row, &mut Vec::new()),
            _ => kiln_kernels::vector::softmax_row_with(isa, row),
        }
    });
    out
}

kiln_kernels::scratch_kinds! {
    /// One `[inner, n]` block of a Softmax along a non-last axis, its lanes made rows.
    LaneRows: Vec<f32>;
    /// The per-lane shifts and sums of a Softmax over a short non-last axis.
    LaneStats: Vec<f32>;
}

/// Lanes at most this long (with values after the axis) run column-wise: the block's `n`
/// rows of `inner` values are combined elementwise (maximum, exponentials, sums), every pass
/// vectorised along `inner`. Longer lanes are transposed into rows for the row kernels.
const COLUMN_LANES: usize = 64;

/// [`softmax_axis_f32`]'s column-wise block (`n <= COLUMN_LANES`): per lane the shift is its
/// maximum (0 when that is infinite, as the row kernel), each value `e^(x - shift)`, then
/// scaled by `1 / sum` (Softmax) or the log-sum taken (LogSoftmax).
/// [`softmax_columns`]' arguments, to compile it for the active level (AVX-512 where there
/// is: its passes are elementwise over `inner` values).
struct Columns<'a> {
    isa: kiln_kernels::isa::Isa,
    kind: SoftmaxKind,
    src: &'a [f32],
    inner: usize,
    dst: &'a mut [f32],
}

impl kiln_kernels::simd::Kernel for Columns<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        softmax_columns(self.isa, self.kind, self.src, self.inner, self.dst)
    }
}

#[inline(always)]
fn softmax_columns(isa: kiln_kernels::isa::Isa, kind: SoftmaxKind, src: &[f32], inner: usize, dst: &mut [f32]) {
    let mut stats = kiln_kernels::recycle::lend::<LaneStats>();
    stats.clear();
    stats.resize(2 * inner, 0.0);
    let (shift, sum) = stats.split_at_mut(inner);
    shift.fill(f32::NEG_INFINITY);
    for row in src.chunks_exact(inner) {
        // `max` skips NaNs, as the comparison did.
        for (m, &x) in shift.iter_mut().zip(row) {
            *m = m.max(x);
        }
    }
    shift.iter_mut().filter(|m| !m.is_finite()).for_each(|m| *m = 0.0);
    for (d, x) in dst.chunks_exact_mut(inner).zip(src.chunks_exact(inner)) {
        for ((o, &v), &m) in d.iter_mut().zip(x).zip(shift.iter()) {
            *o = v - m;
        }
        kiln_kernels::vector::exp_shift_sum_with(isa, d, 0.0);
        for (s, &e) in sum.iter_mut().zip(d.iter()) {
            *s += e;
        }
    }
    match kind {
        SoftmaxKind::LogSoftmax => {
            for (m, &s) in shift.iter_mut().zip(sum.iter()) {
                *m += s.ln();
            }
            for (d, x) in dst.chunks_exact_mut(inner).zip(src.chunks_exact(inner)) {
                for ((o, &v), &l) in d.iter_mut().zip(x).zip(shift.iter()) {
                    *o = v - l;
                }
            }
        }
        _ => {
            sum.iter_mut().for_each(|s| *s = 1.0 / *s);
            for d in dst.chunks_exact_mut(inner) {
                for (o, &inv) in d.iter_mut().zip(sum.iter()) {
                    *o *= inv;
                }
            }
        }
    }
}

/// Softmax or LogSoftmax of f32 along an axis of `n` values with `inner > 1` values after it:
/// each `[n, inner]` block is transposed so its lanes become rows, runs the row kernels, and
/// is transposed back (the same arithmetic as the last-axis path). Blocks over the threads.
fn softmax_axis_f32(kind: SoftmaxKind, xs: &[f32], n: usize, inner: usize) -> kiln_tensor::Buf<f32> {
    let isa = kiln_kernels::isa::active();
    let block = n * inner;
    let mut out = crate::util::out_f32(xs.len());
    kiln_kernels::pool::for_each_chunk_mut(&mut out, block, &|b, dst| {
        let Some(src) = xs.get(b * block..(b + 1) * block) else {
            return;
        };
        if n <= COLUMN_LANES {
            return kiln_kernels::simd::vectorize_kernel(Columns {
                isa,
                kind,
                src,
                inner,
                dst,
            });
        }
        let mut rows = kiln_kernels::recycle::lend::<LaneRows>();
        rows.clear();
        rows.resize(block, 0.0);
        kiln_kernels::transpose::transpose_f32(src, inner, n, inner, &mut rows, n);
        let mut scratch = Vec::new();
        for row in rows.chunks_exact_mut(n) {
            match kind {
                SoftmaxKind::LogSoftmax => kiln_kernels::vector::log_softmax_row_with(isa, row, &mut scratch),
                _ => kiln_kernels::vector::softmax_row_with(isa, row),
            }
        }
        kiln_kernels::transpose::transpose_f32(&rows, n, inner, n, dst, inner);
    });
    out
}

impl Softmax {
    pub fn name(&self) -> &'static str {
        match self.kind {
            SoftmaxKind::Softmax => "Softmax",
            SoftmaxKind::LogSoftmax => "LogSoftmax",
            SoftmaxKind::Hardmax => "Hardmax",
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let shape = x.shape();
        let (outer, n, inner) = if self.coerce_2d {
            let axis = common::norm_axis_incl(self.axis, shape.len())?;
            let (rows, cols) = common::split_2d(shape, axis);
            (rows, cols, 1)
        } else {
            let axis = util::norm_axis(self.axis, shape.len())?;
            common::split_axis(shape, axis)
        };
        if let (Some(xs), 1, true, false) = (
            x.as_slice::<f32>().ok(),
            inner,
            n > 0,
            self.kind == SoftmaxKind::Hardmax,
        ) {
            return Ok(smallvec::smallvec![
                Tensor::from_buf(shape, softmax_rows_f32(self.kind, xs, n))?.into(),
            ]);
        }
        if let (Some(xs), true, false) = (
            x.as_slice::<f32>().ok(),
            n > 0 && inner > 1,
            self.kind == SoftmaxKind::Hardmax,
        ) {
            return Ok(smallvec::smallvec![
                Tensor::from_buf(shape, softmax_axis_f32(self.kind, xs, n, inner))?.into(),
            ]);
        }
        let v = floats(x, 0)?;
        let mut out = vec![0.0f64; v.len()];
        let mut lane = vec![0.0f64; n];
        let mut res = vec![0.0f64; n];
        for o in 0..outer {
            for i in 0..inner {
                let base = o * n * inner + i;
                for k in 0..n {
                    lane[k] = v[base + k * inner];
                }
                softmax_lane(self.kind, &lane, &mut res);
                for k in 0..n {
                    out[base + k * inner] = res[k];
                }
            }
        }
        Ok(smallvec::smallvec![from_f64(x.dtype(), shape.to_vec(), &out)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        common::check_float_input(inputs, 0)?;
        let t = common::input_tensor_type(inputs, 0);
        if let Some(r) = t.rank() {
            if self.coerce_2d {
                common::norm_axis_incl(self.axis, r)?;
            } else {
                util::norm_axis(self.axis, r)?;
            }
        }
        Ok(vec![ValueType::Tensor(t)])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;
    use kiln_tensor::Tensor;

    fn run(op: &Softmax, x: Tensor) -> Vec<f32> {
        let v = Value::Tensor(x);
        let inputs = [Some(&v)];
        op.eval(&Args::new(&inputs)).unwrap()[0]
            .as_tensor()
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
            .to_vec()
    }

    #[test]
    fn softmax_example() {
        // Spec example: softmax([-1, 0, 1]) = [0.09003058, 0.24472848, 0.66524094].
        let op = Softmax {
            kind: SoftmaxKind::Softmax,
            axis: -1,
            coerce_2d: false,
        };
        let y = run(&op, Tensor::from_vec(vec![1, 3], vec![-1f32, 0., 1.]).unwrap());
        for (a, b) in y.iter().zip([0.09003058f32, 0.24472848, 0.66524094]) {
            assert!((a - b).abs() < 1e-7);
        }
        let op = Softmax {
            kind: SoftmaxKind::LogSoftmax,
            axis: -1,
            coerce_2d: false,
        };
        let y = run(&op, Tensor::from_vec(vec![1, 3], vec![-1f32, 0., 1.]).unwrap());
        for (a, b) in y.iter().zip([-2.4076061f32, -1.407606, -0.407606]) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn f32_along_a_middle_axis_matches_the_f64_lanes() {
        // [3, 5, 19]: short lanes, column-wise; [2, 70, 9]: long lanes, transposed into rows
        // (whole 8x8 transpose blocks and edges). A lane of -inf and one with +inf too.
        for shape in [vec![3, 5, 19], vec![2, 70, 9]] {
            let len: usize = shape.iter().product();
            let mut v: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let inner = shape[2];
            for k in 0..shape[1] {
                v[k * inner] = f32::NEG_INFINITY;
            }
            v[inner + 1] = f32::INFINITY;
            let x32 = Tensor::from_vec(shape.clone(), v.clone()).unwrap();
            let x64 = Tensor::from_vec(shape.clone(), v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>()).unwrap();
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                for axis in [0, 1, -2] {
                    let op = Softmax {
                        kind,
                        axis,
                        coerce_2d: false,
                    };
                    let got = run(&op, x32.clone());
                    let want = op.eval(&Args::new(&[Some(&Value::Tensor(x64.clone()))])).unwrap();
                    let want = want[0].as_tensor().unwrap().to_f64_vec();
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let g = f64::from(*g);
                        let same = (g.is_nan() && w.is_nan()) || g == *w || (g - w).abs() <= 2e-6 * (1.0 + w.abs());
                        assert!(same, "{shape:?} {kind:?} axis {axis} [{i}]: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_along_axis0_and_coerced() {
        let x = Tensor::from_vec(vec![2, 2], vec![0f32, 5., 0., 5.]).unwrap();
        let op = Softmax {
            kind: SoftmaxKind::Softmax,
            axis: 0,
            coerce_2d: false,
        };
        assert_eq!(run(&op, x.clone()), vec![0.5, 0.5, 0.5, 0.5]);
        // Coerced at axis 0: one row of all four elements.
        let op = Softmax {
            kind: SoftmaxKind::Hardmax,
            axis: 0,
            coerce_2d: true,
        };
        assert_eq!(run(&op, x), vec![0., 1., 0., 0.]);
    }
}
