//! Element-level arithmetic with ONNX/numpy semantics for every numeric storage type, and the
//! macros that dispatch a `Data` (or a pair of them) to a generic function over its element
//! type.
//!
//! Integers wrap on overflow (numpy's behaviour); integer division and remainder by zero give
//! 0 (what numpy returns, with a warning). `f16`/`bf16` compute in `f32` and round back, as
//! numpy does.

use kiln_tensor::{Element, bf16, f16};

/// A numeric element type (all floats and integers kiln stores natively): the one numeric
/// trait of the op families (elementwise arithmetic, movement's reductions and scans).
pub(crate) trait Num: Copy + PartialOrd + Element {
    const FLOAT: bool;
    fn to_f64(self) -> f64;
    /// From f64: floats round to nearest; integers truncate toward zero and saturate (NaN
    /// gives 0), as `as` does.
    fn from_f64(v: f64) -> Self;
    fn zero() -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Float division; integer division truncating toward zero (0 when dividing by 0).
    fn div(self, o: Self) -> Self;
    /// C `fmod`: the remainder takes the dividend's sign.
    fn fmod(self, o: Self) -> Self;
    /// numpy `mod`: the remainder takes the divisor's sign.
    fn pymod(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
    fn one() -> Self {
        Self::from_f64(1.0)
    }
    /// numpy's maximum: NaN propagates.
    fn max_nan(self, o: Self) -> Self {
        if self.is_nan() || o.is_nan() {
            if self.is_nan() { self } else { o }
        } else if o > self {
            o
        } else {
            self
        }
    }
    /// numpy's minimum: NaN propagates.
    fn min_nan(self, o: Self) -> Self {
        if self.is_nan() || o.is_nan() {
            if self.is_nan() { self } else { o }
        } else if o < self {
            o
        } else {
            self
        }
    }
    /// Storage of `n` elements for an output the caller writes whole (f32: the step's
    /// planned range or a recycled buffer, stale contents, see `crate::util::out_buf`;
    /// others: zeros).
    fn buffer(n: usize) -> kiln_tensor::Buf<Self> {
        kiln_tensor::Buf::from_vec(vec![Self::zero(); n])
    }
}

/// numpy's `npy_divmod` remainder for floats.
fn float_pymod(a: f64, b: f64) -> f64 {
    let m = a % b;
    if b == 0.0 {
        return m; // NaN
    }
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) { m + b } else { m }
    } else {
        0f64.copysign(b)
    }
}

fn float_pymod32(a: f32, b: f32) -> f32 {
    let m = a % b;
    if b == 0.0 {
        return m;
    }
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) { m + b } else { m }
    } else {
        0f32.copysign(b)
    }
}

