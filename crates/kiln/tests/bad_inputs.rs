//! Hostile and malformed models, configs and tensors: each gets a clear error naming the
//! culprit, never a panic or an unbounded allocation. Models are built in code.

use kiln::raw::onnx::proto::{
    AttributeProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, ValueInfoProto,
    attribute_proto::AttributeType, tensor_proto::DataLocation,
};
use kiln::raw::onnx::{ImportOptions, load_model, load_model_bytes};
use kiln::{Error, ImportError, Session, SessionOptions, Tensor, Value};
use prost::Message;

mod common;
use common::{Dim, F32, I64, i64_tensor, import, model, node, value_info};

#[test]
fn every_unsupported_op_is_listed_in_one_error() {
    let m = model(
        vec![
            node("FancyOp", "a", &["x"], &["y"], vec![]),
            node("Relu", "b", &["y"], &["z"], vec![]),
            node("FancyOp", "c", &["z"], &["w"], vec![]),
            node("OtherOp", "d", &["w"], &["v"], vec![]),
        ],
        vec![value_info("x", F32, &[Dim::N(2)])],
        vec![value_info("v", F32, &[Dim::N(2)])],
        vec![],
    );
    let e = import(&m).unwrap_err();
    let ImportError::UnsupportedOps(ops) = &e else {
        panic!("{e}")
    };
    assert_eq!(ops.len(), 2, "{e}");
    assert_eq!(ops[0].op_type, "FancyOp");
    assert_eq!(ops[0].nodes, vec!["a".to_string(), "c".to_string()]);
    assert_eq!(ops[1].op_type, "OtherOp");
    let text = e.to_string();
    assert!(
        text.contains("FancyOp") && text.contains("nodes a, c") && text.contains("OtherOp"),
        "{text}"
    );
}

