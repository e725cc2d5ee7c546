//! The compiler's error type.

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    #[error(transparent)]
    Verify(#[from] kiln_ir::VerifyError),
    #[error(transparent)]
    Infer(#[from] kiln_ir::InferError),
    /// A compile option with a value the compiler cannot use.
    #[error("{0}")]
    Option(String),
    /// `--output-tensors` names a value the graph does not have.
    #[error("output tensor '{name}' is not a value of the model{}", hint(.close))]
    UnknownTensor { name: String, close: Vec<String> },
    /// A pass failed (a bug, or an op whose constant evaluation failed), named with its node.
    #[error("pass {pass}: node '{node}': {message}")]
    Pass {
        pass: &'static str,
        node: String,
        message: String,
    },
}

fn hint(close: &[String]) -> String {
    if close.is_empty() {
        String::new()
    } else {
        format!(" (similar: {})", close.join(", "))
    }
}
