//! Inlining of model-local functions (`ModelProto.functions`, IR 8+): a node calling a
//! function is replaced by the function's body, with formal inputs/outputs mapped to the
//! node's, internal values renamed under a unique prefix, and attribute references
//! (`ref_attr_name`) resolved from the calling node or the function's defaults.

use crate::error::ImportError;
use crate::proto::{AttributeProto, FunctionProto, NodeProto};
use std::collections::HashMap;

/// Deepest chain of functions calling functions that is expanded.
const MAX_DEPTH: usize = 32;
/// Most nodes an expansion may produce, so a hostile file cannot explode.
const MAX_NODES: usize = 1 << 20;

/// Expands every call to a function in `functions` among `nodes`, recursively.
pub fn inline(nodes: &[NodeProto], functions: &[FunctionProto]) -> Result<Vec<NodeProto>, ImportError> {
    let mut out = Vec::with_capacity(nodes.len());
    let mut counter = 0usize;
    for n in nodes {
        expand(n, functions, 0, &mut counter, &mut out)?;
    }
    Ok(out)
}

fn find<'f>(functions: &'f [FunctionProto], n: &NodeProto) -> Option<&'f FunctionProto> {
    let domain = n.domain.as_deref().unwrap_or("");
    let op = n.op_type.as_deref().unwrap_or("");
    let overload = n.overload.as_deref().unwrap_or("");
    functions.iter().find(|f| {
        f.domain.as_deref().unwrap_or("") == domain
            && f.name.as_deref().unwrap_or("") == op
            && f.overload.as_deref().unwrap_or("") == overload
    })
}

fn expand(
    n: &NodeProto,
    functions: &[FunctionProto],
    depth: usize,
    counter: &mut usize,
    out: &mut Vec<NodeProto>,
) -> Result<(), ImportError> {
    let Some(f) = find(functions, n) else {
        out.push(n.clone());
        return Ok(());
    };
    let fname = f.name.clone().unwrap_or_default();
    let err = |reason: String| ImportError::Node {
        node: n.name.clone().unwrap_or_default(),
        op: fname.clone(),
        reason,
    };
    if depth >= MAX_DEPTH {
        return Err(err(format!("functions nest deeper than {MAX_DEPTH}")));
    }
    if out.len() + f.node.len() > MAX_NODES {
        return Err(err(format!("inlining functions makes more than {MAX_NODES} nodes")));
    }
    *counter += 1;
    let prefix = format!("{}__{}_{}/", fname, n.name.as_deref().unwrap_or(""), counter);
    let mut rename: HashMap<&str, String> = HashMap::new();
    for (i, formal) in f.input.iter().enumerate() {
        rename.insert(formal, n.input.get(i).cloned().unwrap_or_default());
    }
    for (i, formal) in f.output.iter().enumerate() {
        rename.insert(formal, n.output.get(i).cloned().unwrap_or_default());
    }
    let map = |name: &String| -> String {
        if name.is_empty() {
            String::new()
        } else {
            rename
                .get(name.as_str())
                .cloned()
                .unwrap_or_else(|| format!("{prefix}{name}"))
        }
    };
    for body in &f.node {
        let mut b = body.clone();
        b.input = body.input.iter().map(map).collect();
        b.output = body.output.iter().map(map).collect();
        b.name = Some(format!("{prefix}{}", body.name.as_deref().unwrap_or("")));
        b.attribute = body.attribute.iter().filter_map(|a| resolve_attr(a, n, f)).collect();
        expand(&b, functions, depth + 1, counter, out)?;
    }
    Ok(())
}

/// An attribute of a body node: itself, or the caller's (or default) value it refers to.
fn resolve_attr(a: &AttributeProto, call: &NodeProto, f: &FunctionProto) -> Option<AttributeProto> {
    let Some(r) = a.ref_attr_name.as_deref().filter(|r| !r.is_empty()) else {
        return Some(a.clone());
    };
    let found = call
        .attribute
        .iter()
        .find(|c| c.name.as_deref() == Some(r))
        .or_else(|| f.attribute_proto.iter().find(|d| d.name.as_deref() == Some(r)))?;
    let mut v = found.clone();
    v.name = a.name.clone();
    Some(v)
}
