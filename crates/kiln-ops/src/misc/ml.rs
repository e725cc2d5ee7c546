//! `ai.onnx.ml` ops:
//! - [LabelEncoder](https://onnx.ai/onnx/operators/onnx_aionnxml_LabelEncoder.html), ml opsets
//!   1-4 (the importer turns the `keys_*`/`values_*`/`default_*` lists and the opset-4 tensor
//!   attributes into tensors).
//! - [TreeEnsemble](https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsemble.html), ml opset 5.
//! - [ArrayFeatureExtractor](https://onnx.ai/onnx/operators/onnx_aionnxml_ArrayFeatureExtractor.html),
//!   ml opset 1.
//! - [Binarizer](https://onnx.ai/onnx/operators/onnx_aionnxml_Binarizer.html), ml opset 1.

use super::{input_shape, tensor_from_f64};
use crate::error::{OpError, Result};
use crate::util::{checked_numel, dtype_only, input_dtype};
use crate::value::{Args, Dim, InferInput, TensorType, ValueType};
use kiln_tensor::{DType, Data, Tensor};
use std::collections::HashMap;

/// A hashable key: strings, integers, or floats by bit pattern (every NaN is one key, and -0
/// equals 0, as float equality has it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq, Hash)]
enum Key {
    S(String),
    I(i64),
    F(u64),
}

fn float_key(x: f64) -> Key {
    if x.is_nan() {
        Key::F(f64::NAN.to_bits())
    } else if x == 0.0 {
        Key::F(0)
    } else {
        Key::F(x.to_bits())
    }
}

/// Keys of a tensor, in the comparison domain its dtype calls for.
fn keys_of(t: &Tensor, as_float: bool) -> Vec<Key> {
    match t.data() {
        Data::Str(v) => v.iter().map(|s| Key::S(s.clone())).collect(),
        _ if as_float || t.dtype().is_float() => t.to_f64_vec().into_iter().map(float_key).collect(),
        _ => t.to_i64_vec().unwrap_or_default().into_iter().map(Key::I).collect(),
    }
}

/// Maps each input element through a key → value table, with a default for unknown keys.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LabelEncoder {
    /// 1-D keys.
    pub keys: Tensor,
    /// 1-D values, as many as keys; their dtype is the output's.
    pub values: Tensor,
    /// One element of the values' dtype.
    pub default: Tensor,
}

impl LabelEncoder {
    /// The spec's default for values of `dtype` when the model gives none: `"_Unused"`, -1 or
    /// -0.0.
    pub fn default_for(dtype: DType) -> Result<Tensor> {
        match dtype {
            DType::String => Ok(Tensor::from_vec(vec![1], vec!["_Unused".to_string()])?),
            d if d.is_float() => tensor_from_f64(d, vec![1], &[-0.0]),
            d => tensor_from_f64(d, vec![1], &[-1.0]),
        }
    }
}

impl LabelEncoder {
    pub fn name(&self) -> &'static str {
        "LabelEncoder"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let n = self.keys.len();
        if self.values.len() != n {
            return Err(OpError::attribute(
                "values",
                format!("{n} values, one per key"),
                format!("{} values", self.values.len()),
            ));
        }
        if self.default.len() != 1 || self.default.dtype() != self.values.dtype() {
            return Err(OpError::attribute(
                "default",
                format!("one {} value, as the values", self.values.dtype()),
                format!("{}{:?}", self.default.dtype(), self.default.shape()),
            ));
        }
        if (x.dtype() == DType::String) != (self.keys.dtype() == DType::String) {
            return Err(OpError::DTypeMismatch {
                a: self.keys.dtype(),
                b: x.dtype(),
            });
        }
        let as_float = x.dtype().is_float() || self.keys.dtype().is_float();
        let mut table = HashMap::with_capacity(n);
        for (i, k) in keys_of(&self.keys, as_float).into_iter().enumerate() {
            table.entry(k).or_insert(i);
        }
        let idx: Vec<usize> = keys_of(x, as_float)
            .iter()
            .map(|k| table.get(k).copied().unwrap_or(n))
            .collect();
        let all = join(&self.values, &self.default)?;
        Ok(smallvec::smallvec![all.gather_flat(x.shape().to_vec(), &idx)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: Some(self.values.dtype()),
            shape: input_shape(inputs, 0),
        })])
    }
}

