//! The owned, dense, row-major tensor and its typed element storage.

use crate::buf::{Buf, SharedBytes};
use crate::dtype::DType;
use half::{bf16, f16};

/// Upper bound on the element count of any tensor kiln creates (2^30, 1 Gi elements: 4 GiB of f32): a
/// declared or computed shape beyond it is refused before anything is allocated.
pub const MAX_ELEMENTS: usize = 1 << 30;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    #[error("shape {shape:?} has {len} elements but the data holds {got}")]
    LengthMismatch { shape: Vec<usize>, len: usize, got: usize },
    #[error("shape {shape:?} is too large (more than {max} elements)")]
    TooLarge { shape: Vec<usize>, max: usize },
    #[error("expected a {expected} tensor, got {got}")]
    DType { expected: DType, got: DType },
    #[error("shapes {a:?} and {b:?} do not broadcast")]
    Broadcast { a: Vec<usize>, b: Vec<usize> },
}

/// Typed element storage. The variant always matches the tensor's [`DType`]; every byte-coded
/// type (float8, fp4, int4, int2, e8m0) is kept in `Coded`, one element per byte.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum Data {
    F32(Buf<f32>),
    F64(Buf<f64>),
    F16(Buf<f16>),
    BF16(Buf<bf16>),
    I8(Buf<i8>),
    I16(Buf<i16>),
    I32(Buf<i32>),
    I64(Buf<i64>),
    U8(Buf<u8>),
    U16(Buf<u16>),
    U32(Buf<u32>),
    U64(Buf<u64>),
    Bool(Buf<bool>),
    Str(Buf<String>),
    Coded(Buf<u8>),
}

/// Applies `$body` (an expression over `$v: &Vec<T>` producing `Vec<T>`) to whichever variant
/// `$data` holds and wraps the result in the same variant: the way data-movement ops stay
/// generic over every dtype.
#[macro_export]
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::Data::F32($v) => $crate::Data::F32($crate::Buf::from_vec($body)),
            $crate::Data::F64($v) => $crate::Data::F64($crate::Buf::from_vec($body)),
            $crate::Data::F16($v) => $crate::Data::F16($crate::Buf::from_vec($body)),
            $crate::Data::BF16($v) => $crate::Data::BF16($crate::Buf::from_vec($body)),
            $crate::Data::I8($v) => $crate::Data::I8($crate::Buf::from_vec($body)),
            $crate::Data::I16($v) => $crate::Data::I16($crate::Buf::from_vec($body)),
            $crate::Data::I32($v) => $crate::Data::I32($crate::Buf::from_vec($body)),
            $crate::Data::I64($v) => $crate::Data::I64($crate::Buf::from_vec($body)),
            $crate::Data::U8($v) => $crate::Data::U8($crate::Buf::from_vec($body)),
            $crate::Data::U16($v) => $crate::Data::U16($crate::Buf::from_vec($body)),
            $crate::Data::U32($v) => $crate::Data::U32($crate::Buf::from_vec($body)),
            $crate::Data::U64($v) => $crate::Data::U64($crate::Buf::from_vec($body)),
            $crate::Data::Bool($v) => $crate::Data::Bool($crate::Buf::from_vec($body)),
            $crate::Data::Str($v) => $crate::Data::Str($crate::Buf::from_vec($body)),
            $crate::Data::Coded($v) => $crate::Data::Coded($crate::Buf::from_vec($body)),
        }
    };
}

