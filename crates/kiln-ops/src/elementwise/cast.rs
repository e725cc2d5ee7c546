//! Cast and CastLike: elementwise type conversion.
//!
//! ONNX operators Cast (opsets 1-25), CastLike (15-25) and BitCast (26),
//! <https://onnx.ai/onnx/operators/>. Cast/CastLike:
//! numpy `astype` semantics (integers wrap to the target width, floats truncate toward zero
//! into integers, anything nonzero is `true`), float8 targets saturating unless
//! `saturate = 0`, e8m0 rounding per `round_mode`, 4/2-bit integer targets keeping the low
//! bits, strings parsed and printed as numbers.

use crate::error::{OpError, Result};
use kiln_tensor::formats::{RoundMode, encode_float_mode, wrap_int};
use kiln_tensor::{DType, Data, Tensor, bf16, f16};

/// Cast to `to` (for CastLike the importer leaves the target to input 1's dtype).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub struct Cast {
    pub to: DType,
    /// Float8 targets: clamp out-of-range values to the largest finite value (default true).
    pub saturate: bool,
    /// e8m0 targets: rounding (default up).
    pub round: RoundMode,
}

/// CastLike: the target dtype is that of input 1.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub struct CastLike {
    pub saturate: bool,
    pub round: RoundMode,
}

/// Source values in a form every target converts from.
enum Vals {
    Float(Vec<f64>),
    Int(Vec<i128>),
    Bool(Vec<bool>),
    Str(Vec<String>),
}

