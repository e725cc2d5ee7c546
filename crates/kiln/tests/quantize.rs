//! Post-training quantization through the Session (convert_to_quantize, dump_profile,
//! load_profile): a small CNN calibrated on samples stays close to the float model without
//! being it, every calibration method and schema compiles and runs, profiles round-trip and a
//! profile of another graph is refused.

mod common;

use common::{F32, f32_info, ints, model, node};
use kiln::raw::compiler::quantize::Spec;
use kiln::raw::compiler::quantize::calib::Method;
use kiln::raw::compiler::quantize::params::Schema;
use kiln::raw::onnx::proto::{ModelProto, TensorProto};
use kiln::{Error, QuantizeMode, QuantizeOptions, Sample, Session, SessionOptions, Tensor, Value};
use std::sync::Arc;

fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f32_tensor(name: &str, dims: &[i64], vals: Vec<f32>) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(F32),
        dims: dims.to_vec(),
        float_data: vals,
        ..Default::default()
    }
}

/// x [1,3,8,8] -> Conv 3x3 (8) -> Relu -> Conv 1x1 (4) -> GlobalAveragePool -> Flatten ->
/// Gemm (transB, 5 outputs) -> y. `w1_scale` changes the first weights (another graph when
/// its shape changes too: `wide`).
fn cnn(wide: bool) -> ModelProto {
    let c1 = if wide { 9 } else { 8 };
    model(
        vec![
            node(
                "Conv",
                "conv1",
                &["x", "w1", "b1"],
                &["c1"],
                vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
            ),
            node("Relu", "relu1", &["c1"], &["r1"], vec![]),
            node(
                "Conv",
                "conv2",
                &["r1", "w2", "b2"],
                &["c2"],
                vec![ints("kernel_shape", &[1, 1])],
            ),
            node("GlobalAveragePool", "gap", &["c2"], &["g"], vec![]),
            node("Flatten", "flat", &["g"], &["f"], vec![]),
            node("Gemm", "fc", &["f", "w3", "b3"], &["y"], vec![common::int("transB", 1)]),
        ],
        vec![f32_info("x", &[1, 3, 8, 8])],
        vec![f32_info("y", &[1, 5])],
        vec![
            f32_tensor("w1", &[c1, 3, 3, 3], noise(c1 as usize * 27, 1, 0.5)),
            f32_tensor("b1", &[c1], noise(c1 as usize, 2, 0.1)),
            f32_tensor("w2", &[4, c1, 1, 1], noise(4 * c1 as usize, 3, 0.5)),
            f32_tensor("b2", &[4], noise(4, 4, 0.1)),
            f32_tensor("w3", &[5, 4], noise(20, 5, 1.0)),
            f32_tensor("b3", &[5], noise(5, 6, 0.1)),
        ],
    )
}

fn sample(seed: u64) -> Sample {
    let x = Tensor::from_vec(vec![1, 3, 8, 8], noise(192, 100 + seed, 1.0)).unwrap();
    vec![("x".to_string(), Value::Tensor(x))]
}

fn samples(n: u64) -> Arc<Vec<Sample>> {
    Arc::new((0..n).map(sample).collect())
}

fn quantizing(spec: Spec, mode: QuantizeMode, samples: Arc<Vec<Sample>>) -> SessionOptions {
    SessionOptions {
        quantize: Some(QuantizeOptions {
            spec,
            mode,
            samples,
            threads: 2,
            report: true,
            progress: None,
            debug_text: false,
            export_json: false,
            debug_dir: None,
            remove_io: false,
        }),
        ..SessionOptions::default()
    }
}

fn output(s: &Session, x: Sample) -> Vec<f32> {
    let out = s.run(x).unwrap_or_else(|e| panic!("{e}"));
    out[0].1.as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec()
}

fn sqnr(reference: &[f32], got: &[f32]) -> f64 {
    let signal: f64 = reference.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let noise: f64 = reference
        .iter()
        .zip(got)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    10.0 * (signal / noise).log10()
}

