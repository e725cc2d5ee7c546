//! ModelProto → [`Model`]: graph construction with scoped name resolution for subgraphs,
//! initializers and Constant nodes as constants, control-flow nodes, topological ordering, and
//! one error listing every unsupported op.

use crate::attrs::NodeCtx;
use crate::error::{ImportError, UnsupportedOp};
use crate::import::import_op;
use crate::proto::{self, GraphProto, ModelProto, NodeProto, TypeProto, ValueInfoProto, type_proto};
use crate::tensor::TensorLoader;
use bytes::Bytes;
use kiln_ir::{
    Capture, ControlFlow, FlexAttentionNode, Graph, IfNode, LoopNode, Node, NodeKind, ScanNode, SequenceMapNode,
    ValueId,
};
use kiln_ops::{Dim, Sequence, TensorType, Value, ValueType};
use kiln_tensor::{DType, Tensor};
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

type Result<T> = std::result::Result<T, ImportError>;

/// Highest opset of the default domain whose semantics kiln's importers follow.
pub const MAX_OPSET: i64 = 28;
/// Nesting bound for subgraphs, so a hostile file cannot exhaust the stack.
const MAX_DEPTH: usize = 64;

/// Options for import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Symbolic dims bound to values (qaic's `onnx_define_symbol`).
    pub symbols: Vec<(String, usize)>,
}

/// An imported model.
#[derive(Debug, Clone)]
pub struct Model {
    pub graph: Graph,
    pub ir_version: i64,
    pub producer: String,
    pub opsets: Vec<(String, i64)>,
}

/// Memory-maps and imports an .onnx file. External data is looked up in the file's folder.
pub fn load_model(path: &Path, options: &ImportOptions) -> Result<Model> {
    let io = |cause| ImportError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let map = crate::mmap::map_file(&file).map_err(io)?;
    let bytes = Bytes::from_owner(map);
    let dir = path
        .parent()
        .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    import(bytes, dir, options)
}

/// Imports a model held in memory; external data is refused (there is no folder).
pub fn load_model_bytes(bytes: Bytes, options: &ImportOptions) -> Result<Model> {
    import(bytes, None, options)
}

