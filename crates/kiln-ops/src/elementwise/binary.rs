//! Two-input elementwise ops with numpy (multidirectional) broadcasting.
//!
//! ONNX operators (<https://onnx.ai/onnx/operators/>), opsets 1 to 24 (BitShift's signed
//! types and out-of-range counts as in opset 28's tests): Add, Sub, Mul, Div, Pow, Mod,
//! BitShift, BitwiseAnd, BitwiseOr, BitwiseXor, And, Or, Xor, Equal, Less, LessOrEqual,
//! Greater, GreaterOrEqual. Opsets before 7 broadcast `B` onto `A` from an `axis` attribute;
//! that form is kept in [`Binary::legacy_axis`].

use super::scalar::{Int, Num, with_float, with_int, with_int2, with_num2};
use crate::error::{OpError, Result};
use crate::util::{checked_numel, norm_axis};
use kiln_tensor::{DType, Data, Element, Shape, Tensor, broadcast_shapes, numel};

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

/// How two shapes broadcast onto their common shape, as a loop nest: the output's dims with
/// runs of dims that both inputs read contiguously (or both repeat) merged, so the innermost
/// loop is one long run in which each input either advances by one or stays on one element.
/// Elementwise ops run that inner loop with the op inlined (no per-element index maps).
#[derive(Clone)]
pub(crate) struct Bcast {
    pub shape: Shape,
    /// Merged dims, outermost first (at least one; `[1]` for a scalar output).
    dims: Shape,
    /// Element strides of `a` and `b` per merged dim (0 where broadcast).
    sa: Shape,
    sb: Shape,
}

impl Bcast {
    pub fn new(a: &[usize], b: &[usize]) -> Result<Bcast> {
        let shape = broadcast_shapes(a, b)?;
        checked_numel(&shape)?;
        let (fa, fb) = (
            crate::util::broadcast_strides(a, &shape, 0)?,
            crate::util::broadcast_strides(b, &shape, 1)?,
        );
        let (mut dims, mut sa, mut sb) = (Shape::new(), Shape::new(), Shape::new());
        for ((&d, &x), &y) in shape.iter().zip(&fa).zip(&fb) {
            if d == 1 {
                continue;
            }
            // Merge into the previous dim when both inputs continue it: stride(prev) =
            // stride(this) * d for each (0 = 0 * d covers "both repeat").
            if let (Some(pd), Some(px), Some(py)) = (dims.last_mut(), sa.last_mut(), sb.last_mut())
                && *px == x * d
                && *py == y * d
            {
                *pd *= d;
                *px = x;
                *py = y;
                continue;
            }
            dims.push(d);
            sa.push(x);
            sb.push(y);
        }
        if dims.is_empty() {
            let empty = shape.contains(&0);
            dims.push(if empty { 0 } else { 1 });
            sa.push(0);
            sb.push(0);
        }
        Ok(Bcast { shape, dims, sa, sb })
    }

    /// Calls `run(a_offset, b_offset)` for every inner run, in output order; each run covers
    /// `inner()` output elements.
    fn for_each_run(&self, mut run: impl FnMut(usize, usize)) {
        let outer = &self.dims[..self.dims.len() - 1];
        if self.dims.iter().any(|&d| d == 0) {
            return;
        }
        let mut idx: Shape = smallvec::smallvec![0usize; outer.len()];
        let (mut ia, mut ib) = (0usize, 0usize);
        loop {
            run(ia, ib);
            // Odometer over the outer dims, innermost first.
            let mut k = outer.len();
            loop {
                if k == 0 {
                    return;
                }
                k -= 1;
                idx[k] += 1;
                ia += self.sa[k];
                ib += self.sb[k];
                if idx[k] < outer[k] {
                    break;
                }
                ia -= self.sa[k] * outer[k];
                ib -= self.sb[k] * outer[k];
                idx[k] = 0;
            }
        }
    }

