//! Graph, node and value types.

use kiln_ops::fast::{ConvPlan, Plan, PoolPlan};
use kiln_ops::nn::{Activation, NnOp};
use kiln_ops::{Op, Value, ValueType};

/// Index of a value in its graph's `values`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    pub ty: ValueType,
}

/// An outer-scope value a subgraph reads: `outer` in the enclosing graph is visible as
/// `inner` inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    pub outer: ValueId,
    pub inner: ValueId,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    pub name: String,
    pub values: Vec<ValueInfo>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Values known at compile time (ONNX initializers and Constant nodes).
    pub constants: Vec<(ValueId, Value)>,
    /// Outer values read by this graph when it is a subgraph (empty for the main graph).
    pub captures: Vec<Capture>,
    /// Opset versions in force, by domain ("" is the default ONNX domain).
    pub opsets: Vec<(String, i64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    /// `None` for an absent optional input.
    pub inputs: Vec<Option<ValueId>>,
    /// `None` for an output the model does not use.
    pub outputs: Vec<Option<ValueId>>,
    /// How the compiler chose to run an op node (layout, kernel, packed weights, fused
    /// activation); `None` as imported. Never changes what the node computes.
    pub plan: Option<kiln_ops::fast::Plan>,
}

impl Node {
    /// The node's plan, made as the default of its op's kind when it has none; `None` for a
    /// node whose op takes no plan.
    pub fn plan_mut(&mut self) -> Option<&mut Plan> {
        if self.plan.is_none() {
            let NodeKind::Op(op) = &self.kind else { return None };
            self.plan = Some(Plan::default_for(op)?);
        }
        self.plan.as_mut()
    }

    /// The Conv plan (the default when the node has none or is no Conv).
    pub fn conv_plan(&self) -> ConvPlan {
        match &self.plan {
            Some(Plan::Conv(p)) => *p,
            _ => ConvPlan::default(),
        }
    }

    /// The pool plan (the default when the node has none).
    pub fn pool_plan(&self) -> PoolPlan {
        match &self.plan {
            Some(Plan::Pool(p)) => *p,
            _ => PoolPlan::default(),
        }
    }

    /// The activation fused into the node: its plan's, or a compiler-made op's own.
    pub fn activation(&self) -> Option<Activation> {
        match &self.kind {
            NodeKind::Op(Op::Nn(NnOp::ChannelAffine(a))) => a.activation,
            _ => self.plan.as_ref().and_then(Plan::activation),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Op(Op),
    Control(ControlFlow),
}

impl NodeKind {
    pub fn name(&self) -> &'static str {
        match self {
            NodeKind::Op(op) => op.name(),
            NodeKind::Control(c) => c.name(),
        }
    }
}

/// Nodes that run subgraphs.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlFlow {
    If(IfNode),
    Loop(LoopNode),
    Scan(ScanNode),
    SequenceMap(SequenceMapNode),
    FlexAttention(FlexAttentionNode),
}

impl ControlFlow {
    pub fn name(&self) -> &'static str {
        match self {
            ControlFlow::If(_) => "If",
            ControlFlow::Loop(_) => "Loop",
            ControlFlow::Scan(_) => "Scan",
            ControlFlow::SequenceMap(_) => "SequenceMap",
            ControlFlow::FlexAttention(_) => "FlexAttention",
        }
    }
    pub fn subgraphs(&self) -> Vec<&Graph> {
        match self {
            ControlFlow::If(n) => vec![&n.then_branch, &n.else_branch],
            ControlFlow::Loop(n) => vec![&n.body],
            ControlFlow::Scan(n) => vec![&n.body],
            ControlFlow::SequenceMap(n) => vec![&n.body],
            ControlFlow::FlexAttention(n) => n.score_mod.iter().chain(n.prob_mod.iter()).collect(),
        }
    }
}

/// ONNX If: inputs `[cond]`; outputs are the taken branch's outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct IfNode {
    pub then_branch: Graph,
    pub else_branch: Graph,
}

/// ONNX Loop: inputs `[M?, cond?, v_initial...]`; body inputs `[iter, cond, v...]`, body
/// outputs `[cond, v..., scan...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopNode {
    pub body: Graph,
}

/// ONNX Scan (opset 9+): inputs `[state..., scan_inputs...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanNode {
    pub body: Graph,
    /// Scan-8 form: input 0 is `sequence_lens` and every value has a leading batch axis.
    pub batched: bool,
    pub num_scan_inputs: usize,
    /// Per scan input: true to iterate backwards.
    pub input_reverse: Vec<bool>,
    pub input_axes: Vec<i64>,
    pub output_reverse: Vec<bool>,
    pub output_axes: Vec<i64>,
}

/// ONNX SequenceMap: inputs `[sequence, additional...]`, each may be a sequence (iterated
/// alongside) or a tensor (passed to every iteration).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceMapNode {
    pub body: Graph,
}

/// `ai.onnx.preview` FlexAttention with modifier subgraphs: each takes the whole score (or
/// probability) tensor and returns one of the same shape.
#[derive(Debug, Clone, PartialEq)]
pub struct FlexAttentionNode {
    pub op: kiln_ops::recurrent::FlexAttention,
    pub score_mod: Option<Graph>,
    pub prob_mod: Option<Graph>,
}

impl Graph {
    pub fn value(&self, id: ValueId) -> Option<&ValueInfo> {
        self.values.get(id.index())
    }
    pub fn value_name(&self, id: ValueId) -> &str {
        self.value(id).map_or("<invalid>", |v| v.name.as_str())
    }
    pub fn add_value(&mut self, name: impl Into<String>, ty: ValueType) -> ValueId {
        self.values.push(ValueInfo { name: name.into(), ty });
        ValueId((self.values.len() - 1) as u32)
    }
    pub fn constant(&self, id: ValueId) -> Option<&Value> {
        self.constants.iter().find(|(v, _)| *v == id).map(|(_, c)| c)
    }
    pub fn opset(&self, domain: &str) -> Option<i64> {
        self.opsets.iter().find(|(d, _)| d == domain).map(|(_, v)| *v)
    }
    /// Number of nodes including those inside subgraphs.
    pub fn node_count_deep(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| match &n.kind {
                NodeKind::Op(_) => 1,
                NodeKind::Control(c) => 1 + c.subgraphs().iter().map(|g| g.node_count_deep()).sum::<usize>(),
            })
            .sum()
    }
}
