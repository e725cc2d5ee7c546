//! Ordering and accumulation ops: TopK, Unique, CumSum, CumProd, Col2Im.

use super::*;
use crate::util::{checked_numel, const_tensor, input_dtype, norm_axis, read_i64, read_i64s};
use std::cmp::Ordering;

/// Total order with NaN after every number (and NaNs equal), as numpy's sorts use.
fn cmp_nan_last<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    #[allow(clippy::eq_op)]
    let (na, nb) = (a.partial_cmp(a).is_none(), b.partial_cmp(b).is_none());
    match (na, nb) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    }
}

/// Runs `$f(&[T])` on the elements of `x`, decoding byte-coded types to f64 so their order is
/// numeric.
macro_rules! with_ordered {
    ($x:expr, $v:ident => $body:expr) => {
        match $x.data() {
            Data::Coded(_) => {
                let decoded = $x.to_f64_vec();
                let $v = &decoded;
                $body
            }
            d => with_data!(d, $v => $body),
        }
    };
}

/// ONNX `TopK` (opsets 1-24): the `k` largest (or smallest) elements along `axis` and their
/// indices, sorted, ties broken by the lower index first. `k` is an attribute in opset 1
/// (kept here) and input 1 after.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TopK {
    pub axis: i64,
    pub largest: bool,
    pub sorted: bool,
    pub k: Option<i64>,
}

fn topk_perm<T: PartialOrd>(v: &[T], outer: usize, n: usize, inner: usize, k: usize, largest: bool) -> Vec<usize> {
    let mut src = vec![0usize; outer * k * inner];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            order.clear();
            order.extend(0..n);
            order.sort_by(|&a, &b| {
                let c = cmp_nan_last(&v[at(a)], &v[at(b)]);
                let c = if largest { c.reverse() } else { c };
                c.then(a.cmp(&b))
            });
            for (r, &j) in order[..k].iter().enumerate() {
                src[(o * k + r) * inner + i] = at(j);
            }
        }
    }
    src
}

impl TopK {
    /// A `k` out of range: the attribute's (opsets before 10) or input 1's.
    fn bad_k(&self, k: i64, expected: String) -> OpError {
        match self.k {
            Some(_) => OpError::attribute("k", expected, k),
            None => OpError::input_value(1, expected, k),
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let k = match self.k {
            Some(k) => k,
            None => read_i64(args.tensor(1)?, 1, "k")?,
        };
        let axis = norm_axis(self.axis, x.rank())?;
        let n = x.shape()[axis];
        if k < 0 || k as usize > n {
            return Err(self.bad_k(k, format!("0 ..= {n} (the axis' size)")));
        }
        let k = k as usize;
        let outer: usize = x.shape()[..axis].iter().product();
        let inner: usize = x.shape()[axis + 1..].iter().product();
        if x.dtype() == DType::String {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: x.dtype(),
            });
        }
        let src = with_ordered!(x, v => topk_perm(v, outer, n, inner, k, self.largest));
        let mut shape = x.shape().to_vec();
        shape[axis] = k;
        let ind: Vec<i64> = src.iter().map(|&f| ((f / inner) % n.max(1)) as i64).collect();
        Ok(smallvec::smallvec![
            Value::Tensor(x.gather_flat(shape.clone(), &src)?),
            Value::Tensor(Tensor::from_vec(shape, ind)?),
        ])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let k = match self.k {
            Some(k) => Some(k),
            None => const_tensor(inputs, 1).map(|t| read_i64(t, 1, "k")).transpose()?,
        };
        let shape = match (in_shape(inputs, 0), k) {
            (Some(mut s), Some(k)) => {
                let axis = norm_axis(self.axis, s.len())?;
                let k = usize::try_from(k).map_err(|_| self.bad_k(k, ">= 0".into()))?;
                s[axis] = Dim::Fixed(k);
                Some(s)
            }
            _ => None,
        };
        Ok(vec![
            tensor_type(input_dtype(inputs, 0), shape.clone()),
            tensor_type(Some(DType::I64), shape),
        ])
    }
}

