//! Runtime errors: a bad input (named, expected vs got) or a failing step (named, with op).

use kiln_ops::OpError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error("input '{name}': {reason}")]
    Input { name: String, reason: String },
    #[error("unknown input '{name}' (the model's inputs are: {known})")]
    UnknownInput { name: String, known: String },
    #[error("missing input '{name}' (expected {expected})")]
    MissingInput { name: String, expected: String },
    #[error("node '{node}' ({op}): {source}")]
    Node {
        node: String,
        op: String,
        #[source]
        source: OpError,
    },
    #[error("node '{node}' ({op}): {reason}")]
    Control { node: String, op: String, reason: String },
    #[error("program: {0}")]
    Program(String),
}
