//! The ten ONNX `Reduce*` operators: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
//! ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare
//! (<https://onnx.ai/onnx/operators/onnx__ReduceSum.html> and siblings), opsets 1 through 20.
//!
//! `axes` is an attribute up to opset 12 (ReduceSum) / 17 (the others) and an optional input
//! afterwards; the importer records which. An empty axes list reduces every axis, unless
//! `noop_with_empty_axes` is set, in which case no axis is reduced and the op's per-element
//! function (square, abs, ...) is applied alone, as ONNX's reference does. Reducing an empty
//! set gives the identity of the reduction (0 for sums, 1 for products, -inf for max and
//! LogSum/LogSumExp, +inf for min; the dtype's extreme values for integers; false/true for
//! boolean max/min).
//!
//! Floats are accumulated in f64 and rounded to the input dtype; integers are exact, wrapping
//! on overflow as numpy does (Mean, L2, LogSum and LogSumExp of integers truncate toward zero).

use super::common::{self, from_f64, from_i128, int_bounds, is_ieee_float, is_plain_int};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{Data, Tensor};

/// Which reduction.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl ReduceKind {
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }
}

/// Where the reduced axes come from.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub enum ReduceAxes {
    /// The `axes` attribute (older opsets), or no axes at all when empty.
    Attr(Vec<i64>),
    /// The optional second input (newer opsets); absent means empty.
    Input,
}

/// A `Reduce*` op.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Reduce {
    pub kind: ReduceKind,
    pub axes: ReduceAxes,
    pub keepdims: bool,
    pub noop_with_empty_axes: bool,
}

/// The reduced axes (sorted, unique) for a list given as in ONNX.
fn resolve_axes(list: &[i64], rank: usize, noop: bool) -> Result<Vec<usize>> {
    if list.is_empty() {
        return Ok(if noop { Vec::new() } else { (0..rank).collect() });
    }
    let mut axes = util::norm_axes(list, rank)?;
    axes.sort_unstable();
    Ok(axes.to_vec())
}

/// Output shapes of a reduction: with reduced dims kept as 1, and the final one.
pub(crate) fn reduced_shapes(shape: &[usize], axes: &[usize], keepdims: bool) -> (Vec<usize>, Vec<usize>) {
    let keep: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if axes.contains(&d) { 1 } else { n })
        .collect();
    let out = if keepdims {
        keep.clone()
    } else {
        shape
            .iter()
            .enumerate()
            .filter(|(d, _)| !axes.contains(d))
            .map(|(_, &n)| n)
            .collect()
    };
    (keep, out)
}

/// For every input element (row-major), the flat index of the output element it reduces into,
/// plus the output element count and the number of inputs per output.
pub(crate) fn reduce_map(shape: &[usize], axes: &[usize]) -> Result<(Vec<usize>, usize, usize)> {
    let (keep, _) = reduced_shapes(shape, axes, true);
    let out_n = util::checked_numel(&keep)?;
    let group = axes.iter().map(|&a| shape[a]).product();
    let map = util::broadcast_map(&keep, shape, 0)?;
    Ok((map, out_n, group))
}

fn fold<T: Copy>(map: &[usize], vals: &[T], out_n: usize, init: T, f: impl Fn(T, T) -> T) -> Vec<T> {
    let mut acc = vec![init; out_n];
    for (&o, &x) in map.iter().zip(vals) {
        acc[o] = f(acc[o], x);
    }
    acc
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b > a || b.is_nan() { b } else { a }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b < a || b.is_nan() { b } else { a }
}

kiln_kernels::scratch_kinds! {
    /// The f64 sums of one output row of a reduction over middle axes.
    RowSums: Vec<f64>;
}

/// Sum, Mean, Max or Min of `[outer, group, inner]` f32 values over the middle dim (`group`
/// and `inner` at least 1): sums in f64 in group order (the reference's order), Max/Min with
/// the reference's NaN rule.
/// Input elements per block of rows of a trailing-axes f32 sum.
const SUM_BLOCK: usize = 1 << 16;

