//! Error artifacts (Axelera's `save_error_artifact`, with `randomize_onnx_model`): when a
//! compile or a run fails, a bundle that reproduces it is written, and `kiln repro BUNDLE`
//! replays it.
//!
//! A bundle is a directory `kiln-error-<stage>-<time>-<pid>` in `output_dir` (else the system's
//! temporary directory), holding:
//! - `bundle.json`: kiln's version, the stage (`compile` or `run`), the files below, the error
//!   as printed (with its causes) and the node it names;
//! - `model.onnx` (an ONNX model, its float weights replaced by random values of the same
//!   shape, range and type unless `randomize_onnx_model` is false; integer tensors, which are
//!   often shapes and indices, are kept) or `model.kiln` (a program file, copied);
//! - `config.json`: the resolved configuration (`kiln config show --json`'s form);
//! - for a run, `inputs.npz`: the run's inputs;
//! - for a run that failed at a node of an ONNX model: `node.onnx`, that node alone, with its
//!   inputs as captured in a run of the model compiled with them as outputs in
//!   `node_inputs.npz` (constant inputs stay initializers).
//!
//! Stopped runs (cancelled) write nothing: a stop is not a failure to reproduce.

use crate::session::{Error, Session, SessionOptions};
use kiln_onnx::proto::{ModelProto, NodeProto, TensorProto, ValueInfoProto};
use kiln_ops::Value;
use kiln_tensor::Tensor;
use prost::Message;
use std::path::{Path, PathBuf};

/// Where and how error artifacts are written.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactOptions {
    /// The directory bundles go to (`output_dir`); `None`: the system's temporary directory.
    pub dir: Option<PathBuf>,
    /// Replace the float weights of a saved ONNX model with random values
    /// (`randomize_onnx_model`, default true).
    pub randomize_weights: bool,
}

/// The stage that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Compile,
    Run,
}

/// `bundle.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BundleInfo {
    pub kiln_version: String,
    pub stage: Stage,
    /// The model file in the bundle (`model.onnx` or `model.kiln`), if it could be saved.
    pub model: Option<String>,
    /// The path the model was read from when it failed (errors that name the file name it).
    pub source_path: Option<String>,
    pub config: String,
    /// The run's inputs (`inputs.npz`), for a run.
    pub inputs: Option<String>,
    /// The failing node alone (`node.onnx`) and its captured inputs (`node_inputs.npz`).
    pub node_model: Option<String>,
    pub node_inputs: Option<String>,
    /// The node the error names, if any.
    pub node: Option<String>,
    /// The error as printed, causes included.
    pub error: String,
    pub randomized_weights: bool,
}

/// What failed, for [`write`].
pub(crate) struct Failure<'a> {
    pub stage: Stage,
    pub model: Option<&'a Path>,
    pub options: &'a SessionOptions,
    pub inputs: Option<&'a [(String, Value)]>,
}

/// The error with its causes, as the CLI prints them (`a: b: c`).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = c.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}

/// The node a run error names.
fn failing_node(e: &Error) -> Option<String> {
    use kiln_runtime::RuntimeError as R;
    match e {
        Error::Run(R::Node { node, .. } | R::Control { node, .. } | R::MemoryLimit { node, .. })
        | Error::Run(R::TimeLimit { node, .. } | R::LoopLimit { node, .. }) => Some(node.clone()),
        _ => None,
    }
}

/// Wraps `error` with the bundle written for it (or why none could be).
pub(crate) fn attach(opts: &ArtifactOptions, failure: Failure<'_>, error: Error) -> Error {
    if matches!(error, Error::Run(kiln_runtime::RuntimeError::Cancelled { .. })) {
        return error;
    }
    let written = write(opts, &failure, &error);
    Error::Artifact {
        error: Box::new(error),
        bundle: written.map_err(|e| e.to_string()),
    }
}

