//! Conversions between f32 and the byte-coded element formats: the four float8 variants,
//! float4 e2m1, e8m0, and the sub-byte integers (int4/uint4/int2/uint2), plus ONNX's packing
//! of 4- and 2-bit elements.
//!
//! Float encodings round to nearest, ties to even (as ml_dtypes, ONNX's reference, does);
//! `saturate` clamps out-of-range values (and infinities) to the largest finite value.

use crate::dtype::DType;

/// Parameters of a small float format with a sign bit.
struct FloatFormat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// The all-ones exponent encodes inf (mantissa 0) and NaN (IEEE-like, e5m2).
    ieee_special: bool,
    /// Only the top mantissa code of the all-ones exponent is NaN (e4m3fn).
    fn_nan: bool,
    /// "fnuz": 0x80 is the only NaN, no negative zero, no inf.
    uz: bool,
}

fn format_of(dtype: DType) -> Option<FloatFormat> {
    let f = |exp_bits, man_bits, bias, ieee_special, fn_nan, uz| FloatFormat {
        exp_bits,
        man_bits,
        bias,
        ieee_special,
        fn_nan,
        uz,
    };
    Some(match dtype {
        DType::F8E4M3FN => f(4, 3, 7, false, true, false),
        DType::F8E4M3FNUZ => f(4, 3, 8, false, false, true),
        DType::F8E5M2 => f(5, 2, 15, true, false, false),
        DType::F8E5M2FNUZ => f(5, 2, 16, false, false, true),
        DType::F4E2M1 => f(2, 1, 1, false, false, false),
        _ => return None,
    })
}

impl FloatFormat {
    fn sign_bit(&self) -> u8 {
        1 << (self.exp_bits + self.man_bits)
    }
    /// Largest code (without sign) that is a finite value.
    fn max_finite_code(&self) -> u8 {
        let all = (1u16 << (self.exp_bits + self.man_bits)) - 1;
        if self.ieee_special {
            (all - (1 << self.man_bits)) as u8
        } else if self.fn_nan {
            (all - 1) as u8
        } else {
            all as u8
        }
    }
    /// Magnitude of an unsigned code (no NaN/inf handling).
    fn magnitude(&self, code: u8) -> f32 {
        let e = (code >> self.man_bits) as i32;
        let m = (code & ((1 << self.man_bits) - 1)) as f32;
        let scale = (1u32 << self.man_bits) as f32;
        if e == 0 {
            m / scale * 2f32.powi(1 - self.bias)
        } else {
            (1.0 + m / scale) * 2f32.powi(e - self.bias)
        }
    }
    fn decode(&self, code: u8) -> f32 {
        let sign = self.sign_bit();
        if self.uz && code == sign {
            return f32::NAN;
        }
        let neg = code & sign != 0;
        let mag = code & (sign - 1);
        let max = self.max_finite_code();
        let v = if mag > max {
            if self.ieee_special && mag == max + 1 {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else {
            self.magnitude(mag)
        };
        if neg { -v } else { v }
    }
    fn encode(&self, x: f32, saturate: bool) -> u8 {
        let sign = self.sign_bit();
        let max = self.max_finite_code();
        if x.is_nan() {
            if self.uz {
                return sign;
            }
            if !self.ieee_special && !self.fn_nan {
                // fp4 has no NaN: like ml_dtypes (ONNX's reference), a NaN becomes a zero
                // of the opposite sign.
                return if x.is_sign_negative() { 0 } else { sign };
            }
            return self.nan_code_plain();
        }
        let neg = x.is_sign_negative();
        let a = x.abs();
        let overflow = || -> u8 {
            if saturate {
                max
            } else if self.ieee_special {
                max + 1
            } else if self.uz {
                u8::MAX // marker: NaN
            } else if self.fn_nan {
                max + 1
            } else {
                max // formats without NaN/inf (fp4) always saturate
            }
        };
        let mag = if a.is_infinite() {
            overflow()
        } else {
            // Binary search for the largest code whose magnitude is <= a.
            let (mut lo, mut hi) = (0u8, max);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if self.magnitude(mid) <= a {
                    lo = mid
                } else {
                    hi = mid - 1
                }
            }
            let below = self.magnitude(lo);
            if below == a {
                lo
            } else {
                // Next value up: the following code, or the value the format would have past max.
                let above = if lo < max {
                    self.magnitude(lo + 1)
                } else {
                    let ulp = self.magnitude(max) - self.magnitude(max - 1);
                    self.magnitude(max) + ulp
                };
                let mid = (below + above) / 2.0;
                let up = a > mid || (a == mid && lo % 2 == 1);
                if !up {
                    lo
                } else if lo < max {
                    lo + 1
                } else {
                    overflow()
                }
            }
        };
        if mag == u8::MAX {
            return sign; // fnuz NaN
        }
        if neg && !(self.uz && mag == 0) { mag | sign } else { mag }
    }
    fn nan_code_plain(&self) -> u8 {
        // All ones below the sign bit is NaN in e4m3fn and e5m2.
        sign_minus_one(self.sign_bit())
    }
}

fn sign_minus_one(sign: u8) -> u8 {
    sign - 1
}

/// Decodes one element code of a byte-coded dtype to f32 (integers to their value).
pub fn decode(dtype: DType, code: u8) -> f32 {
    if let Some(f) = format_of(dtype) {
        return f.decode(code);
    }
    match dtype {
        DType::F8E8M0 => {
            if code == 0xFF {
                f32::NAN
            } else {
                2f32.powi(code as i32 - 127)
            }
        }
        DType::U4 => (code & 0x0F) as f32,
        DType::I4 => (((code << 4) as i8) >> 4) as f32,
        DType::U2 => (code & 0x03) as f32,
        DType::I2 => (((code << 6) as i8) >> 6) as f32,
        _ => code as f32,
    }
}

/// Rounding for conversions to e8m0 (ONNX Cast's `round_mode`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum RoundMode {
    Up,
    Down,
    Nearest,
}

