//! Post-training quantization on the user's data (qaic's `convert_to_quantize`, `dump_profile`,
//! `load_profile`): the model is cleaned for quantization (`kiln_compiler::quantize::prepare`),
//! the activations its quantizable nodes read are profiled over the calibration samples (a
//! min/max pass, then a histogram pass over each range widened to hold 0), a calibration method
//! picks each range, and the graph is rewritten with QDQ (`kiln_compiler::quantize::quantize`)
//! before the usual compile. An accuracy report compares the quantized model with the float one
//! on the calibration samples: SQNR of every output and the ten profiled tensors with the lowest.
//! Profiles are Glow's YAML (`profile_file.rs`).

use crate::session::{Error, Session, SessionOptions};
use kiln_compiler::quantize::calib::{self, Histogram};
use kiln_compiler::quantize::{self as q, Spec};
use kiln_ir::{Graph, ValueId};
use kiln_onnx::Model;
use kiln_ops::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// One calibration sample: a value for every model input, by name.
pub type Sample = Vec<(String, Value)>;

/// What to do with the calibration data.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantizeMode {
    /// Profile the samples and compile the quantized model (`convert_to_quantize`).
    Calibrate,
    /// Profile the samples, write the profile here, compile the float model (`dump_profile`).
    DumpProfile(PathBuf),
    /// Quantize from this profile, without samples (`load_profile`).
    LoadProfile(PathBuf),
    /// Take the ranges this file gives (`external_quantization_file`, see
    /// [`parse_external`]); tensors it does not list are calibrated on the samples.
    External(PathBuf),
}

/// Where profiling is (for a progress bar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeProgress {
    /// "ranges", "histograms" or "accuracy".
    pub stage: &'static str,
    pub done: usize,
    pub total: usize,
}

/// A progress callback.
#[derive(Clone)]
pub struct ProgressFn(pub Arc<dyn Fn(QuantizeProgress) + Send + Sync>);

impl std::fmt::Debug for ProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressFn")
    }
}

/// How to quantize a model as it is compiled.
#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    pub spec: Spec,
    pub mode: QuantizeMode,
    /// The calibration samples (none with `LoadProfile`).
    pub samples: Arc<Vec<Sample>>,
    /// Samples profiled at once (`profiling_threads`), each run on one thread.
    pub threads: usize,
    /// Compare the quantized model with the float one on the samples (the accuracy report).
    pub report: bool,
    pub progress: Option<ProgressFn>,
    /// Write the quantized graph as text and the report (`quantization_debug`).
    pub debug_text: bool,
    /// Write `quantized_graph.json` (`quantized_graph_export`).
    pub export_json: bool,
    /// Where those go (`model_debug_save_dir`, else `output_dir`, else the working directory).
    pub debug_dir: Option<PathBuf>,
    /// The program takes and returns 8-bit tensors (`remove_io_quantization`).
    pub remove_io: bool,
}

/// The SQNR of one tensor of the quantized model against the float model, over the samples:
/// `10 log10(sum x^2 / sum (x - x_q)^2)`; `None` when the two are identical.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TensorSqnr {
    pub name: String,
    pub sqnr_db: Option<f64>,
}

/// What quantizing did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct QuantizeReport {
    /// "convert_to_quantize", "dump_profile" or "load_profile".
    pub mode: String,
    /// The calibration method and schemas, as the options spell them.
    pub method: String,
    pub samples: usize,
    /// Quantized nodes by op type.
    pub nodes: Vec<(String, usize)>,
    pub activations: usize,
    pub weights: usize,
    pub per_channel_weights: usize,
    pub biases: usize,
    /// Quantizable nodes left in float, with the reason.
    pub kept: Vec<(String, String)>,
    /// SQNR of each model output (dB).
    pub outputs: Vec<TensorSqnr>,
    /// The ten profiled tensors with the lowest SQNR.
    pub worst: Vec<TensorSqnr>,
    /// The profile written (`dump_profile`).
    pub profile: Option<PathBuf>,
    /// Inputs and outputs the program takes and returns in 8 bits (`remove_io_quantization`).
    pub io: Vec<q::IoQuant>,
}

