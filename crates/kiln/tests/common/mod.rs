//! ONNX models built in code for the kiln crate's integration tests: value infos, nodes,
//! attributes, tensors and the model around them. Each test binary uses a part of it.
#![allow(dead_code)]

use kiln::raw::onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto, attribute_proto::AttributeType, tensor_shape_proto::Dimension, tensor_shape_proto::dimension,
    type_proto,
};
use kiln::raw::onnx::{ImportOptions, load_model_bytes};
use kiln::{ImportError, Model};
use prost::Message;

pub const F32: i32 = 1;
pub const I64: i32 = 7;

/// A dimension of a declared shape: a number or a symbol.
pub enum Dim {
    N(i64),
    S(&'static str),
}

pub fn value_info(name: &str, elem: i32, shape: &[Dim]) -> ValueInfoProto {
    let dim = shape
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::N(n) => dimension::Value::DimValue(*n),
                Dim::S(s) => dimension::Value::DimParam(s.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An f32 value of fixed `shape`.
pub fn f32_info(name: &str, shape: &[i64]) -> ValueInfoProto {
    let dims: Vec<Dim> = shape.iter().map(|&n| Dim::N(n)).collect();
    value_info(name, F32, &dims)
}

pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

pub fn i64_tensor(name: &str, dims: &[i64], vals: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(I64),
        dims: dims.to_vec(),
        int64_data: vals.to_vec(),
        ..Default::default()
    }
}

/// An opset-17 model of one graph.
pub fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: inputs,
            output: outputs,
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn import(m: &ModelProto) -> Result<Model, ImportError> {
    load_model_bytes(m.encode_to_vec().into(), &ImportOptions::default())
}