fn source(x: &Tensor) -> Vals {
    match x.data() {
        Data::I8(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::I16(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::I32(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::I64(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::U8(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::U16(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::U32(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::U64(v) => Vals::Int(v.iter().map(|&a| a as i128).collect()),
        Data::Bool(v) => Vals::Bool(v.to_vec()),
        Data::Str(v) => Vals::Str(v.to_vec()),
        Data::Coded(_) if x.dtype().is_int() => Vals::Int(x.to_f64_vec().into_iter().map(|a| a as i128).collect()),
        _ => Vals::Float(x.to_f64_vec()),
    }
}

/// numpy-like text of a float (`nan`, `inf`, `1e-07`, `0.5`).
fn float_text(v: f64, single: bool) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = if single {
        format!("{:?}", v as f32)
    } else {
        format!("{v:?}")
    };
    // Rust writes `1e-7`; numpy `1e-07`.
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ("-", d),
                None => ("+", e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

fn parse_float(s: &str) -> f64 {
    let t = s.trim();
    t.parse::<f64>()
        .unwrap_or_else(|_| match t.to_ascii_lowercase().trim_start_matches('+') {
            "inf" | "infinity" => f64::INFINITY,
            "-inf" | "-infinity" => f64::NEG_INFINITY,
            _ => f64::NAN,
        })
}

impl Vals {
    /// Values as f64 (for float targets).
    fn floats(&self) -> Vec<f64> {
        match self {
            Vals::Float(v) => v.clone(),
            Vals::Int(v) => v.iter().map(|&a| a as f64).collect(),
            Vals::Bool(v) => v.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect(),
            Vals::Str(v) => v.iter().map(|s| parse_float(s)).collect(),
        }
    }

    /// Values as integers (for integer targets, which keep the low bits).
    fn ints(&self) -> Vec<i128> {
        let from_float = |a: f64| if a.is_nan() { 0 } else { a.trunc() as i128 };
        match self {
            Vals::Float(v) => v.iter().map(|&a| from_float(a)).collect(),
            Vals::Int(v) => v.clone(),
            Vals::Bool(v) => v.iter().map(|&b| b as i128).collect(),
            Vals::Str(v) => v
                .iter()
                .map(|s| s.trim().parse::<i128>().unwrap_or_else(|_| from_float(parse_float(s))))
                .collect(),
        }
    }

    fn bools(&self) -> Vec<bool> {
        match self {
            Vals::Float(v) => v.iter().map(|&a| a != 0.0).collect(),
            Vals::Int(v) => v.iter().map(|&a| a != 0).collect(),
            Vals::Bool(v) => v.clone(),
            Vals::Str(v) => v.iter().map(|s| !s.is_empty()).collect(),
        }
    }

    fn strings(&self, single: bool) -> Vec<String> {
        match self {
            Vals::Float(v) => v.iter().map(|&a| float_text(a, single)).collect(),
            Vals::Int(v) => v.iter().map(|a| a.to_string()).collect(),
            Vals::Bool(v) => v
                .iter()
                .map(|&b| if b { "True" } else { "False" }.to_string())
                .collect(),
            Vals::Str(v) => v.clone(),
        }
    }
}

impl Cast {
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let to = self.to;
        if x.dtype() == to {
            return Ok(x.clone());
        }
        // The mask casts of transformer exporters, into recycled buffers (every element
        // written): int64 -> bool (nonzero), int64 -> f32 (through f64, as the general path
        // rounds), bool -> f32.
        match (x.data(), to) {
            (Data::I64(v), DType::Bool) => {
                let mut out = kiln_kernels::recycle::take_of::<bool>(v.len());
                out.iter_mut().zip(v.iter()).for_each(|(o, &a)| *o = a != 0);
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            (Data::I64(v), DType::F32) => {
                let mut out = kiln_kernels::recycle::take(v.len());
                out.iter_mut().zip(v.iter()).for_each(|(o, &a)| *o = a as f64 as f32);
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            // float16 <-> f32, on F16C where the CPU has it (both exact or rounded to nearest
            // even once, as the general path).
            (Data::F16(v), DType::F32) => {
                use half::slice::HalfFloatSliceExt;
                let mut out = kiln_kernels::recycle::take(v.len());
                v.convert_to_f32_slice(&mut out);
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            (Data::F32(v), DType::F16) => {
                use half::slice::HalfFloatSliceExt;
                let mut out = vec![f16::ZERO; v.len()];
                out.convert_from_f32_slice(v);
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            // MatMulInteger's int32 products and 8-bit values to f32 (one rounding, as the
            // general path's through-f64 conversion).
            (Data::I32(v), DType::F32) => {
                let mut out = kiln_kernels::recycle::take(v.len());
                out.iter_mut().zip(v.iter()).for_each(|(o, &a)| *o = a as f32);
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            (Data::U8(v), DType::F32) => {
                let mut out = kiln_kernels::recycle::take(v.len());
                out.iter_mut().zip(v.iter()).for_each(|(o, &a)| *o = f32::from(a));
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            (Data::I8(v), DType::F32) => {
                let mut out = kiln_kernels::recycle::take(v.len());
                out.iter_mut().zip(v.iter()).for_each(|(o, &a)| *o = f32::from(a));
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            (Data::Bool(v), DType::F32) => {
                let mut out = kiln_kernels::recycle::take(v.len());
                out.iter_mut()
                    .zip(v.iter())
                    .for_each(|(o, &a)| *o = if a { 1.0 } else { 0.0 });
                return Ok(Tensor::from_vec(x.shape(), out)?);
            }
            _ => {}
        }
        let src = source(x);
        let ints = || src.ints();
        let data = match to {
            DType::F32 => Data::F32(src.floats().into_iter().map(|a| a as f32).collect()),
            DType::F64 => Data::F64(src.floats().into()),
            DType::F16 => Data::F16(src.floats().into_iter().map(f16::from_f64).collect()),
            DType::BF16 => Data::BF16(src.floats().into_iter().map(|a| bf16::from_f32(a as f32)).collect()),
            DType::I8 => Data::I8(ints().into_iter().map(|a| a as i8).collect()),
            DType::I16 => Data::I16(ints().into_iter().map(|a| a as i16).collect()),
            DType::I32 => Data::I32(ints().into_iter().map(|a| a as i32).collect()),
            DType::I64 => Data::I64(ints().into_iter().map(|a| a as i64).collect()),
            DType::U8 => Data::U8(ints().into_iter().map(|a| a as u8).collect()),
            DType::U16 => Data::U16(ints().into_iter().map(|a| a as u16).collect()),
            DType::U32 => Data::U32(ints().into_iter().map(|a| a as u32).collect()),
            DType::U64 => Data::U64(ints().into_iter().map(|a| a as u64).collect()),
            DType::Bool => Data::Bool(src.bools().into()),
            DType::String => Data::Str(
                src.strings(matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16))
                    .into(),
            ),
            DType::U4 | DType::I4 | DType::U2 | DType::I2 => {
                Data::Coded(ints().into_iter().map(|a| wrap_int(to, a as i64)).collect())
            }
            _ if to.is_byte_coded() => Data::Coded(
                src.floats()
                    .into_iter()
                    .map(|a| encode_float_mode(to, a as f32, self.saturate, self.round))
                    .collect(),
            ),
            _ => return Err(OpError::Unsupported(format!("Cast to {to}"))),
        };
        Ok(Tensor::new(to, x.shape(), data)?)
    }
}

impl CastLike {
    pub fn apply(&self, x: &Tensor, like: &Tensor) -> Result<Tensor> {
        Cast {
            to: like.dtype(),
            saturate: self.saturate,
            round: self.round,
        }
        .apply(x)
    }
}

/// BitCast: reinterprets each element's bits as `to`, which must have the same width.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub struct BitCast {
    pub to: DType,
}

/// The raw bits of every element (little-endian value, zero-extended), `None` for strings.
fn raw_bits(x: &Tensor) -> Option<Vec<u64>> {
    Some(match x.data() {
        Data::F32(v) => v.iter().map(|a| u64::from(a.to_bits())).collect(),
        Data::F64(v) => v.iter().map(|a| a.to_bits()).collect(),
        Data::F16(v) => v.iter().map(|a| u64::from(a.to_bits())).collect(),
        Data::BF16(v) => v.iter().map(|a| u64::from(a.to_bits())).collect(),
        Data::I8(v) => v.iter().map(|&a| u64::from(a as u8)).collect(),
        Data::I16(v) => v.iter().map(|&a| u64::from(a as u16)).collect(),
        Data::I32(v) => v.iter().map(|&a| u64::from(a as u32)).collect(),
        Data::I64(v) => v.iter().map(|&a| a as u64).collect(),
        Data::U8(v) => v.iter().map(|&a| u64::from(a)).collect(),
        Data::U16(v) => v.iter().map(|&a| u64::from(a)).collect(),
        Data::U32(v) => v.iter().map(|&a| u64::from(a)).collect(),
        Data::U64(v) => v.to_vec(),
        Data::Bool(v) => v.iter().map(|&b| u64::from(b)).collect(),
        Data::Coded(v) => v.iter().map(|&c| u64::from(c)).collect(),
        Data::Str(_) => return None,
    })
}

impl BitCast {
    pub fn out_dtype(&self, from: DType) -> Result<DType> {
        if from == DType::String {
            return Err(OpError::UnsupportedDType { index: 0, got: from });
        }
        if self.to == DType::String || from.size_of() != self.to.size_of() {
            return Err(OpError::attribute(
                "to",
                format!("a type of {from}'s width ({} bytes)", from.size_of()),
                self.to,
            ));
        }
        Ok(self.to)
    }

    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let to = self.out_dtype(x.dtype())?;
        let bits = raw_bits(x).ok_or(OpError::UnsupportedDType {
            index: 0,
            got: x.dtype(),
        })?;
        let data = match to {
            DType::F32 => Data::F32(bits.iter().map(|&b| f32::from_bits(b as u32)).collect()),
            DType::F64 => Data::F64(bits.iter().map(|&b| f64::from_bits(b)).collect()),
            DType::F16 => Data::F16(bits.iter().map(|&b| f16::from_bits(b as u16)).collect()),
            DType::BF16 => Data::BF16(bits.iter().map(|&b| bf16::from_bits(b as u16)).collect()),
            DType::I8 => Data::I8(bits.iter().map(|&b| b as u8 as i8).collect()),
            DType::I16 => Data::I16(bits.iter().map(|&b| b as u16 as i16).collect()),
            DType::I32 => Data::I32(bits.iter().map(|&b| b as u32 as i32).collect()),
            DType::I64 => Data::I64(bits.iter().map(|&b| b as i64).collect()),
            DType::U8 => Data::U8(bits.iter().map(|&b| b as u8).collect()),
            DType::U16 => Data::U16(bits.iter().map(|&b| b as u16).collect()),
            DType::U32 => Data::U32(bits.iter().map(|&b| b as u32).collect()),
            DType::U64 => Data::U64(bits.into()),
            DType::Bool => Data::Bool(bits.iter().map(|&b| b != 0).collect()),
            _ => {
                let mask = ((1u16 << to.packed_bits().min(8)) - 1) as u64;
                Data::Coded(bits.iter().map(|&b| (b & mask) as u8).collect())
            }
        };
        Ok(Tensor::new(to, x.shape(), data)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cast(x: Tensor, to: DType) -> Tensor {
        Cast {
            to,
            saturate: true,
            round: RoundMode::Up,
        }
        .apply(&x)
        .unwrap()
    }

    #[test]
    fn mask_casts_agree_with_the_general_path() {
        // int64 -> bool and -> f32 (2^53 + 1 and a large value round through f64 as the
        // general path does), bool -> f32, each against the same conversion reached from an
        // equivalent source the fast paths do not take (int32, f64).
        let v = vec![0i64, 3, -2, (1 << 53) + 1, i64::MAX, 0];
        let x = Tensor::from_vec(vec![2, 3], v.clone()).unwrap();
        let b = cast(x.clone(), DType::Bool);
        assert_eq!(b.shape(), [2, 3]);
        assert_eq!(b.as_slice::<bool>().unwrap(), &[false, true, true, true, true, false]);
        let via_f64 = cast(cast(x.clone(), DType::F64), DType::F32);
        assert_eq!(
            cast(x, DType::F32).as_slice::<f32>().unwrap(),
            via_f64.as_slice::<f32>().unwrap()
        );
        let m = Tensor::from_vec(vec![3], vec![true, false, true]).unwrap();
        assert_eq!(cast(m, DType::F32).as_slice::<f32>().unwrap(), &[1.0, 0.0, 1.0]);
    }

    #[test]
    fn cast_follows_astype() {
        let x = Tensor::from_vec(vec![4], vec![-1.7f32, 2.9, 300.0, f32::NAN]).unwrap();
        assert_eq!(cast(x.clone(), DType::I32).as_slice::<i32>().unwrap(), &[-1, 2, 300, 0]);
        assert_eq!(
            cast(x.clone(), DType::Bool).as_slice::<bool>().unwrap(),
            &[true, true, true, true]
        );
        let s = cast(x, DType::String);
        assert_eq!(s.as_slice::<String>().unwrap(), &["-1.7", "2.9", "300.0", "nan"]);
        let y = Tensor::from_vec(vec![3], vec![-1i64, 256, 65]).unwrap();
        assert_eq!(cast(y.clone(), DType::U8).as_slice::<u8>().unwrap(), &[255, 0, 65]);
        assert_eq!(cast(y, DType::F32).as_slice::<f32>().unwrap(), &[-1.0, 256.0, 65.0]);
        let z = Tensor::from_vec(vec![2], vec![" 1.5".to_string(), "-INF".into()]).unwrap();
        assert_eq!(
            cast(z, DType::F64).as_slice::<f64>().unwrap(),
            &[1.5, f64::NEG_INFINITY]
        );
    }

    #[test]
    fn bitcast_reinterprets_bits() {
        let x = Tensor::from_vec(vec![2], vec![1.0f32, -2.0]).unwrap();
        let y = BitCast { to: DType::I32 }.apply(&x).unwrap();
        assert_eq!(y.as_slice::<i32>().unwrap(), &[0x3F80_0000, 0xC000_0000u32 as i32]);
        let z = BitCast { to: DType::I16 }
            .apply(&Tensor::from_vec(vec![2], vec![1u16, 32768]).unwrap())
            .unwrap();
        assert_eq!(z.as_slice::<i16>().unwrap(), &[1, -32768]);
        assert!(BitCast { to: DType::I64 }.apply(&x).is_err());
    }

    #[test]
    fn cast_to_coded_types() {
        // int4 keeps the low bits: -9 -> 7, 8 -> -8 (codes 0x7 and 0x8).
        let x = Tensor::from_vec(vec![3], vec![-9f32, 8.0, 1.0]).unwrap();
        assert_eq!(cast(x.clone(), DType::I4).codes().unwrap(), &[0x7, 0x8, 0x1]);
        // e4m3fn: 1.0 is 0x38; 1e6 saturates to 448 (0x7E), or is NaN (0x7F) without saturate.
        let y = Tensor::from_vec(vec![2], vec![1.0f32, 1e6]).unwrap();
        assert_eq!(cast(y.clone(), DType::F8E4M3FN).codes().unwrap(), &[0x38, 0x7E]);
        let ns = Cast {
            to: DType::F8E4M3FN,
            saturate: false,
            round: RoundMode::Up,
        }
        .apply(&y)
        .unwrap();
        assert_eq!(ns.codes().unwrap(), &[0x38, 0x7F]);
        let back = cast(cast(y, DType::F8E4M3FN), DType::F32);
        assert_eq!(back.as_slice::<f32>().unwrap(), &[1.0, 448.0]);
    }
}