fn reduce_middle_f32(kind: ReduceKind, xs: &[f32], outer: usize, group: usize, inner: usize) -> kiln_tensor::Buf<f32> {
    let mut out = crate::util::out_f32(outer * inner);
    let mut acc = kiln_kernels::recycle::lend::<RowSums>();
    for (o, dst) in out.chunks_exact_mut(inner).enumerate() {
        let block = xs.get(o * group * inner..(o + 1) * group * inner).unwrap_or(&[]);
        let mut rows = block.chunks_exact(inner);
        match kind {
            ReduceKind::Max | ReduceKind::Min => {
                let Some(row0) = rows.next() else { continue };
                dst.copy_from_slice(row0);
                let max = kind == ReduceKind::Max;
                for row in rows {
                    for (d, &x) in dst.iter_mut().zip(row) {
                        let take = d.is_nan() || x.is_nan() || if max { x > *d } else { x < *d };
                        if take {
                            *d = x;
                        }
                    }
                }
            }
            _ => {
                acc.clear();
                acc.resize(inner, 0.0);
                for row in rows {
                    for (a, &x) in acc.iter_mut().zip(row) {
                        *a += f64::from(x);
                    }
                }
                let mean = kind == ReduceKind::Mean;
                for (d, &a) in dst.iter_mut().zip(acc.iter()) {
                    *d = if mean { (a / group as f64) as f32 } else { a as f32 };
                }
            }
        }
    }
    out
}

/// Float reduction in f64.
fn reduce_f64(kind: ReduceKind, vals: &[f64], map: &[usize], out_n: usize, group: usize) -> Vec<f64> {
    let sum_of = |f: fn(f64) -> f64| {
        let mut acc = vec![0.0f64; out_n];
        for (&o, &x) in map.iter().zip(vals) {
            acc[o] += f(x);
        }
        acc
    };
    match kind {
        ReduceKind::Sum => sum_of(|x| x),
        ReduceKind::Mean => sum_of(|x| x).into_iter().map(|s| s / group as f64).collect(),
        ReduceKind::SumSquare => sum_of(|x| x * x),
        ReduceKind::L1 => sum_of(f64::abs),
        ReduceKind::L2 => sum_of(|x| x * x).into_iter().map(f64::sqrt).collect(),
        ReduceKind::LogSum => sum_of(|x| x).into_iter().map(f64::ln).collect(),
        ReduceKind::Prod => fold(map, vals, out_n, 1.0, |a, x| a * x),
        ReduceKind::Max => fold(map, vals, out_n, f64::NEG_INFINITY, max_nan),
        ReduceKind::Min => fold(map, vals, out_n, f64::INFINITY, min_nan),
        ReduceKind::LogSumExp => {
            // Shift by the largest finite value for stability.
            let mut m = vec![f64::NEG_INFINITY; out_n];
            for (&o, &x) in map.iter().zip(vals) {
                if x.is_finite() && x > m[o] {
                    m[o] = x;
                }
            }
            for v in &mut m {
                if !v.is_finite() {
                    *v = 0.0;
                }
            }
            let mut acc = vec![0.0f64; out_n];
            for (&o, &x) in map.iter().zip(vals) {
                acc[o] += (x - m[o]).exp();
            }
            acc.iter().zip(&m).map(|(s, m)| s.ln() + m).collect()
        }
    }
}