    /// `f(x[i], y[j])` for every output element, `x[i]` and `y[j]` the elements broadcasting
    /// reads (the slices hold the elements of the shapes the plan was built from; a shorter
    /// slice gives a shorter result, which `Tensor::new` then refuses).
    pub fn zip<T: Copy, U: Copy, R>(&self, x: &[T], y: &[U], f: impl Fn(T, U) -> R) -> Vec<R> {
        let n = *self.dims.last().unwrap_or(&0);
        let (ka, kb) = (*self.sa.last().unwrap_or(&0), *self.sb.last().unwrap_or(&0));
        let mut out = Vec::with_capacity(numel(&self.shape).unwrap_or(0));
        self.for_each_run(|ia, ib| match (ka, kb) {
            (1, 1) => {
                if let (Some(xs), Some(ys)) = (x.get(ia..ia + n), y.get(ib..ib + n)) {
                    out.extend(xs.iter().zip(ys).map(|(&p, &q)| f(p, q)));
                }
            }
            (1, 0) => {
                if let (Some(xs), Some(&q)) = (x.get(ia..ia + n), y.get(ib)) {
                    out.extend(xs.iter().map(|&p| f(p, q)));
                }
            }
            (0, 1) => {
                if let (Some(&p), Some(ys)) = (x.get(ia), y.get(ib..ib + n)) {
                    out.extend(ys.iter().map(|&q| f(p, q)));
                }
            }
            _ => {
                for i in 0..n {
                    if let (Some(&p), Some(&q)) = (x.get(ia + i * ka), y.get(ib + i * kb)) {
                        out.push(f(p, q));
                    }
                }
            }
        });
        out
    }

    /// [`Self::zip`] over the current thread pool, for large outputs: whole steps of the
    /// outermost merged dim (or blocks of a single one) per task, each written into its own
    /// part of the output. `None` (nothing done) below [`PAR_MIN`] elements or on one thread.
    #[cfg(test)]
    pub fn zip_parallel<T, U, R>(&self, x: &[T], y: &[U], f: impl Fn(T, U) -> R + Sync) -> Option<Vec<R>>
    where
        T: Copy + Sync,
        U: Copy + Sync,
        R: Copy + Send + Default,
    {
        let mut out = vec![R::default(); numel(&self.shape)?];
        self.zip_parallel_into(x, y, f, &mut out).then_some(out)
    }

    /// [`Self::zip_parallel`] into `out` (the plan's element count); false (nothing done)
    /// when it does not apply.
    fn zip_parallel_into<T, U, R>(&self, x: &[T], y: &[U], f: impl Fn(T, U) -> R + Sync, out: &mut [R]) -> bool
    where
        T: Copy + Sync,
        U: Copy + Sync,
        R: Copy + Send,
    {
        let Some(total) = numel(&self.shape) else { return false };
        if total < PAR_MIN
            || out.len() != total
            || kiln_kernels::pool::current_threads() < 2
            || self.dims.contains(&0)
            || self.sa.is_empty()
        {
            return false;
        }
        // One "row": a step of the outermost dim, with the plan of the dims inside it.
        let (rows, sub, (sa0, sb0)) = if self.dims.len() >= 2 {
            let sub = Bcast {
                shape: Shape::new(),
                dims: Shape::from_slice(&self.dims[1..]),
                sa: Shape::from_slice(&self.sa[1..]),
                sb: Shape::from_slice(&self.sb[1..]),
            };
            (self.dims[0], sub, (self.sa[0], self.sb[0]))
        } else {
            // A single dim: blocks of PAR_BLOCK elements.
            let (ka, kb) = (self.sa[0], self.sb[0]);
            let sub = Bcast {
                shape: Shape::new(),
                dims: smallvec::smallvec![PAR_BLOCK],
                sa: smallvec::smallvec![ka],
                sb: smallvec::smallvec![kb],
            };
            (total.div_ceil(PAR_BLOCK), sub, (ka * PAR_BLOCK, kb * PAR_BLOCK))
        };
        let row_len = if self.dims.len() >= 2 {
            total / rows.max(1)
        } else {
            PAR_BLOCK
        };
        kiln_kernels::pool::for_each_chunk_mut(out, row_len.max(1), &|r, dst| {
            let (xs, ys) = (x.get(r * sa0..).unwrap_or(&[]), y.get(r * sb0..).unwrap_or(&[]));
            if dst.len() == row_len {
                sub.zip_into(xs, ys, &f, dst);
            } else {
                // The last, shorter block of a single dim.
                let tail = Bcast {
                    dims: smallvec::smallvec![dst.len()],
                    ..sub.clone()
                };
                tail.zip_into(xs, ys, &f, dst);
            }
        });
        true
    }

    /// Whether every element the plan reads lies within `x.len()` and `y.len()` elements.
    fn reads_within(&self, x_len: usize, y_len: usize) -> bool {
        if self.dims.contains(&0) {
            return true;
        }
        let last = |st: &[usize]| -> Option<usize> {
            self.dims
                .iter()
                .zip(st)
                .try_fold(0usize, |acc, (&d, &s)| acc.checked_add((d - 1).checked_mul(s)?))
        };
        matches!((last(&self.sa), last(&self.sb)), (Some(a), Some(b)) if a < x_len && b < y_len)
    }