/// Like [`map_data!`] but `$body` returns `Result<Vec<T>, E>`; the whole expression is
/// `Result<Data, E>`.
#[macro_export]
macro_rules! try_map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::Data::F32($v) => $body.map(|b| $crate::Data::F32($crate::Buf::from_vec(b))),
            $crate::Data::F64($v) => $body.map(|b| $crate::Data::F64($crate::Buf::from_vec(b))),
            $crate::Data::F16($v) => $body.map(|b| $crate::Data::F16($crate::Buf::from_vec(b))),
            $crate::Data::BF16($v) => $body.map(|b| $crate::Data::BF16($crate::Buf::from_vec(b))),
            $crate::Data::I8($v) => $body.map(|b| $crate::Data::I8($crate::Buf::from_vec(b))),
            $crate::Data::I16($v) => $body.map(|b| $crate::Data::I16($crate::Buf::from_vec(b))),
            $crate::Data::I32($v) => $body.map(|b| $crate::Data::I32($crate::Buf::from_vec(b))),
            $crate::Data::I64($v) => $body.map(|b| $crate::Data::I64($crate::Buf::from_vec(b))),
            $crate::Data::U8($v) => $body.map(|b| $crate::Data::U8($crate::Buf::from_vec(b))),
            $crate::Data::U16($v) => $body.map(|b| $crate::Data::U16($crate::Buf::from_vec(b))),
            $crate::Data::U32($v) => $body.map(|b| $crate::Data::U32($crate::Buf::from_vec(b))),
            $crate::Data::U64($v) => $body.map(|b| $crate::Data::U64($crate::Buf::from_vec(b))),
            $crate::Data::Bool($v) => $body.map(|b| $crate::Data::Bool($crate::Buf::from_vec(b))),
            $crate::Data::Str($v) => $body.map(|b| $crate::Data::Str($crate::Buf::from_vec(b))),
            $crate::Data::Coded($v) => $body.map(|b| $crate::Data::Coded($crate::Buf::from_vec(b))),
        }
    };
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::I16(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::U16(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::U64(v) => v.len(),
            Data::Bool(v) => v.len(),
            Data::Str(v) => v.len(),
            Data::Coded(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the elements are a view of bytes owned elsewhere (a mapped file, a caller's
    /// buffer), which others may be able to write.
    pub fn is_shared(&self) -> bool {
        match self {
            Data::F32(b) => b.is_shared(),
            Data::F64(b) => b.is_shared(),
            Data::F16(b) => b.is_shared(),
            Data::BF16(b) => b.is_shared(),
            Data::I8(b) => b.is_shared(),
            Data::I16(b) => b.is_shared(),
            Data::I32(b) => b.is_shared(),
            Data::I64(b) => b.is_shared(),
            Data::U8(b) => b.is_shared(),
            Data::U16(b) => b.is_shared(),
            Data::U32(b) => b.is_shared(),
            Data::U64(b) => b.is_shared(),
            Data::Coded(b) => b.is_shared(),
            Data::Bool(_) | Data::Str(_) => false,
        }
    }

    /// Whether the elements live in a region of a run arena (only f32, int64, u8 and i8 can).
    pub fn is_region(&self) -> bool {
        match self {
            Data::F32(b) => b.is_region(),
            Data::I64(b) => b.is_region(),
            Data::U8(b) => b.is_region(),
            Data::I8(b) => b.is_region(),
            _ => false,
        }
    }

    /// Copies elements held in a region of a run arena into an owned vector: for values that
    /// leave the run.
    pub fn detach(&mut self) {
        match self {
            Data::F32(b) if b.is_region() => {
                b.make_mut();
            }
            Data::I64(b) if b.is_region() => {
                b.make_mut();
            }
            Data::U8(b) if b.is_region() => {
                b.make_mut();
            }
            Data::I8(b) if b.is_region() => {
                b.make_mut();
            }
            _ => {}
        }
    }

    /// Appends the elements of `other` (same variant) to `self`.
    pub fn append(&mut self, other: &Data) -> Result<(), TensorError> {
        match (self, other) {
            (Data::F32(a), Data::F32(b)) => a.extend_from_slice(b),
            (Data::F64(a), Data::F64(b)) => a.extend_from_slice(b),
            (Data::F16(a), Data::F16(b)) => a.extend_from_slice(b),
            (Data::BF16(a), Data::BF16(b)) => a.extend_from_slice(b),
            (Data::I8(a), Data::I8(b)) => a.extend_from_slice(b),
            (Data::I16(a), Data::I16(b)) => a.extend_from_slice(b),
            (Data::I32(a), Data::I32(b)) => a.extend_from_slice(b),
            (Data::I64(a), Data::I64(b)) => a.extend_from_slice(b),
            (Data::U8(a), Data::U8(b)) => a.extend_from_slice(b),
            (Data::U16(a), Data::U16(b)) => a.extend_from_slice(b),
            (Data::U32(a), Data::U32(b)) => a.extend_from_slice(b),
            (Data::U64(a), Data::U64(b)) => a.extend_from_slice(b),
            (Data::Bool(a), Data::Bool(b)) => a.extend_from_slice(b),
            (Data::Str(a), Data::Str(b)) => a.extend_from_slice(b),
            (Data::Coded(a), Data::Coded(b)) => a.extend_from_slice(b),
            (a, b) => {
                return Err(TensorError::DType {
                    expected: data_dtype(a),
                    got: data_dtype(b),
                });
            }
        }
        Ok(())
    }

    /// The elements as little-endian bytes, for the plain (fixed-size numeric and byte-coded)
    /// variants; `None` for bool and string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        Some(match self {
            Data::F32(v) => bytemuck::cast_slice(v),
            Data::F64(v) => bytemuck::cast_slice(v),
            Data::F16(v) => bytemuck::cast_slice(v),
            Data::BF16(v) => bytemuck::cast_slice(v),
            Data::I8(v) => bytemuck::cast_slice(v),
            Data::I16(v) => bytemuck::cast_slice(v),
            Data::I32(v) => bytemuck::cast_slice(v),
            Data::I64(v) => bytemuck::cast_slice(v),
            Data::U8(v) => v,
            Data::U16(v) => bytemuck::cast_slice(v),
            Data::U32(v) => bytemuck::cast_slice(v),
            Data::U64(v) => bytemuck::cast_slice(v),
            Data::Coded(v) => v,
            Data::Bool(_) | Data::Str(_) => return None,
        })
    }

    /// Storage of `dtype` viewing `bytes[start..end]` in place, or `None` when the dtype has no
    /// plain byte form (bool, string) or the range is out of bounds, misaligned or not a whole
    /// number of elements.
    pub fn shared(dtype: DType, bytes: SharedBytes, start: usize, end: usize) -> Option<Data> {
        Some(match dtype {
            DType::F32 => Data::F32(Buf::shared(bytes, start, end)?),
            DType::F64 => Data::F64(Buf::shared(bytes, start, end)?),
            DType::F16 => Data::F16(Buf::shared(bytes, start, end)?),
            DType::BF16 => Data::BF16(Buf::shared(bytes, start, end)?),
            DType::I8 => Data::I8(Buf::shared(bytes, start, end)?),
            DType::I16 => Data::I16(Buf::shared(bytes, start, end)?),
            DType::I32 => Data::I32(Buf::shared(bytes, start, end)?),
            DType::I64 => Data::I64(Buf::shared(bytes, start, end)?),
            DType::U8 => Data::U8(Buf::shared(bytes, start, end)?),
            DType::U16 => Data::U16(Buf::shared(bytes, start, end)?),
            DType::U32 => Data::U32(Buf::shared(bytes, start, end)?),
            DType::U64 => Data::U64(Buf::shared(bytes, start, end)?),
            DType::Bool | DType::String => return None,
            _ => Data::Coded(Buf::shared(bytes, start, end)?),
        })
    }

    /// Storage of `n` zero elements (empty strings, false, +0.0) for `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n].into()),
            DType::F64 => Data::F64(vec![0.0; n].into()),
            DType::F16 => Data::F16(vec![f16::ZERO; n].into()),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n].into()),
            DType::I8 => Data::I8(vec![0; n].into()),
            DType::I16 => Data::I16(vec![0; n].into()),
            DType::I32 => Data::I32(vec![0; n].into()),
            DType::I64 => Data::I64(vec![0; n].into()),
            DType::U8 => Data::U8(vec![0; n].into()),
            DType::U16 => Data::U16(vec![0; n].into()),
            DType::U32 => Data::U32(vec![0; n].into()),
            DType::U64 => Data::U64(vec![0; n].into()),
            DType::Bool => Data::Bool(vec![false; n].into()),
            DType::String => Data::Str(vec![String::new(); n].into()),
            _ => Data::Coded(vec![0; n].into()),
        }
    }

    /// The storage variant a dtype uses, for checking the invariant.
    fn matches(&self, dtype: DType) -> bool {
        matches!(
            (self, dtype),
            (Data::F32(_), DType::F32)
                | (Data::F64(_), DType::F64)
                | (Data::F16(_), DType::F16)
                | (Data::BF16(_), DType::BF16)
                | (Data::I8(_), DType::I8)
                | (Data::I16(_), DType::I16)
                | (Data::I32(_), DType::I32)
                | (Data::I64(_), DType::I64)
                | (Data::U8(_), DType::U8)
                | (Data::U16(_), DType::U16)
                | (Data::U32(_), DType::U32)
                | (Data::U64(_), DType::U64)
                | (Data::Bool(_), DType::Bool)
                | (Data::Str(_), DType::String)
        ) || (matches!(self, Data::Coded(_)) && dtype.is_byte_coded())
    }
}