#[test]
fn wrong_attribute_type_names_node_and_attribute() {
    let perm = AttributeProto {
        name: Some("perm".into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(1.0),
        ..Default::default()
    };
    let m = model(
        vec![node("Transpose", "t0", &["x"], &["y"], vec![perm])],
        vec![value_info("x", F32, &[Dim::N(2), Dim::N(3)])],
        vec![value_info("y", F32, &[Dim::N(3), Dim::N(2)])],
        vec![],
    );
    let e = import(&m).unwrap_err().to_string();
    assert!(e.contains("t0") && e.contains("perm") && e.contains("FLOAT"), "{e}");
}

#[test]
fn external_data_cannot_leave_the_model_folder() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("model");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(dir.path().join("secret.bin"), [0u8; 16]).unwrap();
    std::fs::write(sub.join("w.bin"), 2.5f32.to_le_bytes().repeat(4)).unwrap();
    let ext = |loc: &str| TensorProto {
        name: Some("w".into()),
        data_type: Some(F32),
        dims: vec![4],
        data_location: Some(DataLocation::External as i32),
        external_data: vec![StringStringEntryProto {
            key: Some("location".into()),
            value: Some(loc.into()),
        }],
        ..Default::default()
    };
    let build = |loc: &str| {
        model(
            vec![node("Add", "add", &["x", "w"], &["y"], vec![])],
            vec![value_info("x", F32, &[Dim::N(4)])],
            vec![value_info("y", F32, &[Dim::N(4)])],
            vec![ext(loc)],
        )
    };
    let path = sub.join("m.onnx");
    // A symlink inside the folder that points out of it is refused too.
    std::os::unix::fs::symlink(dir.path().join("secret.bin"), sub.join("link.bin")).unwrap();
    for bad in ["../secret.bin", "/etc/passwd", "sub/../../secret.bin", "link.bin"] {
        std::fs::write(&path, build(bad).encode_to_vec()).unwrap();
        let e = load_model(&path, &ImportOptions::default()).unwrap_err().to_string();
        assert!(
            e.contains("external data of tensor 'w'") && e.contains(bad),
            "{bad}: {e}"
        );
    }
    std::fs::write(&path, build("w.bin").encode_to_vec()).unwrap();
    let s = Session::new(&path, &SessionOptions::default()).unwrap();
    let x = Tensor::from_vec(vec![4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let out = s.run(vec![("x".into(), Value::Tensor(x))]).unwrap();
    let Value::Tensor(y) = &out[0].1 else { panic!() };
    assert_eq!(y.as_slice::<f32>().unwrap(), &[3.5, 4.5, 5.5, 6.5]);
}

#[test]
fn absurd_declared_shapes_are_refused_before_allocation() {
    let huge = TensorProto {
        name: Some("w".into()),
        data_type: Some(F32),
        dims: vec![1 << 40, 1 << 40],
        raw_data: Some(vec![0u8; 16].into()),
        ..Default::default()
    };
    let m = model(
        vec![node("Add", "add", &["x", "w"], &["y"], vec![])],
        vec![value_info("x", F32, &[Dim::N(4)])],
        vec![value_info("y", F32, &[Dim::N(4)])],
        vec![huge],
    );
    let e = import(&m).unwrap_err().to_string();
    assert!(e.contains("tensor 'w'") && e.contains("exceeds"), "{e}");

    // A shape computed from tensor values: ConstantOfShape asked for 2^40 elements.
    let m = model(
        vec![node("ConstantOfShape", "cos", &["s"], &["y"], vec![])],
        vec![value_info("s", I64, &[Dim::N(2)])],
        vec![value_info("y", F32, &[Dim::S("a"), Dim::S("b")])],
        vec![],
    );
    let model = import(&m).unwrap();
    let limited = SessionOptions {
        limits: kiln::RunLimits {
            memory_bytes: Some(1 << 30),
            ..kiln::RunLimits::NONE
        },
        ..SessionOptions::default()
    };
    let s = Session::from_model(&model, &limited).unwrap();
    let shape = Tensor::from_vec(vec![2], vec![1i64 << 20, 1 << 20]).unwrap();
    // A memory limit refuses it before the op runs ...
    let e = s
        .run(vec![("s".into(), Value::Tensor(shape.clone()))])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cos") && e.contains("ConstantOfShape") && e.contains("run_memory_limit_mb"),
        "{e}"
    );
    // ... and with the default one (far above what an op may make) the op's own bound on
    // elements does.
    let s = Session::from_model(&model, &SessionOptions::default()).unwrap();
    let e = s.run(vec![("s".into(), Value::Tensor(shape))]).unwrap_err().to_string();
    assert!(
        e.contains("cos")
            && e.contains("ConstantOfShape")
            && e.contains("shape [1048576, 1048576] exceeds the bound of 1073741824 elements"),
        "{e}"
    );
}

#[test]
fn out_of_range_indices_name_the_node() {
    let m = model(
        vec![node("Gather", "gather0", &["x", "idx"], &["y"], vec![])],
        vec![value_info("x", F32, &[Dim::N(3)])],
        vec![value_info("y", F32, &[Dim::N(1)])],
        vec![i64_tensor("idx", &[1], &[10])],
    );
    let s = Session::from_model(&import(&m).unwrap(), &SessionOptions::default()).unwrap();
    let x = Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let e = s.run(vec![("x".into(), Value::Tensor(x))]).unwrap_err().to_string();
    assert!(e.contains("gather0") && e.contains("10"), "{e}");
}

#[test]
fn symbols_bind_and_inputs_are_checked_against_them() {
    let m = model(
        vec![node("Add", "add", &["x", "y"], &["z"], vec![])],
        vec![
            value_info("x", F32, &[Dim::S("batch"), Dim::N(3)]),
            value_info("y", F32, &[Dim::S("batch"), Dim::N(3)]),
        ],
        vec![value_info("z", F32, &[Dim::S("batch"), Dim::N(3)])],
        vec![],
    );
    // Unbound: the output keeps the symbol; a mismatched binding across inputs is refused.
    let g = import(&m).unwrap();
    let z = g.graph.value(g.graph.outputs[0]).unwrap();
    assert_eq!(z.ty.to_string(), "f32[batch,3]");
    let s = Session::from_model(&g, &SessionOptions::default()).unwrap();
    let t = |n: usize| Value::Tensor(Tensor::zeros(kiln::DType::F32, vec![n, 3]).unwrap());
    let e = s
        .run(vec![("x".into(), t(2)), ("y".into(), t(3))])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("input 'y'") && e.contains("batch") && e.contains("already bound to 2"),
        "{e}"
    );
    assert_eq!(s.run(vec![("x".into(), t(2)), ("y".into(), t(2))]).unwrap().len(), 1);

    // Bound at compile time: types become fixed and other sizes are refused.
    let bytes: bytes::Bytes = m.encode_to_vec().into();
    let g = load_model_bytes(
        bytes.clone(),
        &ImportOptions {
            symbols: vec![("batch".into(), 4)],
        },
    )
    .unwrap();
    let z = g.graph.value(g.graph.outputs[0]).unwrap();
    assert_eq!(z.ty.to_string(), "f32[4,3]");
    let s = Session::from_model(&g, &SessionOptions::default()).unwrap();
    let e = s
        .run(vec![("x".into(), t(2)), ("y".into(), t(2))])
        .unwrap_err()
        .to_string();
    assert!(e.contains("input 'x'") && e.contains("expected 4, got 2"), "{e}");

    let e = load_model_bytes(
        bytes,
        &ImportOptions {
            symbols: vec![("seq".into(), 4)],
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("'seq'") && e.contains("batch"), "{e}");
}

#[test]
fn truncated_and_corrupted_bytes_never_panic() {
    let m = model(
        vec![
            node("Add", "add", &["x", "w"], &["y"], vec![]),
            node("Relu", "relu", &["y"], &["z"], vec![]),
        ],
        vec![value_info("x", F32, &[Dim::N(4)])],
        vec![value_info("z", F32, &[Dim::N(4)])],
        vec![TensorProto {
            name: Some("w".into()),
            data_type: Some(F32),
            dims: vec![4],
            float_data: vec![1.0, -2.0, 3.0, -4.0],
            ..Default::default()
        }],
    );
    let bytes = m.encode_to_vec();
    for cut in 0..bytes.len() {
        let _ = load_model_bytes(bytes[..cut].to_vec().into(), &ImportOptions::default());
    }
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xFF] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            if let Ok(g) = load_model_bytes(b.into(), &ImportOptions::default()) {
                let _ = Session::from_model(&g, &SessionOptions::default()).map(|s| {
                    let x = Tensor::zeros(kiln::DType::F32, vec![4]).unwrap();
                    s.run(vec![("x".into(), Value::Tensor(x))])
                });
            }
        }
    }
}