impl QuantizeReport {
    /// A few lines for a terminal.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let nodes: Vec<String> = self.nodes.iter().map(|(op, n)| format!("{n} {op}")).collect();
        s.push_str(&format!(
            "quantization ({}; {}): {} calibration samples; {} nodes quantized ({}), {} activations, {} weights ({} per channel), {} biases\n",
            self.mode,
            self.method,
            self.samples,
            self.nodes.iter().map(|(_, n)| n).sum::<usize>(),
            if nodes.is_empty() { "none".to_string() } else { nodes.join(", ") },
            self.activations,
            self.weights,
            self.per_channel_weights,
            self.biases
        ));
        for (node, why) in self.kept.iter().take(10) {
            s.push_str(&format!("  kept in float: {node}: {why}\n"));
        }
        if let Some(p) = &self.profile {
            s.push_str(&format!("  profile written to {}\n", p.display()));
        }
        for q in &self.io {
            s.push_str(&format!(
                "  {} '{}' is {}: x = {} * (q - {})\n",
                q.role, q.name, q.dtype, q.scale, q.zero_point
            ));
        }
        let db = |v: Option<f64>| v.map_or_else(|| "exact".to_string(), |d| format!("{d:.2} dB"));
        if !self.outputs.is_empty() {
            s.push_str("  SQNR against the float model on the calibration samples:\n");
            for t in &self.outputs {
                s.push_str(&format!("    output {:<32} {}\n", t.name, db(t.sqnr_db)));
            }
        }
        if !self.worst.is_empty() {
            s.push_str("  lowest SQNR of the quantized tensors:\n");
            for t in &self.worst {
                s.push_str(&format!("    {:<40} {}\n", t.name, db(t.sqnr_db)));
            }
        }
        s
    }
}

fn err(reason: impl Into<String>) -> Error {
    Error::Quantize(reason.into())
}