/// Mean SQNR of `q` against `f` over inputs the calibration never saw.
fn held_out_sqnr(f: &Session, q: &Session) -> f64 {
    let seeds = 50u64..54;
    let n = (seeds.end - seeds.start) as f64;
    seeds
        .map(|k| sqnr(&output(f, sample(k)), &output(q, sample(k))))
        .sum::<f64>()
        / n
}

fn session(m: &ModelProto, o: &SessionOptions) -> Result<Session, Error> {
    Session::from_model(&common::import(m).unwrap(), o)
}

#[test]
fn a_calibrated_model_is_quantized_and_close_to_the_float_one() {
    let m = cnn(false);
    let f = session(&m, &SessionOptions::default()).unwrap();
    let q = session(&m, &quantizing(Spec::default(), QuantizeMode::Calibrate, samples(8))).unwrap();
    let r = q.quantization().expect("a report");
    assert_eq!(r.nodes, vec![("Conv".to_string(), 2), ("Gemm".to_string(), 1)]);
    // x, relu1's output and the flattened pool; three weights and three biases.
    assert_eq!(
        (r.activations, r.weights, r.biases, r.per_channel_weights),
        (3, 3, 3, 0)
    );
    assert_eq!(r.samples, 8);
    assert_eq!(r.outputs.len(), 1);
    let out_db = r.outputs[0]
        .sqnr_db
        .expect("a quantized output differs from the float one");
    assert!(out_db > 20.0 && out_db < 70.0, "output SQNR {out_db}");
    assert!(!r.worst.is_empty() && r.worst.len() <= 10);
    let db = held_out_sqnr(&f, &q);
    assert!(
        db > 20.0 && db < 70.0,
        "held-out SQNR {db}: 8 bits should be close, and not exact"
    );
    // The passes do not change what the quantized graph computes.
    let mut o0 = quantizing(Spec::default(), QuantizeMode::Calibrate, samples(8));
    o0.compile.opt_level = 0;
    let q0 = session(&m, &o0).unwrap();
    let a = output(&q, sample(60));
    let b = output(&q0, sample(60));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{a:?} vs {b:?}");
    }
}

/// Conv, Relu, MaxPool, a 1x1 Conv added back to the pool's output, Relu, pool, Gemm: a
/// ResNet block in small.
fn residual() -> ModelProto {
    model(
        vec![
            node(
                "Conv",
                "stem",
                &["x", "w1", "b1"],
                &["c1"],
                vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
            ),
            node("Relu", "relu1", &["c1"], &["r1"], vec![]),
            node(
                "MaxPool",
                "pool",
                &["r1"],
                &["p"],
                vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
            ),
            node(
                "Conv",
                "conv2",
                &["p", "w2", "b2"],
                &["c2"],
                vec![ints("kernel_shape", &[1, 1])],
            ),
            node("Add", "add", &["c2", "p"], &["s"], vec![]),
            node("Relu", "relu2", &["s"], &["r2"], vec![]),
            node("GlobalAveragePool", "gap", &["r2"], &["g"], vec![]),
            node("Flatten", "flat", &["g"], &["f"], vec![]),
            node("Gemm", "fc", &["f", "w3", "b3"], &["y"], vec![common::int("transB", 1)]),
        ],
        vec![f32_info("x", &[1, 3, 8, 8])],
        vec![f32_info("y", &[1, 5])],
        vec![
            f32_tensor("w1", &[8, 3, 3, 3], noise(8 * 27, 1, 0.5)),
            f32_tensor("b1", &[8], noise(8, 2, 0.1)),
            f32_tensor("w2", &[8, 8, 1, 1], noise(64, 3, 0.5)),
            f32_tensor("b2", &[8], noise(8, 4, 0.1)),
            f32_tensor("w3", &[5, 8], noise(40, 5, 1.0)),
            f32_tensor("b3", &[5], noise(5, 6, 0.1)),
        ],
    )
}

