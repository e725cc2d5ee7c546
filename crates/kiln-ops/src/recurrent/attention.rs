//! ONNX `Attention` (opsets 23, 24, 25): scaled dot-product attention with MHA/GQA/MQA head
//! grouping, boolean or additive masks, offset-aware causal masking, sliding windows
//! (opset 25), internal KV cache (`past_key`/`past_value`) or external cache padding
//! (`nonpad_kv_seqlen`, opset 24), softcap, the `qk_matmul_output` debug output and
//! `softmax_precision`. <https://onnx.ai/onnx/operators/onnx__Attention.html>
//!
//! Computed in f64 with the intermediate results rounded to the input precision where the
//! ONNX reference casts (scaled Q/K, logits, softmax output, Y), so half-precision results
//! follow the reference.

use super::num::{self, dim_add, dim_div, dim_mul, in_shape, round_to, tt};
use crate::error::{OpError, Result};
use crate::util::checked_numel;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

/// `Attention` with its attributes (ONNX defaults applied).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Attention {
    pub is_causal: bool,
    /// Head counts; required for 3-D inputs, absent for 4-D ones.
    pub q_num_heads: Option<usize>,
    pub kv_num_heads: Option<usize>,
    /// Scale of `Q·Kᵀ`; `None` for `1/sqrt(head_size)`.
    pub scale: Option<f32>,
    /// `0` disables soft capping.
    pub softcap: f32,
    /// What output 3 holds: 0 raw QK, 1 after softcap, 2 after bias, 3 softmax.
    pub qk_matmul_output_mode: u8,
    /// Precision of the softmax (defaults to the input type).
    pub softmax_precision: Option<DType>,
    /// Sliding window bounds, `-1` for unbounded (opset 25).
    pub left_window_size: i64,
    pub right_window_size: i64,
}

/// Q, K, V and caches brought to the 4-D (batch, heads, seq, head) layout.
struct Heads {
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    past: usize,
    /// Total kv length (past + new).
    total: usize,
    d: usize,
    dv: usize,
    q: Vec<f64>,
    /// Present key `[batch, hkv, total, d]` and value `[batch, hkv, total, dv]`.
    k: Vec<f64>,
    v: Vec<f64>,
}

