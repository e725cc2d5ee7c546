//! Indexing ops: Gather, GatherElements, GatherND, ScatterElements (and the deprecated
//! Scatter), ScatterND, TensorScatter, OneHot, Compress, NonZero.

use super::*;
use crate::util::{checked_numel, const_tensor, input_dtype, norm_axis};

/// The values of an integer index input (input `index`): i64 indices in place, others
/// widened.
fn indices_of(t: &Tensor, index: usize) -> Result<std::borrow::Cow<'_, [i64]>> {
    if let Ok(v) = t.as_slice::<i64>() {
        return Ok(std::borrow::Cow::Borrowed(v));
    }
    t.to_i64_vec()
        .map(std::borrow::Cow::Owned)
        .ok_or_else(|| OpError::input_value(index, "integer indices", format!("a {} tensor", t.dtype())))
}

/// Copies `src` into `dst` (equal lengths): runs of a few elements element by element,
/// where `copy_from_slice` would call `memmove` for each (a column gather of one element
/// per row spent most of its time in those calls).
#[inline(always)]
fn copy_run<T: Copy>(dst: &mut [T], src: &[T]) {
    // Fixed-size moves (an element loop would be turned back into a `memmove` call).
    fn fixed<T: Copy, const N: usize>(dst: &mut [T], src: &[T]) -> bool {
        if dst.len() != N {
            return false;
        }
        match (dst.first_chunk_mut::<N>(), src.first_chunk::<N>()) {
            (Some(d), Some(s)) => {
                *d = *s;
                true
            }
            _ => false,
        }
    }
    if !(fixed::<T, 1>(dst, src) || fixed::<T, 2>(dst, src) || fixed::<T, 4>(dst, src)) {
        dst.copy_from_slice(src);
    }
}

/// Gather's output for element types the arena recycles: the rows of `inner` elements starting
/// at `rows`, one after the other, in a recycled buffer of `total` elements.
fn gather_rows<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element>(
    xs: &[T],
    shape: &[usize],
    rows: impl Iterator<Item = usize>,
    total: usize,
    inner: usize,
) -> Result<kiln_tensor::Buf<T>> {
    let mut out = crate::util::out_buf::<T>(total);
    for (dst, base) in out.chunks_exact_mut(inner.max(1)).zip(rows) {
        let src = xs
            .get(base..base + inner)
            .ok_or_else(|| OpError::input_shape(0, format!("a shape of {} elements, as its data", xs.len()), shape))?;
        copy_run(dst, src);
    }
    Ok(out)
}

/// Gather's output when each index picks single elements (`inner` 1: a matrix's columns, a
/// detection head's per-class scores): the elements `idx` of each row of `n` in `xs`, row
/// after row, in a recycled buffer of `total` elements (the rows' count times `idx.len()`).
/// Element by element through [`gather_rows`]' row iterator this had cost 4 ns each
/// (SSDLite's 90 column picks of a [3234, 91] matrix).
fn gather_elements<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element + Copy + Default>(
    xs: &[T],
    n: usize,
    idx: &[usize],
    total: usize,
) -> kiln_tensor::Buf<T> {
    let mut out = crate::util::out_buf::<T>(total);
    if n > 0 && !idx.is_empty() {
        for (row, dst) in xs.chunks_exact(n).zip(out.chunks_exact_mut(idx.len())) {
            for (d, &i) in dst.iter_mut().zip(idx) {
                *d = row.get(i).copied().unwrap_or_default();
            }
        }
    }
    out
}

/// ONNX `Gather` (opsets 1-13): `out[i.., j.., k..] = data[i.., indices[j..], k..]` along
/// `axis`; negative indices count from the end.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Gather {
    pub axis: i64,
}

