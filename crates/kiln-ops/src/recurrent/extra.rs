//! The newer sequence-mixing ops:
//! - `RotaryEmbedding` (opset 23) <https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html>
//! - `LinearAttention` (opset 27): linear / gated / delta / gated-delta state recurrences
//! - `CausalConvWithState` (opset 27): stateful causal depthwise 1-D convolution
//! - `SwiGLU` (opset 28): `A * sigmoid(alpha * A) * B`
//! - `FlexAttention` (`ai.onnx.preview` opset 1); its `score_mod` / `prob_mod` subgraphs run in the runtime
//!
//! Semantics follow the operator specs and the ONNX reference implementation
//! (`onnx/reference/ops/op_*.py`), including where it rounds intermediates to the input type.

use super::num::{self, dim_mul, in_shape, round_to, tt};
use crate::error::{OpError, Result};
use crate::util::checked_numel;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `RotaryEmbedding`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RotaryEmbedding {
    pub interleaved: bool,
    /// Rotated prefix of each head (0: the whole head).
    pub rotary_embedding_dim: usize,
    /// Required for 3-D inputs (unless `contrib`).
    pub num_heads: Option<usize>,
    /// ONNX Runtime's com.microsoft `RotaryEmbedding` semantics (inputs reordered to the ONNX
    /// op's by the importer): a one-element `position_ids` is the first position (rows
    /// `p..p+S` of the caches for every batch entry), and a 3-D input without `num_heads` has
    /// heads of twice the caches' width.
    pub contrib: bool,
}

