//! The error every op evaluation and inference returns; the runtime adds the node's name and op.
//!
//! A small closed set of kinds, each carrying what was wrong: the input (by index) or the
//! attribute (by name), and what was expected against what it got. One input's shape is
//! `InputShape`, a value read from an input tensor (pads, split sizes, a shape tensor) is
//! `InputValue`, two inputs whose shapes must agree are `Inputs`, an attribute outside what the
//! op allows is `Attribute`, a size beyond the allocation bound is `TooLarge`, a subgraph's
//! result the op cannot take is `Subgraph`; axes, indices, dtypes and plans have kinds of
//! their own. `Unsupported` is for what kiln does not implement, never for a malformed model.

use std::borrow::Cow;

use kiln_tensor::{DType, MAX_ELEMENTS, TensorError};

/// What an op expected: mostly a fixed phrase, sometimes one with numbers in it.
pub type Expected = Cow<'static, str>;

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
    #[error("index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange { index: i64, size: usize },
    #[error("axis {axis} is out of range for rank {rank}")]
    Axis { axis: i64, rank: usize },
    /// An axis named twice in a list of axes.
    #[error("axis {axis} appears more than once in {axes:?}")]
    RepeatedAxis { axis: i64, axes: Vec<i64> },
    #[error("not supported: {0}")]
    Unsupported(String),
    /// An attribute outside what the op's spec allows (`Op::validate`, or found at evaluation
    /// when the rule involves the inputs).
    #[error("attribute {attr}: expected {expected}, got {got}")]
    Attribute {
        attr: &'static str,
        expected: Expected,
        got: String,
    },
    /// An input whose shape does not fit the op (or the layout its plan runs in).
    #[error("input {index}: expected {expected}, got shape {got:?}")]
    InputShape {
        index: usize,
        expected: Expected,
        got: Vec<usize>,
    },
    /// A value read from an input tensor that does not fit: pads, split sizes, repeats, slice
    /// starts, a shape, a scalar parameter.
    #[error("input {index}: expected {expected}, got {got}")]
    InputValue {
        index: usize,
        expected: Expected,
        got: String,
    },
    /// Two inputs whose shapes must agree (concatenation, broadcasting, inner dimensions).
    #[error("inputs {a} and {b}: expected {expected}, got shapes {:?} and {:?}", .got.0, .got.1)]
    Inputs {
        a: usize,
        b: usize,
        expected: Expected,
        got: (Vec<usize>, Vec<usize>),
    },
    /// A tensor (or one dimension of it) beyond the allocation bound, refused before any
    /// allocation.
    #[error("{what} {got} exceeds the bound of {MAX_ELEMENTS} elements")]
    TooLarge { what: &'static str, got: String },
    /// A subgraph the op runs (a FlexAttention modifier, a Loop or Scan body) that failed or
    /// returned what the op cannot take.
    #[error("{name} subgraph: expected {expected}, got {got}")]
    Subgraph {
        name: &'static str,
        expected: Expected,
        got: String,
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

impl OpError {
    /// [`OpError::Attribute`].
    pub fn attribute(attr: &'static str, expected: impl Into<Expected>, got: impl ToString) -> Self {
        OpError::Attribute {
            attr,
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// [`OpError::InputShape`].
    pub fn input_shape(index: usize, expected: impl Into<Expected>, got: &[usize]) -> Self {
        OpError::InputShape {
            index,
            expected: expected.into(),
            got: got.to_vec(),
        }
    }

    /// [`OpError::InputValue`].
    pub fn input_value(index: usize, expected: impl Into<Expected>, got: impl ToString) -> Self {
        OpError::InputValue {
            index,
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// [`OpError::Inputs`].
    pub fn inputs(a: usize, b: usize, expected: impl Into<Expected>, got_a: &[usize], got_b: &[usize]) -> Self {
        OpError::Inputs {
            a,
            b,
            expected: expected.into(),
            got: (got_a.to_vec(), got_b.to_vec()),
        }
    }

    /// [`OpError::TooLarge`].
    pub fn too_large(what: &'static str, got: impl ToString) -> Self {
        OpError::TooLarge {
            what,
            got: got.to_string(),
        }
    }

    /// [`OpError::Subgraph`].
    pub fn subgraph(name: &'static str, expected: impl Into<Expected>, got: impl ToString) -> Self {
        OpError::Subgraph {
            name,
            expected: expected.into(),
            got: got.to_string(),
        }
    }
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_culprit_and_expected_against_got() {
        let cases = [
            (
                OpError::input_shape(1, "[16], one per output channel", &[8]),
                "input 1: expected [16], one per output channel, got shape [8]",
            ),
            (
                OpError::input_value(1, "split sizes adding up to 10, the axis' size", "[3, 4]"),
                "input 1: expected split sizes adding up to 10, the axis' size, got [3, 4]",
            ),
            (
                OpError::inputs(0, 1, "A's columns (4) equal to B's rows (3)", &[2, 4], &[3, 5]),
                "inputs 0 and 1: expected A's columns (4) equal to B's rows (3), got shapes [2, 4] and [3, 5]",
            ),
            (
                OpError::attribute("num_groups", "a divisor of the 6 channels", 4),
                "attribute num_groups: expected a divisor of the 6 channels, got 4",
            ),
            (
                OpError::too_large("shape", "[1048576, 1048576]"),
                "shape [1048576, 1048576] exceeds the bound of 1073741824 elements",
            ),
            (
                OpError::RepeatedAxis {
                    axis: -1,
                    axes: vec![1, -1],
                },
                "axis -1 appears more than once in [1, -1]",
            ),
            (
                OpError::subgraph("score_mod", "a float tensor of shape [1, 2]", "i64[1, 2]"),
                "score_mod subgraph: expected a float tensor of shape [1, 2], got i64[1, 2]",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }
}