/// Quantizes `model` as `options.quantize` asks; the model unchanged when it asks nothing.
pub(crate) fn apply(model: &Model, options: &SessionOptions) -> Result<(Model, Option<QuantizeReport>), Error> {
    let Some(qo) = &options.quantize else {
        return Ok((model.clone(), None));
    };
    let mut prepared = model.graph.clone();
    q::prepare(&mut prepared)?;
    let mut targets = q::targets(&prepared, &qo.spec);
    if qo.remove_io {
        // The outputs are returned in 8 bits: their ranges are calibrated too.
        for &o in &prepared.outputs {
            let f32_out = prepared
                .value(o)
                .and_then(|v| v.ty.tensor())
                .is_some_and(|t| t.dtype == Some(kiln_tensor::DType::F32));
            if f32_out && !targets.contains(&o) {
                targets.push(o);
            }
        }
    }
    let hash = graph_hash(&prepared);
    if let QuantizeMode::External(path) = &qo.mode {
        return apply_external(model, prepared, &targets, path, qo, options);
    }
    let histograms: Vec<Histogram> = match &qo.mode {
        QuantizeMode::LoadProfile(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::Profile {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let profile = crate::profile_file::parse(&text).map_err(|reason| Error::Profile {
                path: path.display().to_string(),
                reason,
            })?;
            if profile.hash != hash {
                return Err(Error::Profile {
                    path: path.display().to_string(),
                    reason: format!(
                        "the profile is of another graph: its GraphPreLowerHash is {}, this model's is {hash}",
                        profile.hash
                    ),
                });
            }
            let by_name: HashMap<&str, &Histogram> = profile.entries.iter().map(|(n, h)| (n.as_str(), h)).collect();
            targets
                .iter()
                .map(|&v| {
                    let name = prepared.value_name(v);
                    by_name.get(name).map(|h| (*h).clone()).ok_or_else(|| Error::Profile {
                        path: path.display().to_string(),
                        reason: format!("no entry for tensor '{name}', which this model quantizes"),
                    })
                })
                .collect::<Result<_, _>>()?
        }
        QuantizeMode::Calibrate | QuantizeMode::DumpProfile(_) | QuantizeMode::External(_) => {
            if qo.samples.is_empty() {
                return Err(err(
                    "no calibration data: pass --calibration-data PATH (a folder of .npz files or one .npz with a \
                     leading sample axis), calibration_data in a configuration, or load_profile",
                ));
            }
            profile(model, &prepared, &targets, qo, options)?
        }
    };
    let names: Vec<String> = targets.iter().map(|&v| prepared.value_name(v).to_string()).collect();
    let mut report = QuantizeReport {
        method: describe(&qo.spec),
        samples: qo.samples.len(),
        ..QuantizeReport::default()
    };
    if let QuantizeMode::DumpProfile(path) = &qo.mode {
        let entries: Vec<(String, Histogram)> = names.iter().cloned().zip(histograms).collect();
        let text = crate::profile_file::write(&crate::profile_file::Profile {
            version: format!("kiln {}", env!("CARGO_PKG_VERSION")),
            hash,
            entries,
        });
        std::fs::write(path, text).map_err(|e| Error::Profile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        report.mode = "dump_profile".into();
        report.profile = Some(path.clone());
        // qaic compiles the float model after dumping the profile.
        return Ok((model.clone(), Some(report)));
    }
    report.mode = match qo.mode {
        QuantizeMode::LoadProfile(_) => "load_profile",
        _ => "convert_to_quantize",
    }
    .into();
    let ranges: HashMap<ValueId, (f32, f32)> = targets
        .iter()
        .zip(&histograms)
        .map(|(&v, h)| (v, calib::range(h, qo.spec.method, qo.spec.activations)))
        .collect();
    finish(model, prepared, &names, ranges, report, qo, options)
}

/// Rewrites `prepared` with `ranges` and measures the result.
fn finish(
    model: &Model,
    prepared: Graph,
    names: &[String],
    ranges: HashMap<ValueId, (f32, f32)>,
    mut report: QuantizeReport,
    qo: &QuantizeOptions,
    options: &SessionOptions,
) -> Result<(Model, Option<QuantizeReport>), Error> {
    let mut quantized = prepared.clone();
    let summary = q::quantize(&mut quantized, &qo.spec, &ranges)?;
    // Outputs are compared in float; their 8-bit form comes after the report.
    let output_ranges: HashMap<ValueId, (f32, f32)> = ranges
        .iter()
        .filter(|(v, _)| prepared.outputs.contains(v))
        .map(|(&v, &r)| (v, r))
        .collect();
    report.nodes = summary.nodes.iter().map(|(op, n)| ((*op).to_string(), *n)).collect();
    report.activations = summary.activations;
    report.weights = summary.weights;
    report.per_channel_weights = summary.per_channel;
    report.biases = summary.biases;
    report.kept = summary.kept;
    let ranges_by_name: HashMap<String, (f32, f32)> = ranges
        .iter()
        .map(|(&v, &r)| (prepared.value_name(v).to_string(), r))
        .collect();
    let quantized_model = Model {
        graph: quantized,
        ..model.clone()
    };
    if qo.report && !qo.samples.is_empty() {
        let float_model = Model {
            graph: prepared,
            ..model.clone()
        };
        let (outputs, worst) = accuracy(&float_model, &quantized_model, names, qo, options)?;
        report.outputs = outputs;
        report.worst = worst;
    }
    let mut quantized_model = quantized_model;
    if qo.remove_io {
        report.io = q::quantize_io(&mut quantized_model.graph, &qo.spec, &output_ranges)?;
    }
    if qo.debug_text || qo.export_json {
        write_debug(&quantized_model.graph, &ranges_by_name, &report, qo)?;
    }
    Ok((quantized_model, Some(report)))
}

/// `external_quantization_file`: the file's ranges, the other targets calibrated on the samples.
fn apply_external(
    model: &Model,
    prepared: Graph,
    targets: &[ValueId],
    path: &std::path::Path,
    qo: &QuantizeOptions,
    options: &SessionOptions,
) -> Result<(Model, Option<QuantizeReport>), Error> {
    let bad = |reason: String| Error::Profile {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let given = parse_external(&text).map_err(bad)?;
    let names: Vec<String> = targets.iter().map(|&v| prepared.value_name(v).to_string()).collect();
    let mut ranges: HashMap<ValueId, (f32, f32)> = HashMap::new();
    let mut missing: Vec<ValueId> = Vec::new();
    for (&v, name) in targets.iter().zip(&names) {
        match given.get(name.as_str()) {
            Some(&r) => {
                ranges.insert(v, r);
            }
            None => missing.push(v),
        }
    }
    if !missing.is_empty() {
        if qo.samples.is_empty() {
            let list: Vec<&str> = missing.iter().take(5).map(|&v| prepared.value_name(v)).collect();
            return Err(bad(format!(
                "no range for {} tensor(s) this model quantizes ({}{}), and no calibration data to measure them",
                missing.len(),
                list.join(", "),
                if missing.len() > 5 { ", ..." } else { "" }
            )));
        }
        let hists = profile(model, &prepared, &missing, qo, options)?;
        for (&v, h) in missing.iter().zip(&hists) {
            ranges.insert(v, calib::range(h, qo.spec.method, qo.spec.activations));
        }
    }
    let report = QuantizeReport {
        mode: "external_quantization_file".into(),
        method: format!(
            "{} ranges from {}; {}",
            targets.len() - missing.len(),
            path.display(),
            describe(&qo.spec)
        ),
        samples: qo.samples.len(),
        ..QuantizeReport::default()
    };
    finish(model, prepared, &names, ranges, report, qo, options)
}

/// Ranges by tensor name from an `external_quantization_file`: a JSON object whose values are
/// `{"min": a, "max": b}`, `[a, b]`, or ONNX Runtime's calibration table entries
/// `{"lowest": a, "highest": b}` (numbers or one-element lists).
pub fn parse_external(text: &str) -> Result<HashMap<String, (f32, f32)>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("expected a JSON object of tensor name to range")?;
    let num = |x: &serde_json::Value| -> Option<f64> {
        match x {
            serde_json::Value::Array(a) if a.len() == 1 => a.first().and_then(serde_json::Value::as_f64),
            other => other.as_f64(),
        }
    };
    let mut out = HashMap::new();
    for (name, r) in obj {
        let pair = match r {
            serde_json::Value::Array(a) if a.len() == 2 => a.first().and_then(num).zip(a.get(1).and_then(num)),
            serde_json::Value::Object(o) => o
                .get("min")
                .or_else(|| o.get("lowest"))
                .and_then(num)
                .zip(o.get("max").or_else(|| o.get("highest")).and_then(num)),
            _ => None,
        };
        let Some((lo, hi)) = pair else {
            return Err(format!(
                "tensor '{name}': expected {{\"min\": a, \"max\": b}}, [a, b] or {{\"lowest\": a, \"highest\": b}}, got {r}"
            ));
        };
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(format!("tensor '{name}': {lo} to {hi} is not a finite range"));
        }
        out.insert(name.clone(), (lo as f32, hi as f32));
    }
    Ok(out)
}

/// `quantization_debug` / `quantized_graph_export`: the quantized graph as text and as JSON,
/// and the report, in the debug directory.
fn write_debug(
    g: &Graph,
    ranges: &HashMap<String, (f32, f32)>,
    report: &QuantizeReport,
    qo: &QuantizeOptions,
) -> Result<(), Error> {
    let dir = qo.debug_dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, text))
            .map_err(|e| err(format!("cannot write {}: {e}", path.display())))
    };
    if qo.debug_text {
        write("quantized_graph.txt", g.to_text())?;
        write(
            "quantization_report.json",
            serde_json::to_string_pretty(report).unwrap_or_default() + "\n",
        )?;
    }
    if qo.export_json {
        write(
            "quantized_graph.json",
            serde_json::to_string_pretty(&graph_json(g, ranges)).unwrap_or_default() + "\n",
        )?;
    }
    Ok(())
}