impl Gather {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, ind) = (args.tensor(0)?, args.tensor(1)?);
        let axis = norm_axis(self.axis, x.rank())?;
        let n = x.shape()[axis];
        let outer: usize = x.shape()[..axis].iter().product();
        let inner: usize = x.shape()[axis + 1..].iter().product();
        let mut shape = kiln_tensor::Shape::from_slice(&x.shape()[..axis]);
        shape.extend_from_slice(ind.shape());
        shape.extend_from_slice(&x.shape()[axis + 1..]);
        let total = checked_numel(&shape)?;
        // i64 indices are read in place (embedding lookups take no copy of them); all are
        // checked before any is used.
        let owned;
        let raw: &[i64] = match ind.as_slice::<i64>() {
            Ok(r) => r,
            Err(_) => {
                owned = indices_of(ind, 1)?;
                &owned
            }
        };
        for &i in raw {
            norm_index(i, n)?;
        }
        if inner == 1
            && let Data::F32(xs) = x.data()
        {
            let idx: Vec<usize> = raw.iter().map(|&i| norm_index(i, n)).collect::<Result<_>>()?;
            return one(Tensor::from_buf(shape, gather_elements(xs, n, &idx, total))?);
        }
        let rows = (0..outer).flat_map(|o| {
            raw.iter()
                .map(move |&i| (o * n + norm_index(i, n).unwrap_or(0)) * inner)
        });
        // Whole rows of `inner` elements copied into a recycled buffer, written whole.
        match x.data() {
            Data::F32(xs) => {
                return one(Tensor::from_buf(
                    shape,
                    gather_rows(xs, x.shape(), rows, total, inner)?,
                )?);
            }
            Data::I64(xs) => {
                return one(Tensor::from_buf(
                    shape,
                    gather_rows(xs, x.shape(), rows, total, inner)?,
                )?);
            }
            Data::Bool(xs) => {
                return one(Tensor::from_buf(
                    shape,
                    gather_rows(xs, x.shape(), rows, total, inner)?,
                )?);
            }
            _ => {}
        }
        let mut src = Vec::with_capacity(total);
        for base in rows {
            src.extend(base..base + inner);
        }
        one(x.gather_flat(shape, &src)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (in_shape(inputs, 0), in_shape(inputs, 1)) {
            (Some(d), Some(i)) => {
                let axis = norm_axis(self.axis, d.len())?;
                let mut s = d[..axis].to_vec();
                s.extend(i);
                s.extend_from_slice(&d[axis + 1..]);
                Some(s)
            }
            _ => None,
        };
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}

/// ONNX `GatherElements` (opsets 11-13): `out[p] = data[p with p[axis] = indices[p]]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct GatherElements {
    pub axis: i64,
}

/// For each element of `ind_shape`, the flat position in `data_shape` with the `axis`
/// coordinate replaced by the index value.
fn along_axis_targets(data_shape: &[usize], ind_shape: &[usize], idx: &[i64], axis: usize) -> Result<Vec<usize>> {
    if data_shape.len() != ind_shape.len() {
        return Err(OpError::inputs(
            0,
            1,
            "data and indices of the same rank",
            data_shape,
            ind_shape,
        ));
    }
    for d in 0..data_shape.len() {
        if d != axis && ind_shape[d] > data_shape[d] {
            return Err(OpError::inputs(
                0,
                1,
                format!("indices no larger than data off axis {axis}"),
                data_shape,
                ind_shape,
            ));
        }
    }
    let st = strides(data_shape);
    let (rank, len, step) = (ind_shape.len(), data_shape[axis], st[axis]);
    let Some(&inner) = ind_shape.last() else {
        // Rank 0: one index, on a scalar that has no axis; norm_axis refused it already.
        return idx.iter().map(|&i| Ok(norm_index(i, len)? * step)).collect();
    };
    let last = rank - 1;
    // An odometer over the index rows (all dims but the last): `base` is the offset of the
    // row's first position without its axis coordinate, kept up to date as the row advances.
    let mut pos = vec![0usize; last];
    let mut base = 0usize;
    let mut out = Vec::with_capacity(idx.len());
    for row in idx.chunks(inner.max(1)) {
        if axis == last {
            for &i in row {
                out.push(base + norm_index(i, len)?);
            }
        } else {
            for (k, &i) in row.iter().enumerate() {
                out.push(base + k + norm_index(i, len)? * step);
            }
        }
        for d in (0..last).rev() {
            pos[d] += 1;
            if pos[d] < ind_shape[d] {
                if d != axis {
                    base += st[d];
                }
                break;
            }
            if d != axis {
                base -= st[d] * (pos[d] - 1);
            }
            pos[d] = 0;
        }
    }
    Ok(out)
}