fn import(bytes: Bytes, dir: Option<&Path>, options: &ImportOptions) -> Result<Model> {
    let model = ModelProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    let mut opsets: Vec<(String, i64)> = Vec::new();
    for o in &model.opset_import {
        let domain = normalize_domain(o.domain.as_deref().unwrap_or(""));
        let version = o.version.unwrap_or(0);
        if domain.is_empty() && version > MAX_OPSET {
            return Err(ImportError::Opset {
                domain: "ai.onnx".into(),
                version,
                max: MAX_OPSET,
            });
        }
        opsets.push((domain.to_string(), version));
    }
    if !opsets.iter().any(|(d, _)| d.is_empty()) {
        // IR < 3 models carry no opset_import; they are opset 1.
        opsets.push((String::new(), 1));
    }
    let gp = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Decode("model has no graph".into()))?;
    let loader = TensorLoader::new(dir);
    let mut b = Builder {
        loader: &loader,
        functions: &model.functions,
        opsets: &opsets,
        scopes: Vec::new(),
        unsupported: Vec::new(),
    };
    let mut graph = b.build(gp, &[], None)?;
    if !b.unsupported.is_empty() {
        return Err(ImportError::UnsupportedOps(b.unsupported));
    }
    graph.opsets = opsets.clone();
    graph.verify().map_err(|e| ImportError::Graph {
        graph: e.graph,
        reason: e.reason,
    })?;
    let known = kiln_ir::input_symbols(&graph);
    for (name, _) in &options.symbols {
        if !known.contains(name) {
            return Err(ImportError::Graph {
                graph: graph.name.clone(),
                reason: format!(
                    "symbol '{name}' does not appear in the model's inputs (symbols: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            });
        }
    }
    kiln_ir::name_unknown_input_dims(&mut graph);
    kiln_ir::bind_symbols(&mut graph, &options.symbols).map_err(|e| ImportError::Node {
        node: e.node,
        op: e.op,
        reason: e.source.to_string(),
    })?;
    Ok(Model {
        graph,
        ir_version: model.ir_version.unwrap_or(0),
        producer: format!(
            "{} {}",
            model.producer_name.unwrap_or_default(),
            model.producer_version.unwrap_or_default()
        )
        .trim()
        .to_string(),
        opsets,
    })
}

fn normalize_domain(d: &str) -> &str {
    if d == "ai.onnx" { "" } else { d }
}

struct Scope {
    graph: Graph,
    names: HashMap<String, ValueId>,
}

struct Builder<'a> {
    loader: &'a TensorLoader<'a>,
    functions: &'a [crate::proto::FunctionProto],
    opsets: &'a [(String, i64)],
    scopes: Vec<Scope>,
    unsupported: Vec<UnsupportedOp>,
}

impl Builder<'_> {
    /// Builds a (sub)graph. `formal_inputs` overrides nothing; subgraph inputs come from the
    /// GraphProto itself. `parent_name` is the node owning a subgraph, for messages.
    fn build(&mut self, gp: &GraphProto, _formal: &[()], parent_name: Option<&str>) -> Result<Graph> {
        if self.scopes.len() >= MAX_DEPTH {
            return Err(ImportError::Graph {
                graph: gp.name.clone().unwrap_or_default(),
                reason: format!("subgraphs nested deeper than {MAX_DEPTH}"),
            });
        }
        let name = gp
            .name
            .clone()
            .unwrap_or_else(|| parent_name.map_or("main".into(), |p| format!("{p}.body")));
        self.scopes.push(Scope {
            graph: Graph {
                name: name.clone(),
                ..Graph::default()
            },
            names: HashMap::new(),
        });
        let r = self.fill(gp);
        let scope = self.scopes.pop();
        r?;
        let Some(scope) = scope else {
            return Err(ImportError::Graph {
                graph: name,
                reason: "scope stack underflow".into(),
            });
        };
        Ok(scope.graph)
    }

    fn top(&mut self) -> Result<&mut Scope> {
        self.scopes.last_mut().ok_or_else(|| ImportError::Graph {
            graph: String::new(),
            reason: "no scope".into(),
        })
    }

    fn fill(&mut self, gp: &GraphProto) -> Result<()> {
        let graph_name = gp.name.clone().unwrap_or_default();
        let gerr = |reason: String| ImportError::Graph {
            graph: graph_name.clone(),
            reason,
        };
        // Initializers first: they are constants (also when an old model lists them as inputs).
        for init in &gp.initializer {
            let name = init.name.clone().unwrap_or_default();
            let t = self.loader.load(init)?;
            let scope = self.top()?;
            let id = scope
                .graph
                .add_value(name.clone(), ValueType::Tensor(TensorType::of(&t)));
            scope.graph.constants.push((id, Value::Tensor(t)));
            scope.names.insert(name, id);
        }
        if !gp.sparse_initializer.is_empty() {
            return Err(gerr("sparse initializers are not supported".into()));
        }
        let declared: HashMap<&str, &ValueInfoProto> = gp
            .value_info
            .iter()
            .chain(&gp.output)
            .filter_map(|v| Some((v.name.as_deref()?, v)))
            .collect();
        for vi in &gp.input {
            let name = vi.name.clone().unwrap_or_default();
            let scope = self.top()?;
            if scope.names.contains_key(&name) {
                continue; // an initializer with the same name: a constant, not a runtime input
            }
            let ty = value_type(vi.r#type.as_ref());
            let id = scope.graph.add_value(name.clone(), ty);
            scope.graph.inputs.push(id);
            scope.names.insert(name, id);
        }
        let inlined;
        let body = if self.functions.is_empty() {
            gp
        } else {
            inlined = GraphProto {
                node: crate::functions::inline(&gp.node, self.functions)?,
                ..Default::default()
            };
            &inlined
        };
        for node in topo_order(body).map_err(gerr)? {
            self.node(node, &declared, None)?;
        }
        if !self.unsupported.is_empty() {
            return Ok(()); // reported as one error by the caller
        }
        for vi in &gp.output {
            let name = vi.name.clone().unwrap_or_default();
            let id = self
                .resolve(&name)?
                .ok_or_else(|| gerr(format!("output '{name}' is never produced")))?;
            let declared_ty = value_type(vi.r#type.as_ref());
            let scope = self.top()?;
            if let Some(info) = scope.graph.values.get_mut(id.index())
                && info.ty == ValueType::Unknown
            {
                info.ty = declared_ty;
            }
            scope.graph.outputs.push(id);
        }
        Ok(())
    }

    /// Finds a name in the current scope, capturing it from enclosing scopes when needed.
    fn resolve(&mut self, name: &str) -> Result<Option<ValueId>> {
        let level = self.scopes.len().saturating_sub(1);
        self.resolve_at(name, level)
    }

    fn resolve_at(&mut self, name: &str, level: usize) -> Result<Option<ValueId>> {
        let Some(scope) = self.scopes.get(level) else {
            return Ok(None);
        };
        if let Some(&id) = scope.names.get(name) {
            return Ok(Some(id));
        }
        if level == 0 {
            return Ok(None);
        }
        let Some(outer) = self.resolve_at(name, level - 1)? else {
            return Ok(None);
        };
        let ty = self.scopes[level - 1]
            .graph
            .value(outer)
            .map_or(ValueType::Unknown, |v| v.ty.clone());
        let scope = &mut self.scopes[level];
        let inner = scope.graph.add_value(name.to_string(), ty);
        scope.graph.captures.push(Capture { outer, inner });
        scope.names.insert(name.to_string(), inner);
        Ok(Some(inner))
    }

    fn define_output(
        &mut self,
        name: &str,
        declared: &HashMap<&str, &ValueInfoProto>,
        node: &str,
    ) -> Result<Option<ValueId>> {
        if name.is_empty() {
            return Ok(None);
        }
        let ty = declared
            .get(name)
            .map_or(ValueType::Unknown, |vi| value_type(vi.r#type.as_ref()));
        let scope = self.top()?;
        if scope.names.contains_key(name) {
            return Err(ImportError::Graph {
                graph: scope.graph.name.clone(),
                reason: format!("value '{name}' is produced twice (again by node '{node}')"),
            });
        }
        let id = scope.graph.add_value(name.to_string(), ty);
        scope.names.insert(name.to_string(), id);
        Ok(Some(id))
    }

    /// Imports one node; `expanded` is set for the nodes of a com.microsoft expansion, which
    /// are read at the expansions' own opset.
    fn node(&mut self, np: &NodeProto, declared: &HashMap<&str, &ValueInfoProto>, expanded: Option<i64>) -> Result<()> {
        let op_type = np.op_type.as_deref().unwrap_or("");
        let domain = normalize_domain(np.domain.as_deref().unwrap_or(""));
        let node_name = np.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| {
            np.output
                .first()
                .map_or_else(|| op_type.to_string(), |o| format!("{op_type}:{o}"))
        });
        let opset = expanded.or_else(|| self.opsets.iter().find(|(d, _)| d == domain).map(|(_, v)| *v));
        let Some(opset) = opset else {
            self.note_unsupported(domain, op_type, 0, &node_name);
            return Ok(());
        };
        let mut inputs = Vec::with_capacity(np.input.len());
        for name in &np.input {
            if name.is_empty() {
                inputs.push(None);
                continue;
            }
            let id = self.resolve(name)?.ok_or_else(|| ImportError::Node {
                node: node_name.clone(),
                op: op_type.to_string(),
                reason: format!("input '{name}' is not defined anywhere in scope"),
            })?;
            inputs.push(Some(id));
        }
        let ctx = NodeCtx {
            op_type,
            domain,
            opset,
            name: &node_name,
            inputs_present: np.input.iter().map(|n| !n.is_empty()).collect(),
            num_outputs: np.output.len(),
            attrs: &np.attribute,
            loader: self.loader,
        };
        if expanded.is_none() && crate::contrib::expands(domain, op_type) {
            for n in crate::contrib::expand(&ctx, np)? {
                self.node(&n, declared, Some(crate::contrib::OPSET))?;
            }
            return Ok(());
        }
        // Constant nodes become constants.
        if domain.is_empty() && op_type == "Constant" {
            let value = constant_value(&ctx)?;
            let out = np.output.first().map(String::as_str).unwrap_or("");
            if let Some(id) = self.define_output(out, declared, &node_name)? {
                let scope = self.top()?;
                if let Some(info) = scope.graph.values.get_mut(id.index()) {
                    info.ty = value.value_type();
                }
                scope.graph.constants.push((id, value));
            }
            return Ok(());
        }
        let flex_with_mods = domain == "ai.onnx.preview"
            && op_type == "FlexAttention"
            && (ctx.has_attr("score_mod") || ctx.has_attr("prob_mod"));
        let kind = if flex_with_mods || (domain.is_empty() && matches!(op_type, "If" | "Loop" | "Scan" | "SequenceMap"))
        {
            let control = self.control(&ctx, np)?;
            match control {
                Some(c) if self.unsupported.is_empty() => NodeKind::Control(c),
                _ => {
                    // A subgraph held unsupported ops: keep collecting them.
                    for name in &np.output {
                        if !name.is_empty() && self.resolve(name)?.is_none() {
                            self.define_output(name, declared, &node_name)?;
                        }
                    }
                    return Ok(());
                }
            }
        } else {
            match import_op(&ctx)? {
                Some(op) => NodeKind::Op(op),
                None => {
                    self.note_unsupported(domain, op_type, opset, &node_name);
                    // Define its outputs anyway so later nodes resolve and every unsupported
                    // op is collected into one error.
                    for name in &np.output {
                        if !name.is_empty() && self.resolve(name)?.is_none() {
                            self.define_output(name, declared, &node_name)?;
                        }
                    }
                    return Ok(());
                }
            }
        };
        let mut outputs = Vec::with_capacity(np.output.len());
        for name in &np.output {
            outputs.push(self.define_output(name, declared, &node_name)?);
        }
        self.top()?.graph.nodes.push(Node {
            name: node_name,
            kind,
            inputs,
            outputs,
            plan: None,
        });
        Ok(())
    }

    fn note_unsupported(&mut self, domain: &str, op_type: &str, opset: i64, node: &str) {
        if let Some(u) = self
            .unsupported
            .iter_mut()
            .find(|u| u.domain == domain && u.op_type == op_type)
        {
            u.nodes.push(node.to_string());
        } else {
            self.unsupported.push(UnsupportedOp {
                domain: domain.to_string(),
                op_type: op_type.to_string(),
                opset,
                nodes: vec![node.to_string()],
            });
        }
    }

    fn subgraph(&mut self, ctx: &NodeCtx<'_>, np: &NodeProto, attr: &str) -> Result<Graph> {
        let a = np
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(attr))
            .ok_or_else(|| ctx.attr_err(attr, "is required but missing"))?;
        let g = a.g.as_ref().ok_or_else(|| ctx.attr_err(attr, "must hold a graph"))?;
        self.build(g, &[], Some(ctx.name))
    }

    fn control(&mut self, ctx: &NodeCtx<'_>, np: &NodeProto) -> Result<Option<ControlFlow>> {
        let before = self.unsupported.len();
        let c = self.control_checked(ctx, np);
        // Shape checks on a body that skipped unsupported nodes say nothing useful.
        if self.unsupported.len() != before || !self.unsupported.is_empty() {
            return Ok(None);
        }
        c
    }

    fn control_checked(&mut self, ctx: &NodeCtx<'_>, np: &NodeProto) -> Result<Option<ControlFlow>> {
        Ok(Some(match ctx.op_type {
            "If" => {
                ctx.check_inputs(1, 1)?;
                let then_branch = self.subgraph(ctx, np, "then_branch")?;
                let else_branch = self.subgraph(ctx, np, "else_branch")?;
                for (g, which) in [(&then_branch, "then_branch"), (&else_branch, "else_branch")] {
                    if g.outputs.len() != ctx.num_outputs {
                        return Err(ctx.attr_err(
                            which,
                            format!("has {} outputs, the node {}", g.outputs.len(), ctx.num_outputs),
                        ));
                    }
                }
                ControlFlow::If(IfNode {
                    then_branch,
                    else_branch,
                })
            }
            "Loop" => {
                let body = self.subgraph(ctx, np, "body")?;
                let carried = ctx.num_inputs().saturating_sub(2);
                if body.inputs.len() != carried + 2 {
                    return Err(ctx.attr_err(
                        "body",
                        format!(
                            "takes {} inputs, expected 2 + {carried} loop-carried",
                            body.inputs.len()
                        ),
                    ));
                }
                if body.outputs.len() < carried + 1 || ctx.num_outputs > body.outputs.len() - 1 {
                    return Err(ctx.attr_err(
                        "body",
                        format!(
                            "has {} outputs for {carried} loop-carried values and {} node outputs",
                            body.outputs.len(),
                            ctx.num_outputs
                        ),
                    ));
                }
                ControlFlow::Loop(LoopNode { body })
            }
            "Scan" => {
                // Scan-8 has a leading `sequence_lens` input and batched values.
                let batched = ctx.opset < 9;
                let data_inputs = ctx.num_inputs().saturating_sub(usize::from(batched));
                let body = self.subgraph(ctx, np, "body")?;
                let n = ctx.required("num_scan_inputs", ctx.attr_i64("num_scan_inputs")?)?;
                let num_scan_inputs = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= data_inputs)
                    .ok_or_else(|| ctx.attr_err("num_scan_inputs", format!("{n} is not in 0..={data_inputs}")))?;
                let state = data_inputs - num_scan_inputs;
                if body.inputs.len() != data_inputs || body.outputs.len() != ctx.num_outputs {
                    return Err(ctx.attr_err("body", "input/output counts do not match the node"));
                }
                let num_scan_outputs = ctx.num_outputs.saturating_sub(state);
                let flags = |name: &str, n: usize| -> Result<Vec<bool>> {
                    match ctx.attr_i64s(name)? {
                        None => Ok(vec![false; n]),
                        Some(v) if v.len() == n => Ok(v.iter().map(|&x| x != 0).collect()),
                        Some(v) => Err(ctx.attr_err(name, format!("has {} entries, expected {n}", v.len()))),
                    }
                };
                let axes = |name: &str, n: usize| -> Result<Vec<i64>> {
                    match ctx.attr_i64s(name)? {
                        None => Ok(vec![0; n]),
                        Some(v) if v.len() == n => Ok(v),
                        Some(v) => Err(ctx.attr_err(name, format!("has {} entries, expected {n}", v.len()))),
                    }
                };
                let scan = if batched {
                    ScanNode {
                        num_scan_inputs,
                        batched,
                        input_reverse: flags("directions", num_scan_inputs)?,
                        input_axes: vec![0; num_scan_inputs],
                        output_reverse: vec![false; num_scan_outputs],
                        output_axes: vec![0; num_scan_outputs],
                        body,
                    }
                } else {
                    ScanNode {
                        num_scan_inputs,
                        batched,
                        input_reverse: flags("scan_input_directions", num_scan_inputs)?,
                        input_axes: axes("scan_input_axes", num_scan_inputs)?,
                        output_reverse: flags("scan_output_directions", num_scan_outputs)?,
                        output_axes: axes("scan_output_axes", num_scan_outputs)?,
                        body,
                    }
                };
                ControlFlow::Scan(scan)
            }
            "FlexAttention" => {
                let op = crate::import::recurrent::flex_attention(ctx)?;
                let mut modifier = |name: &str| -> Result<Option<Graph>> {
                    if !ctx.has_attr(name) {
                        return Ok(None);
                    }
                    let g = self.subgraph(ctx, np, name)?;
                    if g.inputs.len() != 1 || g.outputs.len() != 1 {
                        return Err(ctx.attr_err(name, "must take one input and return one output"));
                    }
                    Ok(Some(g))
                };
                let score_mod = modifier("score_mod")?;
                let prob_mod = modifier("prob_mod")?;
                ControlFlow::FlexAttention(FlexAttentionNode {
                    op,
                    score_mod,
                    prob_mod,
                })
            }
            "SequenceMap" => {
                let body = self.subgraph(ctx, np, "body")?;
                if body.inputs.len() != ctx.num_inputs() || body.outputs.len() != ctx.num_outputs {
                    return Err(ctx.attr_err("body", "input/output counts do not match the node"));
                }
                ControlFlow::SequenceMap(SequenceMapNode { body })
            }
            _ => return Ok(None),
        }))
    }
}

/// Orders nodes so every producer precedes its consumers (files are usually sorted already;
/// the order among independent nodes is kept).
fn topo_order(gp: &GraphProto) -> std::result::Result<Vec<&NodeProto>, String> {
    let n = gp.node.len();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in gp.node.iter().enumerate() {
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            producer.insert(o.as_str(), i);
        }
    }
    // Subgraph nodes may read outer values implicitly; count those as dependencies too.
    let deps: Vec<Vec<usize>> = gp
        .node
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let mut names: Vec<&str> = node.input.iter().map(String::as_str).collect();
            for a in &node.attribute {
                if let Some(g) = &a.g {
                    collect_free_names(g, &mut names);
                }
                for g in &a.graphs {
                    collect_free_names(g, &mut names);
                }
            }
            let mut d: Vec<usize> = names
                .iter()
                .filter_map(|s| producer.get(s).copied())
                .filter(|&p| p != i)
                .collect();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    let mut indegree: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &p in d {
            users[p].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(&gp.node[i]);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != n {
        return Err("the graph has a cycle".into());
    }
    Ok(order)
}

fn collect_free_names<'g>(g: &'g GraphProto, out: &mut Vec<&'g str>) {
    for node in &g.node {
        out.extend(node.input.iter().map(String::as_str));
        for a in &node.attribute {
            if let Some(sg) = &a.g {
                collect_free_names(sg, out);
            }
        }
    }
    out.extend(g.output.iter().filter_map(|o| o.name.as_deref()));
}