    /// [`Self::zip`] into `out` (which has the plan's element count; a short input leaves
    /// the rest of `out` as it was).
    fn zip_into<T: Copy, U: Copy, R>(&self, x: &[T], y: &[U], f: &impl Fn(T, U) -> R, out: &mut [R]) {
        let n = *self.dims.last().unwrap_or(&0);
        let (ka, kb) = (*self.sa.last().unwrap_or(&0), *self.sb.last().unwrap_or(&0));
        let mut pos = 0usize;
        self.for_each_run(|ia, ib| {
            let Some(dst) = out.get_mut(pos..pos + n) else { return };
            pos += n;
            match (ka, kb) {
                (1, 1) => {
                    if let (Some(xs), Some(ys)) = (x.get(ia..ia + n), y.get(ib..ib + n)) {
                        for ((d, &p), &q) in dst.iter_mut().zip(xs).zip(ys) {
                            *d = f(p, q);
                        }
                    }
                }
                (1, 0) => {
                    if let (Some(xs), Some(&q)) = (x.get(ia..ia + n), y.get(ib)) {
                        for (d, &p) in dst.iter_mut().zip(xs) {
                            *d = f(p, q);
                        }
                    }
                }
                (0, 1) => {
                    if let (Some(&p), Some(ys)) = (x.get(ia), y.get(ib..ib + n)) {
                        for (d, &q) in dst.iter_mut().zip(ys) {
                            *d = f(p, q);
                        }
                    }
                }
                _ => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        if let (Some(&p), Some(&q)) = (x.get(ia + i * ka), y.get(ib + i * kb)) {
                            *d = f(p, q);
                        }
                    }
                }
            }
        });
    }

    /// [`Bcast::zip`] into a recycled buffer (every element written) when every read is in
    /// bounds, as it is for operands of the planned shapes.
    pub fn zip_recycled<T: Copy, U: Copy, R: kiln_kernels::recycle::Recycled>(
        &self,
        x: &[T],
        y: &[U],
        f: impl Fn(T, U) -> R,
    ) -> Vec<R> {
        if !self.reads_within(x.len(), y.len()) {
            return self.zip(x, y, f);
        }
        let mut out = kiln_kernels::recycle::take_of::<R>(numel(&self.shape).unwrap_or(0));
        self.zip_into(x, y, &f, &mut out);
        out
    }

    pub fn zip_ref<T, U, R>(&self, x: &[T], y: &[U], f: impl Fn(&T, &U) -> R) -> Vec<R> {
        let n = *self.dims.last().unwrap_or(&0);
        let (ka, kb) = (*self.sa.last().unwrap_or(&0), *self.sb.last().unwrap_or(&0));
        let mut out = Vec::with_capacity(numel(&self.shape).unwrap_or(0));
        self.for_each_run(|ia, ib| {
            for i in 0..n {
                if let (Some(p), Some(q)) = (x.get(ia + i * ka), y.get(ib + i * kb)) {
                    out.push(f(p, q));
                }
            }
        });
        out
    }
}

/// The shape `b` takes under opset < 7 broadcasting onto A (shape `a`) from `axis`: its
/// dims, followed by ones up to A's rank.
pub(crate) fn legacy_shape(a: &[usize], b: &[usize], axis: i64) -> Result<Vec<usize>> {
    let rank_a = a.len();
    if b.len() > rank_a {
        return Err(OpError::inputs(0, 1, "B of at most A's rank (legacy broadcast)", a, b));
    }
    if b.len() == rank_a {
        return Ok(b.to_vec());
    }
    let ax = norm_axis(axis, rank_a)?;
    if ax + b.len() > rank_a {
        return Err(OpError::inputs(
            0,
            1,
            format!("B within A's dims from axis {axis} (legacy broadcast)"),
            a,
            b,
        ));
    }
    let mut s = b.to_vec();
    s.resize(rank_a - ax, 1);
    Ok(s)
}

// Each arm passes its own function item, so the inner loop is monomorphised with the op
// inlined (and vectorised where the type allows).
/// Output elements from which binary ops split over the thread pool (256 KiB of f32).
const PAR_MIN: usize = 1 << 16;
/// Elements per task when the broadcast plan has a single dim.
const PAR_BLOCK: usize = 1 << 14;

