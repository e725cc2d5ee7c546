//! Error artifacts end to end: a run that fails at a node and a compile that fails each write
//! a bundle (save_error_artifact), and `kiln repro BUNDLE` replays it to the same error; the
//! failing node comes alone with its captured inputs, and the saved weights are randomized.

use kiln::Tensor;
use kiln::raw::onnx::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    tensor_shape_proto::{Dimension, dimension},
    type_proto,
};
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn info(name: &str, elem: i32, shape: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto {
                    dim: shape
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// s = x + w (w = 0..6 as [2, 3]); y = Gather(s, idx) on axis 0.
fn gather_model(first_op: &str) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![
                node(first_op, "add", &["x", "w"], &["s"]),
                node("Gather", "pick", &["s", "idx"], &["y"]),
            ],
            input: vec![info("x", 1, &[2, 3]), info("idx", 7, &[1])],
            output: vec![info("y", 1, &[1, 3])],
            initializer: vec![TensorProto {
                name: Some("w".into()),
                data_type: Some(1),
                dims: vec![2, 3],
                float_data: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn the_bundle(dir: &Path) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("kiln-error-"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

#[test]
fn a_failed_run_writes_a_bundle_that_repro_replays_with_the_node_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("gather.onnx");
    std::fs::write(&model, gather_model("Add")).unwrap();
    let x = Tensor::from_vec(vec![2, 3], vec![1.0f32; 6]).unwrap();
    let idx = Tensor::from_vec(vec![1], vec![5i64]).unwrap();
    let feed = tmp.path().join("bad.npz");
    std::fs::write(
        &feed,
        kiln::npy::npz_bytes(&[("x".into(), x), ("idx".into(), idx)]).unwrap(),
    )
    .unwrap();
    let out = tmp.path().join("artifacts");
    let run = kiln()
        .args(["run", model.to_str().unwrap(), "--inputs", feed.to_str().unwrap()])
        .args(["-O", "save_error_artifact=true", "-O"])
        .arg(format!("output_dir={}", out.display()))
        .output()
        .unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("node 'pick' (Gather): index 5 is out of range") && err.contains("error artifact written to"),
        "{err}"
    );
    let bundle = the_bundle(&out);
    assert!(err.contains(&bundle.display().to_string()), "{err}");
    let info = kiln::artifact::read_info(&bundle).unwrap();
    assert_eq!(info.node.as_deref(), Some("pick"));
    assert!(info.randomized_weights);

    // The node's inputs as the model computed them (real weights): s = x + w.
    let captured = kiln_cli::npy::read_npz(&bundle.join("node_inputs.npz")).unwrap();
    let s = &captured.iter().find(|(n, _)| n == "s").unwrap().1;
    assert_eq!(s.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // The saved model's weights are random over the original's range [0, 5].
    let saved = ModelProto::decode(std::fs::read(bundle.join("model.onnx")).unwrap().as_slice()).unwrap();
    let w = kiln::raw::onnx::tensor::TensorLoader::new(None)
        .load(&saved.graph.unwrap().initializer[0])
        .unwrap()
        .to_f64_vec();
    assert!(w.iter().all(|v| (0.0..=5.0).contains(v)), "{w:?}");
    assert_ne!(w, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);

    let replay = kiln().args(["repro", bundle.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(1), "{text}");
    assert!(text.contains("reproduced: the same error"), "{text}");
    assert!(
        text.contains("'pick' alone on its captured inputs: node 'pick' (Gather): index 5"),
        "{text}"
    );

    // A run that succeeds writes nothing.
    let good = tmp.path().join("good.npz");
    let x = Tensor::from_vec(vec![2, 3], vec![1.0f32; 6]).unwrap();
    let idx = Tensor::from_vec(vec![1], vec![1i64]).unwrap();
    std::fs::write(
        &good,
        kiln::npy::npz_bytes(&[("x".into(), x), ("idx".into(), idx)]).unwrap(),
    )
    .unwrap();
    let ok = kiln()
        .args(["run", model.to_str().unwrap(), "--inputs", good.to_str().unwrap()])
        .args(["-O", "save_error_artifact=true", "-O"])
        .arg(format!("output_dir={}", out.display()))
        .output()
        .unwrap();
    assert!(ok.status.success());
    assert_eq!(the_bundle(&out), bundle);
}

#[test]
fn a_failed_compile_writes_a_bundle_that_repro_replays() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("unknown.onnx");
    std::fs::write(&model, gather_model("NoSuchOp")).unwrap();
    let out = tmp.path().join("artifacts");
    let compile = kiln()
        .args(["compile", model.to_str().unwrap(), "-o"])
        .arg(tmp.path().join("m.kiln"))
        .args([
            "-O",
            "save_error_artifact=true",
            "-O",
            "randomize_onnx_model=false",
            "-O",
        ])
        .arg(format!("output_dir={}", out.display()))
        .output()
        .unwrap();
    assert!(!compile.status.success());
    let err = String::from_utf8_lossy(&compile.stderr);
    assert!(
        err.contains("NoSuchOp") && err.contains("error artifact written to"),
        "{err}"
    );
    let bundle = the_bundle(&out);
    let info = kiln::artifact::read_info(&bundle).unwrap();
    assert_eq!(info.stage, kiln::artifact::Stage::Compile);
    assert!(!info.randomized_weights && info.inputs.is_none());
    // Not randomized: the very bytes.
    assert_eq!(
        std::fs::read(bundle.join("model.onnx")).unwrap(),
        gather_model("NoSuchOp")
    );
    let replay = kiln().args(["repro", bundle.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(1), "{text}");
    assert!(text.contains("reproduced: the same error"), "{text}");
}
