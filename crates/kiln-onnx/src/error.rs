//! Import errors: each names the node, op, attribute or tensor at fault.

use kiln_tensor::TensorError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The cause is part of the message (not a `source()`), so chain-printing callers show it once.
    #[error("cannot read {path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("not a valid ONNX protobuf: {0}")]
    Decode(String),
    #[error("{}", unsupported_message(.0))]
    UnsupportedOps(Vec<UnsupportedOp>),
    #[error("node '{node}' ({op}): attribute '{attr}': {reason}")]
    Attribute {
        node: String,
        op: String,
        attr: String,
        reason: String,
    },
    #[error("node '{node}' ({op}): {reason}")]
    Node { node: String, op: String, reason: String },
    #[error("tensor '{name}': {reason}")]
    Tensor { name: String, reason: String },
    #[error("external data of tensor '{name}': {reason}")]
    ExternalData { name: String, reason: String },
    #[error("graph '{graph}': {reason}")]
    Graph { graph: String, reason: String },
    #[error("model uses opset {version} of domain '{domain}', kiln supports up to {max}")]
    Opset { domain: String, version: i64, max: i64 },
}

/// One unsupported op type (with its domain and opset) and the nodes that use it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnsupportedOp {
    pub domain: String,
    pub op_type: String,
    pub opset: i64,
    pub nodes: Vec<String>,
}

fn unsupported_message(ops: &[UnsupportedOp]) -> String {
    let mut s = format!("{} unsupported op type(s):", ops.len());
    for op in ops {
        let domain = if op.domain.is_empty() || op.domain == "ai.onnx" {
            String::new()
        } else {
            format!("{}.", op.domain)
        };
        let shown: Vec<&str> = op.nodes.iter().take(5).map(String::as_str).collect();
        let more = if op.nodes.len() > 5 {
            format!(" and {} more", op.nodes.len() - 5)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "\n  {domain}{} (opset {}): nodes {}{more}",
            op.op_type,
            op.opset,
            shown.join(", ")
        ));
    }
    s
}

impl ImportError {
    pub(crate) fn tensor(name: &str, reason: impl Into<String>) -> ImportError {
        ImportError::Tensor {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
    pub(crate) fn from_tensor_error(name: &str, e: TensorError) -> ImportError {
        ImportError::tensor(name, e.to_string())
    }
}