/// ONNX `Unique` (opsets 11-28): the distinct elements (or slices along `axis`), sorted or
/// in order of first occurrence, with first-occurrence indices, inverse indices and counts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Unique {
    pub axis: Option<i64>,
    pub sorted: bool,
}

/// Groups the `n` items (item `j` is elements `(o * n + j) * inner + i` for all o, i):
/// returns the first-occurrence item of each group in output order and each item's group.
fn unique_groups<T: PartialOrd>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    sorted: bool,
) -> (Vec<usize>, Vec<usize>) {
    let cmp_items = |a: usize, b: usize| -> Ordering {
        for o in 0..outer {
            for i in 0..inner {
                let c = cmp_nan_last(&v[(o * n + a) * inner + i], &v[(o * n + b) * inner + i]);
                if c != Ordering::Equal {
                    return c;
                }
            }
        }
        Ordering::Equal
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| cmp_items(a, b).then(a.cmp(&b)));
    // Groups in sorted order, each named by its first (smallest) item.
    let mut firsts: Vec<usize> = Vec::new();
    let mut group_of_sorted = vec![0usize; n];
    for (r, &j) in order.iter().enumerate() {
        if r == 0 || cmp_items(order[r - 1], j) != Ordering::Equal {
            firsts.push(j);
        }
        group_of_sorted[j] = firsts.len() - 1;
    }
    if sorted {
        return (firsts, group_of_sorted);
    }
    // Reorder groups by first occurrence.
    let mut by_first: Vec<usize> = (0..firsts.len()).collect();
    by_first.sort_by_key(|&g| firsts[g]);
    let mut rank = vec![0usize; firsts.len()];
    for (r, &g) in by_first.iter().enumerate() {
        rank[g] = r;
    }
    let new_firsts = by_first.iter().map(|&g| firsts[g]).collect();
    (new_firsts, group_of_sorted.iter().map(|&g| rank[g]).collect())
}

impl Unique {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let (shape, axis) = match self.axis {
            Some(a) => (x.shape().to_vec(), norm_axis(a, x.rank())?),
            None => (vec![x.len()], 0),
        };
        let n = shape[axis];
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let (firsts, groups) = with_ordered!(x, v => unique_groups(v, outer, n, inner, self.sorted));
        let mut out_shape = shape;
        out_shape[axis] = firsts.len();
        let mut src = Vec::with_capacity(outer * firsts.len() * inner);
        for o in 0..outer {
            for &j in &firsts {
                let b = (o * n + j) * inner;
                src.extend(b..b + inner);
            }
        }
        let mut counts = vec![0i64; firsts.len()];
        for &g in &groups {
            counts[g] += 1;
        }
        let k = firsts.len();
        Ok(smallvec::smallvec![
            Value::Tensor(x.gather_flat(out_shape, &src)?),
            Value::Tensor(Tensor::from_vec(
                vec![k],
                firsts.iter().map(|&j| j as i64).collect::<Vec<_>>(),
            )?),
            Value::Tensor(Tensor::from_vec(
                vec![n],
                groups.iter().map(|&g| g as i64).collect::<Vec<_>>(),
            )?),
            Value::Tensor(Tensor::from_vec(vec![k], counts)?),
        ])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let i64t = crate::util::dtype_only(Some(DType::I64));
        let inverse = match (self.axis, in_shape(inputs, 0)) {
            (None, Some(s)) => dim_product(&s).map(|d| vec![d]),
            (Some(a), Some(s)) => Some(vec![s[norm_axis(a, s.len())?].clone()]),
            _ => None,
        };
        Ok(vec![
            tensor_type(input_dtype(inputs, 0), None),
            i64t.clone(),
            tensor_type(Some(DType::I64), inverse),
            i64t,
        ])
    }
}

/// ONNX `CumSum` (opsets 11-14) and `CumProd` (opset 26): running sum / product along the
/// axis given by input 1, optionally `exclusive` (shifted by one) and/or `reverse`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CumSum {
    pub exclusive: bool,
    pub reverse: bool,
}