/// The quantized graph as JSON: nodes, and every tensor a QuantizeLinear or a DequantizeLinear
/// of a constant defines the grid of.
fn graph_json(g: &Graph, ranges: &HashMap<String, (f32, f32)>) -> serde_json::Value {
    use kiln_ir::{NodeKind, Op};
    use kiln_ops::quant::QuantOp;
    let name = |v: &Option<ValueId>| v.map_or(String::new(), |v| g.value_name(v).to_string());
    let constant = |v: &Option<ValueId>| -> Option<&kiln_tensor::Tensor> {
        let v = (*v)?;
        g.constants
            .iter()
            .find(|(c, _)| *c == v)
            .and_then(|(_, x)| x.as_tensor())
    };
    let mut nodes = Vec::new();
    let mut tensors = serde_json::Map::new();
    for n in &g.nodes {
        let NodeKind::Op(op) = &n.kind else { continue };
        nodes.push(serde_json::json!({
            "name": n.name,
            "op": op.name(),
            "inputs": n.inputs.iter().map(name).collect::<Vec<_>>(),
            "outputs": n.outputs.iter().map(name).collect::<Vec<_>>(),
        }));
        let (subject, axis, kind) = match op {
            Op::Quant(QuantOp::QuantizeLinear(q)) => (n.inputs.first(), q.axis, "activation"),
            Op::Quant(QuantOp::DequantizeLinear(d)) if constant(n.inputs.first().unwrap_or(&None)).is_some() => {
                (n.inputs.first(), d.axis, "constant")
            }
            _ => continue,
        };
        let Some(subject) = subject else { continue };
        let scale = constant(n.inputs.get(1).unwrap_or(&None)).map(|t| t.to_f64_vec());
        let zero = constant(n.inputs.get(2).unwrap_or(&None)).map(|t| t.to_f64_vec());
        let dtype = match kind {
            "activation" => constant(n.inputs.get(2).unwrap_or(&None)).map(|t| t.dtype().to_string()),
            _ => constant(subject).map(|t| t.dtype().to_string()),
        };
        let key = name(subject);
        let mut entry = serde_json::json!({
            "kind": kind,
            "dtype": dtype,
            "scale": scale,
            "zero_point": zero,
            "axis": if scale.as_ref().is_some_and(|s| s.len() > 1) { Some(axis) } else { None },
        });
        if let Some((lo, hi)) = ranges.get(&key)
            && let Some(o) = entry.as_object_mut()
        {
            o.insert("range".into(), serde_json::json!([lo, hi]));
        }
        tensors.insert(key, entry);
    }
    serde_json::json!({ "graph": g.name, "nodes": nodes, "tensors": tensors })
}