/// A Rust element type with a fixed tensor dtype and storage variant.
pub trait Element: crate::buf::Plain {
    const DTYPE: DType;
    fn wrap(v: Vec<Self>) -> Data {
        Self::wrap_buf(Buf::from_vec(v))
    }
    fn wrap_buf(b: Buf<Self>) -> Data;
    fn slice(d: &Data) -> Option<&[Self]>;
    fn into_vec(d: Data) -> Option<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $dt:ident, $var:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            fn wrap_buf(b: Buf<Self>) -> Data {
                Data::$var(b)
            }
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$var(v) => Some(v),
                    _ => None,
                }
            }
            fn into_vec(d: Data) -> Option<Vec<Self>> {
                match d {
                    Data::$var(v) => Some(v.into_vec()),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32, F32);
element!(f64, F64, F64);
element!(f16, F16, F16);
element!(bf16, BF16, BF16);
element!(i8, I8, I8);
element!(i16, I16, I16);
element!(i32, I32, I32);
element!(i64, I64, I64);
element!(u8, U8, U8);
element!(u16, U16, U16);
element!(u32, U32, U32);
element!(u64, U64, U64);
element!(bool, Bool, Bool);
element!(String, String, Str);

/// Number of elements of a shape, or `None` when it overflows or exceeds [`MAX_ELEMENTS`].
pub fn numel(shape: &[usize]) -> Option<usize> {
    // A zero anywhere makes an empty tensor whatever the other dims are.
    if shape.contains(&0) {
        return Some(0);
    }
    let mut n: usize = 1;
    for &d in shape {
        n = n.checked_mul(d)?;
    }
    (n <= MAX_ELEMENTS).then_some(n)
}

/// A tensor's dimensions: kept inline up to rank 6 (every tensor of the bench models), so
/// making a tensor of such a shape allocates only its elements.
pub type Shape = smallvec::SmallVec<[usize; 6]>;

/// Row-major strides (in elements) of a shape.
pub fn strides_of(shape: &[usize]) -> Shape {
    let mut strides: Shape = smallvec::smallvec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Numpy-style multidirectional broadcast of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Shape, TensorError> {
    let rank = a.len().max(b.len());
    let mut out: Shape = smallvec::smallvec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(TensorError::Broadcast {
                a: a.to_vec(),
                b: b.to_vec(),
            });
        };
    }
    Ok(out)
}

