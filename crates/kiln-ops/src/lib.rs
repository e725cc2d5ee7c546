//! kiln-ops: the closed operator set. Each op is a typed struct (ONNX attributes parsed, with
//! defaults applied, by the importer); each family module gives every op its static type
//! inference and its reference evaluation, the semantic oracle fast kernels are tested against.
//!
//! Nothing here knows ONNX protobuf or attribute names; the runtime executes these ops, the IR
//! holds them.

/// Declares an op family: the enum of its ops, one variant per op struct, and the dispatch of
/// `name`, `eval` and `infer` to each op's own methods, the one dispatch form of the crate. A
/// variant is named as its ONNX op type unless it gives a name function, `Variant(Type) = f`
/// with `f: fn(&Type) -> &'static str` (ops whose name depends on their attributes, such as
/// MaxPool / AveragePool or the three window functions).
macro_rules! op_family {
    (
        $(#[$meta:meta])*
        pub enum $family:ident {
            $( $(#[$vmeta:meta])* $variant:ident($ty:ty) $(= $name:expr)? ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
        pub enum $family {
            $( $(#[$vmeta])* $variant($ty) ),*
        }

        impl $family {
            /// The op type, as shown in dumps and errors (e.g. `Conv`, `MaxPool`).
            pub fn name(&self) -> &'static str {
                match self {
                    $( $family::$variant(op) => op_family!(@name op, $variant $(, $name)?) ),*
                }
            }

            /// The reference evaluation: every output from the inputs.
            pub fn eval(&self, args: &$crate::value::Args<'_>) -> $crate::error::Result<$crate::Outputs> {
                match self {
                    $( $family::$variant(op) => op.eval(args) ),*
                }
            }

            /// Static output types from the input types.
            pub fn infer(
                &self,
                inputs: &[$crate::value::InferInput<'_>],
            ) -> $crate::error::Result<Vec<$crate::value::ValueType>> {
                match self {
                    $( $family::$variant(op) => op.infer(inputs) ),*
                }
            }
        }
    };
    (@name $op:ident, $variant:ident) => {{
        let _ = $op;
        stringify!($variant)
    }};
    (@name $op:ident, $variant:ident, $name:expr) => {
        ($name)($op)
    };
}

pub mod error;
pub mod serde_depth;
pub mod util;
mod validate;
pub mod value;

pub mod elementwise;
pub mod fast;
pub mod misc;
pub mod movement;
pub mod nn;
pub mod quant;
pub mod recurrent;
pub mod reduce;
pub mod sequence;

pub use error::{OpError, Result};
pub use value::{Args, Dim, InferInput, Sequence, TensorType, Value, ValueType};

/// What an op evaluation returns: its output values, inline when there is one (most ops), so
/// evaluating an op allocates no list.
pub type Outputs = smallvec::SmallVec<[Value; 1]>;

/// Every operator kiln executes, grouped by family. Control flow (If, Loop, Scan, SequenceMap)
/// holds subgraphs and lives in the IR and runtime instead.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum Op {
    Elementwise(elementwise::ElementwiseOp),
    Movement(movement::MovementOp),
    Reduce(reduce::ReduceOp),
    Nn(nn::NnOp),
    Quant(quant::QuantOp),
    Recurrent(recurrent::RecurrentOp),
    Sequence(sequence::SequenceOp),
    Misc(misc::MiscOp),
}

macro_rules! each_family {
    ($self:expr, $op:ident => $body:expr) => {
        match $self {
            Op::Elementwise($op) => $body,
            Op::Movement($op) => $body,
            Op::Reduce($op) => $body,
            Op::Nn($op) => $body,
            Op::Quant($op) => $body,
            Op::Recurrent($op) => $body,
            Op::Sequence($op) => $body,
            Op::Misc($op) => $body,
        }
    };
}

impl Op {
    /// Whether [`Self::view_shape`] applies (a match on the op kind, no work).
    pub fn is_view(&self) -> bool {
        use movement::MovementOp;
        matches!(
            self,
            Op::Movement(
                MovementOp::Reshape(_) | MovementOp::Flatten(_) | MovementOp::Squeeze(_) | MovementOp::Unsqueeze(_)
            )
        )
    }

    /// For ops whose single output is input 0's elements under another shape (Reshape,
    /// Flatten, Squeeze, Unsqueeze): that shape, so a caller owning input 0 can move it
    /// instead of copying. `None` for every other op.
    pub fn view_shape(&self, args: &Args<'_>) -> Option<Result<kiln_tensor::Shape, OpError>> {
        use movement::MovementOp;
        match self {
            Op::Movement(MovementOp::Reshape(r)) => Some(r.view_shape(args)),
            Op::Movement(MovementOp::Flatten(f)) => Some(f.view_shape(args)),
            Op::Movement(MovementOp::Squeeze(q)) => Some(q.view_shape(args)),
            Op::Movement(MovementOp::Unsqueeze(u)) => Some(u.view_shape(args)),
            _ => None,
        }
    }

    /// Short name of the op kind, as shown in dumps and errors (e.g. `Conv`, `Add`).
    pub fn name(&self) -> &'static str {
        each_family!(self, op => op.name())
    }

    /// Reference evaluation: computes every output from the inputs.
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        each_family!(self, op => op.eval(args))
    }

    /// Static output types from the input types (and constant inputs where known).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        each_family!(self, op => op.infer(inputs))
    }

    /// The output value when it follows from the input *types* alone (Shape and Size of
    /// inputs with fixed dims), so shape arithmetic can be folded before any data exists.
    pub fn fold_static(&self, inputs: &[InferInput<'_>]) -> Option<Value> {
        match self {
            Op::Movement(movement::MovementOp::Shape(op)) => op.fold_static(inputs),
            Op::Movement(movement::MovementOp::Size(op)) => op.fold_static(inputs),
            _ => None,
        }
    }

    /// Multiply-accumulate count for the given input shapes, for `kiln info` (0 where the op
    /// does no MAC-like work).
    pub fn macs(&self, inputs: &[InferInput<'_>], outputs: &[ValueType]) -> u64 {
        match self {
            Op::Nn(op) => op.macs(inputs, outputs),
            Op::Recurrent(op) => op.macs(inputs, outputs),
            // An 8-bit convolution: every output element sums `C/group x kH x kW` products
            // (W, input 3, is `[M, C/group, kH, kW]`).
            Op::Quant(quant::QuantOp::QLinearConv(_) | quant::QuantOp::ConvInteger(_)) => {
                let w = if matches!(self, Op::Quant(quant::QuantOp::QLinearConv(_))) {
                    3
                } else {
                    1
                };
                let dims =
                    |v: Option<&ValueType>| v.and_then(ValueType::tensor).and_then(value::TensorType::fixed_shape);
                match (dims(inputs.get(w).map(|i| i.ty)), dims(outputs.first())) {
                    (Some(ws), Some(ys)) => {
                        let per: u64 = ws.iter().skip(1).fold(1u64, |a, &d| a.saturating_mul(d as u64));
                        ys.iter().fold(per, |a, &d| a.saturating_mul(d as u64))
                    }
                    _ => 0,
                }
            }
            _ => 0,
        }
    }
}
