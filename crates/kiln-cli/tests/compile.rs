//! `kiln compile` end to end: the program file runs and matches ONNX Runtime's output, `kiln
//! info` shows its sections, corruption is refused naming the section, intermediate outputs
//! and the configuration reach the compiler.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = kiln(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn err(args: &[&str]) -> String {
    let out = kiln(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean failure for {args:?}: {out:?}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
        .display()
        .to_string()
}

fn read_f32_npy(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn compile(dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join("tiny.kiln");
    let o = out.display().to_string();
    let model = example("tiny_cnn.onnx");
    let mut args = vec!["compile", model.as_str(), "-o", o.as_str(), "--quiet"];
    args.extend_from_slice(extra);
    ok(&args);
    out
}

#[test]
fn compiled_program_matches_onnxruntime_and_shows_its_sections() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile(dir.path(), &["--opt-level", "3"]);
    let p = program.display().to_string();
    let outdir = dir.path().join("out");
    let input = format!("image={}", example("tiny_cnn_input.npy"));
    ok(&["run", &p, "--input", &input, "-o", &outdir.display().to_string()]);
    let got = read_f32_npy(&outdir.join("probs.npy"));
    let want = read_f32_npy(Path::new(&example("tiny_cnn_expected_probs.npy")));
    assert_eq!(got.len(), 10);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "got {got:?}\nwant {want:?}");
    }
    let info = ok(&["info", &p]);
    let version = format!("format version: {}", kiln::raw::runtime::file::FORMAT_VERSION);
    for needle in [
        version.as_str(),
        "content hash (BLAKE3)",
        "meta",
        "program",
        "weights",
        "image: f32[1,3,32,32]",
    ] {
        assert!(info.contains(needle), "missing {needle:?} in\n{info}");
    }
    assert!(
        info.contains("optimization_type = 3") || info.contains("\"opt_level\":3"),
        "{info}"
    );
    // Compile flags cannot change an already compiled program.
    let e = err(&["run", &p, "--input", &input, "--opt-level", "1"]);
    assert!(e.contains("compiled .kiln program"), "{e}");
}