/// TypeProto → ValueType; unnamed unknown dims get a fresh symbol each.
pub(crate) fn value_type(t: Option<&TypeProto>) -> ValueType {
    let Some(t) = t else { return ValueType::Unknown };
    match &t.value {
        Some(type_proto::Value::TensorType(tt)) => {
            let dtype = tt.elem_type.and_then(DType::from_onnx);
            let shape = tt.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(proto::tensor_shape_proto::dimension::Value::DimValue(v)) if *v >= 0 => {
                            Dim::Fixed(*v as usize)
                        }
                        Some(proto::tensor_shape_proto::dimension::Value::DimParam(p)) if !unnamed_param(p) => {
                            Dim::Sym(p.clone())
                        }
                        _ => Dim::fresh(),
                    })
                    .collect()
            });
            ValueType::Tensor(TensorType { dtype, shape })
        }
        Some(type_proto::Value::SequenceType(s)) => ValueType::Sequence(Box::new(value_type(s.elem_type.as_deref()))),
        Some(type_proto::Value::OptionalType(o)) => ValueType::Optional(Box::new(value_type(o.elem_type.as_deref()))),
        _ => ValueType::Unknown,
    }
}

/// Whether a dim_param names no symbol: empty, or what exporters write for "unknown" (paddle2onnx
/// writes `?`, others `-1` or `None`). Each such dim is an unknown of its own, never shared.
fn unnamed_param(p: &str) -> bool {
    matches!(p.trim(), "" | "?" | "None" | "none" | "null") || p.trim().parse::<i64>().is_ok()
}

