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

impl Pool {
    pub fn eval(&self, args: &Args<'_>) -> Result<Vec<Value>> {
        let x = args.tensor(0)?;
        check_dtype(self.kind, x.dtype())?;
        let xs = x.shape();
        if xs.len() < 3 {
            return Err(OpError::Shape(format!("pooling needs X [N,C,spatial..], got {xs:?}")));
        }
        let n = xs.len() - 2;
        if self.kernel_shape.len() != n {
            return Err(OpError::Shape(format!(
                "kernel_shape {:?} does not fit X {xs:?}",
                self.kernel_shape
            )));
        }
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dil = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let pads = pads_attr(&self.pads, n)?;
        let spatial = &xs[2..];
        let mut out = Vec::with_capacity(n);
        let mut tables: Vec<Vec<Tap>> = Vec::with_capacity(n);
        for i in 0..n {
            let (k, s, d) = (self.kernel_shape[i], strides[i], dil[i]);
            let g = window_geom(spatial[i], k, s, d, pads[i], pads[i + n], self.auto_pad, self.ceil_mode)?;
            let mut t = Vec::with_capacity(g.out * k);
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
        for pl in 0..planes {
            let src = &xd[pl * isz..(pl + 1) * isz];
            oidx.iter_mut().for_each(|v| *v = 0);
            for o in 0..osz {
                kidx.iter_mut().for_each(|v| *v = 0);
                let mut best: Option<(f64, usize, usize)> = None;
                let (mut sum, mut counted, mut valid) = (0.0f64, 0usize, 0usize);
                loop {
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
        Ok(res)
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let shape = match input_shape(inputs, 0) {
            Some(xs) if xs.len() >= 3 => {
                let n = xs.len() - 2;
                if self.kernel_shape.len() != n {
                    return Err(OpError::Shape(format!(
                        "kernel_shape {:?} does not fit rank {}",
                        self.kernel_shape,
                        xs.len()
                    )));
                }
                let strides = spatial_attr(&self.strides, n, 1, "strides")?;
                let dil = spatial_attr(&self.dilations, n, 1, "dilations")?;
                let pads = pads_attr(&self.pads, n)?;
                let mut s = xs[..2].to_vec();
                s.extend(window_dims(
                    &xs[2..],
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

/// GlobalAveragePool / GlobalMaxPool / GlobalLpPool: one value per (N, C) plane.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub enum GlobalPool {
    Average,
    Max,
    Lp { p: f64 },
}

impl GlobalPool {
    pub fn name(&self) -> &'static str {
        match self {
            GlobalPool::Average => "GlobalAveragePool",
            GlobalPool::Max => "GlobalMaxPool",
            GlobalPool::Lp { .. } => "GlobalLpPool",
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<Vec<Value>> {
        let x = args.tensor(0)?;
        match x.dtype() {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {}
            d => return Err(OpError::UnsupportedDType { index: 0, got: d }),
        }
        let xs = x.shape();
        if xs.len() < 2 {
            return Err(OpError::Shape(format!("global pooling needs X [N,C,..], got {xs:?}")));
        }
        let planes = xs[0] * xs[1];
        let isz = numel(&xs[2..])?;
        let mut yshape = xs[..2].to_vec();
        yshape.extend(std::iter::repeat_n(1, xs.len() - 2));
        let y: Vec<f64> = {
            {
                let xd = x.to_f64_vec();
                (0..planes)
                    .map(|p| {
                        let s = &xd[p * isz..(p + 1) * isz];
                        match self {
                            GlobalPool::Average => s.iter().sum::<f64>() / isz as f64,
                            GlobalPool::Max => s.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                            GlobalPool::Lp { p } => s.iter().map(|v| v.abs().powf(*p)).sum::<f64>().powf(1.0 / p),
                        }
                    })
                    .collect()
            }
        };
        Ok(vec![Value::Tensor(from_f64s(x.dtype(), yshape, &y)?)])
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
        if xs.len() < 3 || self.kernel_shape.len() != n {
            return Err(OpError::Shape(format!(
                "MaxUnpool: X {xs:?} does not fit kernel_shape {:?}",
                self.kernel_shape
            )));
        }
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let pads = pads_attr(&self.pads, n)?;
        let mut s = xs[..2].to_vec();
        for i in 0..n {
            let full = xs[i + 2].saturating_sub(1) * strides[i] + self.kernel_shape[i];
            s.push(
                full.checked_sub(pads[i] + pads[i + n])
                    .ok_or_else(|| OpError::Shape("MaxUnpool pads too large".into()))?,
            );
        }
        Ok(s)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<Vec<Value>> {
        let x = args.tensor(0)?;
        let ind = args.tensor(1)?;
        let xs = x.shape();
        if ind.shape() != xs {
            return Err(OpError::Shape(format!(
                "MaxUnpool indices {:?} differ from X {xs:?}",
                ind.shape()
            )));
        }
        let inferred = self.inferred(xs)?;
        let out_shape = match args.opt_tensor(2)? {
            Some(t) => {
                let v = util::read_i64s(t, "output_shape")?;
                let s = v
                    .iter()
                    .map(|&d| util::dim(d, "output_shape"))
                    .collect::<Result<Vec<_>>>()?;
                if s.len() != inferred.len() || s.iter().zip(&inferred).any(|(a, b)| a < b) {
                    return Err(OpError::Shape(format!(
                        "MaxUnpool output_shape {s:?} is smaller than {inferred:?}"
                    )));
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
            .ok_or_else(|| OpError::Value("MaxUnpool indices must be integers".into()))?;
        let mut flat = vec![0.0f64; n_inf];
        for (&i, &v) in idx.iter().zip(&xd) {
            let iu = usize::try_from(i)
                .ok()
                .filter(|&u| u < n_inf)
                .ok_or(OpError::IndexOutOfRange { index: i, size: n_inf })?;
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
        Ok(vec![Value::Tensor(from_f64s(x.dtype(), out_shape, &y)?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        if let Some(t) = util::const_tensor(inputs, 2) {
            let v = util::read_i64s(t, "output_shape")?;
            let s = v
                .iter()
                .map(|&d| util::dim(d, "output_shape").map(Dim::Fixed))
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

    fn run(op: &Pool, x: Tensor) -> Vec<Value> {
        let xv = Value::Tensor(x);
        let ins = [Some(&xv)];
        op.eval(&Args::new(&ins)).unwrap()
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
}