/// See [`CumSum`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CumProd {
    pub exclusive: bool,
    pub reverse: bool,
}

#[allow(clippy::too_many_arguments)]
fn cumulate<T: Num>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    prod: bool,
    exclusive: bool,
    reverse: bool,
) -> Result<Vec<T>> {
    let mut out = v.to_vec();
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = if prod { T::one() } else { T::zero() };
            for step in 0..n {
                let j = if reverse { n - 1 - step } else { step };
                let at = (o * n + j) * inner + i;
                let x = v[at];
                if exclusive {
                    out[at] = acc;
                }
                acc = if prod { acc.mul(x) } else { acc.add(x) };
                if !exclusive {
                    out[at] = acc;
                }
            }
        }
    }
    Ok(out)
}

fn cum_eval(args: &Args<'_>, prod: bool, exclusive: bool, reverse: bool) -> Result<crate::Outputs> {
    let x = args.tensor(0)?;
    let axis = norm_axis(read_i64(args.tensor(1)?, 1, "axis")?, x.rank())?;
    let n = x.shape()[axis];
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let data = try_map_num!(x, 0, v => cumulate(v, outer, n, inner, prod, exclusive, reverse))?;
    one(Tensor::new(x.dtype(), x.shape().to_vec(), data)?)
}

impl CumSum {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        cum_eval(args, false, self.exclusive, self.reverse)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

impl CumProd {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        cum_eval(args, true, self.exclusive, self.reverse)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// ONNX `Col2Im` (opset 18): sums column blocks `[N, C * prod(block), L]` back into images
/// `[N, C, *image_shape]` (the inverse of im2col), with `dilations`, `pads`, `strides`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Col2Im {
    pub dilations: Option<Vec<i64>>,
    pub pads: Option<Vec<i64>>,
    pub strides: Option<Vec<i64>>,
}

struct Col2ImGeom {
    batch: usize,
    channels: usize,
    image: Vec<usize>,
    block: Vec<usize>,
    cols: Vec<usize>,
    dil: Vec<usize>,
    stride: Vec<usize>,
    pad_begin: Vec<usize>,
}

fn col2im<T: Num>(v: &[T], g: &Col2ImGeom) -> Result<Vec<T>> {
    let nd = g.image.len();
    let img_size: usize = g.image.iter().product();
    let ks: usize = g.block.iter().product();
    let l: usize = g.cols.iter().product();
    let mut out = vec![T::zero(); checked_numel(&[g.batch, g.channels, img_size])?];
    let img_st = strides(&g.image);
    let (mut off, mut cp) = (vec![0usize; nd], vec![0usize; nd]);
    for b in 0..g.batch {
        for c in 0..g.channels {
            for kc in 0..ks {
                unravel(kc, &g.block, &mut off);
                let row = ((b * g.channels + c) * ks + kc) * l;
                for col in 0..l {
                    unravel(col, &g.cols, &mut cp);
                    let mut flat = 0usize;
                    let mut inside = true;
                    for d in 0..nd {
                        let p = (cp[d] * g.stride[d] + off[d] * g.dil[d]) as i64 - g.pad_begin[d] as i64;
                        if p < 0 || p >= g.image[d] as i64 {
                            inside = false;
                            break;
                        }
                        flat += p as usize * img_st[d];
                    }
                    if inside {
                        let o = &mut out[(b * g.channels + c) * img_size + flat];
                        *o = o.add(v[row + col]);
                    }
                }
            }
        }
    }
    Ok(out)
}

impl Col2Im {
    fn geometry(&self, x: &Tensor, image: &[i64], block: &[i64]) -> Result<Col2ImGeom> {
        let nd = image.len();
        if nd == 0 {
            return Err(OpError::input_value(1, "image_shape of at least one dim", "[]"));
        }
        if block.len() != nd {
            return Err(OpError::input_value(
                2,
                format!("block_shape of {nd} dims, as image_shape {image:?}"),
                format!("{block:?}"),
            ));
        }
        let pos = |v: &[i64], index: usize, what: &str| -> Result<Vec<usize>> {
            v.iter().map(|&d| crate::util::dim(d, index, what)).collect()
        };
        let image = pos(image, 1, "image_shape")?;
        let block = pos(block, 2, "block_shape")?;
        let get = |a: &Option<Vec<i64>>, len: usize, def: i64, attr: &'static str| -> Result<Vec<usize>> {
            let v = a.clone().unwrap_or_else(|| vec![def; len]);
            if v.len() != len {
                return Err(OpError::attribute(attr, format!("{len} values"), format!("{v:?}")));
            }
            v.iter().map(|&d| crate::util::attr_dim(d, attr)).collect()
        };
        let dil = get(&self.dilations, nd, 1, "dilations")?;
        let stride = get(&self.strides, nd, 1, "strides")?;
        let pads = get(&self.pads, 2 * nd, 0, "pads")?;
        for (attr, v) in [("dilations", &dil), ("strides", &stride)] {
            if v.contains(&0) {
                return Err(OpError::attribute(attr, "every value >= 1", format!("{v:?}")));
            }
        }
        let [batch, ckk, l] = *x.shape() else {
            return Err(OpError::input_shape(0, "[N, C x block size, L]", x.shape()));
        };
        let ks: usize = block.iter().product();
        if ks == 0 {
            return Err(OpError::input_value(
                2,
                "block_shape of dims >= 1",
                format!("{block:?}"),
            ));
        }
        if ckk % ks != 0 {
            return Err(OpError::input_shape(
                0,
                format!("dim 1 divisible by the block size {ks}"),
                x.shape(),
            ));
        }
        let mut cols = Vec::with_capacity(nd);
        for d in 0..nd {
            let span = image[d] + pads[d] + pads[d + nd];
            let eff = dil[d] * (block[d].saturating_sub(1)) + 1;
            if span < eff {
                return Err(OpError::input_value(
                    2,
                    format!("a dilated block within the padded image ({span} on axis {d})"),
                    format!("{block:?}, {eff} dilated"),
                ));
            }
            cols.push((span - eff) / stride[d] + 1);
        }
        let blocks = cols.iter().product::<usize>();
        if blocks != l {
            return Err(OpError::input_shape(
                0,
                format!("dim 2 = {blocks}, the block positions {cols:?}"),
                x.shape(),
            ));
        }
        Ok(Col2ImGeom {
            batch,
            channels: ckk / ks,
            image,
            block,
            cols,
            dil,
            stride,
            pad_begin: pads[..nd].to_vec(),
        })
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let image = read_i64s(args.tensor(1)?, 1, "image_shape")?;
        let block = read_i64s(args.tensor(2)?, 2, "block_shape")?;
        let g = self.geometry(x, &image, &block)?;
        let mut shape = vec![g.batch, g.channels];
        shape.extend_from_slice(&g.image);
        checked_numel(&shape)?;
        let data = try_map_num!(x, 0, v => col2im(v, &g))?;
        one(Tensor::new(x.dtype(), shape, data)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (in_shape(inputs, 0), const_tensor(inputs, 1), const_tensor(inputs, 2)) {
            (Some(s), Some(img), Some(blk)) if s.len() == 3 => {
                let img = read_i64s(img, 1, "image_shape")?;
                let ks: i64 = read_i64s(blk, 2, "block_shape")?.iter().product();
                let c = match &s[1] {
                    Dim::Fixed(n) if ks > 0 => Dim::Fixed(n / ks as usize),
                    _ => return Ok(vec![crate::util::dtype_only(input_dtype(inputs, 0))]),
                };
                let mut out = vec![s[0].clone(), c];
                for &d in &img {
                    out.push(Dim::Fixed(crate::util::dim(d, 1, "image_shape")?));
                }
                Some(out)
            }
            _ => None,
        };
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}