fn describe(spec: &Spec) -> String {
    let method = match spec.method {
        calib::Method::MinMax => "MinMax".to_string(),
        calib::Method::Kl => "KLMinimization".to_string(),
        calib::Method::KlV2 => "KLMinimizationV2".to_string(),
        calib::Method::Percentile(p) => format!("Percentile {p}"),
        calib::Method::Mse => "MSE".to_string(),
        calib::Method::Sqnr => "SQNR".to_string(),
    };
    format!(
        "{method}, activations {:?}, constants {:?}{}{}",
        spec.activations,
        spec.constants,
        if spec.channelwise { ", channel-wise" } else { "" },
        if spec.rowwise { ", row-wise" } else { "" }
    )
}

/// blake3 of the prepared graph's text, the profile's `GraphPreLowerHash`.
fn graph_hash(g: &Graph) -> String {
    let h = blake3::hash(g.to_text().as_bytes());
    h.to_hex().as_str().get(..32).unwrap_or_default().to_string()
}

/// A session over `graph` exposing `names`, for profiling (one thread per run; the caller runs
/// samples side by side).
fn exposing(model: &Model, graph: &Graph, names: &[String], options: &SessionOptions) -> Result<Session, Error> {
    let mut o = options.clone();
    o.quantize = None;
    o.artifacts = None;
    o.enable_metrics = false;
    o.enable_profiling = false;
    o.threads = 1;
    o.compile.output_tensors = names.to_vec();
    o.compile.all_outputs = false;
    let m = Model {
        graph: graph.clone(),
        ..model.clone()
    };
    Session::from_model(&m, &o)
}