/// The value of a Constant node, from whichever attribute holds it.
fn constant_value(ctx: &NodeCtx<'_>) -> Result<Value> {
    if let Some(t) = ctx.attr_tensor("value")? {
        return Ok(Value::Tensor(t));
    }
    if let Some(v) = ctx.attr_f32("value_float")? {
        return Ok(Value::Tensor(Tensor::scalar(v)));
    }
    if let Some(v) = ctx.attr_f32s("value_floats")? {
        return Ok(Value::Tensor(
            Tensor::from_vec(vec![v.len()], v).map_err(|e| ctx.node_err(e.to_string()))?,
        ));
    }
    if let Some(v) = ctx.attr_i64("value_int")? {
        return Ok(Value::Tensor(Tensor::scalar(v)));
    }
    if let Some(v) = ctx.attr_i64s("value_ints")? {
        return Ok(Value::Tensor(
            Tensor::from_vec(vec![v.len()], v).map_err(|e| ctx.node_err(e.to_string()))?,
        ));
    }
    if let Some(v) = ctx.attr_string("value_string")? {
        return Ok(Value::Tensor(Tensor::scalar(v)));
    }
    if let Some(v) = ctx.attr_strings("value_strings")? {
        return Ok(Value::Tensor(
            Tensor::from_vec(vec![v.len()], v).map_err(|e| ctx.node_err(e.to_string()))?,
        ));
    }
    if ctx.has_attr("sparse_value") {
        return Err(ctx.attr_err("sparse_value", "sparse constants are not supported"));
    }
    Err(ctx.node_err("Constant has no value attribute"))
}