fn arith<T: Num + Send + Sync + Default>(op: BinaryOp, x: &[T], y: &[T], m: &Bcast) -> kiln_tensor::Buf<T> {
    match op {
        BinaryOp::Sub => m.arith(x, y, T::sub),
        BinaryOp::Mul => m.arith(x, y, T::mul),
        BinaryOp::Div => m.arith(x, y, T::div),
        BinaryOp::Mod { fmod: true } => m.arith(x, y, T::fmod),
        BinaryOp::Mod { fmod: false } => m.arith(x, y, T::pymod),
        _ => m.arith(x, y, T::add),
    }
}

impl Bcast {
    /// `f(x, y)` over the plan, split over the pool when large. `f` is a function item (its
    /// own type), so each op's loop is compiled with the op inlined: as a `fn` pointer the
    /// parallel path made one indirect call per element (BERT's residual Adds on 2 threads
    /// took 5x their 1-thread time).
    pub(super) fn arith<T, F>(&self, x: &[T], y: &[T], f: F) -> kiln_tensor::Buf<T>
    where
        T: Num + Send + Sync,
        F: Fn(T, T) -> T + Sync,
    {
        if !self.reads_within(x.len(), y.len()) {
            // Inputs shorter than their shapes: a short result, which `Tensor::new` refuses.
            return kiln_tensor::Buf::from_vec(self.zip(x, y, f));
        }
        // Written whole below (every element the plan reads exists).
        let mut out = T::buffer(numel(&self.shape).unwrap_or(0));
        if !self.periodic_into(x, y, &f, &mut out) && !self.zip_parallel_into(x, y, &f, &mut out) {
            self.zip_into(x, y, &f, &mut out);
        }
        out
    }

    /// The period `n` when one operand is read whole and in order while the other repeats
    /// `n` contiguous elements along it (a per-channel parameter of a channels-last tensor:
    /// PRelu's slope, a bias, a scale), with `n` below [`PERIOD_SPAN`]; and whether the
    /// repeated one is `y`.
    pub(super) fn period(&self) -> Option<(usize, bool)> {
        let (&[_, n], &[sa0, 1], &[sb0, 1]) = (self.dims.as_slice(), self.sa.as_slice(), self.sb.as_slice()) else {
            return None;
        };
        if n >= PERIOD_SPAN {
            return None;
        }
        match (sa0, sb0) {
            (a, 0) if a == n => Some((n, true)),
            (0, b) if b == n => Some((n, false)),
            _ => None,
        }
    }

    /// [`Self::zip_into`] for a [`Self::period`] plan: the short operand repeated into a
    /// span of whole periods once, then one long run per span of the output, where the
    /// plan's runs were one period each (a 10-channel PRelu: ten elements per run, with
    /// the loop nest's bookkeeping and no vector loop between). Spans in parallel when
    /// large. False (nothing done) when the plan is not periodic or an operand is short.
    fn periodic_into<T, R>(&self, x: &[T], y: &[T], f: &(impl Fn(T, T) -> R + Sync), out: &mut [R]) -> bool
    where
        T: Copy + Sync,
        R: Copy + Send,
    {
        let Some((n, y_repeats)) = self.period() else {
            return false;
        };
        let total = out.len();
        // The plan reads `total` elements of the long operand and `n` of the short one.
        let (long_len, short) = if y_repeats {
            (x.len(), y.get(..n))
        } else {
            (y.len(), x.get(..n))
        };
        let Some(short) = short else { return false };
        if n == 0 || long_len < total || !total.is_multiple_of(n) {
            return false;
        }
        let span = n * (PERIOD_SPAN / n).max(1);
        let chunk = if total >= PAR_MIN {
            span * (PAR_BLOCK / span).max(1)
        } else {
            total.max(1)
        };
        let rep: Vec<T> = short.iter().copied().cycle().take(span).collect();
        if y_repeats {
            periodic_runs(x, &rep, chunk, out, f);
        } else {
            periodic_runs(y, &rep, chunk, out, &|l, r| f(r, l));
        }
        true
    }
}

/// Longest period [`Bcast::periodic_into`] takes, and about the span it repeats it into.
const PERIOD_SPAN: usize = 256;