/// `a` followed by `b` as one 1-D tensor (same dtype).
fn join(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    macro_rules! cat {
        ($($var:ident),*) => {
            match (a.data(), b.data()) {
                $((Data::$var(x), Data::$var(y)) => Data::$var(x.iter().chain(y).cloned().collect()),)*
                _ => return Err(OpError::DTypeMismatch { a: a.dtype(), b: b.dtype() }),
            }
        };
    }
    let data = cat!(
        F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64, Bool, Str, Coded
    );
    Ok(Tensor::new(a.dtype(), vec![a.len() + b.len()], data)?)
}

/// Comparison of a TreeEnsemble node.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum NodeMode {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Member,
}

impl NodeMode {
    pub fn from_code(c: i64) -> Option<NodeMode> {
        Some(match c {
            0 => NodeMode::Leq,
            1 => NodeMode::Lt,
            2 => NodeMode::Gte,
            3 => NodeMode::Gt,
            4 => NodeMode::Eq,
            5 => NodeMode::Neq,
            6 => NodeMode::Member,
            _ => return None,
        })
    }
}

/// How the trees' leaf weights are combined per target.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    Average,
    Sum,
    Min,
    Max,
}

/// Transform applied to each row of scores.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum PostTransform {
    None,
    Softmax,
    Logistic,
    SoftmaxZero,
    Probit,
}

/// A tree ensemble (regressor or classifier scores), `[N, F]` features to `[N, n_targets]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TreeEnsemble {
    pub aggregate: AggregateFunction,
    pub post_transform: PostTransform,
    pub n_targets: usize,
    pub tree_roots: Vec<i64>,
    pub nodes_modes: Vec<NodeMode>,
    pub nodes_featureids: Vec<i64>,
    pub nodes_splits: Vec<f64>,
    pub nodes_truenodeids: Vec<i64>,
    pub nodes_trueleafs: Vec<bool>,
    pub nodes_falsenodeids: Vec<i64>,
    pub nodes_falseleafs: Vec<bool>,
    /// Empty when not given (no node sends missing values to the true branch).
    pub nodes_missing_tracks_true: Vec<bool>,
    /// Members of each set-membership node, in node order, each set ended by a NaN.
    pub membership_values: Vec<f64>,
    pub leaf_targetids: Vec<i64>,
    pub leaf_weights: Vec<f64>,
}

impl TreeEnsemble {
    fn check(&self) -> Result<Vec<Vec<f64>>> {
        let n = self.nodes_modes.len();
        let lens = [
            self.nodes_featureids.len(),
            self.nodes_splits.len(),
            self.nodes_truenodeids.len(),
            self.nodes_trueleafs.len(),
            self.nodes_falsenodeids.len(),
            self.nodes_falseleafs.len(),
        ];
        let names = [
            "nodes_featureids",
            "nodes_splits",
            "nodes_truenodeids",
            "nodes_trueleafs",
            "nodes_falsenodeids",
            "nodes_falseleafs",
        ];
        let missing = (!self.nodes_missing_tracks_true.is_empty()).then_some(self.nodes_missing_tracks_true.len());
        let all = names
            .into_iter()
            .zip(lens)
            .chain(missing.map(|l| ("nodes_missing_tracks_true", l)));
        for (attr, l) in all {
            if l != n {
                return Err(OpError::attribute(
                    attr,
                    format!("{n} values, one per node (as nodes_modes)"),
                    format!("{l} values"),
                ));
            }
        }
        if self.leaf_targetids.len() != self.leaf_weights.len() {
            return Err(OpError::attribute(
                "leaf_targetids",
                format!("{} values, one per leaf weight", self.leaf_weights.len()),
                format!("{} values", self.leaf_targetids.len()),
            ));
        }
        // Membership sets, one per node (empty for other modes).
        let mut sets = vec![Vec::new(); n];
        let mut it = self.membership_values.iter();
        for (i, m) in self.nodes_modes.iter().enumerate() {
            if *m == NodeMode::Member {
                for &v in it.by_ref() {
                    if v.is_nan() {
                        break;
                    }
                    sets[i].push(v);
                }
            }
        }
        Ok(sets)
    }