fn write(opts: &ArtifactOptions, f: &Failure<'_>, error: &Error) -> Result<PathBuf, std::io::Error> {
    let base = opts.dir.clone().unwrap_or_else(std::env::temp_dir);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let stage = match f.stage {
        Stage::Compile => "compile",
        Stage::Run => "run",
    };
    let dir = base.join(format!("kiln-error-{stage}-{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let io = |m: String| std::io::Error::other(m);

    // The model: an ONNX model re-encoded (weights randomized), a program file copied.
    let mut proto: Option<ModelProto> = None;
    let mut model = None;
    let mut randomized = false;
    if let Some(path) = f.model {
        if crate::is_program_file(path) {
            std::fs::copy(path, dir.join("model.kiln"))?;
            model = Some("model.kiln".to_string());
        } else {
            let bytes = std::fs::read(path)?;
            match ModelProto::decode(bytes.as_slice()) {
                Ok(mut m) => {
                    if opts.randomize_weights {
                        randomize(&mut m);
                        randomized = true;
                    }
                    std::fs::write(dir.join("model.onnx"), m.encode_to_vec())?;
                    proto = Some(m);
                }
                // Not decodable (the failure may be that): the bytes as they are.
                Err(_) => std::fs::write(dir.join("model.onnx"), &bytes)?,
            }
            model = Some("model.onnx".to_string());
        }
    }
    let config = serde_json::to_string_pretty(&f.options.config).map_err(|e| io(e.to_string()))?;
    std::fs::write(dir.join("config.json"), config)?;
    let mut inputs = None;
    if let Some(feed) = f.inputs {
        let arrays: Vec<(String, Tensor)> = feed
            .iter()
            .filter_map(|(n, v)| Some((n.clone(), v.as_tensor()?.clone())))
            .collect();
        let npz = crate::npy::npz_bytes(&arrays).map_err(|e| io(e.to_string()))?;
        std::fs::write(dir.join("inputs.npz"), npz)?;
        inputs = Some("inputs.npz".to_string());
    }
    let node = failing_node(error);
    let (mut node_model, mut node_inputs) = (None, None);
    if let (Some(name), Some(m), Some(path), Some(feed)) = (&node, &proto, f.model, f.inputs)
        && let Some((one, captured)) = isolate(m, name, path, f.options, feed)
    {
        std::fs::write(dir.join("node.onnx"), one.encode_to_vec())?;
        let npz = crate::npy::npz_bytes(&captured).map_err(|e| io(e.to_string()))?;
        std::fs::write(dir.join("node_inputs.npz"), npz)?;
        node_model = Some("node.onnx".to_string());
        node_inputs = Some("node_inputs.npz".to_string());
    }
    let info = BundleInfo {
        kiln_version: env!("CARGO_PKG_VERSION").to_string(),
        stage: f.stage,
        model,
        source_path: f.model.map(|p| p.display().to_string()),
        config: "config.json".into(),
        inputs,
        node_model,
        node_inputs,
        node,
        error: chain(error),
        randomized_weights: randomized,
    };
    let json = serde_json::to_string_pretty(&info).map_err(|e| io(e.to_string()))?;
    std::fs::write(dir.join("bundle.json"), json)?;
    Ok(dir)
}

/// SplitMix64: weights' random replacements (quality is ample, and the bundle reproducible).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Replaces the values of every float initializer (in the graph and its subgraphs) by
/// uniform random values over the original's range, same shape and type.
fn randomize(m: &mut ModelProto) {
    let mut state = 0x6b69_6c6e_u64;
    if let Some(g) = m.graph.as_mut() {
        randomize_graph(g, &mut state);
    }
}

fn randomize_graph(g: &mut kiln_onnx::proto::GraphProto, state: &mut u64) {
    for t in &mut g.initializer {
        randomize_tensor(t, state);
    }
    for n in &mut g.node {
        for a in &mut n.attribute {
            if let Some(sub) = a.g.as_mut() {
                randomize_graph(sub, state);
            }
            for sub in &mut a.graphs {
                randomize_graph(sub, state);
            }
        }
    }
}

fn randomize_tensor(t: &mut TensorProto, state: &mut u64) {
    // FLOAT 1, FLOAT16 10, DOUBLE 11, BFLOAT16 16.
    let kind = t.data_type.unwrap_or(0);
    if ![1, 10, 11, 16].contains(&kind) {
        return;
    }
    let Ok(value) = kiln_onnx::tensor::TensorLoader::new(None).load(t) else {
        return;
    };
    let vals = value.to_f64_vec();
    let (lo, hi) = vals
        .iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (-1.0, 1.0) };
    let fresh: Vec<f64> = vals
        .iter()
        .map(|_| lo + (hi - lo) * ((next(state) >> 11) as f64 / (1u64 << 53) as f64))
        .collect();
    let Ok(new) = Tensor::from_f64(value.dtype(), value.shape().to_vec(), &fresh) else {
        return;
    };
    *t = kiln_onnx::tensor::to_proto(&new, t.name.as_deref().unwrap_or(""));
}

/// The node `name` of `m` alone, with its non-constant inputs captured from a run of the
/// model (compiled with them as outputs) on `feed`.
fn isolate(
    m: &ModelProto,
    name: &str,
    path: &Path,
    options: &SessionOptions,
    feed: &[(String, Value)],
) -> Option<(ModelProto, Vec<(String, Tensor)>)> {
    let g = m.graph.as_ref()?;
    let node: &NodeProto = g.node.iter().find(|n| n.name.as_deref() == Some(name))?;
    let initial: Vec<&TensorProto> = g.initializer.iter().collect();
    let is_init = |v: &str| initial.iter().any(|t| t.name.as_deref() == Some(v));
    let graph_inputs: Vec<&str> = g.input.iter().filter_map(|i| i.name.as_deref()).collect();
    let wanted: Vec<String> = node
        .input
        .iter()
        .filter(|i| !i.is_empty() && !is_init(i))
        .cloned()
        .collect();
    // Capture: the original model (real weights) cut to end at those values, so the failing
    // node is not run; graph inputs come from the feed.
    let computed: Vec<String> = wanted
        .iter()
        .filter(|w| !graph_inputs.contains(&w.as_str()))
        .cloned()
        .collect();
    let mut captured: Vec<(String, Tensor)> = Vec::new();
    if !computed.is_empty() {
        let bytes = std::fs::read(path).ok()?;
        let mut cut = ModelProto::decode(bytes.as_slice()).ok()?;
        let cg = cut.graph.as_mut()?;
        cg.output = computed
            .iter()
            .map(|n| ValueInfoProto {
                name: Some(n.clone()),
                ..Default::default()
            })
            .collect();
        let import = kiln_onnx::ImportOptions {
            symbols: options.symbols.clone(),
        };
        let model = kiln_onnx::load_model_bytes(cut.encode_to_vec().into(), &import).ok()?;
        let capture_opts = SessionOptions {
            artifacts: None,
            ..options.clone()
        };
        let session = Session::from_model(&model, &capture_opts).ok()?;
        let outs = session.run(feed.to_vec()).ok()?;
        for w in &computed {
            let t = outs.iter().find(|(n, _)| n == w)?.1.as_tensor()?.clone();
            captured.push((w.clone(), t));
        }
    }
    for w in &wanted {
        if graph_inputs.contains(&w.as_str()) {
            let t = feed.iter().find(|(n, _)| n == w)?.1.as_tensor()?.clone();
            captured.push((w.clone(), t));
        }
    }
    let info = |n: &str, t: &Tensor| -> ValueInfoProto {
        use kiln_onnx::proto::{TensorShapeProto, TypeProto, tensor_shape_proto, type_proto};
        let dim = t
            .shape()
            .iter()
            .map(|&d| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: Some(n.to_string()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(t.dtype().onnx_code()),
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let outputs: Vec<ValueInfoProto> = node
        .output
        .iter()
        .filter(|o| !o.is_empty())
        .map(|o| ValueInfoProto {
            name: Some(o.clone()),
            ..Default::default()
        })
        .collect();
    let graph = kiln_onnx::proto::GraphProto {
        name: Some(format!("{name} alone")),
        node: vec![node.clone()],
        input: captured.iter().map(|(n, t)| info(n, t)).collect(),
        output: outputs,
        initializer: node
            .input
            .iter()
            .filter_map(|i| initial.iter().find(|t| t.name.as_deref() == Some(i.as_str())))
            .map(|t| (*t).clone())
            .collect(),
        ..Default::default()
    };
    let mut one = ModelProto {
        graph: Some(graph),
        ..m.clone()
    };
    // Output types (ONNX requires them): the original's declarations, else kiln's inference
    // on the node alone.
    let declared: Vec<&ValueInfoProto> = g.output.iter().chain(&g.value_info).collect();
    let inferred = kiln_onnx::load_model_bytes(one.encode_to_vec().into(), &kiln_onnx::ImportOptions::default()).ok();
    if let Some(og) = one.graph.as_mut() {
        for o in &mut og.output {
            let name = o.name.clone().unwrap_or_default();
            if let Some(d) = declared.iter().find(|d| d.name.as_deref() == Some(name.as_str())) {
                o.r#type = d.r#type.clone();
                continue;
            }
            let dtype = inferred.as_ref().and_then(|m| {
                let v = m.graph.values.iter().find(|v| v.name == name)?;
                v.ty.tensor()?.dtype
            });
            if let Some(dtype) = dtype {
                use kiln_onnx::proto::{TypeProto, type_proto};
                o.r#type = Some(TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: Some(dtype.onnx_code()),
                        shape: None,
                    })),
                    ..Default::default()
                });
            }
        }
    }
    Some((one, captured))
}

/// Reads a bundle's `bundle.json`.
pub fn read_info(bundle: &Path) -> Result<BundleInfo, String> {
    let path = bundle.join("bundle.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