/// The residual sum and the pool are quantized too (so both convolutions end on a
/// QuantizeLinear); the result stays close to the float model, and the passes that make the
/// block 8-bit (`qdq_conv`, `qdq_add` with its Relu) compute what the QDQ graph computes.
#[test]
fn a_residual_block_is_quantized_through_its_sum_and_pool() {
    let m = residual();
    let f = session(&m, &SessionOptions::default()).unwrap();
    let q = session(&m, &quantizing(Spec::default(), QuantizeMode::Calibrate, samples(8))).unwrap();
    let r = q.quantization().expect("a report");
    let count = |op: &str| r.nodes.iter().find(|(o, _)| o == op).map(|&(_, n)| n);
    assert_eq!(
        (count("Conv"), count("MaxPool"), count("Add"), count("Gemm")),
        (Some(2), Some(1), Some(1), Some(1)),
        "{:?}",
        r.nodes
    );
    let db = held_out_sqnr(&f, &q);
    assert!(db > 20.0 && db < 70.0, "held-out SQNR {db}");
    let mut o0 = quantizing(Spec::default(), QuantizeMode::Calibrate, samples(8));
    o0.compile.opt_level = 0;
    let q0 = session(&m, &o0).unwrap();
    for seed in [60, 61] {
        let a = output(&q, sample(seed));
        let b = output(&q0, sample(seed));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn every_method_and_schema_compiles_and_runs() {
    let m = cnn(false);
    let f = session(&m, &SessionOptions::default()).unwrap();
    let methods = [
        Method::MinMax,
        Method::Kl,
        Method::KlV2,
        Method::Percentile(99.0),
        Method::Mse,
        Method::Sqnr,
    ];
    let schemas = [
        Schema::Asymmetric,
        Schema::Symmetric,
        Schema::SymmetricWithUint8,
        Schema::SymmetricWithPower2Scale,
    ];
    for method in methods {
        for activations in schemas {
            let spec = Spec {
                method,
                activations,
                bins: 512,
                ..Spec::default()
            };
            let q = session(&m, &quantizing(spec, QuantizeMode::Calibrate, samples(6)))
                .unwrap_or_else(|e| panic!("{method:?} {activations:?}: {e}"));
            let db = held_out_sqnr(&f, &q);
            assert!(db > 12.0, "{method:?} {activations:?}: held-out SQNR {db}");
        }
    }
}

#[test]
fn channel_and_row_wise_weights() {
    let m = cnn(false);
    let f = session(&m, &SessionOptions::default()).unwrap();
    let spec = Spec {
        channelwise: true,
        rowwise: true,
        ..Spec::default()
    };
    let q = session(&m, &quantizing(spec, QuantizeMode::Calibrate, samples(8))).unwrap();
    let r = q.quantization().unwrap();
    assert_eq!((r.weights, r.per_channel_weights, r.biases), (3, 3, 3));
    let db = held_out_sqnr(&f, &q);
    assert!(db > 20.0, "{db}");
    // Leaving Gemm in float quantizes only the convolutions.
    let spec = Spec {
        keep: vec!["Gemm".into()],
        ..Spec::default()
    };
    let q = session(&m, &quantizing(spec, QuantizeMode::Calibrate, samples(4))).unwrap();
    assert_eq!(q.quantization().unwrap().nodes, vec![("Conv".to_string(), 2)]);
}

#[test]
fn profiles_round_trip_and_quantize_as_calibrating_does() {
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2) = (dir.path().join("p1.yaml"), dir.path().join("p2.yaml"));
    let m = cnn(false);
    let f = session(&m, &SessionOptions::default()).unwrap();
    // dump_profile writes the profile and compiles the float model.
    let d = session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::DumpProfile(p1.clone()), samples(8)),
    )
    .unwrap();
    assert_eq!(output(&d, sample(70)), output(&f, sample(70)));
    assert_eq!(d.quantization().unwrap().profile.as_deref(), Some(p1.as_path()));
    let text = std::fs::read_to_string(&p1).unwrap();
    assert!(text.starts_with("---\nGlowToolsVersion: 'kiln "), "{text}");
    assert_eq!(text.matches("- NodeOutputName: ").count(), 3, "{text}");
    // The same samples give the same bytes.
    session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::DumpProfile(p2.clone()), samples(8)),
    )
    .unwrap();
    assert_eq!(std::fs::read(&p2).unwrap(), text.as_bytes());
    // load_profile quantizes without samples, as calibrating on them does.
    let l = session(
        &m,
        &quantizing(
            Spec::default(),
            QuantizeMode::LoadProfile(p1.clone()),
            Arc::new(Vec::new()),
        ),
    )
    .unwrap();
    let c = session(&m, &quantizing(Spec::default(), QuantizeMode::Calibrate, samples(8))).unwrap();
    assert_eq!(output(&l, sample(71)), output(&c, sample(71)));
    assert_ne!(output(&l, sample(71)), output(&f, sample(71)));
    // A profile of another graph is refused, naming both hashes.
    let e = session(
        &cnn(true),
        &quantizing(Spec::default(), QuantizeMode::LoadProfile(p1), Arc::new(Vec::new())),
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Profile { .. }) && e.to_string().contains("another graph"),
        "{e}"
    );
}

