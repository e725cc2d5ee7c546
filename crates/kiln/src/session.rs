//! Session: a loaded, compiled model ready to run; immutable and shareable across threads.

use kiln_compiler::CompileOptions;
use kiln_onnx::{ImportOptions, Model};
use kiln_ops::{Value, ValueType};
use kiln_runtime::Program;
use std::path::Path;

/// Everything that can go wrong creating or running a session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Import(#[from] kiln_onnx::ImportError),
    #[error(transparent)]
    Compile(#[from] kiln_compiler::CompileError),
    #[error(transparent)]
    Run(#[from] kiln_runtime::RuntimeError),
    #[error("{path}: {reason}")]
    Unsupported { path: String, reason: String },
}

/// Options for creating a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Bindings of symbolic input dims (`--define-symbol NAME=VALUE`, qaic's
    /// `onnx_define_symbol`).
    pub symbols: Vec<(String, usize)>,
    /// How an `.onnx` model is compiled (ignored for a `.kiln` program, which is compiled).
    pub compile: CompileOptions,
}

/// Name and static type of one model input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct IoInfo {
    pub name: String,
    pub ty: ValueType,
}

/// A compiled model. `Session` is `Send + Sync`; `run` takes `&self`.
#[derive(Debug)]
pub struct Session {
    program: Program,
}

/// Imports an ONNX model (with symbol bindings applied) without compiling it.
pub fn load_onnx(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Model, Error> {
    Ok(kiln_onnx::load_model(
        path.as_ref(),
        &ImportOptions {
            symbols: options.symbols.clone(),
        },
    )?)
}

/// Compiles an `.onnx` model into a `.kiln` program file.
pub fn compile_file(model: &Path, out: &Path, options: &SessionOptions) -> Result<(), Error> {
    let _ = (model, options);
    Err(Error::Unsupported {
        path: out.display().to_string(),
        reason: "writing .kiln programs is not implemented yet".into(),
    })
}

impl Session {
    /// Opens an `.onnx` model (imported and compiled in memory).
    pub fn new(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Session, Error> {
        let path = path.as_ref();
        if path.extension().is_some_and(|e| e == "kiln") {
            return Err(Error::Unsupported {
                path: path.display().to_string(),
                reason: "compiled .kiln programs are not supported by this build yet; open the .onnx model".into(),
            });
        }
        let model = load_onnx(path, options)?;
        Session::from_model(&model, options)
    }

    /// Compiles an already imported model.
    pub fn from_model(model: &Model, options: &SessionOptions) -> Result<Session, Error> {
        let compiled = kiln_compiler::compile(model.graph.clone(), &options.compile)?;
        Ok(Session {
            program: compiled.program,
        })
    }

    pub fn inputs(&self) -> Vec<IoInfo> {
        self.program
            .inputs
            .iter()
            .map(|s| IoInfo {
                name: s.name.clone(),
                ty: s.ty.clone(),
            })
            .collect()
    }

    pub fn outputs(&self) -> Vec<IoInfo> {
        self.program
            .outputs
            .iter()
            .map(|s| IoInfo {
                name: s.name.clone(),
                ty: s.ty.clone(),
            })
            .collect()
    }

    /// Runs the model on named inputs; returns `(name, value)` for every output, in order.
    pub fn run(&self, inputs: Vec<(String, Value)>) -> Result<Vec<(String, Value)>, Error> {
        Ok(kiln_runtime::run(&self.program, inputs)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Session>();
    }
}
