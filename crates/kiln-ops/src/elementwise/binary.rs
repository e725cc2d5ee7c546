//! Two-input elementwise ops with numpy (multidirectional) broadcasting.
//!
//! ONNX operators (<https://onnx.ai/onnx/operators/>), opsets 1 to 24 (BitShift's signed
//! types and out-of-range counts as in opset 28's tests): Add, Sub, Mul, Div, Pow, Mod,
//! BitShift, BitwiseAnd, BitwiseOr, BitwiseXor, And, Or, Xor, Equal, Less, LessOrEqual,
//! Greater, GreaterOrEqual. Opsets before 7 broadcast `B` onto `A` from an `axis` attribute;
//! that form is kept in [`Binary::legacy_axis`].

use super::scalar::{Int, Num, with_float, with_int, with_int2, with_num2};
use crate::error::{OpError, Result};
use crate::util::{broadcast_map, checked_numel, norm_axis};
use kiln_tensor::{DType, Data, Element, Tensor, broadcast_shapes};

/// Which two-input op.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Integer division truncates toward zero.
    Div,
    /// `X ** Y`; the output has X's type, Y may be any numeric type.
    Pow,
    /// `fmod = true`: C fmod (sign of the dividend); otherwise numpy mod (sign of the divisor).
    Mod {
        fmod: bool,
    },
    /// `left`: direction LEFT.
    BitShift {
        left: bool,
    },
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    And,
    Or,
    Xor,
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

/// A two-input op; `legacy_axis` is set for opset < 7 nodes with `broadcast = 1`, where `B`'s
/// dims align with `A`'s starting at that axis.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub struct Binary {
    pub op: BinaryOp,
    pub legacy_axis: Option<i64>,
}

impl BinaryOp {
    pub fn name(&self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "Add",
            Sub => "Sub",
            Mul => "Mul",
            Div => "Div",
            Pow => "Pow",
            Mod { .. } => "Mod",
            BitShift { .. } => "BitShift",
            BitwiseAnd => "BitwiseAnd",
            BitwiseOr => "BitwiseOr",
            BitwiseXor => "BitwiseXor",
            And => "And",
            Or => "Or",
            Xor => "Xor",
            Equal => "Equal",
            Less => "Less",
            LessOrEqual => "LessOrEqual",
            Greater => "Greater",
            GreaterOrEqual => "GreaterOrEqual",
        }
    }

    /// Ops whose output is bool.
    pub fn is_predicate(&self) -> bool {
        use BinaryOp::*;
        matches!(
            self,
            And | Or | Xor | Equal | Less | LessOrEqual | Greater | GreaterOrEqual
        )
    }

    /// Output dtype for input dtypes `a`, `b`; an error when the op does not accept them.
    pub fn out_dtype(&self, a: DType, b: DType) -> Result<DType> {
        use BinaryOp::*;
        let numeric = |d: DType| (d.is_int() || d.is_float()) && !d.is_byte_coded();
        if *self != Pow && a != b {
            return Err(OpError::DTypeMismatch { a, b });
        }
        let ok = match self {
            Add | Sub | Mul | Div | Mod { .. } | Less | LessOrEqual | Greater | GreaterOrEqual => numeric(a),
            Pow => {
                if !numeric(b) {
                    return Err(OpError::UnsupportedDType { index: 1, got: b });
                }
                numeric(a)
            }
            BitShift { .. } | BitwiseAnd | BitwiseOr | BitwiseXor => a.is_int() && !a.is_byte_coded(),
            And | Or | Xor => a == DType::Bool,
            Equal => numeric(a) || a == DType::Bool || a == DType::String,
        };
        if !ok {
            return Err(OpError::UnsupportedDType { index: 0, got: a });
        }
        Ok(if self.is_predicate() { DType::Bool } else { a })
    }
}

/// Broadcast index maps of two (or more) shapes onto their common shape.
pub(crate) struct Bcast {
    pub shape: Vec<usize>,
    pub ia: Vec<usize>,
    pub ib: Vec<usize>,
}

impl Bcast {
    pub fn new(a: &[usize], b: &[usize]) -> Result<Bcast> {
        let shape = broadcast_shapes(a, b)?;
        checked_numel(&shape)?;
        Ok(Bcast {
            ia: broadcast_map(a, &shape)?,
            ib: broadcast_map(b, &shape)?,
            shape,
        })
    }

    /// `f(x[ia[i]], y[ib[i]])` for every output element (the maps index within the slices,
    /// whose lengths match the shapes the maps were built from).
    pub fn zip<T: Copy, U: Copy, R>(&self, x: &[T], y: &[U], f: impl Fn(T, U) -> R) -> Vec<R> {
        self.ia.iter().zip(&self.ib).map(|(&i, &j)| f(x[i], y[j])).collect()
    }

    pub fn zip_ref<T, U, R>(&self, x: &[T], y: &[U], f: impl Fn(&T, &U) -> R) -> Vec<R> {
        self.ia.iter().zip(&self.ib).map(|(&i, &j)| f(&x[i], &y[j])).collect()
    }
}

