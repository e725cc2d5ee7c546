//! Approximate comparison of tensors, as the conformance harness and real-model checks use it.

use crate::tensor::{Data, Tensor};

/// Why two tensors differ, for a readable report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum Mismatch {
    DType {
        expected: String,
        got: String,
    },
    Shape {
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// First differing element: flat index, both values, and how many elements differ.
    Values {
        index: usize,
        expected: String,
        got: String,
        count: usize,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::DType { expected, got } => write!(f, "dtype: expected {expected}, got {got}"),
            Mismatch::Shape { expected, got } => write!(f, "shape: expected {expected:?}, got {got:?}"),
            Mismatch::Values {
                index,
                expected,
                got,
                count,
            } => {
                write!(
                    f,
                    "{count} element(s) differ; first at {index}: expected {expected}, got {got}"
                )
            }
        }
    }
}

/// Compares `got` with `expected`: same dtype and shape; floats within
/// `|got - expected| <= atol + rtol * |expected|` with NaN matching NaN and infinities exact;
/// integers, booleans and strings exactly.
pub fn compare(expected: &Tensor, got: &Tensor, rtol: f64, atol: f64) -> Result<(), Mismatch> {
    if expected.dtype() != got.dtype() {
        return Err(Mismatch::DType {
            expected: expected.dtype().to_string(),
            got: got.dtype().to_string(),
        });
    }
    if expected.shape() != got.shape() {
        return Err(Mismatch::Shape {
            expected: expected.shape().to_vec(),
            got: got.shape().to_vec(),
        });
    }
    let mut first: Option<(usize, String, String)> = None;
    let mut count = 0;
    let mut note = |i: usize, e: String, g: String| {
        count += 1;
        if first.is_none() {
            first = Some((i, e, g));
        }
    };
    match (expected.data(), got.data()) {
        (Data::Str(e), Data::Str(g)) => {
            for (i, (a, b)) in e.iter().zip(g).enumerate() {
                if a != b {
                    note(i, format!("{a:?}"), format!("{b:?}"));
                }
            }
        }
        _ if expected.dtype().is_float() => {
            let e = expected.to_f64_vec();
            let g = got.to_f64_vec();
            for (i, (&a, &b)) in e.iter().zip(&g).enumerate() {
                let ok = if a.is_nan() || b.is_nan() {
                    a.is_nan() && b.is_nan()
                } else if a.is_infinite() || b.is_infinite() {
                    a == b
                } else {
                    (a - b).abs() <= atol + rtol * a.abs()
                };
                if !ok {
                    note(i, a.to_string(), b.to_string());
                }
            }
        }
        (e, g) => {
            let (e, g) = (int_repr(e), int_repr(g));
            for (i, (a, b)) in e.iter().zip(&g).enumerate() {
                if a != b {
                    note(i, a.to_string(), b.to_string());
                }
            }
        }
    }
    match first {
        None => Ok(()),
        Some((index, expected, got)) => Err(Mismatch::Values {
            index,
            expected,
            got,
            count,
        }),
    }
}

/// Exact integer view of non-float data (u64 values above i64::MAX keep their bits).
fn int_repr(d: &Data) -> Vec<i128> {
    match d {
        Data::I8(v) => v.iter().map(|&x| x as i128).collect(),
        Data::I16(v) => v.iter().map(|&x| x as i128).collect(),
        Data::I32(v) => v.iter().map(|&x| x as i128).collect(),
        Data::I64(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U8(v) | Data::Coded(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U16(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U32(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U64(v) => v.iter().map(|&x| x as i128).collect(),
        Data::Bool(v) => v.iter().map(|&x| x as i128).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_use_tolerance_and_nan_matches_nan() {
        let a = Tensor::from_vec(vec![3], vec![1.0f32, f32::NAN, f32::INFINITY]).unwrap();
        let b = Tensor::from_vec(vec![3], vec![1.0005f32, f32::NAN, f32::INFINITY]).unwrap();
        assert!(compare(&a, &b, 1e-3, 0.0).is_ok());
        assert!(compare(&a, &b, 1e-4, 0.0).is_err());
        let c = Tensor::from_vec(vec![3], vec![1.0f32, 0.0, f32::INFINITY]).unwrap();
        assert!(matches!(
            compare(&a, &c, 1e-3, 1e-5),
            Err(Mismatch::Values { index: 1, count: 1, .. })
        ));
    }

    #[test]
    fn ints_are_exact_and_shapes_must_match() {
        let a = Tensor::from_vec(vec![2], vec![1i64, 2]).unwrap();
        let b = Tensor::from_vec(vec![2], vec![1i64, 3]).unwrap();
        assert!(compare(&a, &b, 1.0, 1.0).is_err());
        let c = Tensor::from_vec(vec![1, 2], vec![1i64, 2]).unwrap();
        assert!(matches!(compare(&a, &c, 0.0, 0.0), Err(Mismatch::Shape { .. })));
    }
}
