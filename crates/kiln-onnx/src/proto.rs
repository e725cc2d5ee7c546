//! The ONNX protobuf messages (generated at build time from proto/onnx/*.proto).
#![allow(clippy::all, missing_docs, rust_2018_idioms)]

include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
