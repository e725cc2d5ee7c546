//! ONNX `RNN`, `GRU` and `LSTM` (opsets 7, 14 and 22; opset 1/3 forms import the same way):
//! forward, reverse and bidirectional directions, configurable activations with their
//! alpha/beta, `clip`, `sequence_lens`, `layout` 0/1, initial states, GRU
//! `linear_before_reset`, LSTM peepholes and `input_forget`.
//! <https://onnx.ai/onnx/operators/onnx__LSTM.html>,
//! <https://onnx.ai/onnx/operators/onnx__GRU.html>, <https://onnx.ai/onnx/operators/onnx__RNN.html>
//!
//! Computed in f64 and rounded to the input type at the outputs.

use super::num::{self, in_shape, tt};
use crate::error::{OpError, Result};
use crate::util::checked_numel;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::Tensor;

/// An activation function of the recurrent ops, parameters resolved.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub enum Activation {
    Relu,
    Tanh,
    Sigmoid,
    Affine { alpha: f32, beta: f32 },
    LeakyRelu { alpha: f32 },
    ThresholdedRelu { alpha: f32 },
    ScaledTanh { alpha: f32, beta: f32 },
    HardSigmoid { alpha: f32, beta: f32 },
    Elu { alpha: f32 },
    Softsign,
    Softplus,
}

impl Activation {
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Activation::Affine { alpha, beta } => alpha as f64 * x + beta as f64,
            Activation::LeakyRelu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha as f64 * x
                }
            }
            Activation::ThresholdedRelu { alpha } => {
                if x > alpha as f64 {
                    x
                } else {
                    0.0
                }
            }
            Activation::ScaledTanh { alpha, beta } => alpha as f64 * (beta as f64 * x).tanh(),
            Activation::HardSigmoid { alpha, beta } => (alpha as f64 * x + beta as f64).clamp(0.0, 1.0),
            Activation::Elu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha as f64 * (x.exp() - 1.0)
                }
            }
            Activation::Softsign => x / (1.0 + x.abs()),
            Activation::Softplus => {
                // log(1 + e^x) without overflow.
                if x > 0.0 {
                    x + (-x).exp().ln_1p()
                } else {
                    x.exp().ln_1p()
                }
            }
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Reverse,
    Bidirectional,
}

impl Direction {
    pub fn count(self) -> usize {
        if self == Direction::Bidirectional { 2 } else { 1 }
    }
}

/// Which cell the op runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum Cell {
    /// `Ht = f(Xt·Wᵀ + Ht-1·Rᵀ + Wb + Rb)`; one activation per direction.
    Rnn,
    /// Gates z, r, h; activations f (gates) and g (candidate) per direction.
    Gru { linear_before_reset: bool },
    /// Gates i, o, f, c; activations f (gates), g (cell input), h (output) per direction.
    Lstm { input_forget: bool },
}

impl Cell {
    pub fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm { .. } => 4,
        }
    }
    pub fn activations_per_direction(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 2,
            Cell::Lstm { .. } => 3,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Cell::Rnn => "RNN",
            Cell::Gru { .. } => "GRU",
            Cell::Lstm { .. } => "LSTM",
        }
    }
}

/// `RNN`, `GRU` or `LSTM` with attributes resolved.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Recurrent {
    pub cell: Cell,
    /// From the attribute when given (checked against `R`'s shape).
    pub hidden_size: Option<usize>,
    pub direction: Direction,
    /// `activations_per_direction` per direction, forward first (always full length).
    pub activations: Vec<Activation>,
    /// Bounds activation inputs to `[-clip, clip]`.
    pub clip: Option<f32>,
    /// `layout = 1`: batch-first X, Y, initial and final states.
    pub batch_first: bool,
    /// The recurrent product may quantize the hidden state at each step (ONNX Runtime's
    /// `DynamicQuantizeLSTM`, which quantizes it to 8 bits): with int8-coded R the fast path
    /// multiplies 16-bit codes of the state (2^-16 of its largest magnitude) in exact integer
    /// sums. False (every standard RNN, GRU and LSTM): the state stays f32.
    #[serde(default)]
    pub quantized_state: bool,
}

