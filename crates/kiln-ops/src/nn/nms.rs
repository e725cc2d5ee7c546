//! `NonMaxSuppression` (opset 10–11), per
//! <https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html>: greedy per (batch, class)
//! selection by descending score (ties: lower box index first), suppressing boxes whose IoU
//! with an already selected one exceeds the threshold.

use super::check_float;
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, TensorType, Value, ValueType};
use kiln_tensor::{DType, Tensor};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct NonMaxSuppression {
    /// Boxes are `[x_center, y_center, width, height]` instead of `[y1, x1, y2, x2]`.
    pub center_point_box: bool,
}

/// (x_min, x_max, y_min, y_max) of a box.
fn extent(b: &[f64], center: bool) -> (f64, f64, f64, f64) {
    if center {
        let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
        (b[0] - hw, b[0] + hw, b[1] - hh, b[1] + hh)
    } else {
        (b[1].min(b[3]), b[1].max(b[3]), b[0].min(b[2]), b[0].max(b[2]))
    }
}

/// A box's extent and area, computed once per call.
#[derive(Clone, Copy)]
struct Extent {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    area: f64,
}

impl Extent {
    fn of(b: &[f64], center: bool) -> Extent {
        let (x0, x1, y0, y1) = extent(b, center);
        Extent {
            x0,
            x1,
            y0,
            y1,
            area: (x1 - x0) * (y1 - y0),
        }
    }
}

/// Whether boxes `a` and `b` overlap by more than `iou_threshold` (intersection over union).
fn suppress(a: &Extent, b: &Extent, iou_threshold: f64) -> bool {
    let (ix0, ix1) = (a.x0.max(b.x0), a.x1.min(b.x1));
    let (iy0, iy1) = (a.y0.max(b.y0), a.y1.min(b.y1));
    if ix1 <= ix0 || iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let (area_a, area_b) = (a.area, b.area);
    let union = area_a + area_b - inter;
    if inter <= 0.0 || area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > iou_threshold
}

impl NonMaxSuppression {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let boxes = args.tensor(0)?;
        let scores = args.tensor(1)?;
        check_float(boxes, 0)?;
        check_float(scores, 1)?;
        let (bs, ss) = (boxes.shape(), scores.shape());
        if bs.len() != 3 || bs[2] != 4 {
            return Err(OpError::input_shape(0, "[batch, boxes, 4]", bs));
        }
        if ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
            return Err(OpError::input_shape(
                1,
                format!("[{}, classes, {}], as the boxes", bs[0], bs[1]),
                ss,
            ));
        }
        let scalar_f = |i: usize| -> Result<Option<f64>> {
            Ok(args.opt_tensor(i)?.filter(|t| !t.is_empty()).map(|t| t.to_f64_vec()[0]))
        };
        let max_out = match args.opt_tensor(2)?.filter(|t| !t.is_empty()) {
            Some(t) => util::read_i64s(&t.clone().reshape(vec![t.len()])?, 2, "max_output_boxes_per_class")?[0].max(0),
            None => 0,
        } as usize;
        let iou = scalar_f(3)?.unwrap_or(0.0);
        let score_th = scalar_f(4)?;
        let (nb, nc, n) = (ss[0], ss[1], ss[2]);
        let bd = boxes.to_f64_vec();
        let sd = scores.to_f64_vec();
        let mut out: Vec<i64> = Vec::new();
        for b in 0..nb {
            let bx = &bd[b * n * 4..(b + 1) * n * 4];
            // Every box's extent once, not once per comparison (torchvision's batched NMS
            // hands one call tens of thousands of candidates).
            let ext: Vec<Extent> = bx
                .chunks_exact(4)
                .map(|q| Extent::of(q, self.center_point_box))
                .collect();
            for c in 0..nc {
                let sc = &sd[(b * nc + c) * n..(b * nc + c + 1) * n];
                let mut cand: Vec<usize> = (0..n).filter(|&i| score_th.is_none_or(|t| sc[i] > t)).collect();
                // Descending score, ties by ascending index.
                cand.sort_by(|&i, &j| {
                    sc[j]
                        .partial_cmp(&sc[i])
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(i.cmp(&j))
                });
                let mut sel: Vec<Extent> = Vec::new();
                for i in cand {
                    if sel.len() >= max_out {
                        break;
                    }
                    let Some(&ei) = ext.get(i) else { continue };
                    if sel.iter().all(|s| !suppress(&ei, s, iou)) {
                        sel.push(ei);
                        out.extend([b as i64, c as i64, i as i64]);
                    }
                }
            }
        }
        let rows = out.len() / 3;
        Ok(smallvec::smallvec![Value::Tensor(Tensor::from_vec(
            vec![rows, 3],
            out
        )?)])
    }

    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: Some(DType::I64),
            shape: Some(vec![Dim::Sym("nms_selected".into()), Dim::Fixed(3)]),
        })])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_box_is_suppressed() {
        // Two unit boxes offset by 0.1 (IoU 0.9/1.1 ≈ 0.82) and a far one; threshold 0.5.
        let boxes = Value::Tensor(
            Tensor::from_vec(
                vec![1, 3, 4],
                vec![0.0f32, 0.0, 1.0, 1.0, 0.1, 0.0, 1.1, 1.0, 5.0, 5.0, 6.0, 6.0],
            )
            .unwrap(),
        );
        let scores = Value::Tensor(Tensor::from_vec(vec![1, 1, 3], vec![0.8f32, 0.9, 0.7]).unwrap());
        let max = Value::Tensor(Tensor::from_vec(vec![1], vec![10i64]).unwrap());
        let iou = Value::Tensor(Tensor::from_vec(vec![1], vec![0.5f32]).unwrap());
        let op = NonMaxSuppression {
            center_point_box: false,
        };
        let y = op
            .eval(&Args::new(&[Some(&boxes), Some(&scores), Some(&max), Some(&iou)]))
            .unwrap();
        assert_eq!(
            y[0].as_tensor().unwrap().as_slice::<i64>().unwrap(),
            &[0, 0, 1, 0, 0, 2]
        );
    }
}
