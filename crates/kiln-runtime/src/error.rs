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
    #[error("run cancelled at node '{node}' ({op}) after {elapsed_ms:.1} ms")]
    Cancelled { node: String, op: String, elapsed_ms: f64 },
    #[error(
        "run time limit of {limit_ms:.0} ms (run_time_limit_ms) reached at node '{node}' ({op}) after {elapsed_ms:.1} ms"
    )]
    TimeLimit {
        node: String,
        op: String,
        limit_ms: f64,
        elapsed_ms: f64,
    },
    #[error(
        "memory limit of {} (run_memory_limit_mb) reached at node '{node}' ({op}): it needs {} with {} held",
        mib(*limit_bytes),
        mib(*needed_bytes),
        mib(*held_bytes)
    )]
    MemoryLimit {
        node: String,
        op: String,
        limit_bytes: u64,
        needed_bytes: u64,
        held_bytes: u64,
    },
    #[error(
        "Loop '{node}': iteration limit of {limit} (loop_iteration_limit) reached{}",
        trip_count.map_or_else(|| " (no trip count)".to_string(), |m| format!(" (trip count {m})"))
    )]
    LoopLimit {
        node: String,
        limit: u64,
        trip_count: Option<i64>,
    },
}

/// Bytes as MiB for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}