/// Decodes a serialized TensorProto, SequenceProto or OptionalProto (as test data files hold)
/// into a value of the expected type.
pub fn load_value_proto(bytes: &[u8], expected: &ValueType, dir: Option<&Path>) -> Result<Value> {
    let loader = TensorLoader::new(dir);
    match expected {
        ValueType::Sequence(_) => {
            let s = proto::SequenceProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
            sequence_value(&s, &loader)
        }
        ValueType::Optional(inner) => {
            let o = proto::OptionalProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
            optional_value(&o, inner, &loader)
        }
        _ => {
            let t = proto::TensorProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
            Ok(Value::Tensor(loader.load(&t)?))
        }
    }
}

fn sequence_value(s: &proto::SequenceProto, loader: &TensorLoader<'_>) -> Result<Value> {
    let items = s
        .tensor_values
        .iter()
        .map(|t| loader.load(t))
        .collect::<Result<Vec<_>>>()?;
    if !s.sequence_values.is_empty() || !s.map_values.is_empty() || !s.optional_values.is_empty() {
        return Err(ImportError::Decode(
            "sequences of sequences, maps or optionals are not supported".into(),
        ));
    }
    let dtype = items.first().map(Tensor::dtype);
    Ok(Value::Sequence(Sequence { dtype, items }))
}

fn optional_value(o: &proto::OptionalProto, inner: &ValueType, loader: &TensorLoader<'_>) -> Result<Value> {
    if let Some(t) = &o.tensor_value {
        return Ok(Value::Optional(
            Some(Box::new(Value::Tensor(loader.load(t)?))),
            inner.clone(),
        ));
    }
    if let Some(s) = &o.sequence_value {
        return Ok(Value::Optional(
            Some(Box::new(sequence_value(s, loader)?)),
            inner.clone(),
        ));
    }
    Ok(Value::Optional(None, inner.clone()))
}