/// Integer reduction, exact in i128 with wrapping where numpy wraps.
fn reduce_int(
    kind: ReduceKind,
    vals: &[i128],
    map: &[usize],
    out_n: usize,
    group: usize,
    bounds: (i128, i128),
) -> Vec<i128> {
    let sum_of = |f: fn(i128) -> i128| fold(map, vals, out_n, 0i128, move |a, x| a.wrapping_add(f(x)));
    let trunc = |v: Vec<f64>| v.into_iter().map(common::f64_to_i128).collect::<Vec<_>>();
    match kind {
        ReduceKind::Sum => sum_of(|x| x),
        ReduceKind::SumSquare => sum_of(|x| x.wrapping_mul(x)),
        ReduceKind::L1 => sum_of(|x| x.wrapping_abs()),
        ReduceKind::Mean => sum_of(|x| x)
            .into_iter()
            .map(|s| if group == 0 { 0 } else { s / group as i128 })
            .collect(),
        ReduceKind::Prod => fold(map, vals, out_n, 1i128, |a, x| a.wrapping_mul(x)),
        ReduceKind::Max => fold(map, vals, out_n, bounds.0, |a, x| a.max(x)),
        ReduceKind::Min => fold(map, vals, out_n, bounds.1, |a, x| a.min(x)),
        ReduceKind::L2 => trunc(
            sum_of(|x| x.wrapping_mul(x))
                .into_iter()
                .map(|s| (s as f64).sqrt())
                .collect(),
        ),
        ReduceKind::LogSum => trunc(sum_of(|x| x).into_iter().map(|s| (s as f64).ln()).collect()),
        ReduceKind::LogSumExp => {
            let f: Vec<f64> = vals.iter().map(|&x| x as f64).collect();
            trunc(reduce_f64(kind, &f, map, out_n, group))
        }
    }
}