/// Reads a 3-D `(batch, seq, heads*size)` or 4-D `(batch, heads, seq, size)` tensor (input
/// `index`, its head count given by the attribute `attr`) into the 4-D layout. Returns
/// (values, heads, seq, size).
fn to_4d(
    t: &Tensor,
    index: usize,
    (heads, attr): (Option<usize>, &'static str),
) -> Result<(Vec<f64>, usize, usize, usize)> {
    let s = t.shape();
    let v = t.to_f64_vec();
    match s.len() {
        4 => Ok((v, s[1], s[2], s[3])),
        3 => {
            let h = heads.ok_or_else(|| OpError::attribute(attr, ">= 1 (the inputs are 3-D)", "none"))?;
            if h == 0 {
                return Err(OpError::attribute(attr, ">= 1", 0));
            }
            if !s[2].is_multiple_of(h) {
                return Err(OpError::input_shape(
                    index,
                    format!("a hidden size (dim 2) divisible by {attr} {h}"),
                    s,
                ));
            }
            let (b, seq, d) = (s[0], s[1], s[2] / h);
            let mut out = vec![0.0; v.len()];
            for bi in 0..b {
                for si in 0..seq {
                    for hi in 0..h {
                        for di in 0..d {
                            out[((bi * h + hi) * seq + si) * d + di] = v[(bi * seq + si) * s[2] + hi * d + di];
                        }
                    }
                }
            }
            Ok((out, h, seq, d))
        }
        _ => Err(OpError::input_shape(index, "a 3-D or 4-D input", s)),
    }
}

/// Concatenates a past cache `[b, h, p, d]` and new entries `[b, h, s, d]` along the sequence.
fn concat_seq(past: Option<(&[f64], usize)>, new: &[f64], b: usize, h: usize, s: usize, d: usize) -> Vec<f64> {
    let Some((pv, p)) = past else {
        return new.to_vec();
    };
    let t = p + s;
    let mut out = Vec::with_capacity(b * h * t * d);
    for bh in 0..b * h {
        out.extend_from_slice(&pv[bh * p * d..(bh + 1) * p * d]);
        out.extend_from_slice(&new[bh * s * d..(bh + 1) * s * d]);
    }
    out
}

impl Attention {
    fn heads(&self, args: &Args<'_>) -> Result<Heads> {
        let (q, k, v) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let rank = q.rank();
        for (i, x) in [(1, k), (2, v)] {
            if x.rank() != rank {
                return Err(OpError::inputs(
                    0,
                    i,
                    "Q, K and V of the same rank",
                    q.shape(),
                    x.shape(),
                ));
            }
        }
        let (qv, hq, sq, d) = to_4d(q, 0, (self.q_num_heads, "q_num_heads"))?;
        let (kv, hkv, skv, dk) = to_4d(k, 1, (self.kv_num_heads, "kv_num_heads"))?;
        let (vv, hv, svv, dv) = to_4d(v, 2, (self.kv_num_heads, "kv_num_heads"))?;
        let batch = q.shape()[0];
        for (i, x) in [(1, k), (2, v)] {
            if x.shape()[0] != batch {
                return Err(OpError::inputs(
                    0,
                    i,
                    "Q, K and V of the same batch size",
                    q.shape(),
                    x.shape(),
                ));
            }
        }
        if dk != d {
            return Err(OpError::inputs(
                0,
                1,
                format!("Q and K of the same head size ({d} and {dk})"),
                q.shape(),
                k.shape(),
            ));
        }
        if hv != hkv || svv != skv {
            return Err(OpError::inputs(
                1,
                2,
                "K and V of the same heads and sequence length",
                k.shape(),
                v.shape(),
            ));
        }
        if hkv == 0 || hq % hkv != 0 {
            return Err(OpError::inputs(
                0,
                1,
                format!("Q's heads ({hq}) a multiple of K's ({hkv})"),
                q.shape(),
                k.shape(),
            ));
        }
        let (pk, pv) = (args.opt_tensor(4)?, args.opt_tensor(5)?);
        let (past, kc, vc) = match (pk, pv) {
            (None, None) => (0, kv, vv),
            (Some(pk), Some(pv)) => {
                let p = pk.shape().get(2).copied().unwrap_or(0);
                if pk.shape() != [batch, hkv, p, d] {
                    return Err(OpError::input_shape(
                        4,
                        format!("[{batch}, {hkv}, past length, {d}]"),
                        pk.shape(),
                    ));
                }
                if pv.shape() != [batch, hkv, p, dv] {
                    return Err(OpError::input_shape(
                        5,
                        format!("[{batch}, {hkv}, {p}, {dv}]"),
                        pv.shape(),
                    ));
                }
                let kc = concat_seq(Some((&pk.to_f64_vec(), p)), &kv, batch, hkv, skv, d);
                let vc = concat_seq(Some((&pv.to_f64_vec(), p)), &vv, batch, hkv, skv, dv);
                (p, kc, vc)
            }
            // past_key and past_value come together.
            (Some(_), None) => return Err(OpError::MissingInput { index: 5 }),
            (None, Some(_)) => return Err(OpError::MissingInput { index: 4 }),
        };
        Ok(Heads {
            batch,
            hq,
            hkv,
            sq,
            past,
            total: past + skv,
            d,
            dv,
            q: qv,
            k: kc,
            v: vc,
        })
    }

    /// The additive bias `[batch, hq, sq, total]` from the mask, causal frontier, window and
    /// padding lengths.
    fn bias(&self, args: &Args<'_>, h: &Heads, dt: DType) -> Result<Vec<f64>> {
        let (b, hq, sq, t) = (h.batch, h.hq, h.sq, h.total);
        let n = checked_numel(&[b, hq, sq, t])?;
        let mut bias = vec![0.0f64; n];
        let nonpad = match args.opt_tensor(6)? {
            None => None,
            Some(np) => {
                if h.past > 0 || args.opt_tensor(4)?.is_some() {
                    return Err(OpError::input_value(
                        6,
                        "no nonpad_kv_seqlen beside past_key and past_value",
                        format!("shape {:?}", np.shape()),
                    ));
                }
                let v = np
                    .to_i64_vec()
                    .ok_or_else(|| OpError::input_value(6, "integer lengths", format!("a {} tensor", np.dtype())))?;
                if v.len() != b {
                    return Err(OpError::input_shape(
                        6,
                        format!("{b} lengths, one per batch entry"),
                        np.shape(),
                    ));
                }
                Some(v)
            }
        };
        // Causal / window offset per batch.
        let offset = |bi: usize| -> i64 {
            match &nonpad {
                Some(v) => v[bi] - sq as i64,
                None => h.past as i64,
            }
        };
        if let Some(m) = args.opt_tensor(3)? {
            let ms = m.shape();
            if ms.len() > 4 || ms.is_empty() {
                return Err(OpError::input_shape(3, "rank 1 to 4", ms));
            }
            let target = [b, hq, sq, t];
            let off = 4 - ms.len();
            let last = ms[ms.len() - 1];
            if last > t {
                return Err(OpError::input_shape(
                    3,
                    format!("a last dim at most the total sequence length {t}"),
                    ms,
                ));
            }
            for (i, &d) in ms.iter().enumerate().take(ms.len() - 1) {
                if d != 1 && d != target[i + off] {
                    return Err(OpError::input_shape(
                        3,
                        format!("a shape that broadcasts to {target:?}"),
                        ms,
                    ));
                }
            }
            let is_bool = m.dtype() == DType::Bool;
            let mv = m.to_f64_vec();
            // Broadcast strides of the mask per target dim; the last dim is never broadcast
            // (a shorter mask is padded with -inf / false, as the reference does).
            let mut mstr = [0usize; 4];
            let mut acc = 1usize;
            for i in (0..ms.len()).rev() {
                mstr[i + off] = if ms[i] == 1 && i + 1 != ms.len() { 0 } else { acc };
                acc *= ms[i];
            }
            let mut idx = 0;
            for bi in 0..b {
                for hi in 0..hq {
                    for i in 0..sq {
                        for j in 0..t {
                            let val = if j >= last {
                                f64::NEG_INFINITY
                            } else {
                                let mi = bi * mstr[0] + hi * mstr[1] + i * mstr[2] + j * mstr[3];
                                let x = mv[mi];
                                if is_bool {
                                    if x != 0.0 { 0.0 } else { f64::NEG_INFINITY }
                                } else {
                                    round_to(dt, x)
                                }
                            };
                            bias[idx] = val;
                            idx += 1;
                        }
                    }
                }
            }
        }
        let (lw, rw) = (self.left_window_size, self.right_window_size);
        let window = lw >= 0 || rw >= 0;
        if self.is_causal || window || nonpad.is_some() {
            let mut idx = 0;
            for bi in 0..b {
                let o = offset(bi);
                for _ in 0..hq {
                    for i in 0..sq {
                        for j in 0..t {
                            let diff = i as i64 + o - j as i64;
                            let mut allowed = true;
                            if self.is_causal && diff < 0 {
                                allowed = false;
                            }
                            if lw >= 0 && diff > lw {
                                allowed = false;
                            }
                            if rw >= 0 && -diff > rw {
                                allowed = false;
                            }
                            if let Some(np) = &nonpad
                                && j as i64 >= np[bi]
                            {
                                allowed = false;
                            }
                            if !allowed {
                                bias[idx] += f64::NEG_INFINITY;
                            }
                            idx += 1;
                        }
                    }
                }
            }
        }
        Ok(bias)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if let Some(y) = self.eval_f32(args)? {
            return Ok(y);
        }
        let q_t = args.tensor(0)?;
        let dt = num::need_float(q_t, 0)?;
        let kdt = num::need_float(args.tensor(1)?, 1)?;
        let vdt = num::need_float(args.tensor(2)?, 2)?;
        let h = self.heads(args)?;
        let (b, hq, hkv, sq, t, d, dv) = (h.batch, h.hq, h.hkv, h.sq, h.total, h.d, h.dv);
        let group = hq / hkv;
        let bias = self.bias(args, &h, dt)?;
        let scale = match self.scale {
            Some(s) => s as f64,
            None => 1.0 / (d as f64).sqrt(),
        };
        let sc = round_to(dt, scale.sqrt());
        let qs: Vec<f64> = h.q.iter().map(|&x| round_to(dt, x * sc)).collect();
        let ks: Vec<f64> = h.k.iter().map(|&x| round_to(dt, x * sc)).collect();
        let pdt = self.softmax_precision.unwrap_or(dt);
        let rows = checked_numel(&[b, hq, sq])?;
        let mut qk_out = vec![0.0f64; checked_numel(&[b, hq, sq, t])?];
        let mut y = vec![0.0f64; checked_numel(&[b, hq, sq, dv])?];
        let mut logits = vec![0.0f64; t];
        let mut probs = vec![0.0f64; t];
        for row in 0..rows {
            let bi = row / (hq * sq);
            let hi = (row / sq) % hq;
            let kh = hi / group;
            let qrow = &qs[row * d..(row + 1) * d];
            let kbase = (bi * hkv + kh) * t;
            let brow = &bias[row * t..(row + 1) * t];
            for j in 0..t {
                let krow = &ks[(kbase + j) * d..(kbase + j + 1) * d];
                let raw = round_to(dt, qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>());
                let capped = if self.softcap > 0.0 {
                    let c = self.softcap as f64;
                    round_to(dt, round_to(dt, (raw / c).tanh()) * c)
                } else {
                    raw
                };
                let biased = round_to(dt, capped + brow[j]);
                qk_out[row * t + j] = match self.qk_matmul_output_mode {
                    0 => raw,
                    1 => capped,
                    _ => biased,
                };
                logits[j] = round_to(pdt, biased);
            }
            // Softmax; a row whose bias is all -inf (no attendable key) gives zeros.
            let all_masked = t == 0 || brow.iter().all(|&x| x == f64::NEG_INFINITY);
            if all_masked {
                probs.iter_mut().for_each(|p| *p = 0.0);
            } else {
                let mut mx = f64::NEG_INFINITY;
                for &x in &logits {
                    if x.is_nan() || x > mx {
                        mx = x;
                        if x.is_nan() {
                            break;
                        }
                    }
                }
                let safe = if mx == f64::NEG_INFINITY { 0.0 } else { mx };
                let mut s = 0.0;
                for j in 0..t {
                    probs[j] = round_to(pdt, (round_to(pdt, logits[j] - safe)).exp());
                    // numpy sums bfloat16 (an ml_dtypes user type) one rounded add at a time;
                    // the native float types accumulate in at least f32.
                    s = if pdt == DType::BF16 {
                        round_to(pdt, s + probs[j])
                    } else {
                        s + probs[j]
                    };
                }
                let s = round_to(pdt, s);
                let s = if s == 0.0 { 1.0 } else { s };
                for p in probs.iter_mut() {
                    *p = round_to(dt, round_to(pdt, *p / s));
                }
            }
            if self.qk_matmul_output_mode == 3 {
                qk_out[row * t..(row + 1) * t].copy_from_slice(&probs);
            }
            let vbase = (bi * hkv + kh) * t;
            let yrow = &mut y[row * dv..(row + 1) * dv];
            for (j, &p) in probs.iter().enumerate() {
                let vr = &h.v[(vbase + j) * dv..(vbase + j + 1) * dv];
                for (yv, &vv) in yrow.iter_mut().zip(vr) {
                    *yv += p * vv;
                }
            }
        }
        // Y back to the input layout.
        let y_t = if q_t.rank() == 3 {
            let mut out = vec![0.0f64; y.len()];
            for bi in 0..b {
                for hi in 0..hq {
                    for i in 0..sq {
                        for c in 0..dv {
                            out[(bi * sq + i) * hq * dv + hi * dv + c] = y[((bi * hq + hi) * sq + i) * dv + c];
                        }
                    }
                }
            }
            num::float_tensor(dt, vec![b, sq, hq * dv], out)?
        } else {
            num::float_tensor(dt, vec![b, hq, sq, dv], y)?
        };
        let pk = num::float_tensor(kdt, vec![b, hkv, t, d], h.k)?;
        let pv = num::float_tensor(vdt, vec![b, hkv, t, dv], h.v)?;
        let qk = num::float_tensor(dt, vec![b, hq, sq, t], qk_out)?;
        Ok(smallvec::smallvec![y_t.into(), pk.into(), pv.into(), qk.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = num_dtype(inputs, 0);
        let (qs, ks, vs) = (in_shape(inputs, 0), in_shape(inputs, 1), in_shape(inputs, 2));
        // An absent past gives `None`; a present one of unknown shape leaves the length open.
        let past_given = matches!(inputs.get(4).map(|i| i.ty), Some(ValueType::Tensor(_)));
        let past = in_shape(inputs, 4);
        let mut y = None;
        let mut pk = None;
        let mut pv = None;
        let mut qk = None;
        if let (Some(qs), Some(ks), Some(vs)) = (&qs, &ks, &vs) {
            let four = |s: &Vec<Dim>, heads: Option<usize>| -> Option<(Dim, Dim, Dim, Dim)> {
                match s.len() {
                    4 => Some((s[0].clone(), s[1].clone(), s[2].clone(), s[3].clone())),
                    3 => {
                        let h = heads?;
                        Some((s[0].clone(), Dim::Fixed(h), s[1].clone(), dim_div(&s[2], h)?))
                    }
                    _ => None,
                }
            };
            let q4 = four(qs, self.q_num_heads);
            let k4 = four(ks, self.kv_num_heads);
            let v4 = four(vs, self.kv_num_heads);
            if let (Some(q4), Some(k4), Some(v4)) = (q4, k4, v4) {
                let total = match &past {
                    None if past_given => None,
                    None => Some(k4.2.clone()),
                    Some(p) if p.len() == 4 => dim_add(&p[2], &k4.2),
                    Some(_) => None,
                };
                y = if qs.len() == 4 {
                    Some(vec![q4.0.clone(), q4.1.clone(), q4.2.clone(), v4.3.clone()])
                } else {
                    dim_mul(&q4.1, &v4.3).map(|hd| vec![q4.0.clone(), q4.2.clone(), hd])
                };
                if let Some(total) = total {
                    pk = Some(vec![k4.0.clone(), k4.1.clone(), total.clone(), k4.3.clone()]);
                    pv = Some(vec![v4.0.clone(), v4.1.clone(), total.clone(), v4.3.clone()]);
                    qk = Some(vec![q4.0.clone(), q4.1.clone(), q4.2.clone(), total]);
                }
            }
        }
        Ok(vec![
            tt(dt, y),
            tt(num_dtype(inputs, 1), pk),
            tt(num_dtype(inputs, 2), pv),
            tt(dt, qk),
        ])
    }

    pub fn macs(&self, inputs: &[InferInput<'_>], outputs: &[ValueType]) -> u64 {
        // Q·Kᵀ and P·V: (Q elements + Y elements) * total kv length.
        let shape = |t: Option<&ValueType>| t.and_then(|o| o.tensor()).and_then(|t| t.fixed_shape());
        let count = |s: &[usize]| s.iter().map(|&x| x as u64).product::<u64>();
        match (
            shape(outputs.get(3)),
            shape(outputs.first()),
            shape(inputs.first().map(|i| i.ty)),
        ) {
            (Some(qk), Some(y), Some(q)) if qk.len() == 4 => {
                (count(&q).saturating_add(count(&y))).saturating_mul(qk[3] as u64)
            }
            _ => 0,
        }
    }
}

fn num_dtype(inputs: &[InferInput<'_>], i: usize) -> Option<DType> {
    crate::util::input_dtype(inputs, i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn att() -> Attention {
        Attention {
            is_causal: false,
            q_num_heads: None,
            kv_num_heads: None,
            scale: None,
            softcap: 0.0,
            qk_matmul_output_mode: 0,
            softmax_precision: None,
            left_window_size: -1,
            right_window_size: -1,
        }
    }

    fn run(op: &Attention, inputs: &[Option<Tensor>]) -> Vec<Vec<f64>> {
        let vals: Vec<Option<Value>> = inputs.iter().map(|t| t.clone().map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = op.eval(&Args::new(&refs)).unwrap();
        out.iter().map(|v| v.as_tensor().unwrap().to_f64_vec()).collect()
    }

    #[test]
    fn single_query_two_keys_by_hand() {
        // Q = [1, 0], K = [[1, 0], [0, 0]], V = [[1], [3]], head size 2, scale 1/sqrt(2):
        // logits = [1/sqrt2, 0]; p0 = e^a/(e^a+1) with a = 1/sqrt2; y = p0*1 + (1-p0)*3.
        let q = Tensor::from_vec(vec![1, 1, 1, 2], vec![1.0f64, 0.0]).unwrap();
        let k = Tensor::from_vec(vec![1, 1, 2, 2], vec![1.0f64, 0.0, 0.0, 0.0]).unwrap();
        let v = Tensor::from_vec(vec![1, 1, 2, 1], vec![1.0f64, 3.0]).unwrap();
        let out = run(&att(), &[Some(q), Some(k), Some(v)]);
        let a = 1.0 / 2f64.sqrt();
        let p0 = a.exp() / (a.exp() + 1.0);
        assert!((out[0][0] - (p0 + 3.0 * (1.0 - p0))).abs() < 1e-12);
        assert!((out[3][0] - a).abs() < 1e-12);
    }

    #[test]
    fn causal_and_fully_masked_rows() {
        // Causal with two queries and two keys: query 0 only sees key 0 -> y0 = v0.
        let q = Tensor::from_vec(vec![1, 1, 2, 1], vec![1.0f64, 1.0]).unwrap();
        let k = Tensor::from_vec(vec![1, 1, 2, 1], vec![1.0f64, 1.0]).unwrap();
        let v = Tensor::from_vec(vec![1, 1, 2, 1], vec![5.0f64, 7.0]).unwrap();
        let op = Attention {
            is_causal: true,
            ..att()
        };
        let out = run(&op, &[Some(q.clone()), Some(k.clone()), Some(v.clone())]);
        // Equal logits for query 1 -> mean of 5 and 7.
        assert_eq!(out[0], vec![5.0, 6.0]);
        // A boolean mask that hides every key of row 0 gives a zero row.
        let m = Tensor::from_vec(vec![2, 2], vec![false, false, true, true]).unwrap();
        let out = run(&att(), &[Some(q), Some(k), Some(v), Some(m)]);
        assert_eq!(out[0], vec![0.0, 6.0]);
    }
}
