//! Generates the ONNX protobuf types from the vendored .proto files with protox (pure Rust, no
//! protoc binary). `bytes` fields keep tensor data as slices of the memory-mapped file.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["onnx/onnx-ml.proto", "onnx/onnx-data.proto"], ["proto"])?;
    let mut config = prost_build::Config::new();
    config.bytes(["."]);
    config.compile_fds(fds)?;
    Ok(())
}