impl Reduce {
    fn axes_list(&self, args: &Args<'_>) -> Result<Vec<i64>> {
        match &self.axes {
            ReduceAxes::Attr(v) => Ok(v.clone()),
            ReduceAxes::Input => match args.opt_tensor(1)? {
                Some(t) => util::read_i64s(t, 1, "axes"),
                None => Ok(Vec::new()),
            },
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let list = self.axes_list(args)?;
        let shape = x.shape();
        let axes = resolve_axes(&list, shape.len(), self.noop_with_empty_axes)?;
        let (_, out_shape) = reduced_shapes(shape, &axes, self.keepdims);
        let dtype = x.dtype();
        // f32 Sum or Mean over trailing dims: rows of contiguous values, summed in f64 lanes.
        let trailing = !axes.is_empty() && axes.iter().enumerate().all(|(i, &a)| a + axes.len() == shape.len() + i);
        if dtype == kiln_tensor::DType::F32 && trailing && matches!(self.kind, ReduceKind::Sum | ReduceKind::Mean) {
            let cols: usize = shape.iter().skip(shape.len() - axes.len()).product();
            let rows: usize = shape.iter().take(shape.len() - axes.len()).product();
            let mut out = util::out_f32(rows);
            if cols > 0 {
                let scale = if self.kind == ReduceKind::Mean {
                    1.0 / cols as f64
                } else {
                    1.0
                };
                let xs = x.as_slice::<f32>()?;
                // Blocks of rows over the pool, each summed in one vectorised loop.
                let block = (SUM_BLOCK / cols).max(1);
                kiln_kernels::pool::for_each_chunk_mut(out.as_mut_slice(), block, &|b, o| {
                    let x = xs.get(b * block * cols..).unwrap_or(&[]);
                    kiln_kernels::vector::sum_rows_f64(x, cols, scale, o);
                });
            } else {
                // Sums of nothing: 0; means of nothing: NaN (0 / 0), as the reference gives.
                out.fill(if self.kind == ReduceKind::Mean { f32::NAN } else { 0.0 });
            }
            return Ok(smallvec::smallvec![Tensor::from_buf(out_shape, out)?.into()]);
        }
        // f32 Max or Min over trailing dims: rows of contiguous values; a row holding a NaN
        // takes the reference's order (its NaN rule depends on where the NaNs are).
        if dtype == kiln_tensor::DType::F32 && trailing && matches!(self.kind, ReduceKind::Max | ReduceKind::Min) {
            let cols: usize = shape.iter().skip(shape.len() - axes.len()).product();
            let rows: usize = shape.iter().take(shape.len() - axes.len()).product();
            if cols > 0 {
                let largest = self.kind == ReduceKind::Max;
                let rule = if largest { max_nan } else { min_nan };
                let start = if largest { f64::NEG_INFINITY } else { f64::INFINITY };
                let mut out = util::out_f32(rows);
                for (o, row) in out.iter_mut().zip(x.as_slice::<f32>()?.chunks_exact(cols)) {
                    let (best, nan) = kiln_kernels::vector::extreme(row, largest);
                    *o = if nan {
                        row.iter().fold(start, |a, &v| rule(a, f64::from(v))) as f32
                    } else {
                        best
                    };
                }
                return Ok(smallvec::smallvec![Tensor::from_buf(out_shape, out)?.into()]);
            }
        }
        // f32 Sum, Mean, Max or Min over consecutive axes with others after them: [outer,
        // group, inner] blocks, each output row accumulated from `group` contiguous rows (in
        // f64 for sums, in the reference's order: the same values).
        let consecutive = !axes.is_empty() && axes.windows(2).all(|w| w[1] == w[0] + 1);
        if let (kiln_tensor::DType::F32, true, false, Some(&first), Some(&last)) =
            (dtype, consecutive, trailing, axes.first(), axes.last())
            && matches!(
                self.kind,
                ReduceKind::Sum | ReduceKind::Mean | ReduceKind::Max | ReduceKind::Min
            )
        {
            let outer: usize = shape.iter().take(first).product();
            let group: usize = shape.iter().skip(first).take(last + 1 - first).product();
            let inner: usize = shape.iter().skip(last + 1).product();
            if group > 0 && inner > 0 {
                let xs = x.as_slice::<f32>()?;
                let out = reduce_middle_f32(self.kind, xs, outer, group, inner);
                return Ok(smallvec::smallvec![Tensor::from_buf(out_shape, out)?.into()]);
            }
        }
        let (map, out_n, group) = reduce_map(shape, &axes)?;
        let out = if is_ieee_float(dtype) {
            let vals = x.to_f64_vec();
            from_f64(dtype, out_shape, &reduce_f64(self.kind, &vals, &map, out_n, group))?
        } else if let (true, Some(vals)) = (is_plain_int(dtype), common::ints(x)) {
            let r = reduce_int(self.kind, &vals, &map, out_n, group, int_bounds(dtype));
            from_i128(dtype, out_shape, &r)?
        } else if let (Data::Bool(v), ReduceKind::Max | ReduceKind::Min) = (x.data(), self.kind) {
            let any = self.kind == ReduceKind::Max;
            // max = any, min = all; the empty set gives false / true.
            let r = fold(&map, v, out_n, !any, |a, b| if any { a || b } else { a && b });
            Tensor::from_vec(out_shape, r)?
        } else {
            return Err(OpError::UnsupportedDType { index: 0, got: dtype });
        };
        Ok(smallvec::smallvec![out.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let t = common::input_tensor_type(inputs, 0);
        let list = match &self.axes {
            ReduceAxes::Attr(v) => Some(v.clone()),
            ReduceAxes::Input if inputs.len() < 2 => Some(Vec::new()),
            ReduceAxes::Input => util::const_tensor(inputs, 1).and_then(|c| util::read_i64s(c, 1, "axes").ok()),
        };
        let shape = match (&t.shape, list) {
            (Some(s), Some(list)) => {
                let axes = resolve_axes(&list, s.len(), self.noop_with_empty_axes)?;
                let dims: Vec<Dim> = s
                    .iter()
                    .enumerate()
                    .filter_map(|(d, dim)| match (axes.contains(&d), self.keepdims) {
                        (false, _) => Some(dim.clone()),
                        (true, true) => Some(Dim::Fixed(1)),
                        (true, false) => None,
                    })
                    .collect();
                Some(dims)
            }
            _ => None,
        };
        Ok(vec![common::tensor_type(t.dtype, shape)])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(kind: ReduceKind, axes: Vec<i64>, keepdims: bool, x: Tensor) -> Tensor {
        let op = Reduce {
            kind,
            axes: ReduceAxes::Attr(axes),
            keepdims,
            noop_with_empty_axes: false,
        };
        let v = Value::Tensor(x);
        let inputs = [Some(&v)];
        match op.eval(&Args::new(&inputs)).unwrap().remove(0) {
            Value::Tensor(t) => t,
            _ => unreachable!(),
        }
    }

    fn x322() -> Tensor {
        // The ONNX spec example data: [[[5,1],[20,2]],[[30,1],[40,2]],[[55,1],[60,2]]].
        Tensor::from_vec(
            vec![3, 2, 2],
            vec![5f32, 1., 20., 2., 30., 1., 40., 2., 55., 1., 60., 2.],
        )
        .unwrap()
    }

    /// The f32 rows path (trailing axes, Sum and Mean) against the general path on the
    /// same values in f64.
    #[test]
    fn trailing_f32_sums_and_means_match_the_f64_path() {
        let shape = vec![2, 3, 4, 5];
        let v: Vec<f32> = (0..120).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37).collect();
        let x32 = Tensor::from_vec(shape.clone(), v.clone()).unwrap();
        let x64 = Tensor::from_vec(shape, v.iter().map(|&a| f64::from(a)).collect::<Vec<f64>>()).unwrap();
        for (kind, axes, keep) in [
            (ReduceKind::Sum, vec![2, 3], false),
            (ReduceKind::Mean, vec![-1], true),
            (ReduceKind::Mean, vec![1, 2, 3], true),
            (ReduceKind::Sum, vec![3, 2], false),
        ] {
            let fast = run(kind, axes.clone(), keep, x32.clone());
            let slow = run(kind, axes.clone(), keep, x64.clone());
            assert_eq!(fast.shape(), slow.shape(), "{kind:?} {axes:?}");
            for (a, b) in fast.to_f64_vec().iter().zip(slow.to_f64_vec()) {
                assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{kind:?} {axes:?}: {a} vs {b}");
            }
        }
        // A short last axis over many rows (several blocks, one and two threads): each
        // output the sum of its row's values, which are small integers (exact in f32).
        for cols in [2, 3, 17] {
            let rows = 309 * 172;
            let v: Vec<f32> = (0..rows * cols).map(|i| (i % 1013) as f32 - 500.0).collect();
            let want: Vec<f32> = v.chunks_exact(cols).map(|r| r.iter().sum()).collect();
            let x = Tensor::from_vec(vec![1, 309, 172, cols], v).unwrap();
            for threads in [1, 2] {
                let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap();
                let got = pool.install(|| run(ReduceKind::Sum, vec![-1], false, x.clone()));
                assert_eq!(got.shape(), &[1, 309, 172]);
                assert_eq!(
                    got.as_slice::<f32>().unwrap(),
                    want.as_slice(),
                    "{cols} columns, {threads} threads"
                );
            }
        }
        // Mean over an empty axis: NaN, as 0 / 0.
        let empty = Tensor::from_vec(vec![2, 0], Vec::<f32>::new()).unwrap();
        let m = run(ReduceKind::Mean, vec![1], false, empty);
        assert!(m.as_slice::<f32>().unwrap().iter().all(|v| v.is_nan()));
    }

    #[test]
    fn middle_and_trailing_axis_f32_reductions_match_the_f64_path() {
        let shape = vec![3, 4, 5, 6];
        let mut v: Vec<f32> = (0..360).map(|i| ((i * 53 % 41) as f32 - 20.0) * 0.29).collect();
        v[17] = f32::NAN;
        let x32 = Tensor::from_vec(shape.clone(), v.clone()).unwrap();
        let x64 = Tensor::from_vec(shape, v.iter().map(|&a| f64::from(a)).collect::<Vec<f64>>()).unwrap();
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min] {
            for (axes, keep) in [
                (vec![1], false),
                (vec![1, 2], true),
                (vec![0], false),
                (vec![0, 1, 2], false),
                (vec![3], true),
                (vec![2, 3], false),
                (vec![1, 2, 3], false),
            ] {
                let fast = run(kind, axes.clone(), keep, x32.clone());
                let slow = run(kind, axes.clone(), keep, x64.clone());
                assert_eq!(fast.shape(), slow.shape(), "{kind:?} {axes:?}");
                for (a, b) in fast.to_f64_vec().iter().zip(slow.to_f64_vec()) {
                    let same = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-6 * (1.0 + b.abs());
                    assert!(same, "{kind:?} {axes:?}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn sum_and_mean_over_axis1() {
        let s = run(ReduceKind::Sum, vec![1], false, x322());
        assert_eq!(s.shape(), &[3, 2]);
        assert_eq!(s.as_slice::<f32>().unwrap(), &[25., 3., 70., 3., 115., 3.]);
        let m = run(ReduceKind::Mean, vec![1], true, x322());
        assert_eq!(m.shape(), &[3, 1, 2]);
        assert_eq!(m.as_slice::<f32>().unwrap(), &[12.5, 1.5, 35., 1.5, 57.5, 1.5]);
    }

    #[test]
    fn max_min_prod_all_axes() {
        assert_eq!(
            run(ReduceKind::Max, vec![], true, x322()).as_slice::<f32>().unwrap(),
            &[60.]
        );
        assert_eq!(run(ReduceKind::Min, vec![], false, x322()).shape(), &[] as &[usize]);
        let p = run(ReduceKind::Prod, vec![-1], false, x322());
        assert_eq!(p.as_slice::<f32>().unwrap(), &[5., 40., 30., 80., 55., 120.]);
    }

    #[test]
    fn empty_set_gives_identity() {
        let x = Tensor::from_vec(vec![2, 0, 4], Vec::<f32>::new()).unwrap();
        let s = run(ReduceKind::Sum, vec![1], true, x.clone());
        assert_eq!(s.shape(), &[2, 1, 4]);
        assert!(s.as_slice::<f32>().unwrap().iter().all(|&v| v == 0.0));
        let m = run(ReduceKind::Max, vec![1], true, x.clone());
        assert!(m.as_slice::<f32>().unwrap().iter().all(|&v| v == f32::NEG_INFINITY));
        let l = run(ReduceKind::LogSumExp, vec![1], true, x.clone());
        assert!(l.as_slice::<f32>().unwrap().iter().all(|&v| v == f32::NEG_INFINITY));
        let p = run(ReduceKind::Prod, vec![1], true, x);
        assert!(p.as_slice::<f32>().unwrap().iter().all(|&v| v == 1.0));
    }

    #[test]
    fn norms_and_logs() {
        let x = Tensor::from_vec(vec![2, 2], vec![3f64, -4., 1., 1.]).unwrap();
        assert_eq!(
            run(ReduceKind::L1, vec![1], false, x.clone())
                .as_slice::<f64>()
                .unwrap(),
            &[7., 2.]
        );
        assert_eq!(
            run(ReduceKind::L2, vec![1], false, x.clone())
                .as_slice::<f64>()
                .unwrap(),
            &[5., 2f64.sqrt()]
        );
        assert_eq!(
            run(ReduceKind::SumSquare, vec![1], false, x.clone())
                .as_slice::<f64>()
                .unwrap(),
            &[25., 2.]
        );
        let lse = run(ReduceKind::LogSumExp, vec![1], false, x.clone());
        let v = lse.as_slice::<f64>().unwrap();
        assert!((v[0] - (3f64.exp() + (-4f64).exp()).ln()).abs() < 1e-12);
        assert!((v[1] - (1.0 + 2f64.ln())).abs() < 1e-12);
        let ls = run(ReduceKind::LogSum, vec![0], false, x);
        assert!((ls.as_slice::<f64>().unwrap()[0] - 4f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn integers_and_bools() {
        let x = Tensor::from_vec(vec![2, 2], vec![i64::MAX, 1, -3, 7]).unwrap();
        assert_eq!(
            run(ReduceKind::Sum, vec![1], false, x.clone())
                .as_slice::<i64>()
                .unwrap(),
            &[i64::MIN, 4]
        );
        assert_eq!(
            run(ReduceKind::Min, vec![0], false, x).as_slice::<i64>().unwrap(),
            &[-3, 1]
        );
        let u = Tensor::from_vec(vec![3], vec![7u8, 2, 3]).unwrap();
        assert_eq!(run(ReduceKind::Mean, vec![], false, u).as_slice::<u8>().unwrap(), &[4]);
        let b = Tensor::from_vec(vec![2, 2], vec![true, false, false, false]).unwrap();
        assert_eq!(
            run(ReduceKind::Max, vec![1], false, b.clone())
                .as_slice::<bool>()
                .unwrap(),
            &[true, false]
        );
        assert_eq!(
            run(ReduceKind::Min, vec![0], false, b).as_slice::<bool>().unwrap(),
            &[false, false]
        );
        let e = Tensor::from_vec(vec![0], Vec::<i32>::new()).unwrap();
        assert_eq!(
            run(ReduceKind::Max, vec![], false, e).as_slice::<i32>().unwrap(),
            &[i32::MIN]
        );
    }

    #[test]
    fn noop_with_empty_axes_applies_the_element_function() {
        let op = Reduce {
            kind: ReduceKind::SumSquare,
            axes: ReduceAxes::Input,
            keepdims: true,
            noop_with_empty_axes: true,
        };
        let v = Value::Tensor(Tensor::from_vec(vec![2], vec![2f32, -3.]).unwrap());
        let inputs = [Some(&v)];
        let out = op.eval(&Args::new(&inputs)).unwrap();
        assert_eq!(out[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[4., 9.]);
    }

    #[test]
    fn infer_uses_attribute_or_constant_axes() {
        use crate::value::TensorType;
        let ty = ValueType::Tensor(TensorType::new(
            kiln_tensor::DType::F16,
            vec![Dim::Fixed(3), Dim::Sym("n".into()), Dim::Fixed(2)],
        ));
        let axes = Value::Tensor(Tensor::from_vec(vec![1], vec![-1i64]).unwrap());
        let axes_ty = axes.value_type();
        let inputs = [
            InferInput {
                ty: &ty,
                konst: None,
                present: true,
            },
            InferInput {
                ty: &axes_ty,
                konst: Some(&axes),
                present: true,
            },
        ];
        let op = Reduce {
            kind: ReduceKind::Sum,
            axes: ReduceAxes::Input,
            keepdims: false,
            noop_with_empty_axes: false,
        };
        let out = op.infer(&inputs).unwrap();
        let expect = TensorType::new(kiln_tensor::DType::F16, vec![Dim::Fixed(3), Dim::Sym("n".into())]);
        assert_eq!(out, vec![ValueType::Tensor(expect)]);
        let op = Reduce {
            kind: ReduceKind::Max,
            axes: ReduceAxes::Attr(vec![]),
            keepdims: true,
            noop_with_empty_axes: false,
        };
        let out = op.infer(&inputs[..1]).unwrap();
        assert_eq!(out[0].tensor().unwrap().fixed_shape(), Some(vec![1, 1, 1]));
        // Unknown axes: only the dtype.
        let unknown = [
            InferInput {
                ty: &ty,
                konst: None,
                present: true,
            },
            InferInput {
                ty: &axes_ty,
                konst: None,
                present: true,
            },
        ];
        let op = Reduce {
            kind: ReduceKind::Sum,
            axes: ReduceAxes::Input,
            keepdims: true,
            noop_with_empty_axes: false,
        };
        assert_eq!(op.infer(&unknown).unwrap()[0].tensor().unwrap().shape, None);
    }

    #[test]
    fn half_precision_rounds_once() {
        use kiln_tensor::f16;
        let x = Tensor::from_vec(
            vec![3],
            vec![f16::from_f32(1.0), f16::from_f32(2.0), f16::from_f32(4.0)],
        )
        .unwrap();
        let m = run(ReduceKind::Mean, vec![], false, x);
        assert_eq!(m.as_slice::<f16>().unwrap(), &[f16::from_f64(7.0 / 3.0)]);
    }
}
