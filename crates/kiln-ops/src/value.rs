//! Runtime values (tensors, sequences, optionals), the argument view ops receive, and the
//! static types inference works with.

use crate::error::OpError;
use kiln_tensor::{DType, Tensor};
use std::fmt;

/// A value flowing between nodes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum Value {
    Tensor(Tensor),
    Sequence(Sequence),
    /// An optional; `None` carries the type it would hold.
    Optional(
        #[serde(deserialize_with = "crate::serde_depth::nested")] Option<Box<Value>>,
        ValueType,
    ),
}

/// An ordered sequence of tensors of one element type.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Sequence {
    pub dtype: Option<DType>,
    pub items: Vec<Tensor>,
}

impl Value {
    /// Copies every tensor held in a region of the run arena into owned storage: for values
    /// that leave the run (its outputs), whose arena the next run reuses.
    pub fn detach(&mut self) {
        match self {
            Value::Tensor(t) => t.detach(),
            Value::Sequence(s) => s.items.iter_mut().for_each(Tensor::detach),
            Value::Optional(Some(v), _) => v.detach(),
            Value::Optional(None, _) => {}
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Value::Tensor(_) => "tensor",
            Value::Sequence(_) => "sequence",
            Value::Optional(..) => "optional",
        }
    }

    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The static type this value has.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::Tensor(t) => ValueType::Tensor(TensorType::of(t)),
            Value::Sequence(s) => ValueType::Sequence(Box::new(ValueType::Tensor(TensorType {
                dtype: s.dtype,
                shape: None,
            }))),
            Value::Optional(_, ty) => ValueType::Optional(Box::new(ty.clone())),
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}

/// One dimension of a static shape: a number, or a named symbol bound later.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(usize),
    Sym(String),
}

impl Dim {
    /// Whether a symbol names an unnamed dim (`fresh`, or the importer's `unk__<input>_<axis>`).
    pub fn is_unnamed(symbol: &str) -> bool {
        symbol.starts_with("unk__")
    }

    /// A new symbol for a dim nothing names (an ONNX dim with neither value nor param, or the
    /// disagreeing dims of two If branches). Each call gives a distinct `unk__N`, so two
    /// unrelated unknown dims are never taken for equal. Inputs' `unk__` dims bind nothing.
    pub fn fresh() -> Dim {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Dim::Sym(format!(
            "unk__{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// Static type of a tensor: dtype and shape, each possibly unknown.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq, Hash, Default)]
pub struct TensorType {
    pub dtype: Option<DType>,
    /// `None` when even the rank is unknown; a `Dim::Sym` for an unknown-but-named dim.
    pub shape: Option<Vec<Dim>>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> TensorType {
        TensorType {
            dtype: Some(dtype),
            shape: Some(shape),
        }
    }
    pub fn fixed(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType::new(dtype, shape.iter().map(|&d| Dim::Fixed(d)).collect())
    }
    pub fn dtype_only(dtype: Option<DType>) -> TensorType {
        TensorType { dtype, shape: None }
    }
    pub fn of(t: &Tensor) -> TensorType {
        TensorType::fixed(t.dtype(), t.shape())
    }
    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(Vec::len)
    }
    /// All dims as numbers, when every one is fixed.
    pub fn fixed_shape(&self) -> Option<Vec<usize>> {
        self.shape
            .as_ref()?
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Some(*n),
                Dim::Sym(_) => None,
            })
            .collect()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dtype {
            Some(d) => write!(f, "{d}")?,
            None => f.write_str("?")?,
        }
        match &self.shape {
            Some(s) => {
                f.write_str("[")?;
                for (i, d) in s.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
                f.write_str("]")
            }
            None => f.write_str("[..]"),
        }
    }
}

/// Static type of any value.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq, Hash)]
pub enum ValueType {
    Tensor(TensorType),
    Sequence(#[serde(deserialize_with = "crate::serde_depth::nested")] Box<ValueType>),
    Optional(#[serde(deserialize_with = "crate::serde_depth::nested")] Box<ValueType>),
    /// Nothing is known (e.g. an op whose inference is not written yet).
    Unknown,
}

impl ValueType {
    pub fn tensor(&self) -> Option<&TensorType> {
        match self {
            ValueType::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Tensor(t) => write!(f, "{t}"),
            ValueType::Sequence(t) => write!(f, "seq<{t}>"),
            ValueType::Optional(t) => write!(f, "opt<{t}>"),
            ValueType::Unknown => f.write_str("?"),
        }
    }
}

/// What inference sees of one input: its static type and, when it is a compile-time constant,
/// its value (so e.g. Reshape can read its target shape).
#[derive(Debug, Clone, Copy)]
pub struct InferInput<'a> {
    pub ty: &'a ValueType,
    pub konst: Option<&'a Value>,
    /// False for an optional input the node leaves out (its `ty` is then `Unknown`), so an
    /// absent input is never confused with a present one of unknown type.
    pub present: bool,
}

/// The inputs of one op evaluation; absent optional inputs are `None`.
#[derive(Debug, Clone, Copy)]
pub struct Args<'a> {
    inputs: &'a [Option<&'a Value>],
    /// Bit `i` set: output `i` is read by someone (outputs from 64 on always count as read).
    wanted: u64,
}

