//! From a clipping range to a scale and zero point: Glow's rules (pytorch/glow
//! `lib/Quantization/Base/Base.cpp`, `chooseQuantizationParams`), mapped onto ONNX's 8-bit
//! types. Glow keeps every tensor in int8 with an offset; an asymmetric int8 tensor with offset
//! `o` is the same grid as a uint8 tensor with zero point `o + 128`, so asymmetric tensors and
//! non-negative tensors of `symmetric_with_uint8` are `uint8` here, symmetric ones `int8` with
//! zero point 0.

use kiln_tensor::DType;

/// A quantization schema (qaic's `quantization_schema_activations` / `_constants`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Schema {
    /// `uint8`, scale `(max - min) / 255`, any zero point.
    Asymmetric,
    /// `int8`, zero point 0, the range widened to `[-128 s, 127 s]`.
    Symmetric,
    /// `uint8` with zero point 0 when the range has no negative values, else `Symmetric`.
    SymmetricWithUint8,
    /// `Symmetric` with the scale rounded up to a power of two.
    SymmetricWithPower2Scale,
}

/// Scale and zero point of one 8-bit tensor (or of one channel of it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QParams {
    pub scale: f32,
    pub zero_point: i32,
    /// `uint8` (0..=255) when true, else `int8` (-128..=127).
    pub unsigned: bool,
}

impl QParams {
    pub fn dtype(&self) -> DType {
        if self.unsigned { DType::U8 } else { DType::I8 }
    }

    /// The integer range of the type.
    pub fn bounds(&self) -> (i32, i32) {
        if self.unsigned { (0, 255) } else { (-128, 127) }
    }

    /// `x` quantized as QuantizeLinear does: `x / scale` rounded half to even, plus the zero
    /// point, saturated.
    pub fn quantize(&self, x: f32) -> i32 {
        let (lo, hi) = self.bounds();
        let v = (x / self.scale).round_ties_even();
        if v.is_nan() {
            return self.zero_point.clamp(lo, hi);
        }
        // The float is clamped before the conversion so it cannot overflow.
        let v = v.clamp(-65536.0, 65536.0) as i32;
        (v + self.zero_point).clamp(lo, hi)
    }

    pub fn dequantize(&self, q: i32) -> f32 {
        (q - self.zero_point) as f32 * self.scale
    }

    /// `x` through QuantizeLinear then DequantizeLinear.
    pub fn fake(&self, x: f32) -> f32 {
        self.dequantize(self.quantize(x))
    }

    /// The float range the grid represents.
    pub fn representable(&self) -> (f32, f32) {
        let (lo, hi) = self.bounds();
        (self.dequantize(lo), self.dequantize(hi))
    }
}

/// Glow's degenerate scale (a tensor whose range is a single point).
const DEGENERATE_SCALE: f64 = 0.1;

/// The parameters for the clipping range `[min, max]` under `schema`. The range is first
/// widened to hold 0 (so 0 is exact: padding and ReLU outputs stay exact); non-finite bounds
/// count as 0.
pub fn choose(min: f64, max: f64, schema: Schema) -> QParams {
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let mut min = finite(min).min(0.0);
    let mut max = finite(max).max(0.0);
    let unsigned = match schema {
        Schema::Asymmetric => true,
        Schema::SymmetricWithUint8 => min >= 0.0,
        Schema::Symmetric | Schema::SymmetricWithPower2Scale => false,
    };
    let symmetric = !matches!(schema, Schema::Asymmetric) && !unsigned;
    let (q_min, q_max) = if unsigned { (0.0, 255.0) } else { (-128.0, 127.0) };
    if symmetric {
        // Whichever end saturates first sets the scale of a [-128 s, 127 s] grid.
        let r_min = min / q_min;
        let r_max = max / q_max;
        if r_min > r_max {
            max = r_min * q_max;
        } else {
            min = r_max * q_min;
        }
    }
    let mut scale = (max - min) / (q_max - q_min);
    if !(scale > 0.0 && scale.is_finite()) || (scale as f32) <= 0.0 || !(scale as f32).is_finite() {
        scale = DEGENERATE_SCALE;
    }
    let zero_point = if symmetric || unsigned && matches!(schema, Schema::SymmetricWithUint8) {
        0
    } else {
        // From whichever end gives the smaller rounding error, as Glow does.
        let from_min = q_min - min / scale;
        let from_max = q_max - max / scale;
        let err_min = q_min.abs() + (min / scale).abs();
        let err_max = q_max.abs() + (max / scale).abs();
        let z = if err_min < err_max { from_min } else { from_max };
        z.round_ties_even().clamp(q_min, q_max) as i32
    };
    if matches!(schema, Schema::SymmetricWithPower2Scale) {
        scale = 2f64.powf(scale.log2().ceil());
    }
    QParams {
        scale: scale as f32,
        zero_point,
        unsigned,
    }
}