    /// The leaf a row reaches from `root`.
    fn leaf(&self, row: &[f64], root: i64, sets: &[Vec<f64>]) -> Result<usize> {
        let n = self.nodes_modes.len();
        let node_idx = |i: i64| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < n)
                .ok_or_else(|| OpError::IndexOutOfRange { index: i, size: n })
        };
        let mut node = node_idx(root)?;
        // A well-formed tree visits each node at most once.
        for _ in 0..=n {
            let f = self.nodes_featureids[node];
            let x = usize::try_from(f)
                .ok()
                .and_then(|f| row.get(f).copied())
                .ok_or_else(|| OpError::IndexOutOfRange {
                    index: f,
                    size: row.len(),
                })?;
            let s = self.nodes_splits[node];
            let cond = (x.is_nan() && self.nodes_missing_tracks_true.get(node).copied().unwrap_or(false))
                || match self.nodes_modes[node] {
                    NodeMode::Leq => x <= s,
                    NodeMode::Lt => x < s,
                    NodeMode::Gte => x >= s,
                    NodeMode::Gt => x > s,
                    NodeMode::Eq => x == s,
                    NodeMode::Neq => x != s,
                    NodeMode::Member => sets[node].contains(&x),
                };
            let (next, is_leaf) = if cond {
                (self.nodes_truenodeids[node], self.nodes_trueleafs[node])
            } else {
                (self.nodes_falsenodeids[node], self.nodes_falseleafs[node])
            };
            if is_leaf {
                let l = self.leaf_weights.len();
                return usize::try_from(next)
                    .ok()
                    .filter(|&i| i < l)
                    .ok_or_else(|| OpError::IndexOutOfRange { index: next, size: l });
            }
            node = node_idx(next)?;
        }
        Err(OpError::attribute(
            "nodes_truenodeids",
            "trees without cycles (with nodes_falsenodeids)",
            "a path longer than the nodes",
        ))
    }
}

/// Inverse error function (Giles' single-precision approximation, as ML runtimes use).
fn erf_inv(x: f64) -> f64 {
    let w = -((1.0 - x) * (1.0 + x)).ln();
    let p = if w < 5.0 {
        let w = w - 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [
            3.432_739_39e-07,
            -3.523_387_7e-06,
            -4.391_506_54e-06,
            0.000_218_580_87,
            -0.001_253_725_03,
            -0.004_177_681_64,
            0.246_640_727,
            1.501_409_41,
        ] {
            p = c + p * w;
        }
        p
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [
            0.000_100_950_558,
            0.001_349_343_22,
            -0.003_673_428_44,
            0.005_739_507_73,
            -0.007_622_461_3,
            0.009_438_870_47,
            1.001_674_06,
            2.832_976_82,
        ] {
            p = c + p * w;
        }
        p
    };
    p * x
}

fn post_transform(kind: PostTransform, row: &mut [f64]) {
    match kind {
        PostTransform::None => {}
        PostTransform::Logistic => row.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
        PostTransform::Probit => row
            .iter_mut()
            .for_each(|v| *v = std::f64::consts::SQRT_2 * erf_inv(2.0 * *v - 1.0)),
        PostTransform::Softmax => {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.iter_mut().for_each(|v| *v = (*v - m).exp() / sum);
        }
        PostTransform::SoftmaxZero => {
            let m = row
                .iter()
                .copied()
                .filter(|&v| v != 0.0)
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().filter(|&&v| v != 0.0).map(|v| (v - m).exp()).sum();
            row.iter_mut()
                .for_each(|v| *v = if *v == 0.0 { 0.0 } else { (*v - m).exp() / sum });
        }
    }
}