impl<'a> Args<'a> {
    /// Arguments of a call whose every output is wanted.
    pub fn new(inputs: &'a [Option<&'a Value>]) -> Args<'a> {
        Args {
            inputs,
            wanted: u64::MAX,
        }
    }
    /// Marks which outputs are read (bit `i` for output `i`): an op may then leave an unwanted
    /// trailing output uncomputed and return fewer values (MaxPool's Indices, LayerNorm's
    /// statistics, ...). Output 0 is always computed.
    pub fn with_wanted(mut self, mask: u64) -> Args<'a> {
        self.wanted = mask;
        self
    }
    /// Whether output `i` is read.
    pub fn output_wanted(&self, i: usize) -> bool {
        i >= 64 || self.wanted & (1u64 << i) != 0
    }
    pub fn len(&self) -> usize {
        self.inputs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }
    /// Input `i`, whatever its kind; `None` when absent.
    pub fn value(&self, i: usize) -> Option<&'a Value> {
        self.inputs.get(i).copied().flatten()
    }
    /// A required tensor input.
    pub fn tensor(&self, i: usize) -> Result<&'a Tensor, OpError> {
        match self.value(i) {
            Some(Value::Tensor(t)) => Ok(t),
            Some(v) => Err(OpError::InputKind {
                index: i,
                expected: "tensor",
                got: v.kind(),
            }),
            None => Err(OpError::MissingInput { index: i }),
        }
    }
    /// An optional tensor input: `None` when absent (or an empty optional).
    pub fn opt_tensor(&self, i: usize) -> Result<Option<&'a Tensor>, OpError> {
        match self.value(i) {
            None => Ok(None),
            Some(Value::Tensor(t)) => Ok(Some(t)),
            Some(Value::Optional(None, _)) => Ok(None),
            Some(Value::Optional(Some(v), _)) => match v.as_ref() {
                Value::Tensor(t) => Ok(Some(t)),
                v => Err(OpError::InputKind {
                    index: i,
                    expected: "tensor",
                    got: v.kind(),
                }),
            },
            Some(v) => Err(OpError::InputKind {
                index: i,
                expected: "tensor",
                got: v.kind(),
            }),
        }
    }
    /// A required sequence input.
    pub fn sequence(&self, i: usize) -> Result<&'a Sequence, OpError> {
        match self.value(i) {
            Some(Value::Sequence(s)) => Ok(s),
            Some(v) => Err(OpError::InputKind {
                index: i,
                expected: "sequence",
                got: v.kind(),
            }),
            None => Err(OpError::MissingInput { index: i }),
        }
    }
    /// All present tensor inputs (for variadic ops).
    pub fn tensors(&self) -> Result<smallvec::SmallVec<[&'a Tensor; 8]>, OpError> {
        (0..self.len())
            .filter(|&i| self.value(i).is_some())
            .map(|i| self.tensor(i))
            .collect()
    }
}
