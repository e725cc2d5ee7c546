//! The view an op importer gets of one ONNX node: its type, opset, arity and typed attribute
//! accessors. Importers turn this into a typed op struct; nothing past the importer sees an
//! attribute name.

use crate::error::ImportError;
use crate::proto::{AttributeProto, attribute_proto::AttributeType};
use crate::tensor::TensorLoader;
use kiln_tensor::{DType, Tensor};

/// One node as importers see it.
pub struct NodeCtx<'a> {
    pub op_type: &'a str,
    /// The node's domain, with the default domain spelled `""`.
    pub domain: &'a str,
    /// The opset version in force for the node's domain.
    pub opset: i64,
    pub name: &'a str,
    /// Inputs including absent optional ones (empty names); `inputs_present[i]` tells which.
    pub inputs_present: Vec<bool>,
    pub num_outputs: usize,
    pub(crate) attrs: &'a [AttributeProto],
    pub(crate) loader: &'a TensorLoader<'a>,
}

pub type Result<T> = std::result::Result<T, ImportError>;

impl<'a> NodeCtx<'a> {
    pub fn num_inputs(&self) -> usize {
        self.inputs_present.len()
    }
    pub fn has_input(&self, i: usize) -> bool {
        self.inputs_present.get(i).copied().unwrap_or(false)
    }

    fn find(&self, name: &str) -> Option<&'a AttributeProto> {
        self.attrs.iter().find(|a| a.name.as_deref() == Some(name))
    }

    fn kind(a: &AttributeProto) -> Option<AttributeType> {
        a.r#type.and_then(|t| AttributeType::try_from(t).ok())
    }

    /// An error about attribute `attr` of this node.
    pub fn attr_err(&self, attr: &str, reason: impl Into<String>) -> ImportError {
        ImportError::Attribute {
            node: self.name.to_string(),
            op: self.op_type.to_string(),
            attr: attr.to_string(),
            reason: reason.into(),
        }
    }

    /// An error about this node as a whole.
    /// An op's own error at import (`Op::validate`, a pattern that does not compile): an
    /// attribute's is reported as that attribute's.
    pub fn op_err(&self, e: kiln_ops::OpError) -> ImportError {
        match e {
            kiln_ops::OpError::Attribute { attr, expected, got } => {
                self.attr_err(attr, format!("expected {expected}, got {got}"))
            }
            other => self.node_err(other.to_string()),
        }
    }

    pub fn node_err(&self, reason: impl Into<String>) -> ImportError {
        ImportError::Node {
            node: self.name.to_string(),
            op: self.op_type.to_string(),
            reason: reason.into(),
        }
    }

    fn expect_kind(&self, a: &AttributeProto, name: &str, want: AttributeType) -> Result<()> {
        match Self::kind(a) {
            Some(k) if k == want => Ok(()),
            // Some exporters leave the type unset; accept when the matching field is filled.
            None | Some(AttributeType::Undefined) => Ok(()),
            Some(k) => Err(self.attr_err(
                name,
                format!("expected {}, got {}", want.as_str_name(), k.as_str_name()),
            )),
        }
    }

    pub fn has_attr(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    pub fn attr_i64(&self, name: &str) -> Result<Option<i64>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::Int)?;
        Ok(Some(a.i.unwrap_or(0)))
    }
    pub fn attr_i64_or(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.attr_i64(name)?.unwrap_or(default))
    }
    /// An int attribute used as a flag (0 or 1).
    pub fn attr_bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.attr_i64(name)? {
            None => Ok(default),
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(v) => Err(self.attr_err(name, format!("must be 0 or 1, got {v}"))),
        }
    }
    pub fn attr_f32(&self, name: &str) -> Result<Option<f32>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::Float)?;
        Ok(Some(a.f.unwrap_or(0.0)))
    }
    pub fn attr_f32_or(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.attr_f32(name)?.unwrap_or(default))
    }
    pub fn attr_i64s(&self, name: &str) -> Result<Option<Vec<i64>>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::Ints)?;
        Ok(Some(a.ints.clone()))
    }
    pub fn attr_f32s(&self, name: &str) -> Result<Option<Vec<f32>>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::Floats)?;
        Ok(Some(a.floats.clone()))
    }
    pub fn attr_string(&self, name: &str) -> Result<Option<String>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::String)?;
        let bytes = a.s.as_deref().unwrap_or(&[]);
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| self.attr_err(name, "is not valid UTF-8"))
    }
    pub fn attr_string_or(&self, name: &str, default: &str) -> Result<String> {
        Ok(self.attr_string(name)?.unwrap_or_else(|| default.to_string()))
    }
    pub fn attr_strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::Strings)?;
        a.strings
            .iter()
            .map(|s| String::from_utf8(s.to_vec()).map_err(|_| self.attr_err(name, "holds invalid UTF-8")))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
    pub fn attr_tensor(&self, name: &str) -> Result<Option<Tensor>> {
        let Some(a) = self.find(name) else { return Ok(None) };
        self.expect_kind(a, name, AttributeType::Tensor)?;
        let t = a.t.as_ref().ok_or_else(|| self.attr_err(name, "holds no tensor"))?;
        self.loader.load(t).map(Some)
    }
    /// An int attribute holding an ONNX data type code.
    pub fn attr_dtype(&self, name: &str) -> Result<Option<DType>> {
        match self.attr_i64(name)? {
            None => Ok(None),
            Some(code) => i32::try_from(code)
                .ok()
                .and_then(DType::from_onnx)
                .map(Some)
                .ok_or_else(|| self.attr_err(name, format!("unknown or unsupported data type code {code}"))),
        }
    }
    /// Unwraps a required attribute.
    pub fn required<T>(&self, name: &str, v: Option<T>) -> Result<T> {
        v.ok_or_else(|| self.attr_err(name, "is required but missing"))
    }
    /// Checks the number of inputs against `[min, max]`.
    pub fn check_inputs(&self, min: usize, max: usize) -> Result<()> {
        let n = self.num_inputs();
        if n < min || n > max {
            return Err(self.node_err(format!("expects {min}..={max} inputs, got {n}")));
        }
        for i in 0..min {
            if !self.has_input(i) {
                return Err(self.node_err(format!("input {i} is required but empty")));
            }
        }
        Ok(())
    }
}
