//! kiln-ir: the graph every front end produces and the compiler transforms.
//!
//! A [`Graph`] owns its values (each with a name and a static [`ValueType`]) and a
//! topologically ordered list of [`Node`]s. A node is either a typed [`Op`] or a control-flow
//! construct holding subgraphs; a subgraph names the outer values it reads in its `captures`.

mod graph;
mod infer;
mod print;
mod verify;

pub use graph::{
    Capture, ControlFlow, FlexAttentionNode, Graph, IfNode, LoopNode, Node, NodeKind, ScanNode, SequenceMapNode,
    ValueId, ValueInfo,
};
pub use infer::{InferError, bind_symbols, infer_types, input_symbols, name_unknown_input_dims};
pub use kiln_ops::{Dim, Op, TensorType, Value, ValueType};
pub use verify::VerifyError;