/// Runs `f` on every sample over `threads` threads (samples split in contiguous runs), in sample
/// order per thread; the first error wins.
fn each_sample<T: Send>(
    qo: &QuantizeOptions,
    stage: &'static str,
    f: &(dyn Fn(&Sample) -> Result<T, Error> + Sync),
) -> Result<Vec<T>, Error> {
    let samples = qo.samples.as_slice();
    let total = samples.len();
    let threads = qo.threads.clamp(1, total.max(1));
    let done = std::sync::atomic::AtomicUsize::new(0);
    let report = |_: ()| {
        let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(p) = &qo.progress {
            (p.0)(QuantizeProgress { stage, done: d, total });
        }
    };
    let chunk = total.div_ceil(threads).max(1);
    let results: Vec<Result<Vec<T>, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = samples
            .chunks(chunk)
            .map(|part| {
                let report = &report;
                s.spawn(move || -> Result<Vec<T>, Error> {
                    let mut out = Vec::with_capacity(part.len());
                    for sample in part {
                        out.push(f(sample)?);
                        report(());
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(err("a profiling thread panicked"))))
            .collect()
    });
    let mut all = Vec::with_capacity(total);
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}

/// The f32 data of each of `names` among a run's outputs.
fn pick<'a>(outputs: &'a [(String, Value)], names: &[String]) -> Result<Vec<&'a [f32]>, Error> {
    names
        .iter()
        .map(|n| {
            let t = outputs
                .iter()
                .find(|(o, _)| o == n)
                .and_then(|(_, v)| v.as_tensor())
                .ok_or_else(|| err(format!("the profiling run did not return tensor '{n}'")))?;
            t.as_slice::<f32>()
                .map_err(|e| err(format!("tensor '{n}' is not f32: {e}")))
        })
        .collect()
}

/// The histograms of `targets` over the samples.
fn profile(
    model: &Model,
    prepared: &Graph,
    targets: &[ValueId],
    qo: &QuantizeOptions,
    options: &SessionOptions,
) -> Result<Vec<Histogram>, Error> {
    let names: Vec<String> = targets.iter().map(|&v| prepared.value_name(v).to_string()).collect();
    let session = exposing(model, prepared, &names, options)?;
    let run = |s: &Sample| session.run(s.clone());
    // Pass 1: each tensor's range.
    let ranges = each_sample(qo, "ranges", &|s| {
        let out = run(s)?;
        Ok(pick(&out, &names)?
            .iter()
            .map(|xs| {
                xs.iter()
                    .filter(|x| x.is_finite())
                    .fold((0f32, 0f32), |(lo, hi), &x| (lo.min(x), hi.max(x)))
            })
            .collect::<Vec<(f32, f32)>>())
    })?;
    let mut range = vec![(0f32, 0f32); names.len()];
    for r in &ranges {
        for (acc, &(lo, hi)) in range.iter_mut().zip(r) {
            *acc = (acc.0.min(lo), acc.1.max(hi));
        }
    }
    // Pass 2: histograms over those ranges.
    let bins = qo.spec.bins;
    let parts = each_sample(qo, "histograms", &|s| {
        let out = run(s)?;
        Ok(pick(&out, &names)?
            .iter()
            .zip(&range)
            .map(|(xs, &(lo, hi))| {
                let mut h = Histogram::new(lo, hi, bins);
                h.add(xs);
                h.counts
            })
            .collect::<Vec<Vec<u64>>>())
    })?;
    let mut hists: Vec<Histogram> = range.iter().map(|&(lo, hi)| Histogram::new(lo, hi, bins)).collect();
    for part in &parts {
        for (h, counts) in hists.iter_mut().zip(part) {
            for (a, b) in h.counts.iter_mut().zip(counts) {
                *a += b;
            }
        }
    }
    Ok(hists)
}

