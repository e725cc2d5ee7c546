//! The error every op evaluation and inference returns; the runtime adds the node's name.

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
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;
