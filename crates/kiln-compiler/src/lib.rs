//! kiln-compiler: graph → Program.
//!
//! Today the pipeline is verify → lower: each IR value becomes a slot, each node a step,
//! each subgraph a sub-program with its captures. Optimisation passes and the memory planner
//! slot in before lowering.

mod lower;

pub use lower::{CompileError, lower};
