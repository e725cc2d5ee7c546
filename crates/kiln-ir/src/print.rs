//! A readable text dump of a graph (`kiln info --graph`).

use crate::graph::{Graph, NodeKind, ValueId};
use kiln_ops::Value;
use std::fmt::{self, Write};

/// The op's typed attributes as text (`{ pads: [1, 1, 1, 1], .. }`), without the family and
/// variant wrappers of its Debug form; empty for ops without attributes.
fn attrs_text(op: &kiln_ops::Op) -> String {
    let full = format!("{op:?}");
    let mut s = full.as_str();
    // Peel `Family(Variant(...))` wrappers down to the innermost struct or name.
    loop {
        let Some(open) = s.find('(') else { break };
        let head = &s[..open];
        if !head.chars().all(|c| c.is_alphanumeric() || c == '_') || !s.ends_with(')') {
            break;
        }
        s = &s[open + 1..s.len() - 1];
    }
    match s.find('{') {
        Some(i) if s.ends_with('}') => format!(" {}", &s[i..]),
        _ => String::new(),
    }
}

impl Graph {
    fn fmt_value(&self, id: ValueId) -> String {
        match self.value(id) {
            Some(v) => format!("%{}: {}", v.name, v.ty),
            None => format!("%<invalid {}>", id.0),
        }
    }

    fn write_indented(&self, out: &mut String, indent: usize) -> fmt::Result {
        let pad = " ".repeat(indent);
        let opsets: Vec<String> = self
            .opsets
            .iter()
            .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
            .collect();
        writeln!(
            out,
            "{pad}graph {} {}",
            self.name,
            if opsets.is_empty() {
                String::new()
            } else {
                format!("(opsets {})", opsets.join(", "))
            }
        )?;
        for &i in &self.inputs {
            writeln!(out, "{pad}  input  {}", self.fmt_value(i))?;
        }
        for cap in &self.captures {
            writeln!(
                out,
                "{pad}  capture {} (outer value {})",
                self.fmt_value(cap.inner),
                cap.outer.0
            )?;
        }
        for (id, v) in &self.constants {
            let what = match v {
                Value::Tensor(t) if t.len() <= 8 => format!(" = {:?}", t.to_f64_vec()),
                _ => String::new(),
            };
            writeln!(out, "{pad}  const  {}{what}", self.fmt_value(*id))?;
        }
        for node in &self.nodes {
            let outs: Vec<String> = node
                .outputs
                .iter()
                .map(|o| o.map_or("_".into(), |o| self.fmt_value(o)))
                .collect();
            let ins: Vec<String> = node
                .inputs
                .iter()
                .map(|i| i.map_or("_".into(), |i| format!("%{}", self.value_name(i))))
                .collect();
            match &node.kind {
                NodeKind::Op(op) => {
                    writeln!(
                        out,
                        "{pad}  {} = {}({}){}{}  # '{}'",
                        outs.join(", "),
                        op.name(),
                        ins.join(", "),
                        attrs_text(op),
                        node.plan
                            .as_ref()
                            .map(|p| format!(" plan[{}]", p.summary()))
                            .unwrap_or_default(),
                        node.name
                    )?;
                }
                NodeKind::Control(c) => {
                    writeln!(
                        out,
                        "{pad}  {} = {}({})  # '{}'",
                        outs.join(", "),
                        c.name(),
                        ins.join(", "),
                        node.name
                    )?;
                    for g in c.subgraphs() {
                        g.write_indented(out, indent + 4)?;
                    }
                }
            }
        }
        let outs: Vec<String> = self
            .outputs
            .iter()
            .map(|&o| format!("%{}", self.value_name(o)))
            .collect();
        writeln!(out, "{pad}  output {}", outs.join(", "))
    }

    /// The whole graph as text, subgraphs indented under their node.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_indented(&mut s, 0);
        s
    }
}
