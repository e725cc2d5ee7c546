//! `AttentionMask`: the additive score bias of ONNX Runtime's com.microsoft `Attention` and
//! `MultiHeadAttention` (whose mask formats depend on the mask's rank, known only at run
//! time). The importer expands those two ops into standard ops around an ONNX `Attention`
//! whose `attn_mask` this op computes.
//!
//! Inputs: 0 the mask (optional; int32 in ONNX Runtime, any numeric or bool type here), 1 the query `[B, S, ·]`, 2 the new
//! keys `[B, S_kv, ·]` or `[B, N, S_kv, ·]`, 3 the past keys `[B, N, P, ·]` (optional). The total key length is
//! `T = P + S_kv`. Output: `[B, 1, S, T]` in the query's type, `0` where a key is attended and
//! `filter_value` where it is not, summed over the mask and the causal frontier as ONNX
//! Runtime sums them. Mask formats (ONNX Runtime's):
//! - `[B]`: the end of each row's keys (keys at or after it are masked);
//! - `[2B]`: ends, then starts (keys before the start are masked too);
//! - `[B, T]`, `[B, S, T]`: 1 (non-zero) attends, 0 masks;
//! - `[B, 1, M, M]` (Megatron): rows `P..P+S`, columns `0..T` of a square mask.
//!
//! `causal` masks key `j` for query `i` when `j > P + i` (bottom-right aligned, as with a
//! cache).

use super::num::{in_shape, tt};
use crate::error::{OpError, Result};
use crate::util::checked_numel;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct AttentionMask {
    /// What a masked score gets added (ONNX Runtime's `mask_filter_value`, default -10000).
    pub filter_value: f32,
    /// Whether later keys are masked too (`unidirectional`).
    pub causal: bool,
}

