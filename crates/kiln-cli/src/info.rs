//! `kiln info`: what a model is made of.

use anyhow::{Context, Result};
use kiln::raw::ir::{Graph, NodeKind};
use kiln::raw::ops::{InferInput, ValueType};
use kiln::{SessionOptions, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Appends a formatted line to a String (writing to a String cannot fail).
macro_rules! outln {
    ($o:expr, $($t:tt)*) => {{
        let _ = writeln!($o, $($t)*);
    }};
}

pub fn info(path: &Path, symbols: &[(String, usize)], print_graph: bool) -> Result<()> {
    let mut out = String::new();
    if kiln::is_program_file(path) {
        program_text(&mut out, path, print_graph)?;
        return crate::emit(&out);
    }
    info_text(&mut out, path, symbols, print_graph)?;
    crate::emit(&out)
}

/// Everything a `.kiln` program file records: format, versions, hash, sections, I/O, options,
/// weights, memory plan, and (with `--graph`) its steps.
fn program_text(out: &mut String, path: &Path, print_steps: bool) -> Result<()> {
    let f = kiln::raw::runtime::file::read(path).with_context(|| format!("cannot load {}", path.display()))?;
    let m = &f.meta;
    outln!(out, "program: {} ({} bytes)", path.display(), group(f.size));
    outln!(out, "format version: {}", m.format_version);
    outln!(out, "compiled by: {} from {}", m.compiler, m.source);
    outln!(out, "content hash (BLAKE3): {}", m.content_hash);
    outln!(out, "sections:");
    outln!(out, "  {:<10} {:>12} {:>14}  {}", "name", "offset", "bytes", "crc32");
    for s in &f.sections {
        outln!(
            out,
            "  {:<10} {:>12} {:>14}  {:08x}",
            s.name,
            s.offset,
            group(s.len),
            s.crc
        );
    }
    outln!(out, "inputs:");
    for io in &m.inputs {
        outln!(out, "  {}: {}", io.name, io.ty);
    }
    outln!(out, "outputs:");
    for io in &m.outputs {
        outln!(out, "  {}: {}", io.name, io.ty);
    }
    outln!(
        out,
        "weights: {} tensors, {} bytes, packing {}, {}-byte aligned, used in place from the memory map",
        m.weights.count,
        group(m.weights.bytes),
        m.weights.packing,
        m.weights.alignment
    );
    if let Some(mem) = m
        .memory
        .as_ref()
        .and_then(|v| v.get("summary"))
        .and_then(|v| v.as_str())
    {
        outln!(out, "memory plan: {mem}");
    }
    if !m.shape_sets.is_empty() {
        let listed: Vec<String> = m.shape_sets.iter().map(|b| kiln::format_bindings(b)).collect();
        outln!(
            out,
            "shape specializations: {} compiled ahead of time ({})",
            listed.len(),
            listed.join("; ")
        );
    }
    match &m.specialize {
        Some(s) => outln!(
            out,
            "model source: embedded ({} bytes): a session compiles other input shapes on their first run (shape_cache_size)",
            group(s.bytes)
        ),
        None if m.inputs.iter().any(|i| has_symbol(&i.ty)) => outln!(
            out,
            "model source: not embedded (a model with external data): input shapes other than those above run the shape-generic program"
        ),
        None => {}
    }
    if let Some(q) = m.options.get("quantization").filter(|q| !q.is_null()) {
        outln!(
            out,
            "quantized: {} ({})",
            q["mode"].as_str().unwrap_or("?"),
            q["method"].as_str().unwrap_or("?")
        );
        for io in q["io"].as_array().into_iter().flatten() {
            outln!(
                out,
                "  {} '{}' is {}: x = {} * (q - {})",
                io["role"].as_str().unwrap_or("?"),
                io["name"].as_str().unwrap_or("?"),
                io["dtype"].as_str().unwrap_or("?"),
                io["scale"],
                io["zero_point"]
            );
        }
    }
    let effective = m.options.get("effective").cloned().unwrap_or(serde_json::Value::Null);
    outln!(out, "compile options (effective): {effective}");
    let config: Option<kiln_config::Config> = m
        .options
        .get("config")
        .and_then(|c| serde_json::from_value(c.clone()).ok());
    match config {
        Some(c) => {
            let changed = c.changed();
            outln!(
                out,
                "configuration (options set away from their defaults): {}",
                changed.len()
            );
            for (spec, value, source) in changed {
                outln!(out, "  {} = {} ({})", spec.name, value, source.describe(spec.name));
            }
        }
        None => outln!(out, "configuration: not recorded"),
    }
    let mut hist: BTreeMap<&'static str, usize> = BTreeMap::new();
    for st in &f.program.steps {
        *hist.entry(st.kind.name()).or_default() += 1;
    }
    outln!(out, "steps: {}", f.program.steps.len());
    let mut by_count: Vec<(&str, usize)> = hist.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (op, n) in by_count {
        outln!(out, "  {op:<24} {n:>6}");
    }
    if print_steps {
        outln!(out, "program steps:");
        for st in &f.program.steps {
            let name = |s: &Option<usize>| {
                s.and_then(|i| f.program.slot_names.get(i).cloned())
                    .unwrap_or_else(|| "-".into())
            };
            let ins: Vec<String> = st.inputs.iter().map(name).collect();
            let outs: Vec<String> = st.outputs.iter().map(name).collect();
            let plan = st
                .plan
                .as_ref()
                .map(|p| format!(" plan[{}]", p.summary()))
                .unwrap_or_default();
            outln!(
                out,
                "  {} = {}({}){plan} [{}]",
                outs.join(", "),
                st.kind.name(),
                ins.join(", "),
                st.name
            );
        }
    }
    Ok(())
}

fn info_text(out: &mut String, path: &Path, symbols: &[(String, usize)], print_graph: bool) -> Result<()> {
    let model = kiln::load_onnx(
        path,
        &SessionOptions {
            symbols: symbols.to_vec(),
            ..SessionOptions::default()
        },
    );
    let model = crate::loading(model, path)?;
    let g = &model.graph;
    outln!(out, "model     {}", path.display());
    outln!(
        out,
        "producer  {}",
        if model.producer.is_empty() {
            "-"
        } else {
            &model.producer
        }
    );
    outln!(out, "ir        {}", model.ir_version);
    let opsets: Vec<String> = model
        .opsets
        .iter()
        .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    outln!(out, "opsets    {}", opsets.join(", "));
    outln!(out, "\ninputs");
    for &i in &g.inputs {
        if let Some(v) = g.value(i) {
            outln!(out, "  {:<24} {}", v.name, v.ty);
        }
    }
    outln!(out, "outputs");
    for &o in &g.outputs {
        if let Some(v) = g.value(o) {
            outln!(out, "  {:<24} {}", v.name, v.ty);
        }
    }
    let mut hist: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut stats = Stats::default();
    walk(g, &mut hist, &mut stats);
    let mut hist: Vec<(&str, usize)> = hist.into_iter().collect();
    hist.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    outln!(out, "\nops ({} nodes)", hist.iter().map(|(_, n)| n).sum::<usize>());
    for (op, n) in &hist {
        outln!(out, "  {op:<24} {n}");
    }
    outln!(
        out,
        "\nparameters {} ({} bytes in constants)",
        group(stats.params),
        group(stats.param_bytes)
    );
    let macs = if stats.macs_partial {
        format!("{} (at least: some shapes are unknown)", group(stats.macs))
    } else {
        group(stats.macs)
    };
    outln!(out, "MACs       {macs}");
    if print_graph {
        outln!(out, "\n{}", g.to_text());
    }
    Ok(())
}

#[derive(Default)]
struct Stats {
    params: u64,
    param_bytes: u64,
    macs: u64,
    macs_partial: bool,
}

fn walk(g: &Graph, hist: &mut BTreeMap<&'static str, usize>, stats: &mut Stats) {
    for (_, v) in &g.constants {
        if let Value::Tensor(t) = v {
            stats.params += t.len() as u64;
            stats.param_bytes += (t.len() * t.dtype().size_of()) as u64;
        }
    }
    for node in &g.nodes {
        *hist.entry(node.kind.name()).or_default() += 1;
        match &node.kind {
            NodeKind::Op(op) => {
                let types: Vec<ValueType> = node
                    .inputs
                    .iter()
                    .map(|i| i.and_then(|i| g.value(i)).map_or(ValueType::Unknown, |v| v.ty.clone()))
                    .collect();
                let inputs: Vec<InferInput<'_>> = node
                    .inputs
                    .iter()
                    .zip(&types)
                    .map(|(i, ty)| InferInput {
                        ty,
                        konst: i.and_then(|i| g.constant(i)),
                        present: i.is_some(),
                    })
                    .collect();
                let outputs: Vec<ValueType> = node
                    .outputs
                    .iter()
                    .map(|o| o.and_then(|o| g.value(o)).map_or(ValueType::Unknown, |v| v.ty.clone()))
                    .collect();
                let m = op.macs(&inputs, &outputs);
                if m == 0
                    && matches!(
                        op.name(),
                        "Conv" | "ConvTranspose" | "MatMul" | "Gemm" | "Einsum" | "LSTM" | "GRU" | "RNN" | "Attention"
                    )
                {
                    stats.macs_partial = true;
                }
                stats.macs += m;
            }
            NodeKind::Control(c) => {
                for sub in c.subgraphs() {
                    walk(sub, hist, stats);
                }
            }
        }
    }
}

/// 25557032 → "25,557,032".
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Whether a printed type (`f32[batch,3,224,224]`) has a symbolic dim.
fn has_symbol(ty: &str) -> bool {
    let dims = ty.split_once('[').map_or("", |(_, d)| d.trim_end_matches(']'));
    dims.split(',')
        .any(|d| !d.trim().is_empty() && d.trim().parse::<u64>().is_err())
}