impl GatherElements {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, ind) = (args.tensor(0)?, args.tensor(1)?);
        let axis = norm_axis(self.axis, x.rank())?;
        let src = along_axis_targets(x.shape(), ind.shape(), &indices_of(ind, 1)?, axis)?;
        one(x.gather_flat(ind.shape().to_vec(), &src)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 1))])
    }
}

/// ONNX `GatherND` (opsets 11-13, `batch_dims` from 12): gathers slices of `data` addressed
/// by the last dim of `indices`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct GatherND {
    pub batch_dims: usize,
}

impl GatherND {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, ind) = (args.tensor(0)?, args.tensor(1)?);
        let b = self.batch_dims;
        let (ds, is) = (x.shape(), ind.shape());
        let Some(&k) = is.last() else {
            return Err(OpError::input_shape(1, "rank >= 1", is));
        };
        if b >= is.len() || b + k > ds.len() || ds[..b] != is[..b] {
            return Err(OpError::inputs(
                0,
                1,
                format!(
                    "shapes that fit batch_dims {b} (the same first {b} dims, indices' last dim at most data's rank - {b})"
                ),
                ds,
                is,
            ));
        }
        let mut shape = is[..is.len() - 1].to_vec();
        shape.extend_from_slice(&ds[b + k..]);
        checked_numel(&shape)?;
        let inner: usize = ds[b + k..].iter().product();
        let batch_stride: usize = ds[b..].iter().product();
        let st = strides(ds);
        let idx = indices_of(ind, 1)?;
        let nb: usize = is[..b].iter().product();
        let per_batch: usize = is[b..is.len() - 1].iter().product();
        // f32 data: each addressed slice copied whole (SSD's box gathers, [3234, 4] by
        // [3234, 1], had gone through a per-element index list at 8 ns per element).
        if let (Ok(xs), true) = (x.as_slice::<f32>(), inner > 0 && k > 0) {
            let rows = nb * per_batch;
            if idx.len() != rows * k {
                return Err(OpError::input_shape(1, format!("{rows} index tuples of {k}"), is));
            }
            let mut out = crate::util::out_f32(rows * inner);
            // Single elements of a vector (`data[indices]`, a detector's per-box picks): one
            // read each, no slice copy (SSDLite's 180 picks from [3234]).
            if let ([n], 1) = (&ds[b..], nb) {
                for (d, &i) in out.iter_mut().zip(idx.iter()) {
                    let at = norm_index(i, *n)?;
                    *d = *xs.get(at).ok_or_else(|| OpError::IndexOutOfRange {
                        index: at as i64,
                        size: xs.len(),
                    })?;
                }
                return one(Tensor::from_buf(shape, out)?);
            }
            // Rows in order, the batch offset stepped every `per_batch` rows (no division
            // per row).
            let (mut batch_off, mut left) = (0usize, per_batch);
            for (dst, tuple) in out.chunks_exact_mut(inner).zip(idx.chunks_exact(k)) {
                if left == 0 {
                    batch_off += batch_stride;
                    left = per_batch;
                }
                left -= 1;
                let mut off = batch_off;
                for ((&i, &d), &s) in tuple.iter().zip(&ds[b..]).zip(&st[b..]) {
                    off += norm_index(i, d)? * s;
                }
                let src = xs.get(off..off + inner).ok_or_else(|| OpError::IndexOutOfRange {
                    index: off as i64,
                    size: xs.len(),
                })?;
                copy_run(dst, src);
            }
            return one(Tensor::from_buf(shape, out)?);
        }
        let mut src = Vec::new();
        for batch in 0..nb {
            for t in 0..per_batch {
                let tuple = &idx[(batch * per_batch + t) * k..(batch * per_batch + t + 1) * k];
                let mut off = batch * batch_stride;
                for (j, &i) in tuple.iter().enumerate() {
                    off += norm_index(i, ds[b + j])? * st[b + j];
                }
                src.extend(off..off + inner);
            }
        }
        one(x.gather_flat(shape, &src)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (in_shape(inputs, 0), in_shape(inputs, 1)) {
            (Some(d), Some(i)) => match i.last() {
                Some(Dim::Fixed(k)) if self.batch_dims + k <= d.len() => {
                    let mut s = i[..i.len() - 1].to_vec();
                    s.extend_from_slice(&d[self.batch_dims + k..]);
                    Some(s)
                }
                _ => None,
            },
            _ => None,
        };
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}