/// Encodes an f32 into a float8/fp4 code (round to nearest even) or e8m0 (round up).
pub fn encode_float(dtype: DType, x: f32, saturate: bool) -> u8 {
    encode_float_mode(dtype, x, saturate, RoundMode::Up)
}

/// As [`encode_float`], with the e8m0 rounding mode given.
pub fn encode_float_mode(dtype: DType, x: f32, saturate: bool, round: RoundMode) -> u8 {
    if let Some(f) = format_of(dtype) {
        return f.encode(x, saturate);
    }
    if dtype == DType::F8E8M0 {
        let bits = x.to_bits();
        let exp = (bits >> 23) & 0xFF;
        if exp == 0xFF {
            return 0xFF;
        }
        let mut e = exp as u16;
        let up = match round {
            RoundMode::Down => false,
            RoundMode::Up => bits & 0x7F_FFFF != 0,
            RoundMode::Nearest => {
                let g = bits & 0x40_0000 != 0;
                let r = bits & 0x20_0000 != 0;
                let s = bits & 0x1F_FFFF != 0;
                g && (r || s || exp > 0)
            }
        };
        if up && !(saturate && exp == 0xFE) {
            e += 1;
        }
        return e as u8;
    }
    encode_int(dtype, x as f64)
}

/// Encodes an integer value into a sub-byte integer code, saturating to the type's range.
pub fn encode_int(dtype: DType, v: f64) -> u8 {
    let (lo, hi) = int_range(dtype);
    let r = if v.is_nan() {
        0.0
    } else {
        v.round_ties_even().clamp(lo, hi)
    };
    (r as i64 as u8) & int_mask(dtype)
}

/// Encodes an integer value into a sub-byte integer code keeping only the low bits (the
/// wrap-around of a plain integer cast).
pub fn wrap_int(dtype: DType, v: i64) -> u8 {
    (v as u8) & int_mask(dtype)
}

fn int_mask(dtype: DType) -> u8 {
    match dtype {
        DType::U4 | DType::I4 => 0x0F,
        DType::U2 | DType::I2 => 0x03,
        _ => 0xFF,
    }
}

/// Value range of a sub-byte integer type.
pub fn int_range(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::U4 => (0.0, 15.0),
        DType::I4 => (-8.0, 7.0),
        DType::U2 => (0.0, 3.0),
        DType::I2 => (-2.0, 1.0),
        _ => (0.0, 255.0),
    }
}

/// Splits ONNX's packed 4-bit / 2-bit storage (low bits first) into one code per element.
pub fn unpack(dtype: DType, packed: &[u8], n: usize) -> Option<Vec<u8>> {
    let bits = dtype.packed_bits();
    if bits >= 8 {
        return (packed.len() >= n).then(|| packed[..n].to_vec());
    }
    let per = 8 / bits;
    if packed.len() < n.div_ceil(per) {
        return None;
    }
    let mask = ((1u16 << bits) - 1) as u8;
    Some((0..n).map(|i| (packed[i / per] >> ((i % per) * bits)) & mask).collect())
}