#[test]
fn bad_calibration_input_is_a_clear_error() {
    let m = cnn(false);
    let e = session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::Calibrate, Arc::new(Vec::new())),
    )
    .unwrap_err();
    assert!(e.to_string().contains("calibration data"), "{e}");
    let wrong = vec![vec![(
        "x".to_string(),
        Value::Tensor(Tensor::from_vec(vec![1, 3, 4, 4], vec![0f32; 48]).unwrap()),
    )]];
    let e = session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::Calibrate, Arc::new(wrong)),
    )
    .unwrap_err();
    assert!(e.to_string().contains('x'), "{e}");
    let e = session(
        &m,
        &quantizing(
            Spec::default(),
            QuantizeMode::LoadProfile("/nonexistent/profile.yaml".into()),
            Arc::new(Vec::new()),
        ),
    )
    .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/profile.yaml"), "{e}");
}

#[test]
fn external_ranges_quantize_without_profiling() {
    let dir = tempfile::tempdir().unwrap();
    let m = cnn(false);
    let f = session(&m, &SessionOptions::default()).unwrap();
    // The three activations, in each accepted spelling.
    let full = dir.path().join("ranges.json");
    std::fs::write(
        &full,
        r#"{"x": {"min": -1.0, "max": 1.0}, "r1": [0.0, 2.0], "f": {"lowest": [-1.5], "highest": [1.5]}}"#,
    )
    .unwrap();
    let q = session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::External(full), Arc::new(Vec::new())),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.quantization().unwrap().activations, 3);
    let db = held_out_sqnr(&f, &q);
    assert!(db > 15.0 && db < 70.0, "{db}");
    // A tensor left out is calibrated on samples, or named when there are none.
    let part = dir.path().join("part.json");
    std::fs::write(&part, r#"{"x": [-1, 1]}"#).unwrap();
    let e = session(
        &m,
        &quantizing(
            Spec::default(),
            QuantizeMode::External(part.clone()),
            Arc::new(Vec::new()),
        ),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("r1") && e.to_string().contains("no calibration data"),
        "{e}"
    );
    let q = session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::External(part), samples(4)),
    )
    .unwrap();
    assert_eq!(q.quantization().unwrap().activations, 3);
    // A malformed entry names the tensor.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"x": {"min": 2, "max": 1}}"#).unwrap();
    let e = session(
        &m,
        &quantizing(Spec::default(), QuantizeMode::External(bad), Arc::new(Vec::new())),
    )
    .unwrap_err();
    assert!(e.to_string().contains("'x'"), "{e}");
}