/// A dense row-major tensor owning its elements (or viewing shared, read-only bytes).
/// Deserialising goes through [`Tensor::new`], so a stored tensor is checked like any other.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(try_from = "TensorRepr")]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: Data,
}

/// The serialised form of a [`Tensor`], checked on the way in.
#[derive(serde::Deserialize)]
struct TensorRepr {
    dtype: DType,
    shape: Shape,
    data: Data,
}

impl TryFrom<TensorRepr> for Tensor {
    type Error = TensorError;
    fn try_from(r: TensorRepr) -> Result<Tensor, TensorError> {
        Tensor::new(r.dtype, r.shape, r.data)
    }
}

impl Tensor {
    /// Builds a tensor, checking the element count against the shape and the storage variant
    /// against the dtype.
    pub fn new(dtype: DType, shape: impl Into<Shape>, data: Data) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        let len = numel(&shape).ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
            max: MAX_ELEMENTS,
        })?;
        if data.len() != len {
            return Err(TensorError::LengthMismatch {
                shape: shape.to_vec(),
                len,
                got: data.len(),
            });
        }
        if !data.matches(dtype) {
            return Err(TensorError::DType {
                expected: dtype,
                got: data_dtype(&data),
            });
        }
        Ok(Tensor { dtype, shape, data })
    }

    pub fn from_vec<T: Element>(shape: impl Into<Shape>, v: Vec<T>) -> Result<Tensor, TensorError> {
        Tensor::new(T::DTYPE, shape, T::wrap(v))
    }

    /// [`Tensor::from_vec`] over any storage (an arena region, for a planned output).
    pub fn from_buf<T: Element>(shape: impl Into<Shape>, b: Buf<T>) -> Result<Tensor, TensorError> {
        Tensor::new(T::DTYPE, shape, T::wrap_buf(b))
    }

    /// Copies elements held in a run arena's region into an owned vector (see [`Data::detach`]).
    pub fn detach(&mut self) {
        self.data.detach();
    }

    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor {
            dtype: T::DTYPE,
            shape: Shape::new(),
            data: T::wrap(vec![v]),
        }
    }

    /// A tensor of zeros; refuses shapes beyond [`MAX_ELEMENTS`] before allocating.
    pub fn zeros(dtype: DType, shape: impl Into<Shape>) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        let n = numel(&shape).ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
            max: MAX_ELEMENTS,
        })?;
        Ok(Tensor {
            dtype,
            shape,
            data: Data::zeros(dtype, n),
        })
    }

    /// A byte-coded tensor (float8, fp4, int4, int2, e8m0) from one code per element.
    pub fn from_codes(dtype: DType, shape: impl Into<Shape>, codes: Vec<u8>) -> Result<Tensor, TensorError> {
        Tensor::new(dtype, shape, Data::Coded(codes.into()))
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn data(&self) -> &Data {
        &self.data
    }
    pub fn into_data(self) -> Data {
        self.data
    }
    pub fn into_parts(self) -> (DType, Shape, Data) {
        (self.dtype, self.shape, self.data)
    }

    /// The elements as `&[T]` when the dtype is `T`'s.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        T::slice(&self.data).ok_or(TensorError::DType {
            expected: T::DTYPE,
            got: self.dtype,
        })
    }

    pub fn into_vec<T: Element>(self) -> Result<Vec<T>, TensorError> {
        let got = self.dtype;
        T::into_vec(self.data).ok_or(TensorError::DType {
            expected: T::DTYPE,
            got,
        })
    }

    /// The byte codes of a byte-coded tensor.
    pub fn codes(&self) -> Option<&[u8]> {
        match &self.data {
            Data::Coded(v) => Some(v),
            _ => None,
        }
    }

    /// Same elements, another shape with the same element count.
    pub fn reshape(self, shape: impl Into<Shape>) -> Result<Tensor, TensorError> {
        Tensor::new(self.dtype, shape, self.data)
    }

    /// New tensor whose element `i` is this tensor's element `idx[i]` (all indices must be in
    /// range; callers compute them from shapes they checked).
    pub fn gather_flat(&self, shape: impl Into<Shape>, idx: &[usize]) -> Result<Tensor, TensorError> {
        let data = map_data!(&self.data, v => idx.iter().map(|&i| v[i].clone()).collect());
        Tensor::new(self.dtype, shape, data)
    }

    /// A tensor of `shape` whose every element is this tensor's first (a fill: no index
    /// array). An empty tensor is an error unless `shape` has no elements.
    pub fn filled(&self, shape: impl Into<Shape>) -> Result<Tensor, TensorError> {
        let shape: Shape = shape.into();
        let n = numel(&shape).ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
            max: MAX_ELEMENTS,
        })?;
        if n > 0 && self.is_empty() {
            return Err(TensorError::LengthMismatch {
                shape: shape.to_vec(),
                len: n,
                got: 0,
            });
        }
        let data = map_data!(&self.data, v => v.first().map_or_else(Vec::new, |x| vec![x.clone(); n]));
        Tensor::new(self.dtype, shape, data)
    }

    /// [`Tensor::gather_flat`] with the indices produced one by one, in output order, by
    /// `index` (no index array: its 8 bytes per element outweighed a byte-sized output 8 to
    /// 1). An index out of range is an error. Answers a stop (`kiln_kernels::stop`) every
    /// 64Ki elements: the rest of the output is then left at zero (the run is ending).
    pub fn gather_flat_fn(
        &self,
        shape: impl Into<Shape>,
        mut index: impl FnMut() -> usize,
    ) -> Result<Tensor, TensorError> {
        let shape: Shape = shape.into();
        let n = numel(&shape).ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
            max: MAX_ELEMENTS,
        })?;
        let mut bad = false;
        let data = map_data!(&self.data, v => {
            let mut out: Vec<_> = (0..n)
                .map_while(|o| {
                    if o % (1 << 16) == 0 && o > 0 && kiln_kernels::stop::requested() {
                        return None;
                    }
                    Some(match v.get(index()) {
                        Some(x) => x.clone(),
                        None => {
                            bad = true;
                            Default::default()
                        }
                    })
                })
                .collect();
            out.resize(n, Default::default());
            out
        });
        if bad {
            return Err(TensorError::LengthMismatch {
                shape: shape.to_vec(),
                len: n,
                got: self.len(),
            });
        }
        Tensor::new(self.dtype, shape, data)
    }

    /// All elements of `parts` (same dtype) one after the other, as a 1-D tensor.
    pub fn concat_flat(parts: &[&Tensor]) -> Result<Tensor, TensorError> {
        let Some(first) = parts.first() else {
            return Err(TensorError::LengthMismatch {
                shape: vec![],
                len: 1,
                got: 0,
            });
        };
        let mut data = first.data.clone();
        for p in &parts[1..] {
            if p.dtype != first.dtype {
                return Err(TensorError::DType {
                    expected: first.dtype,
                    got: p.dtype,
                });
            }
            data.append(&p.data)?;
        }
        let n = data.len();
        Tensor::new(first.dtype, vec![n], data)
    }

    /// A tensor of `dtype` from f64 values: floats (incl. float8/fp4/e8m0, saturating) rounded
    /// to nearest, integers truncated toward zero and saturated (Rust's `as`), bool as
    /// non-zero. Strings are refused. Ops whose integer semantics differ convert themselves.
    pub fn from_f64(dtype: DType, shape: impl Into<Shape>, v: &[f64]) -> Result<Tensor, TensorError> {
        let data = match dtype {
            DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => Data::F64(v.to_vec().into()),
            DType::F16 => Data::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => Data::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
            DType::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
            DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
            DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
            DType::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
            DType::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
            DType::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
            DType::Bool => Data::Bool(v.iter().map(|&x| x != 0.0).collect()),
            DType::String => {
                return Err(TensorError::DType {
                    expected: DType::F64,
                    got: DType::String,
                });
            }
            d if d.is_float() => Data::Coded(
                v.iter()
                    .map(|&x| crate::formats::encode_float(d, x as f32, true))
                    .collect(),
            ),
            d => Data::Coded(v.iter().map(|&x| crate::formats::encode_int(d, x.trunc())).collect()),
        };
        Tensor::new(dtype, shape, data)
    }

    /// Element values converted to f64 (NaN for strings); byte-coded types are decoded.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.to_vec(),
            Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::I8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I16(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U16(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| if x { 1.0 } else { 0.0 }).collect(),
            Data::Str(v) => v.iter().map(|_| f64::NAN).collect(),
            Data::Coded(v) => v
                .iter()
                .map(|&c| crate::formats::decode(self.dtype, c) as f64)
                .collect(),
        }
    }

    /// Integer element values as i64 (for index-like inputs: shapes, axes, indices). Floats
    /// are truncated; `None` for strings.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match &self.data {
            Data::I64(v) => v.to_vec(),
            Data::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            Data::Str(_) => return None,
            _ => self.to_f64_vec().into_iter().map(|x| x as i64).collect(),
        })
    }
}