/// Signal and noise power sums of `b` against `a`.
fn power(a: &[f32], b: &[f32]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, n), (&x, &y)| {
        let (x, y) = (f64::from(x), f64::from(y));
        if x.is_finite() && y.is_finite() {
            (s + x * x, n + (x - y) * (x - y))
        } else {
            (s, n)
        }
    })
}

fn sqnr(name: &str, (signal, noise): (f64, f64)) -> TensorSqnr {
    TensorSqnr {
        name: name.to_string(),
        sqnr_db: (noise > 0.0).then(|| 10.0 * (signal.max(f64::MIN_POSITIVE) / noise).log10()),
    }
}

/// SQNR of the outputs and of the profiled tensors of `quantized` against `float`.
fn accuracy(
    float: &Model,
    quantized: &Model,
    names: &[String],
    qo: &QuantizeOptions,
    options: &SessionOptions,
) -> Result<(Vec<TensorSqnr>, Vec<TensorSqnr>), Error> {
    // The float outputs, by id (no name lookups).
    let g = &float.graph;
    let outputs: Vec<String> = g
        .outputs
        .iter()
        .filter(|&&o| {
            g.value(o)
                .and_then(|v| v.ty.tensor())
                .is_some_and(|t| t.dtype == Some(kiln_tensor::DType::F32))
        })
        .map(|&o| g.value_name(o).to_string())
        .collect();
    let all: Vec<String> = outputs
        .iter()
        .chain(names.iter().filter(|n| !outputs.contains(n)))
        .cloned()
        .collect();
    let fs = exposing(float, &float.graph, &all, options)?;
    let qs = exposing(quantized, &quantized.graph, &all, options)?;
    let parts = each_sample(qo, "accuracy", &|s| {
        let a = fs.run(s.clone())?;
        let b = qs.run(s.clone())?;
        let (a, b) = (pick(&a, &all)?, pick(&b, &all)?);
        Ok(a.iter().zip(&b).map(|(x, y)| power(x, y)).collect::<Vec<(f64, f64)>>())
    })?;
    let mut sums = vec![(0f64, 0f64); all.len()];
    for p in &parts {
        for (acc, (s, n)) in sums.iter_mut().zip(p) {
            acc.0 += s;
            acc.1 += n;
        }
    }
    let per: Vec<TensorSqnr> = all.iter().zip(&sums).map(|(n, &p)| sqnr(n, p)).collect();
    let (outs, rest) = per.split_at(outputs.len().min(per.len()));
    let mut worst: Vec<TensorSqnr> = rest.iter().filter(|t| t.sqnr_db.is_some()).cloned().collect();
    worst.sort_by(|a, b| a.sqnr_db.partial_cmp(&b.sqnr_db).unwrap_or(std::cmp::Ordering::Equal));
    worst.truncate(10);
    Ok((outs.to_vec(), worst))
}