#[test]
fn axelera_and_qaic_options_reach_the_quantizer() {
    let mut c = kiln_config::Config::default();
    c.load_str(
        "compiler_mode: quantize_and_lower\nquantization_scheme: hybrid_per_tensor_per_channel\n",
        std::path::Path::new("axelera.yaml"),
    )
    .unwrap();
    c.check().unwrap_or_else(|e| panic!("{e}"));
    let o = SessionOptions::from_config(&c);
    let q = o.quantize.expect("quantize_and_lower quantizes");
    assert_eq!(q.mode, QuantizeMode::Calibrate);
    assert!(q.spec.channelwise);
    assert_eq!(q.spec.method, Method::Kl);
    let mut c = kiln_config::Config::default();
    c.load_str(
        "convert_to_quantize: true\nquantization_calibration: SQNR\nquantization_schema_activations: asymmetric\nenable_rowwise: true\nprofiling_threads: 3\n",
        std::path::Path::new("qaic.yaml"),
    )
    .unwrap();
    let q = SessionOptions::from_config(&c).quantize.unwrap();
    assert_eq!(
        (q.spec.method, q.spec.activations, q.spec.rowwise, q.threads),
        (Method::Sqnr, Schema::Asymmetric, true, 3)
    );
    assert!(
        SessionOptions::from_config(&kiln_config::Config::default())
            .quantize
            .is_none()
    );
}

#[test]
fn debug_outputs_describe_the_quantized_graph() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = quantizing(Spec::default(), QuantizeMode::Calibrate, samples(4));
    if let Some(q) = o.quantize.as_mut() {
        q.debug_text = true;
        q.export_json = true;
        q.debug_dir = Some(dir.path().join("dbg"));
    }
    session(&cnn(false), &o).unwrap();
    let text = std::fs::read_to_string(dir.path().join("dbg/quantized_graph.txt")).unwrap();
    assert!(
        text.contains("QuantizeLinear") && text.contains("DequantizeLinear"),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("dbg/quantization_report.json")).unwrap())
            .unwrap();
    assert_eq!(report["activations"], 3);
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("dbg/quantized_graph.json")).unwrap()).unwrap();
    let x = &g["tensors"]["x"];
    assert_eq!(x["kind"], "activation");
    assert_eq!(x["dtype"], "i8", "{x}"); // x has negatives: symmetric int8
    let (lo, hi) = (x["range"][0].as_f64().unwrap(), x["range"][1].as_f64().unwrap());
    assert!(lo < -0.5 && hi > 0.5, "{x}");
    let scale = x["scale"][0].as_f64().unwrap();
    assert!((scale - lo.abs().max(hi) / 128.0).abs() < 0.01, "{x}");
    assert_eq!(g["tensors"]["w1_quantized"]["kind"], "constant");
    assert!(g["nodes"].as_array().unwrap().len() > 6);
}

#[test]
fn remove_io_quantization_takes_and_returns_8_bits() {
    let m = cnn(false);
    let mut o = quantizing(Spec::default(), QuantizeMode::Calibrate, samples(6));
    if let Some(q) = o.quantize.as_mut() {
        q.remove_io = true;
    }
    let q = session(&m, &o).unwrap();
    let io = &q.quantization().unwrap().io;
    assert_eq!(io.len(), 2, "{io:?}");
    let (inp, out) = (&io[0], &io[1]);
    assert_eq!((inp.name.as_str(), inp.role, inp.dtype.as_str()), ("x", "input", "i8"));
    assert_eq!((out.name.as_str(), out.role), ("y", "output"));
    // The signature says so, and the session runs on 8-bit input.
    let ins = q.inputs();
    assert_eq!(ins[0].name, "x");
    assert_eq!(ins[0].ty.tensor().and_then(|t| t.dtype), Some(kiln::DType::I8));
    let x = sample(80);
    let xf = x[0].1.as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec();
    let xq: Vec<i8> = xf
        .iter()
        .map(|&v| ((v / inp.scale).round_ties_even() as i32 + inp.zero_point).clamp(-128, 127) as i8)
        .collect();
    let out_v = q
        .run(vec![(
            "x".into(),
            Value::Tensor(Tensor::from_vec(vec![1, 3, 8, 8], xq).unwrap()),
        )])
        .unwrap_or_else(|e| panic!("{e}"));
    let yt = out_v[0].1.as_tensor().unwrap();
    assert_eq!(out_v[0].0, "y");
    let yd: Vec<f32> = match yt.dtype() {
        kiln::DType::U8 => yt
            .as_slice::<u8>()
            .unwrap()
            .iter()
            .map(|&v| (i32::from(v) - out.zero_point) as f32 * out.scale)
            .collect(),
        _ => yt
            .as_slice::<i8>()
            .unwrap()
            .iter()
            .map(|&v| (i32::from(v) - out.zero_point) as f32 * out.scale)
            .collect(),
    };
    // Dequantized, it is the quantized model's output within half an output step (saturated
    // where this input's output passes the calibrated range).
    let plain = session(&m, &quantizing(Spec::default(), QuantizeMode::Calibrate, samples(6))).unwrap();
    let want = output(&plain, x);
    let (lo, hi) = if yt.dtype() == kiln::DType::U8 {
        (0, 255)
    } else {
        (-128, 127)
    };
    let (rlo, rhi) = (
        (lo - out.zero_point) as f32 * out.scale,
        (hi - out.zero_point) as f32 * out.scale,
    );
    for (a, b) in yd.iter().zip(&want) {
        assert!(
            (a - b.clamp(rlo, rhi)).abs() <= out.scale * 0.51 + 1e-6,
            "{yd:?} vs {want:?}"
        );
    }
}