/// One direction's weights, as f64 matrices.
struct DirWeights<'a> {
    /// `[gates*H, I]`
    w: &'a [f64],
    /// `[gates*H, H]`
    r: &'a [f64],
    /// `[2*gates*H]` (Wb then Rb)
    b: &'a [f64],
    /// `[3*H]` (LSTM i, o, f)
    p: &'a [f64],
}

/// `out[g] = sum_k m[g, k] * x[k]` for rows `rows` of a row-major `[*, cols]` matrix.
fn matvec(m: &[f64], cols: usize, x: &[f64], out: &mut [f64]) {
    for (g, o) in out.iter_mut().enumerate() {
        let row = &m[g * cols..(g + 1) * cols];
        *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
    }
}

impl Recurrent {
    pub fn name(&self) -> &'static str {
        self.cell.name()
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x_t = args.tensor(0)?;
        let dt = num::need_float(x_t, 0)?;
        let (w_t, r_t) = (args.tensor(1)?, args.tensor(2)?);
        num::need_rank(x_t, 0, 3)?;
        num::need_rank(w_t, 1, 3)?;
        num::need_rank(r_t, 2, 3)?;
        let nd = self.direction.count();
        let g = self.cell.gates();
        let (seq, batch, input) = if self.batch_first {
            (x_t.shape()[1], x_t.shape()[0], x_t.shape()[2])
        } else {
            (x_t.shape()[0], x_t.shape()[1], x_t.shape()[2])
        };
        let hs = r_t.shape()[2];
        if let Some(h) = self.hidden_size
            && h != hs
        {
            return Err(OpError::attribute("hidden_size", format!("{hs}, R's last dim"), h));
        }
        if w_t.shape() != [nd, g * hs, input] {
            return Err(OpError::input_shape(
                1,
                format!("[{nd}, {}, {input}]", g * hs),
                w_t.shape(),
            ));
        }
        if r_t.shape() != [nd, g * hs, hs] {
            return Err(OpError::input_shape(
                2,
                format!("[{nd}, {}, {hs}]", g * hs),
                r_t.shape(),
            ));
        }
        let w = w_t.to_f64_vec();
        let r = r_t.to_f64_vec();
        let b = match args.opt_tensor(3)? {
            Some(t) => {
                if t.shape() != [nd, 2 * g * hs] {
                    return Err(OpError::input_shape(3, format!("[{nd}, {}]", 2 * g * hs), t.shape()));
                }
                t.to_f64_vec()
            }
            None => vec![0.0; nd * 2 * g * hs],
        };
        let lens: Vec<usize> = match args.opt_tensor(4)? {
            Some(t) => {
                let v = t
                    .to_i64_vec()
                    .ok_or_else(|| OpError::input_value(4, "integer lengths", format!("a {} tensor", t.dtype())))?;
                if v.len() != batch {
                    return Err(OpError::input_shape(
                        4,
                        format!("{batch} lengths, one per batch entry"),
                        t.shape(),
                    ));
                }
                v.iter()
                    .map(|&l| {
                        usize::try_from(l)
                            .ok()
                            .filter(|&l| l <= seq)
                            .ok_or_else(|| OpError::input_value(4, format!("lengths in 0 ..= {seq}"), l))
                    })
                    .collect::<Result<_>>()?
            }
            None => vec![seq; batch],
        };
        // States in [dirs, batch, H] (converted from batch-first when layout = 1).
        let state = |i: usize, what: &str| -> Result<Vec<f64>> {
            match args.opt_tensor(i)? {
                None => Ok(vec![0.0; nd * batch * hs]),
                Some(t) => {
                    let want = if self.batch_first {
                        [batch, nd, hs]
                    } else {
                        [nd, batch, hs]
                    };
                    if t.shape() != want {
                        return Err(OpError::input_shape(i, format!("{what} of shape {want:?}"), t.shape()));
                    }
                    let v = t.to_f64_vec();
                    if !self.batch_first {
                        return Ok(v);
                    }
                    let mut out = vec![0.0; v.len()];
                    for bi in 0..batch {
                        for d in 0..nd {
                            out[(d * batch + bi) * hs..(d * batch + bi + 1) * hs]
                                .copy_from_slice(&v[(bi * nd + d) * hs..(bi * nd + d + 1) * hs]);
                        }
                    }
                    Ok(out)
                }
            }
        };
        let is_lstm = matches!(self.cell, Cell::Lstm { .. });
        let h0 = state(5, "initial_h")?;
        let c0 = if is_lstm {
            state(6, "initial_c")?
        } else {
            vec![0.0; nd * batch * hs]
        };
        let p = match (is_lstm, args.opt_tensor(7)?) {
            (true, Some(t)) => {
                if t.shape() != [nd, 3 * hs] {
                    return Err(OpError::input_shape(7, format!("[{nd}, {}]", 3 * hs), t.shape()));
                }
                t.to_f64_vec()
            }
            _ => vec![0.0; nd * 3 * hs],
        };
        let xv = x_t.to_f64_vec();
        let x_at = |t: usize, bi: usize| -> &[f64] {
            let off = if self.batch_first {
                (bi * seq + t) * input
            } else {
                (t * batch + bi) * input
            };
            &xv[off..off + input]
        };
        let apd = self.cell.activations_per_direction();
        if self.activations.len() != nd * apd {
            return Err(OpError::attribute(
                "activations",
                format!("{} functions, {apd} per direction", nd * apd),
                format!("{} functions", self.activations.len()),
            ));
        }
        // Y in [seq, dirs, batch, H].
        let mut y = vec![0.0f64; checked_numel(&[seq, nd, batch, hs])?];
        let mut yh = h0.clone();
        let mut yc = c0.clone();
        let clip = |v: f64| match self.clip {
            Some(c) => v.clamp(-(c as f64), c as f64),
            None => v,
        };
        let mut gx = vec![0.0; g * hs];
        let mut gh = vec![0.0; g * hs];
        for d in 0..nd {
            let reverse = self.direction == Direction::Reverse || d == 1;
            let wd = DirWeights {
                w: &w[d * g * hs * input..(d + 1) * g * hs * input],
                r: &r[d * g * hs * hs..(d + 1) * g * hs * hs],
                b: &b[d * 2 * g * hs..(d + 1) * 2 * g * hs],
                p: &p[d * 3 * hs..(d + 1) * 3 * hs],
            };
            let acts = &self.activations[d * apd..(d + 1) * apd];
            for (bi, &len) in lens.iter().enumerate() {
                let so = (d * batch + bi) * hs;
                let mut h = h0[so..so + hs].to_vec();
                let mut c = c0[so..so + hs].to_vec();
                for step in 0..len {
                    let t = if reverse { len - 1 - step } else { step };
                    matvec(wd.w, input, x_at(t, bi), &mut gx);
                    matvec(wd.r, hs, &h, &mut gh);
                    let (wb, rb) = wd.b.split_at(g * hs);
                    match self.cell {
                        Cell::Rnn => {
                            for k in 0..hs {
                                h[k] = acts[0].apply(clip(gx[k] + gh[k] + wb[k] + rb[k]));
                            }
                        }
                        Cell::Gru { linear_before_reset } => {
                            // Gate order z, r, h.
                            let mut hn = vec![0.0; hs];
                            let mut z = vec![0.0; hs];
                            let mut rg = vec![0.0; hs];
                            for k in 0..hs {
                                z[k] = acts[0].apply(clip(gx[k] + gh[k] + wb[k] + rb[k]));
                                let j = hs + k;
                                rg[k] = acts[0].apply(clip(gx[j] + gh[j] + wb[j] + rb[j]));
                            }
                            let rh = &wd.r[2 * hs * hs..3 * hs * hs];
                            if linear_before_reset {
                                for k in 0..hs {
                                    let j = 2 * hs + k;
                                    hn[k] = acts[1].apply(clip(gx[j] + rg[k] * (gh[j] + rb[j]) + wb[j]));
                                }
                            } else {
                                let rhp: Vec<f64> = rg.iter().zip(&h).map(|(a, b)| a * b).collect();
                                let mut tmp = vec![0.0; hs];
                                matvec(rh, hs, &rhp, &mut tmp);
                                for k in 0..hs {
                                    let j = 2 * hs + k;
                                    hn[k] = acts[1].apply(clip(gx[j] + tmp[k] + rb[j] + wb[j]));
                                }
                            }
                            for k in 0..hs {
                                h[k] = (1.0 - z[k]) * hn[k] + z[k] * h[k];
                            }
                        }
                        Cell::Lstm { input_forget } => {
                            // Gate order i, o, f, c; peepholes i, o, f.
                            let pre = |gate: usize, k: usize| {
                                let j = gate * hs + k;
                                gx[j] + gh[j] + wb[j] + rb[j]
                            };
                            for k in 0..hs {
                                let i = acts[0].apply(clip(pre(0, k) + wd.p[k] * c[k]));
                                let f = if input_forget {
                                    1.0 - i
                                } else {
                                    acts[0].apply(clip(pre(2, k) + wd.p[2 * hs + k] * c[k]))
                                };
                                let cc = acts[1].apply(clip(pre(3, k)));
                                c[k] = f * c[k] + i * cc;
                                let o = acts[0].apply(clip(pre(1, k) + wd.p[hs + k] * c[k]));
                                h[k] = o * acts[2].apply(c[k]);
                            }
                        }
                    }
                    let yo = ((t * nd + d) * batch + bi) * hs;
                    y[yo..yo + hs].copy_from_slice(&h);
                }
                yh[so..so + hs].copy_from_slice(&h);
                yc[so..so + hs].copy_from_slice(&c);
            }
        }
        // Back to the requested layout.
        let (y_shape, y) = if self.batch_first {
            let mut out = vec![0.0; y.len()];
            for t in 0..seq {
                for d in 0..nd {
                    for bi in 0..batch {
                        let src = ((t * nd + d) * batch + bi) * hs;
                        let dst = ((bi * seq + t) * nd + d) * hs;
                        out[dst..dst + hs].copy_from_slice(&y[src..src + hs]);
                    }
                }
            }
            (vec![batch, seq, nd, hs], out)
        } else {
            (vec![seq, nd, batch, hs], y)
        };
        let state_out = |v: Vec<f64>| -> Result<Tensor> {
            if self.batch_first {
                let mut out = vec![0.0; v.len()];
                for d in 0..nd {
                    for bi in 0..batch {
                        out[(bi * nd + d) * hs..(bi * nd + d + 1) * hs]
                            .copy_from_slice(&v[(d * batch + bi) * hs..(d * batch + bi + 1) * hs]);
                    }
                }
                num::float_tensor(dt, vec![batch, nd, hs], out)
            } else {
                num::float_tensor(dt, vec![nd, batch, hs], v)
            }
        };
        let mut outs = vec![num::float_tensor(dt, y_shape, y)?.into(), state_out(yh)?.into()];
        if is_lstm {
            outs.push(state_out(yc)?.into());
        }
        Ok(outs.into())
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = crate::util::input_dtype(inputs, 0);
        let nd = Dim::Fixed(self.direction.count());
        let hs = self
            .hidden_size
            .map(Dim::Fixed)
            .or_else(|| in_shape(inputs, 2).and_then(|s| s.get(2).cloned()));
        let (mut y, mut st) = (None, None);
        if let (Some(x), Some(hs)) = (in_shape(inputs, 0), hs)
            && x.len() == 3
        {
            let (seq, batch) = if self.batch_first {
                (x[1].clone(), x[0].clone())
            } else {
                (x[0].clone(), x[1].clone())
            };
            if self.batch_first {
                y = Some(vec![batch.clone(), seq, nd.clone(), hs.clone()]);
                st = Some(vec![batch, nd, hs]);
            } else {
                y = Some(vec![seq, nd.clone(), batch.clone(), hs.clone()]);
                st = Some(vec![nd, batch, hs]);
            }
        }
        let mut out = vec![tt(dt, y), tt(dt, st.clone())];
        if matches!(self.cell, Cell::Lstm { .. }) {
            out.push(tt(dt, st));
        }
        Ok(out)
    }

    pub fn macs(&self, inputs: &[InferInput<'_>], _outputs: &[ValueType]) -> u64 {
        // seq * batch * dirs * gates*H * (I + H).
        let x = in_shape(inputs, 0).and_then(|s| s.iter().map(num::fixed).collect::<Option<Vec<_>>>());
        let r = in_shape(inputs, 2).and_then(|s| s.iter().map(num::fixed).collect::<Option<Vec<_>>>());
        match (x, r) {
            (Some(x), Some(r)) if x.len() == 3 && r.len() == 3 => {
                let (sb, i) = ((x[0] * x[1]) as u64, x[2] as u64);
                let (nd, gh, h) = (r[0] as u64, r[1] as u64, r[2] as u64);
                sb.saturating_mul(nd).saturating_mul(gh).saturating_mul(i + h)
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(op: &Recurrent, inputs: Vec<Option<Tensor>>) -> Vec<Vec<f64>> {
        let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| t.map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        op.eval(&Args::new(&refs))
            .unwrap()
            .iter()
            .map(|v| v.as_tensor().unwrap().to_f64_vec())
            .collect()
    }

    #[test]
    fn rnn_relu_by_hand() {
        // H = 1, I = 1, W = 2, R = 0.5, Relu; X = [1, -3]: h1 = 2, h2 = relu(-6 + 1) = 0.
        let op = Recurrent {
            cell: Cell::Rnn,
            hidden_size: Some(1),
            direction: Direction::Forward,
            activations: vec![Activation::Relu],
            clip: None,
            batch_first: false,
            quantized_state: false,
        };
        let x = Tensor::from_vec(vec![2, 1, 1], vec![1.0f64, -3.0]).unwrap();
        let w = Tensor::from_vec(vec![1, 1, 1], vec![2.0f64]).unwrap();
        let r = Tensor::from_vec(vec![1, 1, 1], vec![0.5f64]).unwrap();
        let out = run(&op, vec![Some(x.clone()), Some(w.clone()), Some(r.clone())]);
        assert_eq!(out[0], vec![2.0, 0.0]);
        assert_eq!(out[1], vec![0.0]);
        // Reverse: h(t=1) = relu(-6) = 0, h(t=0) = relu(2 + 0) = 2; Y_h is the t=0 state.
        let op = Recurrent {
            direction: Direction::Reverse,
            ..op
        };
        let out = run(&op, vec![Some(x), Some(w), Some(r)]);
        assert_eq!(out[0], vec![2.0, 0.0]);
        assert_eq!(out[1], vec![2.0]);
    }

    #[test]
    fn lstm_affine_gates_by_hand() {
        // All activations Affine(1, 0) (identity), H = I = 1, W = 1 for every gate, R = 0.
        // x = 2: i = o = f = c~ = 2; C = f*0 + i*c~ = 4; H = o * C = 8.
        let id = Activation::Affine { alpha: 1.0, beta: 0.0 };
        let op = Recurrent {
            cell: Cell::Lstm { input_forget: false },
            hidden_size: Some(1),
            direction: Direction::Forward,
            activations: vec![id, id, id],
            clip: None,
            batch_first: false,
            quantized_state: false,
        };
        let x = Tensor::from_vec(vec![1, 1, 1], vec![2.0f64]).unwrap();
        let w = Tensor::from_vec(vec![1, 4, 1], vec![1.0f64; 4]).unwrap();
        let r = Tensor::from_vec(vec![1, 4, 1], vec![0.0f64; 4]).unwrap();
        let out = run(&op, vec![Some(x), Some(w), Some(r)]);
        assert_eq!(out[0], vec![8.0]);
        assert_eq!(out[2], vec![4.0]);
    }
}