#[test]
fn a_broken_program_file_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // The program-file magic followed by garbage: refused as a program file, naming the path.
    let path = dir.path().join("model.kiln");
    std::fs::write(&path, b"KILNPROG\x01\x00\x00\x00 and then nothing sensible at all").unwrap();
    let e = Session::new(&path, &SessionOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Program { .. }), "{e}");
    assert!(e.to_string().contains("model.kiln"), "{e}");
    // A missing file is an I/O error naming it, whatever its extension.
    let e = Session::new(dir.path().join("missing.kiln"), &SessionOptions::default()).unwrap_err();
    assert!(e.to_string().contains("missing.kiln"), "{e}");
}

/// An integer `axis` attribute.
fn axis_attr(axis: i64) -> AttributeProto {
    AttributeProto {
        name: Some("axis".into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(axis),
        ..Default::default()
    }
}

#[test]
fn shape_arithmetic_is_folded_for_inference() {
    // y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])): [2,3,4] -> [2,12] only if the shape
    // computation is evaluated during inference.
    let axis0 = axis_attr(0);
    let m = model(
        vec![
            node("Shape", "shape", &["x"], &["s"], vec![]),
            node("Gather", "first", &["s", "zero"], &["n"], vec![axis0.clone()]),
            node("Concat", "cat", &["n", "minus1"], &["target"], vec![axis0]),
            node("Reshape", "reshape", &["x", "target"], &["y"], vec![]),
        ],
        vec![value_info("x", F32, &[Dim::N(2), Dim::N(3), Dim::N(4)])],
        vec![ValueInfoProto {
            name: Some("y".into()),
            ..Default::default()
        }],
        vec![i64_tensor("zero", &[1], &[0]), i64_tensor("minus1", &[1], &[-1])],
    );
    let g = import(&m).unwrap();
    let y = g.graph.value(g.graph.outputs[0]).unwrap();
    assert_eq!(y.ty.to_string(), "f32[2,12]");
    // With a symbolic leading dim the target shape is not known statically.
    let mut m2 = m.clone();
    if let Some(g2) = m2.graph.as_mut() {
        g2.input = vec![value_info("x", F32, &[Dim::S("n"), Dim::N(3), Dim::N(4)])];
    }
    let g = import(&m2).unwrap();
    let y = g.graph.value(g.graph.outputs[0]).unwrap();
    assert_ne!(y.ty.to_string(), "f32[2,12]");
}

#[test]
fn reductions_in_shape_arithmetic_are_folded_for_inference() {
    // y = Reshape(x, Concat(ReduceMax(Shape(x)), [-1])): [2,3,4] -> [4,6], the way a
    // detector's transform sizes its padded batch from the larger image dim; without the
    // reduction's value every shape below it is unknown and no fast path applies.
    let axis0 = axis_attr(0);
    let m = model(
        vec![
            node("Shape", "shape", &["x"], &["s"], vec![]),
            node("ReduceMax", "largest", &["s"], &["n"], vec![]),
            node("Concat", "cat", &["n", "minus1"], &["target"], vec![axis0]),
            node("Reshape", "reshape", &["x", "target"], &["y"], vec![]),
        ],
        vec![value_info("x", F32, &[Dim::N(2), Dim::N(3), Dim::N(4)])],
        vec![ValueInfoProto {
            name: Some("y".into()),
            ..Default::default()
        }],
        vec![i64_tensor("minus1", &[1], &[-1])],
    );
    let g = import(&m).unwrap();
    let y = g.graph.value(g.graph.outputs[0]).unwrap();
    assert_eq!(y.ty.to_string(), "f32[4,6]");
}

#[test]
fn model_local_functions_are_inlined() {
    use kiln::raw::onnx::proto::FunctionProto;
    // AddLeaky(a, b) = LeakyRelu(a + b, alpha = @slope), called twice with different slopes.
    let leaky = NodeProto {
        attribute: vec![AttributeProto {
            name: Some("alpha".into()),
            r#type: Some(AttributeType::Float as i32),
            ref_attr_name: Some("slope".into()),
            ..Default::default()
        }],
        ..node("LeakyRelu", "leaky", &["t"], &["c"], vec![])
    };
    let f = FunctionProto {
        name: Some("AddLeaky".into()),
        domain: Some("my.domain".into()),
        input: vec!["a".into(), "b".into()],
        output: vec!["c".into()],
        attribute: vec!["slope".into()],
        node: vec![node("Add", "add", &["a", "b"], &["t"], vec![]), leaky],
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        ..Default::default()
    };
    let slope = |v: f32| AttributeProto {
        name: Some("slope".into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v),
        ..Default::default()
    };
    let call = |name: &str, ins: &[&str], outs: &[&str], v: f32| NodeProto {
        domain: Some("my.domain".into()),
        ..node("AddLeaky", name, ins, outs, vec![slope(v)])
    };
    let mut m = model(
        vec![
            call("f1", &["x", "y"], &["z"], 0.5),
            call("f2", &["z", "y"], &["w"], 0.25),
        ],
        vec![value_info("x", F32, &[Dim::N(2)]), value_info("y", F32, &[Dim::N(2)])],
        vec![value_info("w", F32, &[Dim::N(2)])],
        vec![],
    );
    m.functions = vec![f];
    m.opset_import.push(OperatorSetIdProto {
        domain: Some("my.domain".into()),
        version: Some(1),
    });
    let s = Session::from_model(&import(&m).unwrap(), &SessionOptions::default()).unwrap();
    let x = Tensor::from_vec(vec![2], vec![-4.0f32, 1.0]).unwrap();
    let y = Tensor::from_vec(vec![2], vec![1.0f32, 1.0]).unwrap();
    let out = s
        .run(vec![("x".into(), Value::Tensor(x)), ("y".into(), Value::Tensor(y))])
        .unwrap();
    // z = leaky_0.5([-3, 2]) = [-1.5, 2]; w = leaky_0.25([-0.5, 3]) = [-0.125, 3]
    let Value::Tensor(w) = &out[0].1 else { panic!() };
    assert_eq!(w.as_slice::<f32>().unwrap(), &[-0.125, 3.0]);
}

#[test]
fn com_microsoft_features_kiln_cannot_honour_are_refused_by_name() {
    let ms = |op: &str, inputs: &[&str], attrs: Vec<AttributeProto>| {
        let mut n = node(op, "n0", inputs, &["y"], attrs);
        n.domain = Some("com.microsoft".into());
        let mut m = model(
            vec![n],
            vec![value_info("x", F32, &[Dim::N(1), Dim::N(2), Dim::N(8)])],
            vec![value_info("y", F32, &[Dim::N(1), Dim::N(2), Dim::N(8)])],
            vec![],
        );
        m.opset_import.push(OperatorSetIdProto {
            domain: Some("com.microsoft".into()),
            version: Some(1),
        });
        import(&m).map(|_| ()).map_err(|e| e.to_string())
    };
    let int = |name: &str, v: i64| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    };
    // The same model imports when nothing is refused.
    ms("MultiHeadAttention", &["x", "x", "x"], vec![int("num_heads", 2)]).unwrap();
    let e = ms("MultiHeadAttention", &["x"], vec![int("num_heads", 2)]).unwrap_err();
    assert!(e.contains("n0") && e.contains("packed QKV"), "{e}");
    let e = ms("MultiHeadAttention", &["x", "x", "x"], vec![int("num_heads", 0)]).unwrap_err();
    assert!(e.contains("num_heads") && e.contains("got 0"), "{e}");
    let e = ms("FusedMatMul", &["x", "x"], vec![int("transBatchA", 1)]).unwrap_err();
    assert!(e.contains("transBatchA"), "{e}");
    let e = ms("Attention", &["x", "x"], vec![int("num_heads", 2), int("do_rotary", 1)]).unwrap_err();
    assert!(e.contains("do_rotary"), "{e}");
    let e = ms(
        "RotaryEmbedding",
        &["x", "x", "x", "x"],
        vec![int("is_packed_batching", 1)],
    )
    .unwrap_err();
    assert!(e.contains("is_packed_batching"), "{e}");
}

/// Fuzz finding (load_program seeds): a Conv with an empty kernel compiled into a program whose
/// packed kernel_shape held a 0, which the file then refused to load. Whatever the compile
/// makes of it, its own program file loads.
#[test]
fn a_compiled_empty_kernel_conv_loads_back() {
    let m = model(
        vec![node("Conv", "c", &["x", "w"], &["y"], vec![])],
        vec![value_info("x", F32, &[Dim::N(1), Dim::N(0), Dim::N(4), Dim::N(4)])],
        vec![value_info("y", F32, &[Dim::N(1), Dim::N(2), Dim::N(4), Dim::N(4)])],
        vec![TensorProto {
            name: Some("w".into()),
            data_type: Some(F32),
            dims: vec![2, 0, 1, 1],
            ..Default::default()
        }],
    );
    let dir = tempfile::tempdir().unwrap();
    let (onnx, prog) = (dir.path().join("m.onnx"), dir.path().join("m.kiln"));
    std::fs::write(&onnx, m.encode_to_vec()).unwrap();
    if kiln::compile_file(&onnx, &prog, &SessionOptions::default()).is_ok() {
        Session::new(&prog, &SessionOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    }
}