/// How scattered updates combine with the existing element.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduce_into<T: Num>(data: &[T], upd: &[T], targets: &[usize], red: Reduction) -> Result<Vec<T>> {
    let mut out = data.to_vec();
    if red == Reduction::None {
        for (&t, &u) in targets.iter().zip(upd) {
            if let Some(o) = out.get_mut(t) {
                *o = u;
            }
        }
        return Ok(out);
    }
    for (&t, &u) in targets.iter().zip(upd) {
        let Some(o) = out.get_mut(t) else { continue };
        *o = match red {
            Reduction::None => u,
            Reduction::Add => o.add(u),
            Reduction::Mul => o.mul(u),
            Reduction::Max => o.max_nan(u),
            Reduction::Min => o.min_nan(u),
        };
    }
    Ok(out)
}

/// `data` with `updates[j]` written to (or combined into) flat position `targets[j]`, in order.
fn scatter(data: &Tensor, updates: &Tensor, targets: &[usize], red: Reduction) -> Result<Tensor> {
    if data.dtype() != updates.dtype() {
        return Err(OpError::DTypeMismatch {
            a: data.dtype(),
            b: updates.dtype(),
        });
    }
    if targets.len() != updates.len() {
        return Err(OpError::input_shape(
            2,
            format!("{} updates, one per index", targets.len()),
            updates.shape(),
        ));
    }
    let n = data.len();
    // Numeric values (any reduction, none too) are written in place into a copy of data.
    macro_rules! numeric {
        ($($v:ident),*) => {
            match (data.data(), updates.data()) {
                $((Data::$v(d), Data::$v(u)) => {
                    Some(reduce_into(d, u, targets, red).map(|v| Data::$v(kiln_tensor::Buf::from_vec(v))))
                })*
                _ => None,
            }
        };
    }
    if let Some(out) = numeric!(F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64) {
        return Ok(Tensor::new(data.dtype(), data.shape().to_vec(), out?)?);
    }
    let all = concat_flat(&[data, updates])?;
    if red == Reduction::None {
        let mut idx: Vec<usize> = (0..n).collect();
        for (j, &t) in targets.iter().enumerate() {
            idx[t] = n + j;
        }
        return Ok(all.gather_flat(data.shape().to_vec(), &idx)?);
    }
    let out = if data.dtype() == DType::Bool {
        // numpy: add is `or`, mul is `and`, max/min likewise.
        let v = all.as_slice::<bool>()?;
        let mut out = v[..n].to_vec();
        for (&t, &u) in targets.iter().zip(&v[n..]) {
            out[t] = match red {
                Reduction::Add | Reduction::Max => out[t] | u,
                _ => out[t] & u,
            };
        }
        Data::Bool(out.into())
    } else {
        return Err(OpError::UnsupportedDType {
            index: 0,
            got: data.dtype(),
        });
    };
    Ok(Tensor::new(data.dtype(), data.shape().to_vec(), out)?)
}

/// ONNX `ScatterElements` (opsets 11-18; also `Scatter`, opsets 9-10):
/// `out[p with p[axis] = indices[p]] = updates[p]`, combined by `reduction` (opset 16/18).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ScatterElements {
    pub axis: i64,
    pub reduction: Reduction,
}

impl ScatterElements {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, ind, upd) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let axis = norm_axis(self.axis, x.rank())?;
        if ind.shape() != upd.shape() {
            return Err(OpError::inputs(
                1,
                2,
                "indices and updates of the same shape",
                ind.shape(),
                upd.shape(),
            ));
        }
        let targets = along_axis_targets(x.shape(), ind.shape(), &indices_of(ind, 1)?, axis)?;
        one(scatter(x, upd, &targets, self.reduction)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// ONNX `ScatterND` (opsets 11-18): writes `updates` slices at the positions the last dim of
/// `indices` addresses, combined by `reduction` (opset 16/18).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ScatterND {
    pub reduction: Reduction,
}