/// Packs one code per element into ONNX's 4-bit / 2-bit storage.
pub fn pack(dtype: DType, codes: &[u8]) -> Vec<u8> {
    let bits = dtype.packed_bits();
    if bits >= 8 {
        return codes.to_vec();
    }
    let per = 8 / bits;
    let mask = ((1u16 << bits) - 1) as u8;
    let mut out = vec![0u8; codes.len().div_ceil(per)];
    for (i, &c) in codes.iter().enumerate() {
        out[i / per] |= (c & mask) << ((i % per) * bits);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3fn_known_values() {
        assert_eq!(decode(DType::F8E4M3FN, 0x7E), 448.0);
        assert!(decode(DType::F8E4M3FN, 0x7F).is_nan());
        assert_eq!(decode(DType::F8E4M3FN, 0x38), 1.0);
        assert_eq!(decode(DType::F8E4M3FN, 0x01), 2f32.powi(-9));
        assert_eq!(encode_float(DType::F8E4M3FN, 1.0, true), 0x38);
        assert_eq!(encode_float(DType::F8E4M3FN, 1e6, true), 0x7E);
        assert!(decode(DType::F8E4M3FN, encode_float(DType::F8E4M3FN, 1e6, false)).is_nan());
        assert_eq!(encode_float(DType::F8E4M3FN, -448.0, true), 0xFE);
    }

    #[test]
    fn e5m2_has_infinity() {
        assert_eq!(decode(DType::F8E5M2, 0x7C), f32::INFINITY);
        assert_eq!(decode(DType::F8E5M2, 0x7B), 57344.0);
        assert_eq!(encode_float(DType::F8E5M2, f32::INFINITY, false), 0x7C);
        assert_eq!(encode_float(DType::F8E5M2, f32::INFINITY, true), 0x7B);
    }

    #[test]
    fn fnuz_has_one_nan_and_no_negative_zero() {
        assert!(decode(DType::F8E4M3FNUZ, 0x80).is_nan());
        assert_eq!(decode(DType::F8E4M3FNUZ, 0x7F), 240.0);
        assert_eq!(encode_float(DType::F8E4M3FNUZ, -0.0, true), 0x00);
        assert_eq!(encode_float(DType::F8E5M2FNUZ, f32::NAN, true), 0x80);
    }

    #[test]
    fn ties_round_to_even() {
        // 1.0625 lies halfway between 1.0 (0x38, even) and 1.125 (0x39).
        assert_eq!(encode_float(DType::F8E4M3FN, 1.0625, true), 0x38);
        // 1.1875 lies halfway between 1.125 (0x39) and 1.25 (0x3A, even).
        assert_eq!(encode_float(DType::F8E4M3FN, 1.1875, true), 0x3A);
    }

    #[test]
    fn fp4_values() {
        let vals: Vec<f32> = (0..8).map(|c| decode(DType::F4E2M1, c)).collect();
        assert_eq!(vals, vec![0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
        assert_eq!(decode(DType::F4E2M1, 0x9), -0.5);
        assert_eq!(encode_float(DType::F4E2M1, 100.0, false), 0x7);
        assert_eq!(encode_float(DType::F4E2M1, f32::NEG_INFINITY, false), 0xF);
        // ml_dtypes' choice for NaN: the zero of the opposite sign.
        assert_eq!(encode_float(DType::F4E2M1, f32::NAN, false), 0x8);
        assert_eq!(encode_float(DType::F4E2M1, -f32::NAN, false), 0x0);
    }

    #[test]
    fn sub_byte_ints_pack_low_first() {
        let codes = [1u8, 2, 3];
        let packed = pack(DType::U4, &codes);
        assert_eq!(packed, vec![0x21, 0x03]);
        assert_eq!(unpack(DType::U4, &packed, 3).unwrap(), codes.to_vec());
        assert_eq!(decode(DType::I4, 0x0F), -1.0);
        assert_eq!(encode_int(DType::I4, -100.0), 0x08);
        assert_eq!(decode(DType::I2, 0x02), -2.0);
    }

    #[test]
    fn e8m0_rounds_up_by_default() {
        assert_eq!(encode_float(DType::F8E8M0, 1.0, true), 127);
        assert_eq!(encode_float(DType::F8E8M0, 1.5, true), 128);
        assert_eq!(decode(DType::F8E8M0, 128), 2.0);
    }
}
