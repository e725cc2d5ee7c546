//! Lowering an IR graph to a runtime Program, one slot per value.

use kiln_ir::{ControlFlow, Graph, NodeKind};
use kiln_runtime::{IoSpec, LoopStep, Program, ScanStep, Step, StepKind};

use crate::CompileError;

/// Lowers a verified graph (and its subgraphs) into a Program.
pub fn lower(graph: &Graph) -> Result<Program, CompileError> {
    graph.verify()?;
    let mut p = lower_graph(graph);
    p.compute_frees();
    Ok(p)
}

fn lower_graph(g: &Graph) -> Program {
    let io = |id: kiln_ir::ValueId| IoSpec {
        name: g.value_name(id).to_string(),
        slot: id.index(),
        ty: g.value(id).map_or(kiln_ops::ValueType::Unknown, |v| v.ty.clone()),
    };
    Program {
        name: g.name.clone(),
        slot_names: g.values.iter().map(|v| v.name.clone()).collect(),
        inputs: g.inputs.iter().map(|&i| io(i)).collect(),
        outputs: g.outputs.iter().map(|&o| io(o)).collect(),
        constants: g.constants.iter().map(|(id, v)| (id.index(), v.clone())).collect(),
        captures: g.captures.iter().map(|c| (c.outer.index(), c.inner.index())).collect(),
        steps: g
            .nodes
            .iter()
            .map(|n| Step {
                name: n.name.clone(),
                kind: match &n.kind {
                    NodeKind::Op(op) => StepKind::Op(op.clone()),
                    NodeKind::Control(c) => lower_control(c),
                },
                inputs: n.inputs.iter().map(|i| i.map(|i| i.index())).collect(),
                outputs: n.outputs.iter().map(|o| o.map(|o| o.index())).collect(),
                frees: Vec::new(),
                plan: n.plan.clone(),
            })
            .collect(),
        arena: kiln_runtime::ArenaPlan::default(),
    }
}

fn lower_control(c: &ControlFlow) -> StepKind {
    match c {
        ControlFlow::If(n) => StepKind::If {
            then_branch: Box::new(lower_graph(&n.then_branch)),
            else_branch: Box::new(lower_graph(&n.else_branch)),
        },
        ControlFlow::Loop(n) => StepKind::Loop(LoopStep {
            body: Box::new(lower_graph(&n.body)),
        }),
        ControlFlow::Scan(n) => StepKind::Scan(ScanStep {
            body: Box::new(lower_graph(&n.body)),
            batched: n.batched,
            num_scan_inputs: n.num_scan_inputs,
            input_reverse: n.input_reverse.clone(),
            input_axes: n.input_axes.clone(),
            output_reverse: n.output_reverse.clone(),
            output_axes: n.output_axes.clone(),
        }),
        ControlFlow::SequenceMap(n) => StepKind::SequenceMap {
            body: Box::new(lower_graph(&n.body)),
        },
        ControlFlow::FlexAttention(n) => StepKind::FlexAttention {
            op: n.op.clone(),
            score_mod: n.score_mod.as_ref().map(|g| Box::new(lower_graph(g))),
            prob_mod: n.prob_mod.as_ref().map(|g| Box::new(lower_graph(g))),
        },
    }
}