/// `out[i] = f(long[i], rep[i % rep.len()])`, `chunk` elements (a multiple of `rep.len()`)
/// per task of the pool: [`Bcast::periodic_into`]'s loop (which swaps `f`'s operands when
/// the repeated one is the op's first).
fn periodic_runs<T, R>(long: &[T], rep: &[T], chunk: usize, out: &mut [R], f: &(impl Fn(T, T) -> R + Sync))
where
    T: Copy + Sync,
    R: Copy + Send,
{
    let span = rep.len().max(1);
    kiln_kernels::pool::for_each_chunk_mut(out, chunk, &|c, dst| {
        let ls = long.get(c * chunk..).unwrap_or(&[]);
        for (d, ls) in dst.chunks_mut(span).zip(ls.chunks(span)) {
            for ((d, &l), &r) in d.iter_mut().zip(ls).zip(rep) {
                *d = f(l, r);
            }
        }
    });
}

fn bits<T: Int>(op: BinaryOp, x: &[T], y: &[T], m: &Bcast) -> Vec<T> {
    match op {
        BinaryOp::BitShift { left: true } => m.zip(x, y, T::shl),
        BinaryOp::BitShift { left: false } => m.zip(x, y, T::shr),
        BinaryOp::BitwiseOr => m.zip(x, y, T::or),
        BinaryOp::BitwiseXor => m.zip(x, y, T::xor),
        _ => m.zip(x, y, T::and),
    }
}

/// [`compare`] for plain values: the vectorisable runs of [`Bcast::zip_recycled`] (a
/// one-hot's `Equal` of [4, 2048, 1] against [1, 1, 257] ran at 2.4 ns per element through
/// the per-element reads of `zip_ref`).
fn compare_copy<T: PartialOrd + Copy>(op: BinaryOp, x: &[T], y: &[T], m: &Bcast) -> Vec<bool> {
    match op {
        BinaryOp::Less => m.zip_recycled(x, y, |a, b| a < b),
        BinaryOp::LessOrEqual => m.zip_recycled(x, y, |a, b| a <= b),
        BinaryOp::Greater => m.zip_recycled(x, y, |a, b| a > b),
        BinaryOp::GreaterOrEqual => m.zip_recycled(x, y, |a, b| a >= b),
        _ => m.zip_recycled(x, y, |a, b| a == b),
    }
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
    // A square (the commonest exponent: norms, variances, STFT magnitudes): `a * a` in f64 is
    // exact for every type up to f32 and rounds once, as powf(a, 2) does, without its cost.
    if e.len() == 1 && e.first() == Some(&2.0) {
        return m.zip(x, e, |a, _| {
            let a = a.to_f64();
            T::from_f64(a * a)
        });
    }
    m.zip(x, e, |a, b| T::from_f64(a.to_f64().powf(b)))
}

fn pow_by_int<T: Int>(x: &[T], e: &[i64], m: &Bcast) -> Vec<T> {
    m.zip(x, e, |a, b| a.int_pow(b))
}

impl Binary {
    pub fn name(&self) -> &'static str {
        self.op.name()
    }

    pub fn apply(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        use BinaryOp::*;
        let out_dt = self.op.out_dtype(a.dtype(), b.dtype())?;
        let b_shape = match self.legacy_axis {
            Some(axis) => Shape::from(legacy_shape(a.shape(), b.shape(), axis)?),
            None => Shape::from_slice(b.shape()),
        };
        let m = Bcast::new(a.shape(), &b_shape)?;
        let unsupported = || OpError::UnsupportedDType {
            index: 0,
            got: a.dtype(),
        };
        let data = match self.op {
            Add | Sub | Mul | Div | Mod { .. } => {
                with_num2!(a.data(), b.data(), (x, y) => Element::wrap_buf(arith(self.op, x, y, &m)), else return Err(unsupported()))
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
                        And => m.zip_recycled(x, y, |p, q| p && q),
                        Or => m.zip_recycled(x, y, |p, q| p || q),
                        _ => m.zip_recycled(x, y, |p, q| p != q),
                    }
                    .into(),
                ),
                _ => return Err(unsupported()),
            },
            Equal | Less | LessOrEqual | Greater | GreaterOrEqual => match (a.data(), b.data()) {
                (Data::Bool(x), Data::Bool(y)) => Data::Bool(compare_copy(self.op, x, y, &m).into()),
                (Data::Str(x), Data::Str(y)) => Data::Bool(compare(self.op, x, y, &m).into()),
                (da, db) => Data::Bool(
                    with_num2!(da, db, (x, y) => compare_copy(self.op, x, y, &m), else return Err(unsupported()))
                        .into(),
                ),
            },
        };
        Ok(Tensor::new(out_dt, m.shape, data)?)
    }
}
