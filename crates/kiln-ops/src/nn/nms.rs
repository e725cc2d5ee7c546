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

/// A float's position in the total order of finite floats and infinities, as an integer key.
fn order_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 { !b } else { b | (1 << 63) }
}

/// The boxes selected so far for one (batch, class). With finite coordinates they are kept
/// ordered by left edge with the widest width seen, so a candidate is compared only with the
/// boxes whose left edge lies within (its left edge - that width, its right edge): the others
/// cannot intersect it (their x-ranges are apart), so the selection is the same as comparing
/// with all. torchvision's batched NMS offsets each class's boxes into a region of its own
/// and hands one call every class's candidates (ten thousand and more), where all-pairs
/// comparison is quadratic in the boxes kept. With a NaN or infinite coordinate in the batch,
/// every selected box is compared, as before.
enum Selected {
    Ordered {
        by_left: std::collections::BTreeMap<(u64, usize), Extent>,
        widest: f64,
    },
    All(Vec<Extent>),
}

impl Selected {
    fn new(ordered: bool) -> Selected {
        if ordered {
            Selected::Ordered {
                by_left: std::collections::BTreeMap::new(),
                widest: 0.0,
            }
        } else {
            Selected::All(Vec::new())
        }
    }

    fn len(&self) -> usize {
        match self {
            Selected::Ordered { by_left, .. } => by_left.len(),
            Selected::All(v) => v.len(),
        }
    }

    /// Whether `e` overlaps a selected box by more than `iou`.
    fn suppresses(&self, e: &Extent, iou: f64) -> bool {
        match self {
            Selected::All(v) => v.iter().any(|s| suppress(e, s, iou)),
            Selected::Ordered { by_left, widest } => {
                // Widened by a relative margin far above f64 rounding: a superset of the boxes
                // whose x-range can meet [e.x0, e.x1].
                let from = e.x0 - widest * (1.0 + 1e-9) - e.x0.abs() * 1e-12 - f64::MIN_POSITIVE;
                let to = e.x1 + e.x1.abs() * 1e-12 + f64::MIN_POSITIVE;
                by_left
                    .range((order_key(from), 0)..=(order_key(to), usize::MAX))
                    .any(|(_, s)| suppress(e, s, iou))
            }
        }
    }

    fn push(&mut self, e: Extent, index: usize) {
        match self {
            Selected::All(v) => v.push(e),
            Selected::Ordered { by_left, widest } => {
                *widest = widest.max(e.x1 - e.x0);
                by_left.insert((order_key(e.x0), index), e);
            }
        }
    }
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
            let finite = ext
                .iter()
                .all(|e| [e.x0, e.x1, e.y0, e.y1, e.area].iter().all(|v| v.is_finite()));
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
                let mut sel = Selected::new(finite);
                for i in cand {
                    if sel.len() >= max_out {
                        break;
                    }
                    let Some(&ei) = ext.get(i) else { continue };
                    if !sel.suppresses(&ei, iou) {
                        sel.push(ei, i);
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

    /// The left-edge search selects what comparing with every selected box selects: 600
    /// boxes in clusters (overlapping within a cluster, clusters offset as torchvision's batched
    /// NMS offsets classes), run once with finite boxes (ordered search) and once with a NaN
    /// box below the score threshold added (which switches to all-pairs comparison).
    #[test]
    fn the_left_edge_search_selects_as_all_pairs_do() {
        let mut s = 12345u64;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32
        };
        let n = 600;
        let (mut boxes, mut scores) = (Vec::new(), Vec::new());
        for i in 0..n {
            let off = (i % 7) as f32 * 50.0;
            let (y, x) = (off + rnd() * 20.0, off + rnd() * 20.0);
            let (h, w) = (1.0 + rnd() * 15.0, 1.0 + rnd() * 15.0);
            // Some boxes given corners swapped (the op takes either order).
            if i % 5 == 0 {
                boxes.extend([y + h, x + w, y, x]);
            } else {
                boxes.extend([y, x, y + h, x + w]);
            }
            scores.push(0.1 + rnd());
        }
        let op = NonMaxSuppression {
            center_point_box: false,
        };
        let max = Value::Tensor(Tensor::from_vec(vec![1], vec![1000i64]).unwrap());
        let iou = Value::Tensor(Tensor::from_vec(vec![1], vec![0.3f32]).unwrap());
        let th = Value::Tensor(Tensor::from_vec(vec![1], vec![0.05f32]).unwrap());
        let run = |boxes: Vec<f32>, scores: Vec<f32>| -> Vec<i64> {
            let m = scores.len();
            let b = Value::Tensor(Tensor::from_vec(vec![1, m, 4], boxes).unwrap());
            let sc = Value::Tensor(Tensor::from_vec(vec![1, 1, m], scores).unwrap());
            let y = op
                .eval(&Args::new(&[Some(&b), Some(&sc), Some(&max), Some(&iou), Some(&th)]))
                .unwrap();
            y[0].as_tensor().unwrap().as_slice::<i64>().unwrap().to_vec()
        };
        let ordered = run(boxes.clone(), scores.clone());
        let (mut b2, mut s2) = (boxes, scores);
        b2.extend([f32::NAN, 0.0, 1.0, 1.0]);
        s2.push(0.01);
        let all_pairs = run(b2, s2);
        assert_eq!(ordered, all_pairs);
        let kept = ordered.len() / 3;
        assert!(
            kept > 50 && kept < n,
            "{kept} kept: the case must both keep and suppress"
        );
    }
}