impl ScatterND {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, ind, upd) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let (ds, is) = (x.shape(), ind.shape());
        let Some(&k) = is.last() else {
            return Err(OpError::input_shape(1, "rank >= 1", is));
        };
        if k > ds.len() {
            return Err(OpError::inputs(
                0,
                1,
                format!("index tuples (indices' last dim, {k}) no longer than data's rank"),
                ds,
                is,
            ));
        }
        let mut want = is[..is.len() - 1].to_vec();
        want.extend_from_slice(&ds[k..]);
        if upd.shape() != want.as_slice() {
            return Err(OpError::input_shape(
                2,
                format!("{want:?} (indices' leading dims, then data's trailing dims)"),
                upd.shape(),
            ));
        }
        let inner: usize = ds[k..].iter().product();
        let st = strides(ds);
        let idx = indices_of(ind, 1)?;
        let mut targets = Vec::with_capacity(upd.len());
        let tuples: usize = is[..is.len() - 1].iter().product();
        for t in 0..tuples {
            let mut off = 0;
            for (j, &i) in idx[t * k..(t + 1) * k].iter().enumerate() {
                off += norm_index(i, ds[j])? * st[j];
            }
            targets.extend(off..off + inner);
        }
        one(scatter(x, upd, &targets, self.reduction)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// ONNX `TensorScatter` (opset 24): writes `update` into a copy of `past_cache` along `axis`
/// starting at `write_indices[batch]` (default 0), wrapping when `circular`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TensorScatter {
    pub axis: i64,
    pub circular: bool,
}

