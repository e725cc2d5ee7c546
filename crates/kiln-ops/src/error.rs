//! The error every op evaluation and inference returns; the runtime adds the node's name.
//!
//! Kinds carry what was wrong: the input or attribute, and expected against got (`Attribute`,
//! `InputShape`, `Axis`, `IndexOutOfRange`, dtypes). `Shape(String)` and `Value(String)` are
//! the older free-form kinds, still used by many reference ops and being replaced.

use kiln_tensor::{DType, TensorError};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    #[error("input {index} is required but absent")]
    MissingInput { index: usize },
    #[error("input {index} must be a {expected}, got a {got}")]
    InputKind {
        index: usize,
        expected: &'static str,
        got: &'static str,
    },
    #[error("input {index}: dtype {got} is not supported here")]
    UnsupportedDType { index: usize, got: DType },
    #[error("inputs have mismatched dtypes: {a} vs {b}")]
    DTypeMismatch { a: DType, b: DType },
    #[error("shape error: {0}")]
    Shape(String),
    #[error("invalid value: {0}")]
    Value(String),
    #[error("index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange { index: i64, size: usize },
    #[error("axis {axis} is out of range for rank {rank}")]
    Axis { axis: i64, rank: usize },
    #[error("not supported: {0}")]
    Unsupported(String),
    /// An attribute outside what the op's spec allows (`Op::validate`).
    #[error("attribute {attr}: expected {expected}, got {got}")]
    Attribute {
        attr: &'static str,
        expected: &'static str,
        got: String,
    },
    /// An input whose shape does not fit the op (or the layout its plan runs in).
    #[error("input {index}: expected {expected}, got shape {got:?}")]
    InputShape {
        index: usize,
        expected: &'static str,
        got: Vec<usize>,
    },
    /// A compiler plan that does not fit its op (a crafted program file).
    #[error("a {op} node cannot carry the plan '{plan}': {reason}")]
    Plan {
        op: &'static str,
        plan: String,
        reason: &'static str,
    },
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;