/// The quantization a resolved configuration asks for: `convert_to_quantize`, `dump_profile` or
/// `load_profile` (the configuration has refused their conflicting combinations); the samples
/// are the caller's to load (`calibration_data`).
pub(crate) fn from_config(c: &kiln_config::CompileConfig) -> Option<QuantizeOptions> {
    use kiln_compiler::quantize::params::Schema;
    use kiln_config::{ActivationSchema, BiasPrecision, Calibration, ConstantSchema};
    let mode = match (&c.dump_profile, &c.load_profile, &c.external_quantization_file) {
        (Some(p), _, _) => QuantizeMode::DumpProfile(p.clone()),
        (None, Some(p), _) => QuantizeMode::LoadProfile(p.clone()),
        (None, None, Some(p)) => QuantizeMode::External(p.clone()),
        (None, None, None) if c.convert_to_quantize || axelera_quantizes(c) => QuantizeMode::Calibrate,
        (None, None, None) => return None,
    };
    let spec = Spec {
        activations: match c.quantization_schema_activations {
            ActivationSchema::Asymmetric => Schema::Asymmetric,
            ActivationSchema::Symmetric => Schema::Symmetric,
            ActivationSchema::SymmetricWithUint8 => Schema::SymmetricWithUint8,
            ActivationSchema::SymmetricWithPower2Scale => Schema::SymmetricWithPower2Scale,
        },
        constants: match c.quantization_schema_constants {
            ConstantSchema::Asymmetric => Schema::Asymmetric,
            ConstantSchema::Symmetric => Schema::Symmetric,
            ConstantSchema::SymmetricWithUint8 => Schema::SymmetricWithUint8,
        },
        method: match c.quantization_calibration {
            Calibration::None => calib::Method::MinMax,
            Calibration::KlMinimization => calib::Method::Kl,
            Calibration::KlMinimizationV2 => calib::Method::KlV2,
            Calibration::Percentile => calib::Method::Percentile(c.percentile_calibration_value),
            Calibration::Mse => calib::Method::Mse,
            Calibration::Sqnr => calib::Method::Sqnr,
        },
        bins: usize::try_from(c.num_histogram_bins)
            .unwrap_or(usize::MAX)
            .clamp(1, MAX_BINS),
        bias_int32: matches!(c.quantization_precision_bias, BiasPrecision::Int32),
        channelwise: c.enable_channelwise,
        depthwise_channelwise: c.quantize_dw_channel_wise,
        rowwise: c.enable_rowwise,
        keep: c.keep_original_precision_for_nodes.clone(),
    };
    let mut spec = spec;
    if axelera_quantizes(c) {
        use kiln_config::QuantizationScheme as S;
        // The configuration refuses a calibration that contradicts the scheme.
        let histogram = |m: calib::Method| {
            if m == calib::Method::MinMax {
                calib::Method::Kl
            } else {
                m
            }
        };
        match c.quantization_scheme {
            S::PerTensorMinMax => spec.method = calib::Method::MinMax,
            S::PerTensorHistogram => spec.method = histogram(spec.method),
            S::HybridPerTensorPerChannel => {
                spec.method = histogram(spec.method);
                spec.channelwise = true;
            }
        }
    }
    Some(QuantizeOptions {
        spec,
        mode,
        samples: Arc::new(Vec::new()),
        threads: usize::try_from(c.profiling_threads).unwrap_or(1).max(1),
        report: true,
        progress: None,
        debug_text: c.quantization_debug,
        export_json: c.quantized_graph_export,
        debug_dir: c.model_debug_save_dir.clone().or_else(|| c.output_dir.clone()),
        remove_io: c.remove_io_quantization,
    })
}

/// Axelera's `compiler_mode: quantize_and_lower` (kiln's default is `lower_only`).
fn axelera_quantizes(c: &kiln_config::CompileConfig) -> bool {
    c.compiler_mode == kiln_config::AxeleraCompilerMode::QuantizeAndLower
}

/// Most histogram bins (a profile's size is bins x tensors).
pub const MAX_BINS: usize = 1 << 16;