/// Symmetric `int8` parameters for one channel of a constant (per-channel weights are symmetric
/// whatever the schema, the TFLite convention Glow follows).
pub fn symmetric_channel(min: f64, max: f64) -> QParams {
    choose(min, max, Schema::Symmetric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asymmetric_covers_the_range_with_an_exact_zero() {
        let p = choose(-1.0, 3.0, Schema::Asymmetric);
        assert!(p.unsigned);
        assert!((p.scale - 4.0 / 255.0).abs() < 1e-7);
        assert_eq!(p.zero_point, 64); // 1 / (4 / 255) = 63.75 -> 64
        assert_eq!(p.fake(0.0), 0.0);
        let (lo, hi) = p.representable();
        assert!(lo <= -1.0 + p.scale && hi >= 3.0 - p.scale);
    }

    #[test]
    fn symmetric_uses_minus_128_to_127() {
        let p = choose(-2.0, 1.0, Schema::Symmetric);
        assert!(!p.unsigned);
        assert_eq!(p.zero_point, 0);
        // -2 / -128 = 1/64 > 1/127: the minimum sets the scale.
        assert!((p.scale - 2.0 / 128.0).abs() < 1e-8);
        assert_eq!(p.quantize(-2.0), -128);
        let p = choose(-1.0, 2.54, Schema::Symmetric);
        assert!((p.scale - 0.02).abs() < 1e-7);
        assert_eq!(p.quantize(2.54), 127);
    }

    #[test]
    fn symmetric_with_uint8_is_unsigned_only_without_negatives() {
        let p = choose(0.0, 5.1, Schema::SymmetricWithUint8);
        assert!(p.unsigned);
        assert_eq!(p.zero_point, 0);
        assert!((p.scale - 0.02).abs() < 1e-7);
        let q = choose(-0.5, 5.1, Schema::SymmetricWithUint8);
        assert!(!q.unsigned);
        assert_eq!(q.zero_point, 0);
        // A positive minimum is widened to 0 first.
        assert!(choose(1.0, 5.1, Schema::SymmetricWithUint8).unsigned);
    }

    #[test]
    fn power2_scale_rounds_up() {
        let p = choose(-1.0, 1.0, Schema::SymmetricWithPower2Scale);
        assert_eq!(p.scale, 1.0 / 64.0); // 1/127 -> 2^-6
        assert_eq!(p.zero_point, 0);
    }

    #[test]
    fn degenerate_and_non_finite_ranges_stay_usable() {
        let p = choose(0.0, 0.0, Schema::Asymmetric);
        assert_eq!(p.scale, 0.1);
        let p = choose(f64::NAN, f64::INFINITY, Schema::Symmetric);
        assert!(p.scale > 0.0 && p.scale.is_finite());
        assert_eq!(p.quantize(f32::NAN), 0);
        assert_eq!(p.quantize(1e30), 127);
    }

    #[test]
    fn quantize_rounds_half_to_even() {
        let p = QParams {
            scale: 1.0,
            zero_point: 0,
            unsigned: false,
        };
        assert_eq!(p.quantize(2.5), 2);
        assert_eq!(p.quantize(3.5), 4);
        assert_eq!(p.quantize(-2.5), -2);
    }
}
