//! kiln-onnx: ONNX models into kiln's IR.
//!
//! The file is memory-mapped and decoded by prost with `bytes` fields, so weight data is read
//! in place; each node's attributes become a typed op ([`attrs::NodeCtx`] → `kiln_ops::Op`).
//! This is the only crate that knows ONNX op names, opsets and protobuf.

pub mod attrs;
pub mod contrib;
mod error;
mod functions;
mod import;
mod mmap;
mod model;
pub mod proto;
pub mod tensor;

pub use error::{ImportError, UnsupportedOp};
pub use model::{ImportOptions, Model, load_model, load_model_bytes, load_value_proto};