fn data_dtype(d: &Data) -> DType {
    match d {
        Data::F32(_) => DType::F32,
        Data::F64(_) => DType::F64,
        Data::F16(_) => DType::F16,
        Data::BF16(_) => DType::BF16,
        Data::I8(_) => DType::I8,
        Data::I16(_) => DType::I16,
        Data::I32(_) => DType::I32,
        Data::I64(_) => DType::I64,
        Data::U8(_) => DType::U8,
        Data::U16(_) => DType::U16,
        Data::U32(_) => DType::U32,
        Data::U64(_) => DType::U64,
        Data::Bool(_) => DType::Bool,
        Data::Str(_) => DType::String,
        Data::Coded(_) => DType::U8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]).unwrap().as_slice(), [2, 4, 3]);
        assert_eq!(broadcast_shapes(&[], &[5]).unwrap().as_slice(), [5]);
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 3]).unwrap().as_slice(), [0, 3]);
        assert!(broadcast_shapes(&[2, 3], &[3, 2]).is_err());
    }

    #[test]
    fn new_checks_length_and_variant() {
        assert!(Tensor::new(DType::F32, vec![2, 2], Data::F32(vec![0.0; 3].into())).is_err());
        assert!(Tensor::new(DType::F32, vec![2], Data::I32(vec![0; 2].into())).is_err());
        assert!(Tensor::new(DType::F8E4M3FN, vec![2], Data::Coded(vec![0; 2].into())).is_ok());
    }

    #[test]
    fn absurd_shapes_are_refused_before_allocation() {
        let e = Tensor::zeros(DType::F32, vec![1 << 20, 1 << 20]).unwrap_err();
        assert!(matches!(e, TensorError::TooLarge { .. }));
        assert_eq!(numel(&[usize::MAX, 2]), None);
        assert_eq!(numel(&[usize::MAX, 0]), Some(0));
    }

    #[test]
    fn from_f64_rounds_floats_and_truncates_ints() {
        let v = [1.7, -2.5, 300.0];
        assert_eq!(
            Tensor::from_f64(DType::F32, vec![3], &v)
                .unwrap()
                .as_slice::<f32>()
                .unwrap(),
            &[1.7, -2.5, 300.0]
        );
        assert_eq!(
            Tensor::from_f64(DType::I8, vec![3], &v)
                .unwrap()
                .as_slice::<i8>()
                .unwrap(),
            &[1, -2, 127]
        );
        assert_eq!(
            Tensor::from_f64(DType::U8, vec![3], &v)
                .unwrap()
                .as_slice::<u8>()
                .unwrap(),
            &[1, 0, 255]
        );
        let f8 = Tensor::from_f64(DType::F8E4M3FN, vec![3], &v).unwrap();
        assert_eq!(f8.to_f64_vec(), vec![1.75, -2.5, 288.0]);
        assert!(Tensor::from_f64(DType::String, vec![3], &v).is_err());
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(strides_of(&[2, 3, 4]).as_slice(), [12, 4, 1]);
        assert!(strides_of(&[]).is_empty());
    }
}