/// Found quantizing DeepLab (random weights): a ReLU that never fires on the samples has the
/// range [0, 0], which the histogram had widened to 1.2e-7: its reader's int32 bias on a
/// scale of ~1e-12 overflowed and the output was noise. The range stays degenerate (Glow's
/// 0.1 scale), and a bias past 2^30 steps would stay in float.
#[test]
fn a_dead_relu_keeps_its_readers_bias() {
    let m = model(
        vec![
            node(
                "Conv",
                "c1",
                &["x", "w1", "b1"],
                &["c"],
                vec![ints("kernel_shape", &[1, 1])],
            ),
            node("Relu", "r", &["c"], &["h"], vec![]),
            node(
                "Conv",
                "c2",
                &["h", "w2", "b2"],
                &["y"],
                vec![ints("kernel_shape", &[1, 1])],
            ),
        ],
        vec![f32_info("x", &[1, 3, 4, 4])],
        vec![f32_info("y", &[1, 2, 4, 4])],
        vec![
            f32_tensor("w1", &[4, 3, 1, 1], noise(12, 7, 0.1)),
            f32_tensor("b1", &[4], vec![-10.0; 4]),
            f32_tensor("w2", &[2, 4, 1, 1], noise(8, 8, 1.0)),
            f32_tensor("b2", &[2], vec![0.25, -0.5]),
        ],
    );
    let f = session(&m, &SessionOptions::default()).unwrap();
    let x = || {
        vec![(
            "x".to_string(),
            Value::Tensor(Tensor::from_vec(vec![1, 3, 4, 4], noise(48, 9, 1.0)).unwrap()),
        )]
    };
    let samples = Arc::new(vec![x(), x()]);
    let q = session(&m, &quantizing(Spec::default(), QuantizeMode::Calibrate, samples)).unwrap();
    // The output is the bias alone, on the grid of 0.1 x the weight scale (within 1e-3).
    let (a, b) = (output(&f, x()), output(&q, x()));
    for (p, r) in a.iter().zip(&b) {
        assert!((p - r).abs() < 1e-3, "{a:?} vs {b:?}");
    }
}

#[test]
fn the_profile_shows_each_steps_precision() {
    let mut o = quantizing(Spec::default(), QuantizeMode::Calibrate, samples(4));
    o.enable_profiling = true;
    let q = session(&cnn(false), &o).unwrap();
    q.run(sample(90)).unwrap();
    let p = q.get_profile().expect("a profile");
    let precs: Vec<String> = p.steps.iter().map(kiln::step_precision).collect();
    // The Gemm of 8-bit constant weights is an integer product; the Q/DQ pairs convert.
    assert!(precs.iter().any(|s| s == "int8"), "{precs:?}");
    assert!(precs.iter().any(|s| s == "q/dq"), "{precs:?}");
    assert!(precs.iter().any(|s| s == "f32"), "{precs:?}");
    let table = p.table(None);
    assert!(table.contains("prec") && table.contains("\nint8 "), "{table}");
}