impl TreeEnsemble {
    pub fn name(&self) -> &'static str {
        "TreeEnsemble"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        super::require_float(x, 0)?;
        let (rows, feats) = match *x.shape() {
            [n, f] => (n, f),
            [f] => (1, f),
            ref s => {
                return Err(OpError::input_shape(0, "[N, F] or [F]", s));
            }
        };
        let sets = self.check()?;
        let t = self.n_targets;
        let shape = if x.rank() == 2 { vec![rows, t] } else { vec![t] };
        let mut out = vec![0.0; checked_numel(&shape)?];
        let v = x.to_f64_vec();
        let max = match x.dtype() {
            DType::F64 => f64::MAX,
            DType::F16 => 65504.0,
            _ => f32::MAX as f64,
        };
        let trees = self.tree_roots.len() as f64;
        for r in 0..rows {
            let row = &v[r * feats..(r + 1) * feats];
            let acc = &mut out[r * t..(r + 1) * t];
            match self.aggregate {
                AggregateFunction::Min => acc.fill(max),
                AggregateFunction::Max => acc.fill(-max),
                _ => {}
            }
            for &root in &self.tree_roots {
                let l = self.leaf(row, root, &sets)?;
                let target = self.leaf_targetids[l];
                let slot = usize::try_from(target)
                    .ok()
                    .and_then(|i| acc.get_mut(i))
                    .ok_or_else(|| OpError::IndexOutOfRange { index: target, size: t })?;
                let w = self.leaf_weights[l];
                match self.aggregate {
                    AggregateFunction::Sum => *slot += w,
                    AggregateFunction::Average => *slot += w / trees,
                    AggregateFunction::Min => *slot = slot.min(w),
                    AggregateFunction::Max => *slot = slot.max(w),
                }
            }
            post_transform(self.post_transform, acc);
        }
        Ok(smallvec::smallvec![tensor_from_f64(x.dtype(), shape, &out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let t = Dim::Fixed(self.n_targets);
        Ok(vec![match input_shape(inputs, 0) {
            Some(s) if s.len() == 2 => ValueType::Tensor(TensorType {
                dtype,
                shape: Some(vec![s[0].clone(), t]),
            }),
            Some(s) if s.len() == 1 => ValueType::Tensor(TensorType {
                dtype,
                shape: Some(vec![t]),
            }),
            _ => dtype_only(dtype),
        }])
    }
}

/// Selects elements of the last axis by index.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ArrayFeatureExtractor;

impl ArrayFeatureExtractor {
    pub fn name(&self) -> &'static str {
        "ArrayFeatureExtractor"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let ind = args.tensor(1)?;
        let ind = ind.to_i64_vec().ok_or(OpError::UnsupportedDType {
            index: 1,
            got: ind.dtype(),
        })?;
        let shape = x.shape();
        let last = *shape
            .last()
            .ok_or_else(|| OpError::input_shape(0, "rank >= 1", shape))?;
        let cols = ind
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .filter(|&i| i < last)
                    .ok_or_else(|| OpError::IndexOutOfRange { index: i, size: last })
            })
            .collect::<Result<Vec<_>>>()?;
        let outer = x.len().checked_div(last).unwrap_or(0);
        let mut out_shape = if shape.len() == 1 {
            vec![1]
        } else {
            shape[..shape.len() - 1].to_vec()
        };
        out_shape.push(cols.len());
        checked_numel(&out_shape)?;
        let idx: Vec<usize> = (0..outer)
            .flat_map(|o| cols.iter().map(move |&c| o * last + c))
            .collect();
        Ok(smallvec::smallvec![x.gather_flat(out_shape, &idx)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let n = super::fixed_shape(inputs, 1).map(|s| s.iter().product::<usize>());
        let shape = input_shape(inputs, 0).map(|s| {
            let mut o = if s.len() <= 1 {
                vec![Dim::Fixed(1)]
            } else {
                s[..s.len() - 1].to_vec()
            };
            o.push(n.map_or(Dim::Sym("features".into()), Dim::Fixed));
            o
        });
        Ok(vec![ValueType::Tensor(TensorType { dtype, shape })])
    }
}

/// 1 where the input exceeds the threshold, else 0.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Binarizer {
    pub threshold: f32,
}

