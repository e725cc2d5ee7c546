//! `Lookup8`: `y = table[x]` for an 8-bit X, one table entry per byte value: a quantized
//! elementwise function (`DequantizeLinear -> f -> QuantizeLinear`, f any run of unary ops and
//! arithmetic on the value and constants, e.g. SiLU, HardSwish, GELU, Sigmoid) tabulated by
//! the compiler (`qdq_lut` pass), which computed each entry with the ops it replaces: the same
//! values, a byte per element read instead of a float pipeline. The entries are 8-bit (the
//! function ended on a `QuantizeLinear`) or f32.

use crate::error::{OpError, Result};
use crate::value::{Args, InferInput, TensorType, ValueType};
use kiln_kernels::igemm::Int8;
use kiln_tensor::{DType, Tensor};

/// The op: X's 8-bit type and the table (see the module docs).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Lookup8 {
    /// X's type: U8, or I8 (looked up by its two's-complement byte).
    pub input: DType,
    pub table: LookupTable,
}

/// The 256 entries, indexed by X's byte, in the output's type.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum LookupTable {
    U8(Vec<u8>),
    I8(Vec<i8>),
    F32(Vec<f32>),
}

/// Elements from which the lookup is spread over the pool.
const PAR_MIN: usize = 1 << 16;

impl LookupTable {
    fn dtype(&self) -> DType {
        match self {
            LookupTable::U8(_) => DType::U8,
            LookupTable::I8(_) => DType::I8,
            LookupTable::F32(_) => DType::F32,
        }
    }
}

/// A table of exactly 256 entries, or the error naming what it held.
fn entries<T: Copy>(v: &[T]) -> Result<&[T; 256]> {
    v.try_into()
        .map_err(|_| OpError::attribute("table", "256 entries", format!("{}", v.len())))
}

/// `y[i] = table[x[i]]` in pieces over the pool for large tensors.
fn look<T: Copy + Send + Sync>(x: &[u8], y: &mut [T], each: &(dyn Fn(&[u8], &mut [T]) + Sync)) {
    if x.len() < PAR_MIN {
        each(x, y);
        return;
    }
    let piece = PAR_MIN / 4;
    kiln_kernels::pool::for_each_chunk_mut(y, piece, &|i, out| {
        let start = i * piece;
        if let Some(xs) = x.get(start..start + out.len()) {
            each(xs, out);
        }
    });
}

impl Lookup8 {
    pub fn name(&self) -> &'static str {
        "Lookup8"
    }

    fn check(&self) -> Result<()> {
        if !matches!(self.input, DType::U8 | DType::I8) {
            return Err(OpError::attribute("input", "U8 or I8", format!("{:?}", self.input)));
        }
        match &self.table {
            LookupTable::U8(t) => entries(t).map(|_| ()),
            LookupTable::I8(t) => entries(t).map(|_| ()),
            LookupTable::F32(t) => entries(t).map(|_| ()),
        }
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        self.check()?;
        let x = inputs.first().ok_or(OpError::MissingInput { index: 0 })?;
        if let Some(d) = x.ty.tensor().and_then(|t| t.dtype)
            && d != self.input
        {
            return Err(OpError::UnsupportedDType { index: 0, got: d });
        }
        let shape = x.ty.tensor().and_then(|t| t.shape.clone());
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: Some(self.table.dtype()),
            shape,
        })])
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        self.check()?;
        let x = args.tensor(0)?;
        if x.dtype() != self.input {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: x.dtype(),
            });
        }
        let bytes: &[u8] = match x.dtype() {
            DType::U8 => x.as_slice::<u8>()?,
            _ => Int8::bytes(x.as_slice::<i8>()?),
        };
        let shape = x.shape().to_vec();
        let n = bytes.len();
        let isa = kiln_kernels::isa::active();
        let y = match &self.table {
            LookupTable::U8(t) => {
                let t = entries(t)?;
                let mut y = crate::util::out_buf::<u8>(n);
                look(bytes, &mut y, &|x, y| kiln_kernels::lut::lookup_bytes(isa, x, t, y));
                Tensor::from_buf(shape, y)?
            }
            LookupTable::I8(t) => {
                // The i8 entries as their bytes, looked up as a byte table.
                let t = entries(Int8::bytes(entries(t)?))?;
                let mut y = crate::util::out_buf::<i8>(n);
                look(bytes, &mut y, &|x, y| {
                    kiln_kernels::lut::lookup_bytes(isa, x, t, Int8::bytes_mut(y))
                });
                Tensor::from_buf(shape, y)?
            }
            LookupTable::F32(t) => {
                let t = entries(t)?;
                let mut y = crate::util::out_f32(n);
                look(bytes, &mut y, &|x, y| kiln_kernels::lut::lookup(x, t, y));
                Tensor::from_buf(shape, y)?
            }
        };
        Ok(smallvec::smallvec![crate::value::Value::Tensor(y)])
    }
}
