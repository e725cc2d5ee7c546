//! End-to-end tests of the `kiln` binary on the shipped example model: outputs match ONNX
//! Runtime's (computed when the example was made), and bad inputs fail cleanly.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn read_f32_npy(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn run_matches_onnxruntime_on_the_example() {
    let out = tempfile::tempdir().unwrap();
    let ex = examples();
    let status = kiln()
        .arg("run")
        .arg(ex.join("tiny_cnn.onnx"))
        .arg("--input")
        .arg(format!("image={}", ex.join("tiny_cnn_input.npy").display()))
        .arg("--output-dir")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(stdout.starts_with("probs: f32[1, 10]"), "{stdout}");
    let got = read_f32_npy(&out.path().join("probs.npy"));
    let want = read_f32_npy(&ex.join("tiny_cnn_expected_probs.npy"));
    assert_eq!(got.len(), 10);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "got {got:?}\nwant {want:?}");
    }
}

fn run_err(args: &[&str]) -> String {
    let out = kiln().args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean failure for {args:?}: {out:?}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_inputs_are_named() {
    let ex = examples();
    let model = ex.join("tiny_cnn.onnx");
    let model = model.to_str().unwrap();
    let err = run_err(&["run", model]);
    assert!(err.contains("missing input 'image'"), "{err}");
    let input = format!("nope={}", ex.join("tiny_cnn_input.npy").display());
    let err = run_err(&["run", model, "--input", &input]);
    assert!(err.contains("unknown input 'nope'") && err.contains("image"), "{err}");
    // The expected-probs file is f32[1,10]: the wrong shape for 'image'.
    let input = format!("image={}", ex.join("tiny_cnn_expected_probs.npy").display());
    let err = run_err(&["run", model, "--input", &input]);
    assert!(err.contains("input 'image'") && err.contains("rank"), "{err}");
    let err = run_err(&["run", "/nonexistent/model.onnx"]);
    assert!(err.contains("/nonexistent/model.onnx"), "{err}");
}

#[test]
fn corrupted_models_fail_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(examples().join("tiny_cnn.onnx")).unwrap();
    for cut in [1, 17, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1] {
        let p = dir.path().join(format!("cut{cut}.onnx"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let out = kiln().arg("info").arg(&p).output().unwrap();
        assert_ne!(out.status.code(), Some(101), "panic on a model cut at {cut}: {out:?}");
        assert!(!out.status.success(), "a model cut at {cut} loaded");
    }
}

#[test]
fn info_reports_params_and_macs() {
    let out = kiln()
        .arg("info")
        .arg(examples().join("tiny_cnn.onnx"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    // 8*3*3*3+8 + 4*8 + 16*8*3*3+16 + 16*10+10 + 2 (shape) = 224 + 32 + 1168 + 170 + 2
    assert!(text.contains("parameters 1,596"), "{text}");
    // conv1 8*3*9*32*32 + conv2 16*8*9*8*8 + fc 16*10 = 221184 + 73728 + 160
    assert!(text.contains("MACs       295,072"), "{text}");
    assert!(text.contains("image") && text.contains("f32[1,3,32,32]"), "{text}");
}

#[test]
fn info_graph_prints_typed_values_and_attributes() {
    let out = kiln()
        .arg("info")
        .arg(examples().join("tiny_cnn.onnx"))
        .arg("--graph")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let conv1 = text.lines().find(|l| l.contains("'conv1'")).unwrap_or_default();
    assert!(
        conv1.starts_with("  %c1: f32[1,8,32,32] = Conv(%image, %conv1_w, %conv1_b) {"),
        "{conv1}"
    );
    assert!(conv1.contains("pads: [1, 1, 1, 1]"), "{conv1}");
    assert!(text.contains("%probs: f32[1,10] = Softmax(%logits)"), "{text}");
    assert!(text.contains("  input  %image: f32[1,3,32,32]"), "{text}");
}