impl TensorScatter {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (past, upd) = (args.tensor(0)?, args.tensor(1)?);
        let r = past.rank();
        let axis = norm_axis(self.axis, r)?;
        if axis == 0 {
            return Err(OpError::attribute(
                "axis",
                "an axis other than the batch axis 0",
                self.axis,
            ));
        }
        let (ps, us) = (past.shape(), upd.shape());
        if us.len() != r || (0..r).any(|d| if d == axis { us[d] > ps[d] } else { us[d] != ps[d] }) {
            return Err(OpError::inputs(
                0,
                1,
                format!("an update of the cache's rank and dims, at most the cache's on axis {axis}"),
                ps,
                us,
            ));
        }
        let wi = match args.opt_tensor(2)? {
            Some(t) if t.len() != ps[0] => {
                return Err(OpError::input_shape(
                    2,
                    format!("{} write indices, one per batch entry", ps[0]),
                    t.shape(),
                ));
            }
            Some(t) => indices_of(t, 2)?.into_owned(),
            None => vec![0; ps[0]],
        };
        let max_len = ps[axis] as i64;
        let st = strides(ps);
        let mut pos = vec![0usize; r];
        let mut targets = Vec::with_capacity(upd.len());
        for f in 0..upd.len() {
            unravel(f, us, &mut pos);
            let mut s = wi[pos[0]] + pos[axis] as i64;
            if self.circular && max_len > 0 {
                s = s.rem_euclid(max_len);
            }
            if s < 0 || s >= max_len {
                return Err(OpError::IndexOutOfRange {
                    index: s,
                    size: max_len as usize,
                });
            }
            pos[axis] = s as usize;
            targets.push(pos.iter().zip(&st).map(|(p, s)| p * s).sum());
        }
        one(scatter(past, upd, &targets, Reduction::None)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// ONNX `OneHot` (opsets 9-11): inserts a dim of size `depth` at `axis`; `values[1]` where
/// the position equals the (wrapped) index, `values[0]` elsewhere.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct OneHot {
    pub axis: i64,
}

impl OneHot {
    fn axis(&self, rank: usize) -> Result<usize> {
        norm_axis(self.axis, rank + 1)
    }
    fn depth(t: &Tensor) -> Result<usize> {
        let v = t.to_f64_vec();
        match v.as_slice() {
            [d] if *d >= 0.0 => Ok(*d as usize),
            _ => Err(OpError::input_value(1, "one number >= 0", format!("{v:?}"))),
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (ind, depth, values) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let depth = Self::depth(depth)?;
        if values.len() != 2 {
            return Err(OpError::input_shape(2, "2 elements (off and on)", values.shape()));
        }
        let axis = self.axis(ind.rank())?;
        let mut shape = ind.shape().to_vec();
        shape.insert(axis, depth);
        let n = checked_numel(&shape)?;
        let iv = ind.to_f64_vec();
        let inner: usize = ind.shape()[axis..].iter().product();
        let src: Vec<usize> = (0..n)
            .map(|f| {
                let (outer, rest) = (f / (depth * inner), f % (depth * inner));
                let (d, i) = (rest / inner, rest % inner);
                let mut v = iv[outer * inner + i];
                if v < 0.0 {
                    v += depth as f64;
                }
                (v == d as f64) as usize
            })
            .collect();
        one(values.gather_flat(shape, &src)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (in_shape(inputs, 0), const_tensor(inputs, 1)) {
            (Some(mut s), Some(d)) => {
                let axis = self.axis(s.len())?;
                s.insert(axis, Dim::Fixed(Self::depth(d)?));
                Some(s)
            }
            _ => None,
        };
        Ok(vec![tensor_type(input_dtype(inputs, 2), shape)])
    }
}

/// ONNX `Compress` (opsets 9-11): keeps the slices along `axis` (or elements of the flattened
/// input) whose `condition` entry is true.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Compress {
    pub axis: Option<i64>,
}

impl Compress {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, cond) = (args.tensor(0)?, args.tensor(1)?);
        let c = cond.to_f64_vec();
        if cond.rank() != 1 {
            return Err(OpError::input_shape(1, "a 1-D condition", cond.shape()));
        }
        let (shape, axis) = match self.axis {
            Some(a) => (x.shape().to_vec(), norm_axis(a, x.rank())?),
            None => (vec![x.len()], 0),
        };
        let n = shape[axis];
        let keep: Vec<usize> = c
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0)
            .map(|(i, _)| i)
            .collect();
        if let Some(&i) = keep.last()
            && i >= n
        {
            return Err(OpError::IndexOutOfRange {
                index: i as i64,
                size: n,
            });
        }
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let mut src = Vec::with_capacity(outer * keep.len() * inner);
        for o in 0..outer {
            for &k in &keep {
                let b = (o * n + k) * inner;
                src.extend(b..b + inner);
            }
        }
        let mut out_shape = shape;
        out_shape[axis] = keep.len();
        one(x.gather_flat(out_shape, &src)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (self.axis, in_shape(inputs, 0), const_tensor(inputs, 1)) {
            (Some(a), Some(mut s), Some(c)) => {
                let axis = norm_axis(a, s.len())?;
                s[axis] = Dim::Fixed(c.to_f64_vec().iter().filter(|v| **v != 0.0).count());
                Some(s)
            }
            _ => None,
        };
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}

/// ONNX `NonZero` (opsets 9-13): the indices of the non-zero elements, shape `[rank, count]`
/// (row-major order).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct NonZero;

impl NonZero {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        // The flat positions of the nonzero elements, read in each element type directly,
        // counted first so the list is allocated once (grown by doubling, a [3234] mask's
        // list had been most of the op's time).
        fn hits<T: Copy>(v: &[T], nonzero: impl Fn(T) -> bool) -> Vec<usize> {
            let mut out = Vec::with_capacity(v.iter().filter(|&&e| nonzero(e)).count());
            out.extend(v.iter().enumerate().filter(|&(_, &e)| nonzero(e)).map(|(i, _)| i));
            out
        }
        let hits: Vec<usize> = match x.data() {
            Data::Str(v) => v
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .map(|(i, _)| i)
                .collect(),
            Data::Bool(v) => hits(v, |e| e),
            Data::F32(v) => hits(v, |e| e != 0.0),
            Data::I64(v) => hits(v, |e| e != 0),
            Data::I32(v) => hits(v, |e| e != 0),
            Data::U8(v) => hits(v, |e| e != 0),
            _ => hits(&x.to_f64_vec(), |e| e != 0.0),
        };
        let r = x.rank();
        if r == 1 {
            let out: Vec<i64> = hits.iter().map(|&f| f as i64).collect();
            return one(Tensor::from_vec(vec![1, out.len()], out)?);
        }
        let mut out = vec![0i64; r * hits.len()];
        let mut pos = vec![0usize; r];
        for (j, &f) in hits.iter().enumerate() {
            unravel(f, x.shape(), &mut pos);
            for d in 0..r {
                out[d * hits.len() + j] = pos[d] as i64;
            }
        }
        one(Tensor::from_vec(vec![r, hits.len()], out)?)
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![crate::util::dtype_only(Some(DType::I64))])
    }
}
