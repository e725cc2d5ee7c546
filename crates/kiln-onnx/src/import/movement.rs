//! Importers for the movement family: ONNX node → typed op of `kiln_ops::movement`.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    let _ = ctx;
    Ok(None)
}