/// The shape `b` takes under opset < 7 broadcasting onto a tensor of rank `rank_a` from
/// `axis`: its dims, followed by ones up to `rank_a`.
pub(crate) fn legacy_shape(b: &[usize], rank_a: usize, axis: i64) -> Result<Vec<usize>> {
    if b.len() > rank_a {
        return Err(OpError::Shape(format!(
            "B of shape {b:?} has a higher rank than A ({rank_a})"
        )));
    }
    if b.len() == rank_a {
        return Ok(b.to_vec());
    }
    let ax = norm_axis(axis, rank_a)?;
    if ax + b.len() > rank_a {
        return Err(OpError::Shape(format!(
            "B of shape {b:?} does not fit A's rank {rank_a} from axis {axis}"
        )));
    }
    let mut s = b.to_vec();
    s.resize(rank_a - ax, 1);
    Ok(s)
}

fn arith<T: Num>(op: BinaryOp, x: &[T], y: &[T], m: &Bcast) -> Vec<T> {
    let f: fn(T, T) -> T = match op {
        BinaryOp::Sub => T::sub,
        BinaryOp::Mul => T::mul,
        BinaryOp::Div => T::div,
        BinaryOp::Mod { fmod: true } => T::fmod,
        BinaryOp::Mod { fmod: false } => T::pymod,
        _ => T::add,
    };
    m.zip(x, y, f)
}

fn bits<T: Int>(op: BinaryOp, x: &[T], y: &[T], m: &Bcast) -> Vec<T> {
    let f: fn(T, T) -> T = match op {
        BinaryOp::BitShift { left: true } => T::shl,
        BinaryOp::BitShift { left: false } => T::shr,
        BinaryOp::BitwiseOr => T::or,
        BinaryOp::BitwiseXor => T::xor,
        _ => T::and,
    };
    m.zip(x, y, f)
}

fn compare<T: PartialOrd>(op: BinaryOp, x: &[T], y: &[T], m: &Bcast) -> Vec<bool> {
    match op {
        BinaryOp::Less => m.zip_ref(x, y, |a, b| a < b),
        BinaryOp::LessOrEqual => m.zip_ref(x, y, |a, b| a <= b),
        BinaryOp::Greater => m.zip_ref(x, y, |a, b| a > b),
        BinaryOp::GreaterOrEqual => m.zip_ref(x, y, |a, b| a >= b),
        _ => m.zip_ref(x, y, |a, b| a == b),
    }
}

fn pow_by_f64<T: Num>(x: &[T], e: &[f64], m: &Bcast) -> Vec<T> {
    m.zip(x, e, |a, b| T::from_f64(a.to_f64().powf(b)))
}

fn pow_by_int<T: Int>(x: &[T], e: &[i64], m: &Bcast) -> Vec<T> {
    m.zip(x, e, |a, b| a.int_pow(b))
}

impl Binary {
    pub fn name(&self) -> &'static str {
        self.op.name()
    }

    pub fn eval(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        use BinaryOp::*;
        let out_dt = self.op.out_dtype(a.dtype(), b.dtype())?;
        let b_shape = match self.legacy_axis {
            Some(axis) => legacy_shape(b.shape(), a.rank(), axis)?,
            None => b.shape().to_vec(),
        };
        let m = Bcast::new(a.shape(), &b_shape)?;
        let unsupported = || OpError::UnsupportedDType {
            index: 0,
            got: a.dtype(),
        };
        let data = match self.op {
            Add | Sub | Mul | Div | Mod { .. } => {
                with_num2!(a.data(), b.data(), (x, y) => Element::wrap(arith(self.op, x, y, &m)), else return Err(unsupported()))
            }
            BitShift { .. } | BitwiseAnd | BitwiseOr | BitwiseXor => {
                with_int2!(a.data(), b.data(), (x, y) => Element::wrap(bits(self.op, x, y, &m)), else return Err(unsupported()))
            }
            Pow => {
                if a.dtype().is_float() || b.dtype().is_float() {
                    let e = b.to_f64_vec();
                    with_float!(a.data(), x => Element::wrap(pow_by_f64(x, &e, &m)),
                        else with_int!(a.data(), x => Element::wrap(pow_by_f64(x, &e, &m)), else return Err(unsupported())))
                } else {
                    let e = b.to_i64_vec().ok_or(OpError::UnsupportedDType {
                        index: 1,
                        got: b.dtype(),
                    })?;
                    with_int!(a.data(), x => Element::wrap(pow_by_int(x, &e, &m)), else return Err(unsupported()))
                }
            }
            And | Or | Xor => match (a.data(), b.data()) {
                (Data::Bool(x), Data::Bool(y)) => Data::Bool(
                    match self.op {
                        And => m.zip(x, y, |p, q| p && q),
                        Or => m.zip(x, y, |p, q| p || q),
                        _ => m.zip(x, y, |p, q| p != q),
                    }
                    .into(),
                ),
                _ => return Err(unsupported()),
            },
            Equal | Less | LessOrEqual | Greater | GreaterOrEqual => match (a.data(), b.data()) {
                (Data::Bool(x), Data::Bool(y)) => Data::Bool(compare(self.op, x, y, &m).into()),
                (Data::Str(x), Data::Str(y)) => Data::Bool(compare(self.op, x, y, &m).into()),
                (da, db) => Data::Bool(
                    with_num2!(da, db, (x, y) => compare(self.op, x, y, &m), else return Err(unsupported())).into(),
                ),
            },
        };
        Ok(Tensor::new(out_dt, m.shape, data)?)
    }
}
