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
    /// The compile's stop fired (`kiln_kernels::stop`: cancelled, or its time limit passed).
    #[error("{}", stopped_message(*.reason, .limit, *.elapsed, .after))]
    Stopped {
        reason: kiln_kernels::stop::StopReason,
        limit: Option<std::time::Duration>,
        elapsed: std::time::Duration,
        /// The last stage that completed.
        after: String,
    },
}

fn stopped_message(
    reason: kiln_kernels::stop::StopReason,
    limit: &Option<std::time::Duration>,
    elapsed: std::time::Duration,
    after: &str,
) -> String {
    let secs = elapsed.as_secs_f64();
    match reason {
        kiln_kernels::stop::StopReason::Cancelled => format!("compile cancelled after {secs:.1} s ({after})"),
        kiln_kernels::stop::StopReason::TimeLimit => format!(
            "compile time limit of {:.0} s (compile_time_limit_s) reached after {secs:.1} s ({after})",
            limit.map_or(0.0, |l| l.as_secs_f64())
        ),
    }
}

/// The error for the current stop when it has fired (`after`: the stage that completed last).
pub(crate) fn check_stop(after: impl FnOnce() -> String) -> Result<(), CompileError> {
    if !kiln_kernels::stop::requested() {
        return Ok(());
    }
    match kiln_kernels::stop::current_state() {
        Some((reason, limit, elapsed)) => Err(CompileError::Stopped {
            reason,
            limit,
            elapsed,
            after: after(),
        }),
        None => Ok(()),
    }
}

fn hint(close: &[String]) -> String {
    if close.is_empty() {
        String::new()
    } else {
        format!(" (similar: {})", close.join(", "))
    }
}
