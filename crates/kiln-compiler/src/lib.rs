//! kiln-compiler: ONNX-free graph → Program.
//!
//! `compile` runs: extra outputs requested by the user are exposed, the ordered optimisation
//! pipeline (`pipeline.rs`) rewrites the graph at the chosen level, the graph is verified and
//! lowered (each value a slot, each node a step, each subgraph a sub-program), and the memory
//! plan (`plan.rs`) places every statically sized intermediate in one arena; at level 1 and up
//! constant MatMul weights are prepacked for the GEMM kernels (`prepack.rs`).

pub mod custom_io;
mod error;
mod lower;
mod outputs;
mod passes;
mod pipeline;
pub mod plan;
pub mod prepack;
pub mod quantize;

pub use error::CompileError;
pub use lower::lower;
pub use passes::layout::is_layout_transpose;
pub use pipeline::{PassStat, PipelineReport, optimize};

use kiln_ir::Graph;
use kiln_runtime::Program;

/// Highest optimisation level (`optimization_type` / `-O`).
pub const MAX_OPT_LEVEL: u8 = 3;

/// What the compiler is asked to do; the typed subset of the configuration it reads.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompileOptions {
    /// 0 = no rewrites (debugging), 1 = cleanup (folding, dead code, CSE), 2 = fusions
    /// (default), 3 = everything.
    pub opt_level: u8,
    /// Intermediate values to expose as extra outputs, by name (`--output-tensors`).
    pub output_tensors: Vec<String>,
    /// Expose every intermediate tensor value as an output (`--all-outputs`).
    pub all_outputs: bool,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            opt_level: 2,
            output_tensors: Vec::new(),
            all_outputs: false,
        }
    }
}

/// The result of compiling: the program, what the pipeline did, and the memory plan.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub program: Program,
    pub report: PipelineReport,
    pub memory: plan::MemoryPlan,
    /// MatMul, Gemm and channels-last Conv weights prepacked for the GEMM kernels (layout [`prepack::LAYOUT`]).
    pub prepacked: usize,
    /// 3x3 convolutions compiled to Winograd F(4x4, 3x3), their weights transformed and packed.
    pub winograd: usize,
}

/// Compiles a graph (types inferred, symbols bound) into a Program.
pub fn compile(mut graph: Graph, options: &CompileOptions) -> Result<Compiled, CompileError> {
    if options.opt_level > MAX_OPT_LEVEL {
        return Err(CompileError::Option(format!(
            "optimization level {} is out of range 0-{MAX_OPT_LEVEL}",
            options.opt_level
        )));
    }
    outputs::expose(&mut graph, &options.output_tensors, options.all_outputs)?;
    error::check_stop(|| "before the passes".into())?;
    let report = optimize(&mut graph, options.opt_level)?;
    let mut program = lower(&graph)?;
    let memory = plan::plan(&graph);
    program.arena = memory.arena_plan();
    // Winograd changes rounding (within 1e-5 relative, see kiln_kernels::winograd): from the
    // default level on, like the other fusions. Before the GEMM packing, which takes the
    // channels-last convolutions Winograd leaves.
    // Each applies to the main program and every sub-program (If branches, Loop and Scan
    // bodies): a model whose work sits in a branch (Silero VAD's sample-rate If) gets the
    // same packed weights.
    let winograd = if options.opt_level >= 2 {
        each_program(&graph, &mut program, &mut prepack::winograd)
    } else {
        0
    };
    // Level 0 runs the graph as imported, weights included.
    let prepacked = if options.opt_level >= 1 {
        // Channels-last convolutions exist from level 2 (the `layout` pass).
        each_program(&graph, &mut program, &mut prepack::run)
            + each_program(&graph, &mut program, &mut |_, p| prepack::channels_last(p))
    } else {
        0
    };
    // Integer MatMul weights pack on their first run (not counted as prepacked).
    if options.opt_level >= 1 {
        each_program(&graph, &mut program, &mut |_, p| prepack::integer_weights(p));
        // So do recurrent weights.
        each_program(&graph, &mut program, &mut |_, p| prepack::recurrent_weights(p));
    }
    error::check_stop(|| "while packing weights".into())?;
    Ok(Compiled {
        program,
        report,
        memory,
        prepacked,
        winograd,
    })
}

/// Applies `f` to a graph's program and, recursively, to each control-flow node's
/// sub-programs with their subgraphs (lowering keeps nodes and steps, and a node's subgraphs
/// and its step's sub-programs, in the same order); returns the sum of what `f` returns.
fn each_program(graph: &Graph, program: &mut Program, f: &mut dyn FnMut(&Graph, &mut Program) -> usize) -> usize {
    use kiln_runtime::StepKind;
    let mut n = f(graph, program);
    for (node, step) in graph.nodes.iter().zip(program.steps.iter_mut()) {
        let kiln_ir::NodeKind::Control(c) = &node.kind else {
            continue;
        };
        let programs: Vec<&mut Program> = match &mut step.kind {
            StepKind::If {
                then_branch,
                else_branch,
            } => vec![then_branch.as_mut(), else_branch.as_mut()],
            StepKind::Loop(l) => vec![l.body.as_mut()],
            StepKind::Scan(s) => vec![s.body.as_mut()],
            StepKind::SequenceMap { body } => vec![body.as_mut()],
            StepKind::FlexAttention {
                score_mod, prob_mod, ..
            } => score_mod
                .iter_mut()
                .chain(prob_mod.iter_mut())
                .map(|b| b.as_mut())
                .collect(),
            StepKind::Op(_) => Vec::new(),
        };
        for (sub, p) in c.subgraphs().into_iter().zip(programs) {
            n += each_program(sub, p, f);
        }
    }
    n
}
