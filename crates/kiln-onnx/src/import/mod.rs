//! Op importers, one module per family of `kiln_ops`. Each family's `import` claims the node
//! types it knows and returns `None` for the others; the first family to claim a node wins.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;

mod elementwise;
mod misc;
mod movement;
mod nn;
mod quant;
pub(crate) mod recurrent;
mod reduce;
mod sequence;

/// The typed op for one node, or `None` when no family knows its type (the caller collects
/// those into one "unsupported ops" error).
pub fn import_op(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    type Importer = fn(&NodeCtx<'_>) -> Result<Option<Op>>;
    const FAMILIES: [Importer; 8] = [
        elementwise::import,
        movement::import,
        reduce::import,
        nn::import,
        quant::import,
        recurrent::import,
        sequence::import,
        misc::import,
    ];
    for import in FAMILIES {
        if let Some(op) = import(ctx)? {
            // The one attribute check, shared with the program decoder.
            op.validate().map_err(|e| ctx.op_err(e))?;
            return Ok(Some(op));
        }
    }
    Ok(None)
}