impl Binarizer {
    pub fn name(&self) -> &'static str {
        "Binarizer"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        if !(x.dtype().is_float() || x.dtype().is_int()) {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: x.dtype(),
            });
        }
        let th = self.threshold as f64;
        let v: Vec<f64> = x
            .to_f64_vec()
            .into_iter()
            .map(|v| if v > th { 1.0 } else { 0.0 })
            .collect();
        Ok(smallvec::smallvec![
            tensor_from_f64(x.dtype(), x.shape().to_vec(), &v)?.into()
        ])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: input_dtype(inputs, 0),
            shape: input_shape(inputs, 0),
        })])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn label_encoder_maps_with_default() {
        let op = LabelEncoder {
            keys: Tensor::from_vec(vec![3], vec!["a".to_string(), "b".into(), "c".into()]).unwrap(),
            values: Tensor::from_vec(vec![3], vec![0i64, 1, 2]).unwrap(),
            default: Tensor::from_vec(vec![1], vec![42i64]).unwrap(),
        };
        let x = strs(&[4], &["c", "a", "z", "b"]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(out::<i64>(&y[0]), (vec![4], vec![2, 0, 42, 1]));
        // Float keys: NaN finds NaN.
        let op = LabelEncoder {
            keys: Tensor::from_vec(vec![2], vec![f32::NAN, 1.5]).unwrap(),
            values: Tensor::from_vec(vec![2], vec!["nan".to_string(), "x".into()]).unwrap(),
            default: Tensor::from_vec(vec![1], vec!["_Unused".to_string()]).unwrap(),
        };
        let x = t(&[3], vec![1.5f32, f32::NAN, 2.0]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(out::<String>(&y[0]).1, vec!["x", "nan", "_Unused"]);
    }

    #[test]
    fn tree_ensemble_single_tree() {
        // Root x0 <= 3.14 → (x0 <= 1.2 ? leaf 0 : leaf 1), else (x0 <= 4.2 ? leaf 2 : leaf 3),
        // leaves (5.23 → t0, 12.12 → t1, -12.23 → t0, 7.21 → t1): x0 = 1, 2, 5 reach leaves 0, 1, 3.
        let op = TreeEnsemble {
            aggregate: AggregateFunction::Sum,
            post_transform: PostTransform::None,
            n_targets: 2,
            tree_roots: vec![0],
            nodes_modes: vec![NodeMode::Leq; 3],
            nodes_featureids: vec![0, 0, 0],
            nodes_splits: vec![3.14, 1.2, 4.2],
            nodes_truenodeids: vec![1, 0, 2],
            nodes_trueleafs: vec![false, true, true],
            nodes_falsenodeids: vec![2, 1, 3],
            nodes_falseleafs: vec![false, true, true],
            nodes_missing_tracks_true: vec![],
            membership_values: vec![],
            leaf_targetids: vec![0, 1, 0, 1],
            leaf_weights: vec![5.23, 12.12, -12.23, 7.21],
        };
        let x = t(&[3, 1], vec![1.0f64, 2.0, 5.0]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(out::<f64>(&y[0]), (vec![3, 2], vec![5.23, 0.0, 0.0, 12.12, 0.0, 7.21]));
    }

    #[test]
    fn feature_extractor_and_binarizer() {
        let x = t(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let i = t(&[2], vec![2i64, 0]);
        let y = run(&[Some(&x), Some(&i)], |a| ArrayFeatureExtractor.eval(a));
        assert_eq!(out::<f32>(&y[0]), (vec![2, 2], vec![3.0, 1.0, 6.0, 4.0]));
        let y = run(&[Some(&x)], |a| Binarizer { threshold: 3.0 }.eval(a));
        assert_eq!(out::<f32>(&y[0]).1, vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn erf_inv_inverts_known_points() {
        // erf(0.5) = 0.5204998778
        assert!((erf_inv(0.520_499_877_8) - 0.5).abs() < 1e-6);
        assert_eq!(erf_inv(0.0), 0.0);
    }
}