impl RotaryEmbedding {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let dt = num::need_float(x, 0)?;
        let (cos, sin) = (args.tensor(1)?, args.tensor(2)?);
        let pos = args.opt_tensor(3)?;
        let s = x.shape();
        // (batch, seq, heads, head) and the flat offset of each element.
        let (b, sq, h, d, four) = match s.len() {
            4 => (s[0], s[2], s[1], s[3], true),
            3 if self.contrib && self.num_heads.is_none_or(|h| h == 0) => {
                let head = 2 * cos.shape().last().copied().unwrap_or(0);
                if head == 0 || s[2] % head != 0 {
                    return Err(OpError::input_shape(
                        1,
                        format!("a cache whose width x 2 divides the hidden size {}", s[2]),
                        cos.shape(),
                    ));
                }
                (s[0], s[1], s[2] / head, head, false)
            }
            3 => {
                let h = self.num_heads.filter(|&h| h > 0).ok_or_else(|| {
                    let got = self.num_heads.map_or_else(|| "none".to_string(), |h| h.to_string());
                    OpError::attribute("num_heads", ">= 1 (the input is 3-D)", got)
                })?;
                if s[2] % h != 0 {
                    return Err(OpError::input_shape(
                        0,
                        format!("a hidden size (dim 2) divisible by num_heads {h}"),
                        s,
                    ));
                }
                (s[0], s[1], h, s[2] / h, false)
            }
            _ => {
                return Err(OpError::input_shape(0, "a 3-D or 4-D input", s));
            }
        };
        let rd = if self.rotary_embedding_dim == 0 {
            d
        } else {
            self.rotary_embedding_dim
        };
        if rd > d || rd % 2 != 0 {
            return Err(OpError::attribute(
                "rotary_embedding_dim",
                format!("an even value <= the head size {d}"),
                rd,
            ));
        }
        let half = rd / 2;
        let (cv, sv) = (cos.to_f64_vec(), sin.to_f64_vec());
        if cos.shape() != sin.shape() {
            return Err(OpError::inputs(
                1,
                2,
                "cos and sin caches of the same shape",
                cos.shape(),
                sin.shape(),
            ));
        }
        if cos.shape().last() != Some(&half) {
            return Err(OpError::input_shape(
                1,
                format!("a last dim of rotary_embedding_dim / 2 = {half}"),
                cos.shape(),
            ));
        }
        // Cache row for (batch, position).
        let rows: Vec<usize> = match pos {
            Some(p) if self.contrib && p.len() == 1 && !(b == 1 && sq == 1) => {
                let maxp = cos.shape().first().copied().unwrap_or(0);
                let first = p
                    .to_i64_vec()
                    .and_then(|v| v.first().copied())
                    .ok_or_else(|| OpError::input_value(3, "an integer position", format!("a {} tensor", p.dtype())))?;
                let start = usize::try_from(first)
                    .ok()
                    .filter(|&u| cos.rank() == 2 && u.checked_add(sq).is_some_and(|e| e <= maxp))
                    .ok_or_else(|| OpError::IndexOutOfRange {
                        index: first.saturating_add(sq as i64),
                        size: maxp,
                    })?;
                (0..b).flat_map(|_| start..start + sq).collect()
            }
            Some(p) => {
                if p.len() != b * sq || (!self.contrib && p.shape() != [b, sq]) {
                    return Err(OpError::input_shape(3, format!("[{b}, {sq}]"), p.shape()));
                }
                if cos.rank() != 2 {
                    return Err(OpError::input_shape(
                        1,
                        "a 2-D cache [positions, rotary_embedding_dim / 2] with position_ids",
                        cos.shape(),
                    ));
                }
                let maxp = cos.shape()[0];
                let pv = p
                    .to_i64_vec()
                    .ok_or_else(|| OpError::input_value(3, "integer positions", format!("a {} tensor", p.dtype())))?;
                pv.iter()
                    .map(|&v| {
                        usize::try_from(v)
                            .ok()
                            .filter(|&u| u < maxp)
                            .ok_or_else(|| OpError::IndexOutOfRange { index: v, size: maxp })
                    })
                    .collect::<Result<_>>()?
            }
            None => {
                if cos.shape() != [b, sq, half] {
                    return Err(OpError::input_shape(
                        1,
                        format!("[{b}, {sq}, {half}] without position_ids"),
                        cos.shape(),
                    ));
                }
                (0..b * sq).collect()
            }
        };
        let xv = x.to_f64_vec();
        let mut out = xv.clone();
        let r = |v: f64| round_to(dt, v);
        for bi in 0..b {
            for si in 0..sq {
                let row = rows[bi * sq + si] * half;
                for hi in 0..h {
                    let base = if four {
                        ((bi * h + hi) * sq + si) * d
                    } else {
                        (bi * sq + si) * h * d + hi * d
                    };
                    for i in 0..half {
                        let (i1, i2) = if self.interleaved {
                            (2 * i, 2 * i + 1)
                        } else {
                            (i, i + half)
                        };
                        let (x1, x2) = (xv[base + i1], xv[base + i2]);
                        let (c, sn) = (cv[row + i], sv[row + i]);
                        out[base + i1] = r(r(c * x1) - r(sn * x2));
                        out[base + i2] = r(r(sn * x1) + r(c * x2));
                    }
                }
            }
        }
        Ok(smallvec::smallvec![num::float_tensor(dt, s.to_vec(), out)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tt(crate::util::input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// `SwiGLU`: `Y = A * sigmoid(alpha * A) * B` (equal shapes, no broadcasting).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SwiGlu {
    pub alpha: f32,
}

impl SwiGlu {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (a, b) = (args.tensor(0)?, args.tensor(1)?);
        let dt = num::need_float(a, 0)?;
        if b.dtype() != dt {
            return Err(OpError::DTypeMismatch { a: dt, b: b.dtype() });
        }
        if a.shape() != b.shape() {
            return Err(OpError::inputs(0, 1, "the same shape", a.shape(), b.shape()));
        }
        let al = self.alpha as f64;
        let y = a
            .to_f64_vec()
            .iter()
            .zip(b.to_f64_vec())
            .map(|(&x, y)| {
                let sg = round_to(dt, sigmoid(round_to(dt, al * x)));
                round_to(dt, round_to(dt, x * sg) * y)
            })
            .collect();
        Ok(smallvec::smallvec![
            num::float_tensor(dt, a.shape().to_vec(), y)?.into()
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tt(crate::util::input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// `CausalConvWithState`: depthwise causal conv over `[past_state | input]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CausalConvWithState {
    /// Fused SiLU (`"silu"` / `"swish"`) after the convolution.
    pub silu: bool,
}

impl CausalConvWithState {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, w) = (args.tensor(0)?, args.tensor(1)?);
        let dt = num::need_float(x, 0)?;
        num::need_rank(x, 0, 3)?;
        num::need_rank(w, 1, 3)?;
        let (b, c, l) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let k = w.shape()[2];
        if w.shape()[0] != c || w.shape()[1] != 1 || k == 0 {
            return Err(OpError::input_shape(1, format!("[{c}, 1, k] with k >= 1"), w.shape()));
        }
        let bias = match args.opt_tensor(2)? {
            Some(t) => {
                if t.shape() != [c] {
                    return Err(OpError::input_shape(2, format!("[{c}]"), t.shape()));
                }
                t.to_f64_vec()
            }
            None => vec![0.0; c],
        };
        let past = match args.opt_tensor(3)? {
            Some(t) => {
                if t.shape() != [b, c, k - 1] {
                    return Err(OpError::input_shape(3, format!("[{b}, {c}, {}]", k - 1), t.shape()));
                }
                t.to_f64_vec()
            }
            None => vec![0.0; b * c * (k - 1)],
        };
        let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
        let pl = l + k - 1;
        let mut y = vec![0.0; checked_numel(&[b, c, l])?];
        let mut present = vec![0.0; b * c * (k - 1)];
        let mut padded = vec![0.0; pl];
        for bi in 0..b {
            for ci in 0..c {
                let row = bi * c + ci;
                padded[..k - 1].copy_from_slice(&past[row * (k - 1)..(row + 1) * (k - 1)]);
                padded[k - 1..].copy_from_slice(&xv[row * l..(row + 1) * l]);
                for t in 0..l {
                    let acc: f64 = (0..k).map(|j| padded[t + j] * wv[ci * k + j]).sum::<f64>() + bias[ci];
                    let v = round_to(dt, acc);
                    y[row * l + t] = if self.silu {
                        round_to(DType::F32, v) * sigmoid(round_to(DType::F32, v))
                    } else {
                        v
                    };
                }
                present[row * (k - 1)..(row + 1) * (k - 1)].copy_from_slice(&padded[pl - (k - 1)..]);
            }
        }
        Ok(smallvec::smallvec![
            num::float_tensor(dt, vec![b, c, l], y)?.into(),
            num::float_tensor(dt, vec![b, c, k - 1], present)?.into(),
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = crate::util::input_dtype(inputs, 0);
        let st = match (in_shape(inputs, 0), in_shape(inputs, 1)) {
            (Some(x), Some(w)) if x.len() == 3 && w.len() == 3 => match &w[2] {
                Dim::Fixed(k) if *k > 0 => Some(vec![x[0].clone(), x[1].clone(), Dim::Fixed(k - 1)]),
                _ => None,
            },
            _ => None,
        };
        Ok(vec![tt(dt, in_shape(inputs, 0)), tt(dt, st)])
    }
}

/// Update rule of `LinearAttention`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum UpdateRule {
    Linear,
    Gated,
    Delta,
    GatedDelta,
}

/// `LinearAttention`: a `(d_k x d_v)` state per kv head updated token by token
/// (optionally decayed by `exp(decay)` and delta-corrected by `beta`), read by the queries.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LinearAttention {
    pub q_num_heads: usize,
    pub kv_num_heads: usize,
    /// 0 for `1/sqrt(d_k)`.
    pub scale: f32,
    pub update_rule: UpdateRule,
}

/// (B, T, H*D) -> values at [b][h][t][d].
fn unpack(v: &[f64], t: usize, h: usize, d: usize) -> impl Fn(usize, usize, usize, usize) -> f64 + '_ {
    move |bi, hi, ti, di| v[((bi * t + ti) * h + hi) * d + di]
}

impl LinearAttention {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (q, k, v) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let dt = num::need_float(q, 0)?;
        for (i, t) in [q, k, v].into_iter().enumerate() {
            num::need_rank(t, i, 3)?;
        }
        let (hq, hk) = (self.q_num_heads, self.kv_num_heads);
        if hk == 0 {
            return Err(OpError::attribute("kv_num_heads", ">= 1", hk));
        }
        if hq == 0 || hq % hk != 0 {
            return Err(OpError::attribute(
                "q_num_heads",
                format!("a positive multiple of kv_num_heads {hk}"),
                hq,
            ));
        }
        let (b, t) = (q.shape()[0], q.shape()[1]);
        for (i, x, heads, attr) in [
            (0, q, hq, "q_num_heads"),
            (1, k, hk, "kv_num_heads"),
            (2, v, hk, "kv_num_heads"),
        ] {
            if x.shape()[2] % heads != 0 {
                return Err(OpError::input_shape(
                    i,
                    format!("a hidden size (dim 2) divisible by {attr} {heads}"),
                    x.shape(),
                ));
            }
        }
        let dk = q.shape()[2] / hq;
        let dv = v.shape()[2] / hk;
        if k.shape() != [b, t, hk * dk] {
            return Err(OpError::input_shape(
                1,
                format!("[{b}, {t}, {}], as the query", hk * dk),
                k.shape(),
            ));
        }
        if v.shape()[..2] != [b, t] {
            return Err(OpError::input_shape(
                2,
                format!("[{b}, {t}, _], as the query"),
                v.shape(),
            ));
        }
        let gating = matches!(self.update_rule, UpdateRule::Gated | UpdateRule::GatedDelta);
        let delta = matches!(self.update_rule, UpdateRule::Delta | UpdateRule::GatedDelta);
        let decay = args.opt_tensor(4)?;
        let beta = args.opt_tensor(5)?;
        // A rule's own inputs are required; an input of another rule means another rule.
        for (wants, given, index, expected) in [
            (gating, decay.is_some(), 4, "a gated rule (decay, input 4, is given)"),
            (delta, beta.is_some(), 5, "a delta rule (beta, input 5, is given)"),
        ] {
            match (wants, given) {
                (true, false) => return Err(OpError::MissingInput { index }),
                (false, true) => {
                    return Err(OpError::attribute(
                        "update_rule",
                        expected,
                        format!("{:?}", self.update_rule),
                    ));
                }
                _ => {}
            }
        }
        // decay: per head (B, T, Hk) or per key dim (B, T, Hk*dk).
        let decay_v = decay.map(|d| d.to_f64_vec());
        let decay_per_dim = match decay {
            Some(d) if d.shape() == [b, t, hk] => Some(false),
            Some(d) if d.shape() == [b, t, hk * dk] => Some(true),
            Some(d) => {
                return Err(OpError::input_shape(
                    4,
                    format!("[{b}, {t}, {hk}] or [{b}, {t}, {}]", hk * dk),
                    d.shape(),
                ));
            }
            None => None,
        };
        let beta_v = beta.map(|x| x.to_f64_vec());
        let beta_heads = match beta {
            Some(x) if x.shape() == [b, t, hk] => hk,
            Some(x) if x.shape() == [b, t, 1] => 1,
            Some(x) => {
                return Err(OpError::input_shape(
                    5,
                    format!("[{b}, {t}, {hk}] or [{b}, {t}, 1]"),
                    x.shape(),
                ));
            }
            None => 1,
        };
        let state_shape = [b, hk, dk, dv];
        let (mut state, sdt) = match args.opt_tensor(3)? {
            Some(s) => {
                if s.shape() != state_shape {
                    return Err(OpError::input_shape(3, format!("{state_shape:?}"), s.shape()));
                }
                (
                    s.to_f64_vec()
                        .into_iter()
                        .map(|x| round_to(DType::F32, x))
                        .collect::<Vec<_>>(),
                    num::need_float(s, 3)?,
                )
            }
            None => (vec![0.0; checked_numel(&state_shape)?], dt),
        };
        let scale = if self.scale == 0.0 {
            1.0 / (dk as f64).sqrt()
        } else {
            self.scale as f64
        };
        let f = |x: f64| round_to(DType::F32, x);
        let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
        let (qa, ka, va) = (unpack(&qv, t, hq, dk), unpack(&kv, t, hk, dk), unpack(&vv, t, hk, dv));
        let group = hq / hk;
        let mut out = vec![0.0; checked_numel(&[b, t, hq * dv])?];
        let mut vt = vec![0.0; dv];
        for bi in 0..b {
            for ti in 0..t {
                for hi in 0..hk {
                    let st = &mut state[(bi * hk + hi) * dk * dv..(bi * hk + hi + 1) * dk * dv];
                    if let (Some(dv_), Some(per_dim)) = (&decay_v, decay_per_dim) {
                        for di in 0..dk {
                            let g = if per_dim {
                                dv_[((bi * t + ti) * hk + hi) * dk + di]
                            } else {
                                dv_[(bi * t + ti) * hk + hi]
                            };
                            let e = f(f(g).exp());
                            for m in 0..dv {
                                st[di * dv + m] = f(st[di * dv + m] * e);
                            }
                        }
                    }
                    for (m, x) in vt.iter_mut().enumerate() {
                        *x = f(va(bi, hi, ti, m));
                    }
                    if let Some(bv) = &beta_v {
                        let bh = if beta_heads == 1 { 0 } else { hi };
                        let be = f(bv[(bi * t + ti) * beta_heads + bh]);
                        for (m, x) in vt.iter_mut().enumerate() {
                            let retrieved: f64 = (0..dk).map(|di| st[di * dv + m] * f(ka(bi, hi, ti, di))).sum();
                            *x = f(be * f(*x - f(retrieved)));
                        }
                    }
                    for di in 0..dk {
                        let kd = f(ka(bi, hi, ti, di));
                        for m in 0..dv {
                            st[di * dv + m] = f(st[di * dv + m] + f(kd * vt[m]));
                        }
                    }
                }
                for hi in 0..hq {
                    let kh = hi / group;
                    let st = &state[(bi * hk + kh) * dk * dv..(bi * hk + kh + 1) * dk * dv];
                    for m in 0..dv {
                        let acc: f64 = (0..dk).map(|di| f(qa(bi, hi, ti, di)) * st[di * dv + m]).sum();
                        out[(bi * t + ti) * hq * dv + hi * dv + m] = f(scale * f(acc));
                    }
                }
            }
        }
        Ok(smallvec::smallvec![
            num::float_tensor(dt, vec![b, t, hq * dv], out)?.into(),
            num::float_tensor(sdt, state_shape.to_vec(), state)?.into(),
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = crate::util::input_dtype(inputs, 0);
        let sdt = crate::util::input_dtype(inputs, 3).or(dt);
        let (q, k, v) = (in_shape(inputs, 0), in_shape(inputs, 1), in_shape(inputs, 2));
        let (mut y, mut st) = (None, None);
        if let (Some(q), Some(k), Some(v)) = (q, k, v)
            && q.len() == 3
            && k.len() == 3
            && v.len() == 3
        {
            let dvd = num::dim_div(&v[2], self.kv_num_heads);
            let dkd = num::dim_div(&k[2], self.kv_num_heads);
            if let Some(dvd) = &dvd {
                y = dim_mul(dvd, &Dim::Fixed(self.q_num_heads)).map(|hd| vec![q[0].clone(), q[1].clone(), hd]);
            }
            if let (Some(dkd), Some(dvd)) = (dkd, dvd) {
                st = Some(vec![q[0].clone(), Dim::Fixed(self.kv_num_heads), dkd, dvd]);
            }
        }
        Ok(vec![tt(dt, y), tt(sdt, st)])
    }
}

/// Values of a modifier's result, which must keep the score tensor's shape.
fn read_mod(t: &Tensor, shape: &[usize], which: &'static str) -> Result<Vec<f64>> {
    if t.shape() != shape || !t.dtype().is_float() {
        return Err(OpError::subgraph(
            which,
            format!("a float tensor of shape {shape:?}"),
            format!("{}{:?}", t.dtype(), t.shape()),
        ));
    }
    Ok(t.to_f64_vec())
}

/// `FlexAttention` (`ai.onnx.preview`): scaled dot-product attention with GQA, softmax in
/// `softmax_precision` (f32 for 16-bit inputs by default). The `score_mod` / `prob_mod`
/// subgraphs are run by the runtime through [`FlexAttention::eval_with`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct FlexAttention {
    pub scale: Option<f32>,
    pub softmax_precision: Option<DType>,
}

impl FlexAttention {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        self.eval_with(args, &mut |t| Ok(t), &mut |t| Ok(t))
    }

    /// Evaluation with the `score_mod` and `prob_mod` modifiers applied to the whole score
    /// tensor (after scaling, in the softmax precision) and the whole probability tensor; the
    /// runtime passes its sub-programs here, plain `eval` passes identities.
    pub fn eval_with(
        &self,
        args: &Args<'_>,
        score_mod: &mut dyn FnMut(Tensor) -> Result<Tensor>,
        prob_mod: &mut dyn FnMut(Tensor) -> Result<Tensor>,
    ) -> Result<crate::Outputs> {
        let (q, k, v) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let dt = num::need_float(q, 0)?;
        for (i, t) in [q, k, v].into_iter().enumerate() {
            num::need_rank(t, i, 4)?;
        }
        let (b, hq, l, e) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let (hk, s) = (k.shape()[1], k.shape()[2]);
        let ev = v.shape()[3];
        if k.shape() != [b, hk, s, e] {
            return Err(OpError::inputs(
                0,
                1,
                "Q and K of the same batch and head size",
                q.shape(),
                k.shape(),
            ));
        }
        if v.shape()[..3] != [b, hk, s] {
            return Err(OpError::inputs(
                1,
                2,
                "K and V of the same batch, heads and sequence",
                k.shape(),
                v.shape(),
            ));
        }
        if hk == 0 || hq % hk != 0 {
            return Err(OpError::inputs(
                0,
                1,
                format!("Q's heads ({hq}) a multiple of K's ({hk})"),
                q.shape(),
                k.shape(),
            ));
        }
        let cdt = self
            .softmax_precision
            .unwrap_or(if dt == DType::F64 { DType::F64 } else { DType::F32 });
        let scale = self.scale.map_or(1.0 / (e as f64).sqrt(), |s| s as f64);
        let sq = round_to(dt, (scale as f32).sqrt() as f64);
        let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
        let group = hq / hk;
        let rows = b * hq * l;
        // Scores [b, hq, l, s] in the softmax precision.
        let mut scores = vec![0.0; checked_numel(&[b, hq, l, s])?];
        for bi in 0..b {
            for hi in 0..hq {
                let kh = hi / group;
                for li in 0..l {
                    let qrow = &qv[((bi * hq + hi) * l + li) * e..][..e];
                    let srow = &mut scores[((bi * hq + hi) * l + li) * s..][..s];
                    for (j, pj) in srow.iter_mut().enumerate() {
                        let krow = &kv[((bi * hk + kh) * s + j) * e..][..e];
                        let dot: f64 = qrow
                            .iter()
                            .zip(krow)
                            .map(|(a, c)| round_to(dt, a * sq) * round_to(dt, c * sq))
                            .sum();
                        *pj = round_to(cdt, round_to(dt, dot));
                    }
                }
            }
        }
        let shape = vec![b, hq, l, s];
        let modded = score_mod(num::float_tensor(cdt, shape.clone(), scores)?)?;
        let mut p = read_mod(&modded, &shape, "score_mod")?;
        for r in 0..rows {
            let row = &mut p[r * s..][..s];
            let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for pj in row.iter_mut() {
                *pj = round_to(cdt, (*pj - mx).exp());
                sum += *pj;
            }
            let sum = round_to(cdt, sum);
            for pj in row.iter_mut() {
                *pj = round_to(cdt, *pj / sum);
            }
        }
        let modded = prob_mod(num::float_tensor(cdt, shape.clone(), p)?)?;
        let p = read_mod(&modded, &shape, "prob_mod")?;
        let mut y = vec![0.0; checked_numel(&[b, hq, l, ev])?];
        for bi in 0..b {
            for hi in 0..hq {
                let kh = hi / group;
                for li in 0..l {
                    let prow = &p[((bi * hq + hi) * l + li) * s..][..s];
                    let yrow = &mut y[((bi * hq + hi) * l + li) * ev..][..ev];
                    for (j, &pr) in prow.iter().enumerate() {
                        let vrow = &vv[((bi * hk + kh) * s + j) * ev..][..ev];
                        for (yv, &x) in yrow.iter_mut().zip(vrow) {
                            *yv += round_to(cdt, pr) * round_to(cdt, x);
                        }
                    }
                }
            }
        }
        Ok(smallvec::smallvec![
            num::float_tensor(v.dtype(), vec![b, hq, l, ev], y)?.into()
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (in_shape(inputs, 0), in_shape(inputs, 2)) {
            (Some(q), Some(v)) if q.len() == 4 && v.len() == 4 => {
                Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()])
            }
            _ => None,
        };
        Ok(vec![tt(crate::util::input_dtype(inputs, 2), shape)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;
    use kiln_tensor::Tensor;

    fn eval1(out: Result<crate::Outputs>) -> Vec<f64> {
        out.unwrap()[0].as_tensor().unwrap().to_f64_vec()
    }

    #[test]
    fn rotary_quarter_turn() {
        // One head of size 2 at position 0 with cos 0, sin 1: (x1, x2) -> (-x2, x1).
        let x = Value::Tensor(Tensor::from_vec(vec![1, 1, 1, 2], vec![3.0f32, 5.0]).unwrap());
        let c = Value::Tensor(Tensor::from_vec(vec![1, 1, 1], vec![0.0f32]).unwrap());
        let s = Value::Tensor(Tensor::from_vec(vec![1, 1, 1], vec![1.0f32]).unwrap());
        let op = RotaryEmbedding {
            interleaved: false,
            rotary_embedding_dim: 0,
            num_heads: None,
            contrib: false,
        };
        assert_eq!(
            eval1(op.eval(&Args::new(&[Some(&x), Some(&c), Some(&s)]))),
            vec![-5.0, 3.0]
        );
    }

    #[test]
    fn contrib_rotary_reads_a_one_element_position_as_an_offset() {
        // Two positions of one head of size 2 (3-D input, heads from the cache width); the
        // caches' rows 0..3 turn by 0, 90 and 180 degrees. Offset 1 uses rows 1 and 2.
        let x = Value::Tensor(Tensor::from_vec(vec![1, 2, 2], vec![3.0f32, 5.0, 3.0, 5.0]).unwrap());
        let c = Value::Tensor(Tensor::from_vec(vec![3, 1], vec![1.0f32, 0.0, -1.0]).unwrap());
        let s = Value::Tensor(Tensor::from_vec(vec![3, 1], vec![0.0f32, 1.0, 0.0]).unwrap());
        let p = Value::Tensor(Tensor::from_vec(vec![1], vec![1i64]).unwrap());
        let op = RotaryEmbedding {
            interleaved: false,
            rotary_embedding_dim: 0,
            num_heads: None,
            contrib: true,
        };
        let args = [Some(&x), Some(&c), Some(&s), Some(&p)];
        assert_eq!(eval1(op.eval(&Args::new(&args))), vec![-5.0, 3.0, -3.0, -5.0]);
        // Past the cache's end is an error, not a read out of bounds.
        let far = Value::Tensor(Tensor::from_vec(vec![1], vec![2i64]).unwrap());
        let args = [Some(&x), Some(&c), Some(&s), Some(&far)];
        assert!(matches!(
            op.eval(&Args::new(&args)),
            Err(OpError::IndexOutOfRange { .. })
        ));
    }

    #[test]
    fn swiglu_zero_and_gate() {
        // a = 0 -> 0; a = 2, alpha = 0 -> sigmoid(0) = 0.5 -> 2 * 0.5 * b(3) = 3.
        let a = Value::Tensor(Tensor::from_vec(vec![2], vec![0.0f64, 2.0]).unwrap());
        let b = Value::Tensor(Tensor::from_vec(vec![2], vec![7.0f64, 3.0]).unwrap());
        let op = SwiGlu { alpha: 0.0 };
        assert_eq!(eval1(op.eval(&Args::new(&[Some(&a), Some(&b)]))), vec![0.0, 3.0]);
    }

    #[test]
    fn causal_conv_state_shifts() {
        // k = 2, weight [1, 10], past [4], input [1, 2]: y = [4 + 10, 1 + 20], present [2].
        let x = Value::Tensor(Tensor::from_vec(vec![1, 1, 2], vec![1.0f32, 2.0]).unwrap());
        let w = Value::Tensor(Tensor::from_vec(vec![1, 1, 2], vec![1.0f32, 10.0]).unwrap());
        let p = Value::Tensor(Tensor::from_vec(vec![1, 1, 1], vec![4.0f32]).unwrap());
        let out = CausalConvWithState { silu: false }
            .eval(&Args::new(&[Some(&x), Some(&w), None, Some(&p)]))
            .unwrap();
        assert_eq!(out[0].as_tensor().unwrap().to_f64_vec(), vec![14.0, 21.0]);
        assert_eq!(out[1].as_tensor().unwrap().to_f64_vec(), vec![2.0]);
    }

    #[test]
    fn linear_attention_accumulates_outer_products() {
        // One head, d = 1, scale 1: S1 = k1 v1 = 2*3 = 6, o1 = q1 S1 = 6;
        // S2 = 6 + 1*4 = 10, o2 = 0.5 * 10 = 5.
        let q = Value::Tensor(Tensor::from_vec(vec![1, 2, 1], vec![1.0f32, 0.5]).unwrap());
        let k = Value::Tensor(Tensor::from_vec(vec![1, 2, 1], vec![2.0f32, 1.0]).unwrap());
        let v = Value::Tensor(Tensor::from_vec(vec![1, 2, 1], vec![3.0f32, 4.0]).unwrap());
        let op = LinearAttention {
            q_num_heads: 1,
            kv_num_heads: 1,
            scale: 1.0,
            update_rule: UpdateRule::Linear,
        };
        let out = op.eval(&Args::new(&[Some(&q), Some(&k), Some(&v)])).unwrap();
        assert_eq!(out[0].as_tensor().unwrap().to_f64_vec(), vec![6.0, 5.0]);
        assert_eq!(out[1].as_tensor().unwrap().to_f64_vec(), vec![10.0]);
    }
}