macro_rules! float_num {
    ($t:ty, $pymod:ident $(, $buffer:path)?) => {
        impl Num for $t {
            $(fn buffer(n: usize) -> kiln_tensor::Buf<Self> {
                $buffer(n)
            })?
            const FLOAT: bool = true;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn zero() -> Self {
                0.0
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn fmod(self, o: Self) -> Self {
                self % o
            }
            fn pymod(self, o: Self) -> Self {
                $pymod(self, o)
            }
            fn neg(self) -> Self {
                -self
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}
float_num!(f32, float_pymod32, crate::util::out_f32);
float_num!(f64, float_pymod);

macro_rules! half_num {
    ($t:ty) => {
        impl Num for $t {
            const FLOAT: bool = true;
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn zero() -> Self {
                <$t>::ZERO
            }
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            fn sub(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() - o.to_f32())
            }
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            fn div(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() / o.to_f32())
            }
            fn fmod(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() % o.to_f32())
            }
            fn pymod(self, o: Self) -> Self {
                <$t>::from_f32(float_pymod32(self.to_f32(), o.to_f32()))
            }
            fn neg(self) -> Self {
                -self
            }
            fn abs(self) -> Self {
                <$t>::from_f32(self.to_f32().abs())
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}
half_num!(f16);
half_num!(bf16);

macro_rules! int_num {
    ($t:ty, $u:ty, $signed:expr) => {
        impl Num for $t {
            const FLOAT: bool = false;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn zero() -> Self {
                0
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn div(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            fn fmod(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_rem(o) }
            }
            #[allow(unused_comparisons)]
            fn pymod(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(o);
                if r != 0 && ((r < 0) != (o < 0)) {
                    r.wrapping_add(o)
                } else {
                    r
                }
            }
            fn neg(self) -> Self {
                (0 as $t).wrapping_sub(self)
            }
            #[allow(unused_comparisons)]
            fn abs(self) -> Self {
                if self < 0 {
                    (0 as $t).wrapping_sub(self)
                } else {
                    self
                }
            }
            fn is_nan(self) -> bool {
                false
            }
        }

        impl Int for $t {
            fn and(self, o: Self) -> Self {
                self & o
            }
            fn or(self, o: Self) -> Self {
                self | o
            }
            fn xor(self, o: Self) -> Self {
                self ^ o
            }
            fn not(self) -> Self {
                !self
            }
            #[allow(unused_comparisons)]
            fn shl(self, s: Self) -> Self {
                if s < 0 || (s as u64) >= u64::from(<$t>::BITS) {
                    0
                } else {
                    ((self as $u) << (s as u32)) as $t
                }
            }
            #[allow(unused_comparisons)]
            fn shr(self, s: Self) -> Self {
                if s < 0 || (s as u64) >= u64::from(<$t>::BITS) {
                    if self < 0 { !(0 as $t) } else { 0 }
                } else {
                    self >> (s as u32)
                }
            }
            fn int_pow(self, e: i64) -> Self {
                // Exponentiation by squaring, wrapping in 64 bits (the low bits are the same
                // as wrapping in the narrow type).
                let b = self as i64;
                if e < 0 {
                    // numpy refuses negative integer powers; give the C-like integer result.
                    return match b {
                        1 => 1 as $t,
                        -1 => (if e % 2 == 0 { 1i64 } else { -1i64 }) as $t,
                        _ => 0 as $t,
                    };
                }
                let (mut base, mut e, mut acc) = (b, e as u64, 1i64);
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc as $t
            }
        }
    };
}

/// Integer element types: bitwise operations and shifts.
pub(crate) trait Int: Num {
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    /// Left shift; a shift count below 0 or at least the bit width gives 0.
    fn shl(self, s: Self) -> Self;
    /// Right shift (arithmetic for signed types); an out-of-range count gives 0, or -1 for a
    /// negative signed value.
    fn shr(self, s: Self) -> Self;
    /// `self ** e` with wrapping.
    fn int_pow(self, e: i64) -> Self;
}

int_num!(i8, u8, true);
int_num!(i16, u16, true);
int_num!(i32, u32, true);
int_num!(i64, u64, true);
int_num!(u8, u8, false);
int_num!(u16, u16, false);
int_num!(u32, u32, false);
int_num!(u64, u64, false);

/// NaN-propagating maximum (numpy `maximum`).
pub(crate) fn nan_max<T: Num>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() || b > a {
        b
    } else {
        a
    }
}

/// NaN-propagating minimum (numpy `minimum`).
pub(crate) fn nan_min<T: Num>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() || b < a {
        b
    } else {
        a
    }
}

/// `match`es a `Data` over its numeric variants, binding the element slice to `$v`; the body is
/// the same generic expression for every type. Other variants evaluate `$other`.
macro_rules! with_num {
    ($data:expr, $v:ident => $body:expr, else $other:expr) => {
        match $data {
            kiln_tensor::Data::F32($v) => $body,
            kiln_tensor::Data::F64($v) => $body,
            kiln_tensor::Data::F16($v) => $body,
            kiln_tensor::Data::BF16($v) => $body,
            kiln_tensor::Data::I8($v) => $body,
            kiln_tensor::Data::I16($v) => $body,
            kiln_tensor::Data::I32($v) => $body,
            kiln_tensor::Data::I64($v) => $body,
            kiln_tensor::Data::U8($v) => $body,
            kiln_tensor::Data::U16($v) => $body,
            kiln_tensor::Data::U32($v) => $body,
            kiln_tensor::Data::U64($v) => $body,
            #[allow(unreachable_patterns)]
            _ => $other,
        }
    };
}

/// As [`with_num`] for the float variants only.
macro_rules! with_float {
    ($data:expr, $v:ident => $body:expr, else $other:expr) => {
        match $data {
            kiln_tensor::Data::F32($v) => $body,
            kiln_tensor::Data::F64($v) => $body,
            kiln_tensor::Data::F16($v) => $body,
            kiln_tensor::Data::BF16($v) => $body,
            #[allow(unreachable_patterns)]
            _ => $other,
        }
    };
}

/// As [`with_num`] for the integer variants only.
macro_rules! with_int {
    ($data:expr, $v:ident => $body:expr, else $other:expr) => {
        match $data {
            kiln_tensor::Data::I8($v) => $body,
            kiln_tensor::Data::I16($v) => $body,
            kiln_tensor::Data::I32($v) => $body,
            kiln_tensor::Data::I64($v) => $body,
            kiln_tensor::Data::U8($v) => $body,
            kiln_tensor::Data::U16($v) => $body,
            kiln_tensor::Data::U32($v) => $body,
            kiln_tensor::Data::U64($v) => $body,
            #[allow(unreachable_patterns)]
            _ => $other,
        }
    };
}

/// Two `Data` of the same numeric variant, bound to `$x` and `$y`.
macro_rules! with_num2 {
    ($a:expr, $b:expr, ($x:ident, $y:ident) => $body:expr, else $other:expr) => {
        match ($a, $b) {
            (kiln_tensor::Data::F32($x), kiln_tensor::Data::F32($y)) => $body,
            (kiln_tensor::Data::F64($x), kiln_tensor::Data::F64($y)) => $body,
            (kiln_tensor::Data::F16($x), kiln_tensor::Data::F16($y)) => $body,
            (kiln_tensor::Data::BF16($x), kiln_tensor::Data::BF16($y)) => $body,
            (kiln_tensor::Data::I8($x), kiln_tensor::Data::I8($y)) => $body,
            (kiln_tensor::Data::I16($x), kiln_tensor::Data::I16($y)) => $body,
            (kiln_tensor::Data::I32($x), kiln_tensor::Data::I32($y)) => $body,
            (kiln_tensor::Data::I64($x), kiln_tensor::Data::I64($y)) => $body,
            (kiln_tensor::Data::U8($x), kiln_tensor::Data::U8($y)) => $body,
            (kiln_tensor::Data::U16($x), kiln_tensor::Data::U16($y)) => $body,
            (kiln_tensor::Data::U32($x), kiln_tensor::Data::U32($y)) => $body,
            (kiln_tensor::Data::U64($x), kiln_tensor::Data::U64($y)) => $body,
            _ => $other,
        }
    };
}

/// Two `Data` of the same integer variant, bound to `$x` and `$y`.
macro_rules! with_int2 {
    ($a:expr, $b:expr, ($x:ident, $y:ident) => $body:expr, else $other:expr) => {
        match ($a, $b) {
            (kiln_tensor::Data::I8($x), kiln_tensor::Data::I8($y)) => $body,
            (kiln_tensor::Data::I16($x), kiln_tensor::Data::I16($y)) => $body,
            (kiln_tensor::Data::I32($x), kiln_tensor::Data::I32($y)) => $body,
            (kiln_tensor::Data::I64($x), kiln_tensor::Data::I64($y)) => $body,
            (kiln_tensor::Data::U8($x), kiln_tensor::Data::U8($y)) => $body,
            (kiln_tensor::Data::U16($x), kiln_tensor::Data::U16($y)) => $body,
            (kiln_tensor::Data::U32($x), kiln_tensor::Data::U32($y)) => $body,
            (kiln_tensor::Data::U64($x), kiln_tensor::Data::U64($y)) => $body,
            _ => $other,
        }
    };
}

/// Two `Data` of the same variant, any variant (strings, bools and byte codes included); the
/// body yields a `Vec` of the element type, wrapped back into that variant.
macro_rules! map_same2 {
    ($a:expr, $b:expr, ($x:ident, $y:ident) => $body:expr, else $other:expr) => {
        match ($a, $b) {
            (kiln_tensor::Data::F32($x), kiln_tensor::Data::F32($y)) => {
                kiln_tensor::Data::F32(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::F64($x), kiln_tensor::Data::F64($y)) => {
                kiln_tensor::Data::F64(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::F16($x), kiln_tensor::Data::F16($y)) => {
                kiln_tensor::Data::F16(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::BF16($x), kiln_tensor::Data::BF16($y)) => {
                kiln_tensor::Data::BF16(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::I8($x), kiln_tensor::Data::I8($y)) => {
                kiln_tensor::Data::I8(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::I16($x), kiln_tensor::Data::I16($y)) => {
                kiln_tensor::Data::I16(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::I32($x), kiln_tensor::Data::I32($y)) => {
                kiln_tensor::Data::I32(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::I64($x), kiln_tensor::Data::I64($y)) => {
                kiln_tensor::Data::I64(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::U8($x), kiln_tensor::Data::U8($y)) => {
                kiln_tensor::Data::U8(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::U16($x), kiln_tensor::Data::U16($y)) => {
                kiln_tensor::Data::U16(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::U32($x), kiln_tensor::Data::U32($y)) => {
                kiln_tensor::Data::U32(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::U64($x), kiln_tensor::Data::U64($y)) => {
                kiln_tensor::Data::U64(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::Bool($x), kiln_tensor::Data::Bool($y)) => {
                kiln_tensor::Data::Bool(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::Str($x), kiln_tensor::Data::Str($y)) => {
                kiln_tensor::Data::Str(kiln_tensor::Buf::from_vec($body))
            }
            (kiln_tensor::Data::Coded($x), kiln_tensor::Data::Coded($y)) => {
                kiln_tensor::Data::Coded(kiln_tensor::Buf::from_vec($body))
            }
            _ => $other,
        }
    };
}

pub(crate) use {map_same2, with_float, with_int, with_int2, with_num, with_num2};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics_follow_numpy() {
        assert_eq!(Num::div(-7i32, 2), -3); // truncation
        assert_eq!(Num::div(7u8, 0), 0);
        assert_eq!(Num::pymod(-4i32, 3), 2);
        assert_eq!(Num::pymod(7i32, -3), -2);
        assert_eq!(Num::fmod(-4i32, 3), -1);
        assert_eq!(Num::add(250u8, 10), 4);
        assert_eq!(Num::abs(i8::MIN), i8::MIN);
        assert_eq!(Int::shl(64i8, 1), -128);
        assert_eq!(Int::shl(-8i8, 8), 0);
        assert_eq!(Int::shr(-8i8, 1), -4);
        assert_eq!(Int::shr(-8i8, -1), -1);
        assert_eq!(Int::shr(16u8, 9), 0);
        assert_eq!(Int::int_pow(3i32, 3), 27);
        assert_eq!(Int::int_pow(2u8, 9), 0);
    }

    #[test]
    fn float_mod_takes_divisor_sign() {
        assert_eq!(Num::pymod(-3.0f64, 2.0), 1.0);
        assert_eq!(Num::pymod(3.0f64, -2.0), -1.0);
        assert!(Num::pymod(0.0f64, -2.0).is_sign_negative());
        assert!(Num::pymod(-0.0f64, 2.0).is_sign_positive());
        assert!(Num::pymod(1.0f64, 0.0).is_nan());
        assert_eq!(Num::pymod(-3.0f64, f64::INFINITY), f64::INFINITY);
        assert_eq!(Num::pymod(3.0f64, f64::INFINITY), 3.0);
    }
}
