//! The closed set of element types, with their ONNX numbering and sizes.

use std::fmt;

/// Element type of a tensor. Numbered as ONNX's `TensorProto.DataType` so the importer can map
/// codes with [`DType::from_onnx`], but nothing else in kiln depends on that numbering.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    U8,
    I8,
    U16,
    I16,
    I32,
    I64,
    String,
    Bool,
    F16,
    F64,
    U32,
    U64,
    BF16,
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    U4,
    I4,
    F4E2M1,
    F8E8M0,
    U2,
    I2,
}

impl DType {
    pub const ALL: [DType; 24] = [
        DType::F32,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::String,
        DType::Bool,
        DType::F16,
        DType::F64,
        DType::U32,
        DType::U64,
        DType::BF16,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::U4,
        DType::I4,
        DType::F4E2M1,
        DType::F8E8M0,
        DType::U2,
        DType::I2,
    ];

    /// Maps an ONNX `TensorProto.DataType` code; `None` for UNDEFINED, complex types and codes
    /// kiln does not know.
    pub fn from_onnx(code: i32) -> Option<DType> {
        Some(match code {
            1 => DType::F32,
            2 => DType::U8,
            3 => DType::I8,
            4 => DType::U16,
            5 => DType::I16,
            6 => DType::I32,
            7 => DType::I64,
            8 => DType::String,
            9 => DType::Bool,
            10 => DType::F16,
            11 => DType::F64,
            12 => DType::U32,
            13 => DType::U64,
            16 => DType::BF16,
            17 => DType::F8E4M3FN,
            18 => DType::F8E4M3FNUZ,
            19 => DType::F8E5M2,
            20 => DType::F8E5M2FNUZ,
            21 => DType::U4,
            22 => DType::I4,
            23 => DType::F4E2M1,
            24 => DType::F8E8M0,
            25 => DType::U2,
            26 => DType::I2,
            _ => return None,
        })
    }

    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::String => 8,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::F8E4M3FN => 17,
            DType::F8E4M3FNUZ => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2FNUZ => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1 => 23,
            DType::F8E8M0 => 24,
            DType::U2 => 25,
            DType::I2 => 26,
        }
    }

    /// Short lower-case name as used in the text dump and CLI (`f32`, `i64`, `f8e4m3fn`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::String => "string",
            DType::Bool => "bool",
            DType::F16 => "f16",
            DType::F64 => "f64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::BF16 => "bf16",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::U4 => "u4",
            DType::I4 => "i4",
            DType::F4E2M1 => "f4e2m1",
            DType::F8E8M0 => "f8e8m0",
            DType::U2 => "u2",
            DType::I2 => "i2",
        }
    }

    /// Bytes one element takes in kiln's in-memory layout (sub-byte types are kept one per
    /// byte, unpacked; strings count their handle).
    pub fn size_of(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::String => std::mem::size_of::<String>(),
            _ => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32
                | DType::F64
                | DType::F16
                | DType::BF16
                | DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F4E2M1
                | DType::F8E8M0
        )
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::U8
                | DType::I8
                | DType::U16
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U32
                | DType::U64
                | DType::U4
                | DType::I4
                | DType::U2
                | DType::I2
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::I4 | DType::I2
        )
    }

    /// Types stored one byte per element whose value needs a format conversion (float8, fp4,
    /// packed integers).
    pub fn is_byte_coded(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::U4
                | DType::I4
                | DType::F4E2M1
                | DType::F8E8M0
                | DType::U2
                | DType::I2
        )
    }

    /// Bits per element in ONNX's packed serialisation (4 for int4/uint4/fp4, 2 for int2/uint2).
    pub fn packed_bits(self) -> usize {
        match self {
            DType::U4 | DType::I4 | DType::F4E2M1 => 4,
            DType::U2 | DType::I2 => 2,
            DType::Bool => 8,
            DType::String => 0,
            other => other.size_of() * 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