#[test]
fn a_flipped_byte_is_refused_naming_the_section() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile(dir.path(), &[]);
    let bytes = std::fs::read(&program).unwrap();
    let info = ok(&["info", &program.display().to_string()]);
    // Section offsets from `kiln info`: "  name  offset  bytes  crc".
    let offset = |name: &str| -> usize {
        info.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() == 4 && w[0] == name)
            .and_then(|w| w[1].parse().ok())
            .unwrap()
    };
    let input = format!("image={}", example("tiny_cnn_input.npy"));
    for (at, expect) in [
        (offset("meta") + 3, "section 'meta' is corrupted"),
        (offset("program") + 5, "section 'program' is corrupted"),
        (offset("weights") + 100, "section 'weights' is corrupted"),
        (bytes.len() - 1, "section 'weights' is corrupted"),
        (12, "header is corrupted"),
    ] {
        let mut c = bytes.clone();
        c[at] ^= 0x01;
        let bad = dir.path().join(format!("bad{at}.kiln"));
        std::fs::write(&bad, &c).unwrap();
        let e = err(&["run", &bad.display().to_string(), "--input", &input]);
        assert!(e.contains(expect), "byte {at}: {e}");
        let shown = bad.display().to_string();
        assert_eq!(e.matches(&shown).count(), 1, "the path once: {e}");
    }
    let cut = dir.path().join("cut.kiln");
    std::fs::write(&cut, &bytes[..bytes.len() - 64]).unwrap();
    let e = err(&["info", &cut.display().to_string()]);
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn intermediate_outputs_are_exposed_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let model = example("tiny_cnn.onnx");
    let input = format!("image={}", example("tiny_cnn_input.npy"));
    let all = ok(&["run", &model, "--input", &input, "--outputs", "all"]);
    let lines = all.lines().filter(|l| l.contains(": f32[")).count();
    assert!(lines > 3, "expected every intermediate tensor:\n{all}");
    let e = err(&[
        "compile",
        &model,
        "-o",
        &dir.path().join("x.kiln").display().to_string(),
        "--output-tensors",
        "probz",
    ]);
    assert!(
        e.contains("output tensor 'probz' is not a value of the model (similar: probs)"),
        "{e}"
    );
    // A program's outputs are fixed when compiling: `--outputs all` on one is refused, not ignored.
    let program = dir.path().join("tiny.kiln").display().to_string();
    ok(&["compile", &model, "-o", &program]);
    let e = err(&["run", &program, "--input", &input, "--outputs", "all"]);
    assert!(
        e.contains("compiled .kiln program") && e.contains("--outputs all"),
        "{e}"
    );
    // The program's steps show the plan the compiler chose beside each op: the image stem
    // gathered channels-first into packed panels with its Relu, the pool channels-last, the
    // classifier's weights packed; a Softmax runs as imported.
    let steps = ok(&["info", &program, "--graph"]);
    let line = |op: &str| {
        steps
            .lines()
            .find(|l| l.contains(&format!("= {op}(")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("Conv").contains("plan[nchw->nhwc packed(m=8 c=3 3x3) +Relu]"),
        "{steps}"
    );
    assert!(line("MaxPool").contains("plan[nhwc]"), "{steps}");
    assert!(line("Gemm").contains("plan[packed_b(16x10 f32/nr32/v1)]"), "{steps}");
    assert!(
        !line("Softmax").is_empty() && !line("Softmax").contains("plan["),
        "{steps}"
    );
}

#[test]
fn configuration_files_and_overrides_reach_the_compiler() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("opts.yaml");
    std::fs::write(
        &yaml,
        format!(
            "optimization_type: 0\noutput_dir: {}\n",
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let model = example("tiny_cnn.onnx");
    let y = yaml.display().to_string();
    let text = ok(&["compile", &model, "--config", &y]);
    assert!(text.contains("optimisation level 0"), "{text}");
    let program = dir.path().join("out/tiny_cnn.kiln");
    assert!(program.exists());
    let text = ok(&["compile", &model, "--config", &y, "-O", "O=3"]);
    assert!(text.contains("optimisation level 3"), "{text}");
    let e = err(&["compile", &model, "--config", &y, "-O", "convert_to_fp16=true"]);
    assert!(
        e.contains("convert_to_fp16") && e.contains("not yet implemented"),
        "{e}"
    );
}

#[test]
fn bench_takes_qaic_run_benchmark_options_from_the_configuration() {
    let model = example("tiny_cnn.onnx");
    let json = ok(&["bench", &model, "-O", "num_inferences=7", "--json", "--quiet"]);
    assert!(json.contains("\"inferences\": 7"), "{json}");
    // -n on the command line wins over the configuration.
    let json = ok(&[
        "bench",
        &model,
        "-O",
        "num_inferences=7",
        "-n",
        "3",
        "--json",
        "--quiet",
    ]);
    assert!(json.contains("\"inferences\": 3"), "{json}");
}

#[test]
fn num_activations_runs_concurrent_inferences_on_one_session() {
    let model = example("tiny_cnn.onnx");
    for args in [
        vec![
            "bench",
            model.as_str(),
            "-O",
            "num_activations=3",
            "-n",
            "10",
            "--json",
            "--quiet",
        ],
        vec![
            "bench",
            model.as_str(),
            "--activations",
            "2",
            "-n",
            "7",
            "--json",
            "--quiet",
        ],
    ] {
        let n = args[args.iter().position(|a| *a == "-n").unwrap() + 1];
        let json = ok(&args);
        assert!(json.contains(&format!("\"inferences\": {n},")), "{json}");
    }
    let text = ok(&["bench", &model, "--activations", "2", "-n", "4", "--quiet"]);
    assert!(text.contains("activations    2"), "{text}");
}

/// One .npz of `n` samples (leading axis) of the example input, each scaled differently.
fn calibration_npz(dir: &Path, n: usize) -> PathBuf {
    let x = kiln::npy::parse_npy(&std::fs::read(example("tiny_cnn_input.npy")).unwrap()).unwrap();
    let base = x.as_slice::<f32>().unwrap();
    let mut all = Vec::with_capacity(base.len() * n);
    for k in 0..n {
        let s = 1.0 - 0.3 * k as f32;
        all.extend(base.iter().map(|v| v * s));
    }
    let mut shape = vec![n];
    shape.extend_from_slice(x.shape());
    let t = kiln::Tensor::from_vec(shape, all).unwrap();
    let path = dir.join("calib.npz");
    std::fs::write(&path, kiln::npy::npz_bytes(&[("image".to_string(), t)]).unwrap()).unwrap();
    path
}

#[test]
fn convert_to_quantize_calibrates_reports_and_stays_close() {
    let dir = tempfile::tempdir().unwrap();
    let calib = calibration_npz(dir.path(), 4);
    let report = dir.path().join("report.json");
    let out = dir.path().join("q.kiln");
    let model = example("tiny_cnn.onnx");
    let (c, r, o) = (
        calib.display().to_string(),
        report.display().to_string(),
        out.display().to_string(),
    );
    let text = ok(&[
        "compile",
        &model,
        "-o",
        &o,
        "-O",
        "convert_to_quantize=true",
        "-O",
        "enable_channelwise=true",
        "--calibration-data",
        &c,
        "--report",
        &r,
    ]);
    assert!(text.contains("quantization (convert_to_quantize"), "{text}");
    assert!(text.contains("4 calibration samples"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let db = json["outputs"][0]["sqnr_db"].as_f64().expect("an output SQNR");
    assert!(db > 15.0, "{json}");
    assert!(json["per_channel_weights"].as_u64().unwrap() >= 1, "{json}");
    // The program runs and its probabilities stay near the float model's.
    let outdir = dir.path().join("out");
    let input = format!("image={}", example("tiny_cnn_input.npy"));
    ok(&["run", &o, "--input", &input, "-o", &outdir.display().to_string()]);
    let got = read_f32_npy(&outdir.join("probs.npy"));
    let want = read_f32_npy(Path::new(&example("tiny_cnn_expected_probs.npy")));
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b]));
    assert_eq!(argmax(&got), argmax(&want), "got {got:?}\nwant {want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 0.05, "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn profiles_and_calibration_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let calib = calibration_npz(dir.path(), 3).display().to_string();
    let model = example("tiny_cnn.onnx");
    let o = dir.path().join("x.kiln").display().to_string();
    let e = err(&["compile", &model, "-o", &o, "--calibration-data", &calib]);
    assert!(e.contains("convert_to_quantize"), "{e}");
    let profile = dir.path().join("p.yaml").display().to_string();
    let dump = format!("dump_profile={profile}");
    let text = ok(&["compile", &model, "-o", &o, "-O", &dump, "--calibration-data", &calib]);
    assert!(text.contains("profile written to"), "{text}");
    let load = format!("load_profile={profile}");
    ok(&["compile", &model, "-o", &o, "-O", &load]);
    let e = err(&[
        "compile",
        &model,
        "-o",
        &o,
        "-O",
        &load,
        "-O",
        "convert_to_quantize=true",
    ]);
    assert!(e.contains("convert_to_quantize") && e.contains("load_profile"), "{e}");
    let e = err(&["compile", &model, "-o", &o, "-O", "convert_to_quantize=true"]);
    assert!(e.contains("no calibration data"), "{e}");
}

fn write_f32_npy(path: &Path, shape: &[usize], v: &[f32]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        dims.join(", ")
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// qaic's custom I/O: the template lists the model's I/O; edited to take the image
/// channels-last, the program's input is `[1, 32, 32, 3]` and, fed the transposed image, it
/// gives ONNX Runtime's probabilities. A name the model lacks is refused naming it.
#[test]
fn custom_io_takes_the_image_channels_last_from_an_edited_template() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.yaml");
    let dump = format!("dump_custom_io_config_template_file={}", template.display());
    compile(dir.path(), &["-O", &dump]);
    let t = std::fs::read_to_string(&template).unwrap();
    for needle in ["IOName: image", "Layout: NCHW", "IOName: probs", "Precision: float"] {
        assert!(t.contains(needle), "missing {needle:?} in\n{t}");
    }
    let io = dir.path().join("io.yaml");
    std::fs::write(&io, t.replacen("Layout: NCHW", "Layout: NHWC", 1)).unwrap();
    let custom = format!("custom_io_list_file={}", io.display());
    let program = compile(dir.path(), &["-O", &custom]);
    let p = program.display().to_string();
    let info = ok(&["info", &p]);
    assert!(info.contains("image: f32[1,32,32,3]"), "{info}");
    let nchw = read_f32_npy(Path::new(&example("tiny_cnn_input.npy")));
    let mut nhwc = vec![0f32; nchw.len()];
    for c in 0..3 {
        for hw in 0..32 * 32 {
            nhwc[hw * 3 + c] = nchw[c * 32 * 32 + hw];
        }
    }
    let input_path = dir.path().join("image_nhwc.npy");
    write_f32_npy(&input_path, &[1, 32, 32, 3], &nhwc);
    let outdir = dir.path().join("out");
    let input = format!("image={}", input_path.display());
    ok(&["run", &p, "--input", &input, "-o", &outdir.display().to_string()]);
    let got = read_f32_npy(&outdir.join("probs.npy"));
    let want = read_f32_npy(Path::new(&example("tiny_cnn_expected_probs.npy")));
    assert_eq!(got.len(), 10);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "got {got:?}\nwant {want:?}");
    }
    std::fs::write(&io, "- IOName: picture\n  Layout: NHWC\n").unwrap();
    let model = example("tiny_cnn.onnx");
    let e = err(&["compile", &model, "-o", &p, "-O", &custom]);
    assert!(e.contains("'picture'") && e.contains("inputs: image"), "{e}");
}