impl AttentionMask {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let q = args.tensor(1)?;
        let k = args.tensor(2)?;
        let dt = q.dtype();
        if !matches!(dt, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            return Err(OpError::UnsupportedDType { index: 1, got: dt });
        }
        let &[b, s, _] = q.shape() else {
            return Err(OpError::input_shape(
                1,
                "a 3-D [batch, sequence, hidden] tensor",
                q.shape(),
            ));
        };
        let (kb, skv) = match *k.shape() {
            [kb, skv, _] | [kb, _, skv, _] => (kb, skv),
            _ => {
                return Err(OpError::input_shape(
                    2,
                    "3-D [batch, sequence, hidden] or 4-D [batch, heads, sequence, head] keys",
                    k.shape(),
                ));
            }
        };
        if kb != b {
            return Err(OpError::inputs(1, 2, "the same batch size", q.shape(), k.shape()));
        }
        let past = match args.opt_tensor(3)? {
            None => 0,
            Some(p) => match p.shape() {
                &[pb, _, pl, _] if pb == b => pl,
                other => {
                    return Err(OpError::input_shape(
                        3,
                        format!("a 4-D [{b}, heads, past, head] cache"),
                        other,
                    ));
                }
            },
        };
        let t = past
            .checked_add(skv)
            .ok_or_else(|| OpError::too_large("total sequence length", format!("{past} + {skv}")))?;
        let n = checked_numel(&[b, s, t])?;
        let filter = f64::from(self.filter_value);
        let mut out = vec![0.0f64; n];
        if let Some(m) = args.opt_tensor(0)? {
            self.apply_mask(m, &mut out, b, s, t, past, filter)?;
        }
        if self.causal {
            for (row, chunk) in out.chunks_mut(t.max(1)).enumerate() {
                let i = row % s.max(1);
                for (j, x) in chunk.iter_mut().enumerate() {
                    if j > past + i {
                        *x += filter;
                    }
                }
            }
        }
        let y = Tensor::from_f64(dt, vec![b, 1, s, t], &out)?;
        Ok(smallvec::smallvec![y.into()])
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_mask(
        &self,
        m: &Tensor,
        out: &mut [f64],
        b: usize,
        s: usize,
        t: usize,
        past: usize,
        filter: f64,
    ) -> Result<()> {
        if m.dtype() == DType::String {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: m.dtype(),
            });
        }
        let mv = m.to_f64_vec();
        let ms = m.shape();
        let row_of = |bi: usize, i: usize| (bi * s + i) * t;
        match *ms {
            [n] if n == b || n == 2 * b => {
                for bi in 0..b {
                    let end = mv[bi].clamp(0.0, t as f64) as usize;
                    let start = if n == 2 * b {
                        mv[b + bi].clamp(0.0, t as f64) as usize
                    } else {
                        0
                    };
                    for i in 0..s {
                        let row = &mut out[row_of(bi, i)..row_of(bi, i) + t];
                        for (j, x) in row.iter_mut().enumerate() {
                            if j >= end || j < start {
                                *x += filter;
                            }
                        }
                    }
                }
            }
            [mb, mt] if mb == b && mt == t => {
                for bi in 0..b {
                    for i in 0..s {
                        for j in 0..t {
                            if mv[bi * t + j] <= 0.0 {
                                out[row_of(bi, i) + j] += filter;
                            }
                        }
                    }
                }
            }
            [mb, ms_, mt] if mb == b && ms_ == s && mt == t => {
                for (x, &v) in out.iter_mut().zip(&mv) {
                    if v <= 0.0 {
                        *x += filter;
                    }
                }
            }
            [mb, 1, mr, mc] if mb == b && mr >= past + s && mc >= t => {
                for bi in 0..b {
                    for i in 0..s {
                        for j in 0..t {
                            if mv[(bi * mr + past + i) * mc + j] <= 0.0 {
                                out[row_of(bi, i) + j] += filter;
                            }
                        }
                    }
                }
            }
            _ => {
                return Err(OpError::input_shape(
                    0,
                    format!(
                        "a mask of shape [{b}], [{}], [{b}, {t}], [{b}, {s}, {t}] or [{b}, 1, M, M] with M >= {}",
                        2 * b,
                        (past + s).max(t)
                    ),
                    ms,
                ));
            }
        }
        Ok(())
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = crate::util::input_dtype(inputs, 1);
        let q = in_shape(inputs, 1);
        let k = in_shape(inputs, 2);
        let shape = match (q.as_deref(), k.as_deref()) {
            (Some([b, s, _]), Some([_, skv, _] | [_, _, skv, _])) => {
                let has_past = inputs.get(3).is_some_and(|x| x.present);
                let t = match in_shape(inputs, 3).as_deref() {
                    _ if !has_past => Some(skv.clone()),
                    Some([_, _, p, _]) => super::num::dim_add(p, skv),
                    _ => None,
                };
                Some(vec![b.clone(), Dim::Fixed(1), s.clone(), t.unwrap_or_else(Dim::fresh)])
            }
            _ => None,
        };
        Ok(vec![tt(dtype, shape)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(op: &AttentionMask, mask: Option<Tensor>, s: usize, skv: usize, past: usize) -> Result<Vec<f64>> {
        let q = Value::Tensor(Tensor::from_vec(vec![2, s, 4], vec![0.0f32; 2 * s * 4]).unwrap());
        let k = Value::Tensor(Tensor::from_vec(vec![2, skv, 4], vec![0.0f32; 2 * skv * 4]).unwrap());
        let p = Value::Tensor(Tensor::from_vec(vec![2, 1, past, 4], vec![0.0f32; 2 * past * 4]).unwrap());
        let m = mask.map(Value::Tensor);
        let args = [m.as_ref(), Some(&q), Some(&k), (past > 0).then_some(&p)];
        let out = op.eval(&Args::new(&args))?;
        let t = out[0].as_tensor().unwrap();
        assert_eq!(t.shape(), [2, 1, s, past + skv]);
        Ok(t.to_f64_vec())
    }

    const F: f64 = -100.0;
    fn op(causal: bool) -> AttentionMask {
        AttentionMask {
            filter_value: F as f32,
            causal,
        }
    }

    #[test]
    fn every_mask_format_by_hand() {
        // [B] ends: row 0 sees 3 keys, row 1 sees 1.
        let ends = Tensor::from_vec(vec![2], vec![3i32, 1]).unwrap();
        assert_eq!(
            run(&op(false), Some(ends), 1, 3, 0).unwrap(),
            [0.0, 0.0, 0.0, 0.0, F, F]
        );
        // [2B] ends then starts: row 1 sees keys 1..3.
        let ends_starts = Tensor::from_vec(vec![4], vec![3i32, 3, 0, 1]).unwrap();
        assert_eq!(
            run(&op(false), Some(ends_starts), 1, 3, 0).unwrap(),
            [0.0, 0.0, 0.0, F, 0.0, 0.0]
        );
        // [B, T] raw 0/1.
        let raw = Tensor::from_vec(vec![2, 3], vec![1i64, 0, 1, 0, 1, 1]).unwrap();
        assert_eq!(run(&op(false), Some(raw), 1, 3, 0).unwrap(), [0.0, F, 0.0, F, 0.0, 0.0]);
        // [B, S, T] per query.
        let per_query = Tensor::from_vec(vec![2, 2, 2], vec![1i32, 0, 0, 1, 1, 1, 0, 0]).unwrap();
        assert_eq!(
            run(&op(false), Some(per_query), 2, 2, 0).unwrap(),
            [0.0, F, F, 0.0, 0.0, 0.0, F, F]
        );
        // [B, 1, M, M] Megatron, with one past key: rows 1..2 of the 3x3 square.
        let sq: Vec<i32> = [[1, 0, 0], [1, 1, 0], [1, 1, 1]].concat();
        let two = [sq.clone(), sq].concat();
        let megatron = Tensor::from_vec(vec![2, 1, 3, 3], two).unwrap();
        assert_eq!(
            run(&op(false), Some(megatron), 2, 2, 1).unwrap(),
            [0.0, 0.0, F, 0.0, 0.0, 0.0, 0.0, 0.0, F, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn causal_frontier_is_offset_by_the_past_and_sums_with_the_mask() {
        // Two queries, one new key per query and one past key: query i sees keys 0..=1+i.
        assert_eq!(
            run(&op(true), None, 2, 2, 1).unwrap(),
            [0.0, 0.0, F, 0.0, 0.0, 0.0, 0.0, 0.0, F, 0.0, 0.0, 0.0]
        );
        // Masked by both: twice the filter, as ONNX Runtime adds them.
        let raw = Tensor::from_vec(vec![2, 2], vec![1i32, 0, 1, 1]).unwrap();
        assert_eq!(
            run(&op(true), Some(raw), 2, 2, 0).unwrap(),
            [0.0, 2.0 * F, 0.0, F, 0.0, F, 0.0, 0.0]
        );
    }

    #[test]
    fn a_mask_of_another_shape_is_refused_naming_the_formats() {
        let bad = Tensor::from_vec(vec![3], vec![1i32, 1, 1]).unwrap();
        let e = run(&op(false), Some(bad), 1, 3, 0).unwrap_err();
        assert!(e.to_string().contains("[2, 3]"), "{e}");
        // A float mask reads like an integer one: positive attends.
        let float = Tensor::from_vec(vec![2, 3], vec![1.0f32, 0.0, 0.5, 0.0, 0.0, 2.0]).unwrap();
        assert_eq!(run(&op(false), Some(float), 1, 3, 0).unwrap(), [0.0, F, 0.0, F, F, 0.0]);
    }
}
