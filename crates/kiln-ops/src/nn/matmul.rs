//! Matrix products: `MatMul` (opset 1–13, numpy semantics), `Gemm` (opset 1–13) and `Einsum`
//! (opset 12), per <https://onnx.ai/onnx/operators/onnx__MatMul.html>,
//! <https://onnx.ai/onnx/operators/onnx__Gemm.html> and
//! <https://onnx.ai/onnx/operators/onnx__Einsum.html>.

use super::FastEpilogue;
use super::activation::{self, Activation};
use super::{Real, from_f64s, from_floats, input_shape, numel, tensor_type};
use crate::elementwise::{Binary, BinaryOp};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};
use kiln_kernels::gemm::{GemmScalar, MatLayout, gemm};
use kiln_tensor::{DType, Element, Shape, Tensor};

/// `MatMul`: numpy `matmul` (batch broadcasting; 1-D operands are promoted and the added dim
/// removed).
///
/// The compiler may give it a third input, a bias added to the product exactly as the `Add`
/// node it replaces did (`Y = A·B + bias`, numpy broadcasting, the product rounded first), a
/// fourth, a residual of the output's shape added after the bias (a transformer block's skip
/// connection: `Y = A·B + bias + R`, each sum rounded), and an activation applied after that.
///
/// A fused activation and prepacked weights are the compiler's plan
/// ([`crate::fast::GemmPlan`]), not attributes: ONNX's MatMul has none.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct MatMul {}

/// The shapes of a matmul: promoted operand shapes, batch shape, (m, k, n), output shape.
struct MatMulPlan {
    a_batch: Shape,
    b_batch: Shape,
    batch: Shape,
    m: usize,
    k: usize,
    n: usize,
    out: Shape,
}

fn matmul_plan(a: &[usize], b: &[usize]) -> Result<MatMulPlan> {
    for (i, s) in [a, b].into_iter().enumerate() {
        if s.is_empty() {
            return Err(OpError::input_shape(i, "rank >= 1", s));
        }
    }
    let mut pa = Shape::from_slice(a);
    let mut pb = Shape::from_slice(b);
    if pa.len() == 1 {
        pa.insert(0, 1);
    }
    if pb.len() == 1 {
        pb.push(1);
    }
    let (m, k) = (pa[pa.len() - 2], pa[pa.len() - 1]);
    let (k2, n) = (pb[pb.len() - 2], pb[pb.len() - 1]);
    if k != k2 {
        return Err(OpError::inputs(
            0,
            1,
            format!("A's columns ({k}) equal to B's rows ({k2})"),
            a,
            b,
        ));
    }
    let a_batch = Shape::from_slice(&pa[..pa.len() - 2]);
    let b_batch = Shape::from_slice(&pb[..pb.len() - 2]);
    let batch = kiln_tensor::broadcast_shapes(&a_batch, &b_batch)?;
    let mut out = batch.clone();
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    // One B for every matrix of an unbroadcast A: the batch is one product of `batch * m` rows
    // (the row-major output is laid out the same), so B streams once, not once per matrix.
    if b_batch.iter().all(|&d| d == 1) && a_batch == batch {
        let rows = numel(&batch)?
            .checked_mul(m)
            .ok_or_else(|| OpError::too_large("A of shape", format!("{a:?}")))?;
        return Ok(MatMulPlan {
            a_batch: Shape::new(),
            b_batch: Shape::new(),
            batch: Shape::new(),
            m: rows,
            k,
            n,
            out,
        });
    }
    Ok(MatMulPlan {
        a_batch,
        b_batch,
        batch,
        m,
        k,
        n,
        out,
    })
}

/// A fast GEMM for one matrix of the batch (see [`Real::fast_gemm`]); `None` for no fast path.
type FastGemm<T> =
    for<'a> fn(usize, usize, usize, &[T], MatLayout, &[T], MatLayout, &mut [T], FastEpilogue<'a, T>) -> Option<bool>;

fn no_fast_gemm<T>(
    _: usize,
    _: usize,
    _: usize,
    _: &[T],
    _: MatLayout,
    _: &[T],
    _: MatLayout,
    _: &mut [T],
    _: FastEpilogue<'_, T>,
) -> Option<bool> {
    None
}

/// The batched product, and whether every matrix went through `fast` (which then applied
/// `ep`); otherwise nothing of `ep` was applied. `None` when the operands' data do not fill
/// their shapes.
/// Products of at most this many multiply-adds in a batch of two or more run one per thread.
const BATCH_SPLIT_MAX_MACS: usize = 1 << 21;

fn matmul_core<T: GemmScalar + kiln_tensor::Plain>(
    p: &MatMulPlan,
    a: &[T],
    b: &[T],
    fast: FastGemm<T>,
    ep: FastEpilogue<'_, T>,
) -> Result<Option<(kiln_tensor::Buf<T>, bool)>> {
    let nb = numel(&p.batch)?;
    // Each operand's matrix for every matrix of the batch: its offset under broadcasting.
    let (sa, sb) = (
        util::broadcast_strides(&p.a_batch, &p.batch, 0)?,
        util::broadcast_strides(&p.b_batch, &p.batch, 1)?,
    );
    let (m, k, n) = (p.m, p.k, p.n);
    // Every matrix is overwritten whole (or the call fails).
    let len = numel(&[nb, m, n])?;
    let mut out = match T::planned_out(len) {
        Some(r) => kiln_tensor::Buf::from_region(r),
        None => kiln_tensor::Buf::from_vec(T::out_buffer(len)),
    };
    let (la, lb) = (MatLayout::row_major(k), MatLayout::row_major(n));
    // A batch of small products (attention's heads: 128 x 128 x 32 each) splits over the pool
    // by matrix, each product on one thread: a product that small splits poorly inside.
    if nb >= 2 && m * n > 0 && m * n * k <= BATCH_SPLIT_MAX_MACS && kiln_kernels::pool::current_threads() > 1 {
        let mut offsets = Vec::with_capacity(nb);
        util::for_each_offset(&p.batch, [&sa, &sb], |[ai, bi]| offsets.push((ai, bi)));
        let ok = std::sync::atomic::AtomicBool::new(offsets.len() == nb);
        let all_fast = std::sync::atomic::AtomicBool::new(true);
        kiln_kernels::pool::for_each_chunk_mut(&mut out, m * n, &|i, out_i| {
            let done = offsets.get(i).and_then(|&(ai, bi)| {
                let a_i = a.get(ai * m * k..(ai + 1) * m * k)?;
                let b_i = b.get(bi * k * n..(bi + 1) * k * n)?;
                Some(match fast(m, n, k, a_i, la, b_i, lb, out_i, ep) {
                    Some(done) => done,
                    None => {
                        all_fast.store(false, std::sync::atomic::Ordering::Relaxed);
                        gemm(m, n, k, a_i, la, b_i, lb, out_i)
                    }
                })
            });
            if done != Some(true) {
                ok.store(false, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let ok = ok.into_inner();
        return Ok(ok.then_some((out, all_fast.into_inner())));
    }
    let mut all_fast = nb > 0;
    let mut ok = true;
    let mut outs = out.chunks_exact_mut((m * n).max(1));
    util::for_each_offset(&p.batch, [&sa, &sb], |[ai, bi]| {
        if !ok {
            return;
        }
        // An empty product (m or n is 0) has empty matrices, which `chunks_exact_mut` skips.
        let out_i = if m * n == 0 { Some(&mut [][..]) } else { outs.next() };
        let (Some(a_i), Some(b_i), Some(out_i)) = (
            a.get(ai * m * k..(ai + 1) * m * k),
            b.get(bi * k * n..(bi + 1) * k * n),
            out_i,
        ) else {
            ok = false;
            return;
        };
        ok &= match fast(m, n, k, a_i, la, b_i, lb, out_i, ep) {
            Some(done) => done,
            None => {
                all_fast = false;
                gemm(m, n, k, a_i, la, b_i, lb, out_i)
            }
        };
    });
    Ok(ok.then_some((out, all_fast)))
}

/// Operands whose data do not fill their shapes.
fn short_operands(a: &Tensor, b: &Tensor) -> OpError {
    OpError::inputs(0, 1, "operands whose data fill their shapes", a.shape(), b.shape())
}

/// The float product; with `ep` (f32 only) the bias and activation go into the kernels'
/// epilogue, and the flag says whether they were applied.
fn matmul_float<T: Real>(p: &MatMulPlan, a: &Tensor, b: &Tensor, ep: FastEpilogue<'_, T>) -> Result<(Tensor, bool)> {
    let ad = super::floats::<T>(a, 0)?;
    let bd = super::floats::<T>(b, 1)?;
    let (y, fused) = matmul_core(p, &ad, &bd, T::fast_gemm, ep)?.ok_or_else(|| short_operands(a, b))?;
    Ok((from_floats(a.dtype(), p.out.clone(), y)?, fused))
}

fn matmul_int<T: GemmScalar + Element>(p: &MatMulPlan, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (y, _) = matmul_core(
        p,
        a.as_slice::<T>()?,
        b.as_slice::<T>()?,
        no_fast_gemm::<T>,
        FastEpilogue::none(),
    )?
    .ok_or_else(|| short_operands(a, b))?;
    Ok(Tensor::from_buf(p.out.clone(), y)?)
}

/// The bias as a per-column slice the GEMM epilogue can add, when it is one: f32, `n` values
/// along the last axis (leading dims 1), and no higher rank than the product (a higher-rank bias
/// would broadcast the output up, which the `Add` fallback does).
pub(crate) fn epilogue_bias(t: &Tensor, n: usize, out_rank: usize) -> Option<&[f32]> {
    let along_last = t.len() == n && t.rank() <= out_rank && t.shape().iter().rev().skip(1).all(|&d| d == 1);
    if along_last { t.as_slice::<f32>().ok() } else { None }
}

impl MatMul {
    /// A and B, of one element type.
    pub(crate) fn operands<'a>(args: &Args<'a>) -> Result<(&'a Tensor, &'a Tensor)> {
        let (a, b) = (args.tensor(0)?, args.tensor(1)?);
        if a.dtype() != b.dtype() {
            return Err(OpError::DTypeMismatch {
                a: a.dtype(),
                b: b.dtype(),
            });
        }
        Ok((a, b))
    }

    /// The reference semantics, the bias and residual inputs included.
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        self.eval_with(None, args)
    }

    /// The product, bias and residual, then `act` (a plan's fused activation): on the f32
    /// kernels' epilogue where it fits, else applied after.
    pub(crate) fn eval_with(&self, act: Option<Activation>, args: &Args<'_>) -> Result<crate::Outputs> {
        let (a, b) = Self::operands(args)?;
        let bias = args.opt_tensor(2)?;
        let resid = args.opt_tensor(3)?;
        let p = matmul_plan(a.shape(), b.shape())?;
        // f32: a bias along the last axis and the activation go into the kernels' epilogue.
        if a.dtype() == DType::F32 && p.out.last() == Some(&p.n) && resid.is_none() {
            let col_bias = match bias {
                None => Some(None),
                Some(t) => epilogue_bias(t, p.n, p.out.len()).map(Some),
            };
            if let Some(col_bias) = col_bias {
                let ep = FastEpilogue {
                    row_bias: None,
                    col_bias,
                    act: act.map(|a| a.kernel_act()),
                };
                let (y, fused) = matmul_float::<f32>(&p, a, b, ep)?;
                if fused {
                    return Ok(smallvec::smallvec![y.into()]);
                }
                return self.finish(y, bias, None, act);
            }
        }
        let y = match a.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => matmul_float::<f32>(&p, a, b, FastEpilogue::none())?.0,
            DType::F64 => matmul_float::<f64>(&p, a, b, FastEpilogue::none())?.0,
            DType::I32 => matmul_int::<i32>(&p, a, b)?,
            DType::I64 => matmul_int::<i64>(&p, a, b)?,
            DType::U32 => matmul_int::<u32>(&p, a, b)?,
            DType::U64 => matmul_int::<u64>(&p, a, b)?,
            d => return Err(OpError::UnsupportedDType { index: 0, got: d }),
        };
        self.finish(y, bias, resid, act)
    }

    /// The bias, the residual and the activation after a plain product.
    pub(crate) fn finish(
        &self,
        y: Tensor,
        bias: Option<&Tensor>,
        resid: Option<&Tensor>,
        act: Option<Activation>,
    ) -> Result<crate::Outputs> {
        let add = Binary {
            op: BinaryOp::Add,
            legacy_axis: None,
        };
        // Each sum is a new tensor; the one it replaces goes back to the run's arena, as the
        // runtime gives back the values it frees.
        let plus = |y: Tensor, other: Option<&Tensor>| -> Result<Tensor> {
            let Some(other) = other else { return Ok(y) };
            let z = add.apply(&y, other)?;
            // (A planned range of the run arena is released by dropping it.)
            if !y.data().is_region()
                && let Ok(v) = y.into_vec::<f32>()
            {
                kiln_kernels::recycle::give(v);
            }
            Ok(z)
        };
        let y = plus(plus(y, bias)?, resid)?;
        Ok(smallvec::smallvec![activation::apply(act.as_ref(), y)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let (Some(a), Some(b)) = (input_shape(inputs, 0), input_shape(inputs, 1)) else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        for (i, s) in [&a, &b].into_iter().enumerate() {
            if s.is_empty() {
                return Err(OpError::input_shape(i, "rank >= 1", &[]));
            }
        }
        let ab = if a.len() >= 2 { &a[..a.len() - 2] } else { &[][..] };
        let bb = if b.len() >= 2 { &b[..b.len() - 2] } else { &[][..] };
        let Some(mut out) = util::broadcast_dims(ab, bb) else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        if a.len() >= 2 {
            out.push(a[a.len() - 2].clone());
        }
        if b.len() >= 2 {
            out.push(b[b.len() - 1].clone());
        }
        Ok(vec![tensor_type(dtype, Some(out))])
    }
}

/// `Gemm`: `Y = alpha * op(A) * op(B) + beta * C`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
}

impl Default for Gemm {
    fn default() -> Gemm {
        Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: false,
        }
    }
}

impl Gemm {
    fn dims(&self, a: &[usize], b: &[usize]) -> Result<(usize, usize, usize)> {
        for (i, s) in [a, b].into_iter().enumerate() {
            if s.len() != 2 {
                return Err(OpError::input_shape(i, "rank 2", s));
            }
        }
        let (m, k) = if self.trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
        let (k2, n) = if self.trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
        if k != k2 {
            return Err(OpError::inputs(
                0,
                1,
                format!(
                    "op(A)'s columns ({k}) equal to op(B)'s rows ({k2}) (transA {}, transB {})",
                    self.trans_a, self.trans_b
                ),
                a,
                b,
            ));
        }
        Ok((m, k, n))
    }

    fn run<T: Real>(&self, a: &Tensor, b: &Tensor, c: Option<&Tensor>) -> Result<Vec<T>> {
        let (m, k, n) = self.dims(a.shape(), b.shape())?;
        let ad = super::floats::<T>(a, 0)?;
        let bd = super::floats::<T>(b, 1)?;
        let la = if self.trans_a {
            MatLayout::transposed(m)
        } else {
            MatLayout::row_major(k)
        };
        let lb = if self.trans_b {
            MatLayout::transposed(k)
        } else {
            MatLayout::row_major(n)
        };
        let mut y = vec![T::zero(); numel(&[m, n])?];
        let ok = match T::fast_gemm(m, n, k, &ad, la, &bd, lb, &mut y, FastEpilogue::none()) {
            Some(done) => done,
            None => gemm(m, n, k, &ad, la, &bd, lb, &mut y),
        };
        if !ok {
            return Err(short_operands(a, b));
        }
        self.scale_and_add(&mut y, c, m, n)?;
        Ok(y)
    }

    /// `alpha * y + beta * C` on the product `y`.
    pub(crate) fn scale_and_add<T: Real>(&self, y: &mut [T], c: Option<&Tensor>, m: usize, n: usize) -> Result<()> {
        let alpha = T::from_f64(self.alpha as f64);
        if self.alpha != 1.0 {
            y.iter_mut().for_each(|v| *v = *v * alpha);
        }
        if let Some(c) = c
            && self.beta != 0.0
        {
            let cd = super::floats::<T>(c, 2)?;
            let beta = T::from_f64(self.beta as f64);
            // C broadcasts to [m, n] (rank <= 2): per row of Y, its row of C, or the one value
            // of a row broadcast along the columns.
            let st = util::broadcast_strides(c.shape(), &[m, n], 2)?;
            let (sm, sn) = (st.first().copied().unwrap_or(0), st.get(1).copied().unwrap_or(0));
            for (r, row) in y.chunks_exact_mut(n.max(1)).enumerate() {
                let base = r * sm;
                if sn == 0 {
                    let b = beta * cd.get(base).copied().unwrap_or_else(T::zero);
                    row.iter_mut().for_each(|v| *v += b);
                } else if let Some(cr) = cd.get(base..base + n) {
                    row.iter_mut().zip(cr).for_each(|(v, &b)| *v += beta * b);
                }
            }
        }
        Ok(())
    }

    /// The reference semantics.
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        self.eval_with(None, args)
    }

    /// The reference, then `act` (a plan's fused activation).
    pub(crate) fn eval_with(&self, act: Option<Activation>, args: &Args<'_>) -> Result<crate::Outputs> {
        let a = args.tensor(0)?;
        let b = args.tensor(1)?;
        let c = args.opt_tensor(2)?;
        let (m, _, n) = self.dims(a.shape(), b.shape())?;
        let y = match a.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => from_floats(a.dtype(), vec![m, n], self.run::<f32>(a, b, c)?)?,
            DType::F64 => from_floats(a.dtype(), vec![m, n], self.run::<f64>(a, b, c)?)?,
            DType::I32 | DType::I64 | DType::U32 | DType::U64 => {
                // Integer Gemm: exact for the magnitudes f64 holds.
                let conv = |t: &Tensor| Tensor::from_vec(t.shape(), t.to_f64_vec());
                let (af, bf) = (conv(a)?, conv(b)?);
                let cf = c.map(conv).transpose()?;
                from_f64s(a.dtype(), vec![m, n], &self.run::<f64>(&af, &bf, cf.as_ref())?)?
            }
            d => return Err(OpError::UnsupportedDType { index: 0, got: d }),
        };
        Ok(smallvec::smallvec![activation::apply(act.as_ref(), y)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        match (input_shape(inputs, 0), input_shape(inputs, 1)) {
            (Some(a), Some(b)) if a.len() == 2 && b.len() == 2 => {
                let m = if self.trans_a { a[1].clone() } else { a[0].clone() };
                let n = if self.trans_b { b[0].clone() } else { b[1].clone() };
                Ok(vec![tensor_type(dtype, Some(vec![m, n]))])
            }
            (a, b) => {
                // A rank other than 2, named here when the shape is all fixed (else at evaluation).
                for (i, s) in [(0, a), (1, b)] {
                    if let Some(s) = s.filter(|s| s.len() != 2).and_then(|s| util::fixed(&s)) {
                        return Err(OpError::input_shape(i, "rank 2", &s));
                    }
                }
                Ok(vec![util::dtype_only(dtype)])
            }
        }
    }
}

/// `Einsum`: the equation, as given (spaces are ignored).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Einsum {
    pub equation: String,
}

/// A parsed einsum term: letters as labels 0..52, `None` for the ellipsis.
type Term = Vec<Option<u8>>;

struct EinsumPlan {
    /// Size of every label (letters 0..52, ellipsis dims 52..).
    sizes: Vec<usize>,
    /// Output labels in order.
    out: Vec<usize>,
    /// Labels summed over.
    sum: Vec<usize>,
    /// Per input, per label: element stride (0 when absent or broadcast).
    strides: Vec<Vec<usize>>,
}

/// A malformed equation.
fn bad_equation(expected: &'static str, eq: &str) -> OpError {
    OpError::attribute("equation", expected, format!("{eq:?}"))
}

fn label(c: char, eq: &str) -> Result<u8> {
    match c {
        'a'..='z' => Ok(c as u8 - b'a' + 26),
        'A'..='Z' => Ok(c as u8 - b'A'),
        _ => Err(bad_equation("labels a-z and A-Z, ',', '...' and '->'", eq)),
    }
}

/// A label's letter, or its place among the ellipsis dims.
fn label_name(l: usize) -> String {
    match l {
        0..26 => char::from(b'A' + l as u8).to_string(),
        26..52 => char::from(b'a' + (l - 26) as u8).to_string(),
        _ => format!("of ellipsis dim {}", l - 52),
    }
}

/// A term of the equation `eq`.
fn parse_term(s: &str, eq: &str) -> Result<Term> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("...") {
            if out.contains(&None) {
                return Err(bad_equation("at most one ellipsis per term", eq));
            }
            out.push(None);
            rest = &rest[3..];
        } else {
            out.push(Some(label(c, eq)?));
            rest = &rest[c.len_utf8()..];
        }
    }
    Ok(out)
}

impl Einsum {
    fn plan(&self, shapes: &[Vec<usize>]) -> Result<EinsumPlan> {
        let eq: String = self.equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms = lhs.split(',').map(|t| parse_term(t, &eq)).collect::<Result<Vec<_>>>()?;
        if terms.len() != shapes.len() {
            return Err(OpError::attribute(
                "equation",
                format!("{} operands, one per input", shapes.len()),
                format!("{eq:?}, of {} operands", terms.len()),
            ));
        }
        // Ellipsis rank: the broadcast of every operand's ellipsis part.
        let mut ell_rank = 0usize;
        for (i, ((t, s), text)) in terms.iter().zip(shapes).zip(lhs.split(',')).enumerate() {
            let letters = t.iter().filter(|l| l.is_some()).count();
            let has_ell = t.contains(&None);
            if s.len() < letters || (!has_ell && s.len() != letters) {
                let rank = if has_ell { "at least " } else { "" };
                return Err(OpError::input_shape(
                    i,
                    format!("rank {rank}{letters}, as its term {text:?}"),
                    s,
                ));
            }
            if has_ell {
                ell_rank = ell_rank.max(s.len() - letters);
            }
        }
        let nl = 52 + ell_rank;
        let mut sizes = vec![0usize; nl];
        let mut seen = vec![false; nl];
        let mut count = vec![0usize; nl];
        let mut strides = vec![vec![0usize; nl]; shapes.len()];
        let mut dim_labels: Vec<Vec<usize>> = Vec::with_capacity(shapes.len());
        // The input that set each label's size.
        let mut set_by = vec![0usize; nl];
        for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
            let letters = t.iter().filter(|l| l.is_some()).count();
            let er = s.len() - letters;
            let mut labels_of_dims = Vec::with_capacity(s.len());
            for l in t {
                match l {
                    Some(l) => labels_of_dims.push(*l as usize),
                    None => labels_of_dims.extend((0..er).map(|j| 52 + ell_rank - er + j)),
                }
            }
            for (d, &l) in labels_of_dims.iter().enumerate() {
                let size = s[d];
                if !seen[l] || sizes[l] == 1 {
                    sizes[l] = size;
                    set_by[l] = i;
                } else if size != sizes[l] && size != 1 {
                    return Err(OpError::inputs(
                        set_by[l],
                        i,
                        format!("the same size for label {} ({} and {size})", label_name(l), sizes[l]),
                        &shapes[set_by[l]],
                        s,
                    ));
                }
                seen[l] = true;
                count[l] += 1;
            }
            dim_labels.push(labels_of_dims);
        }
        // Strides once sizes are final; broadcast (size-1) dims contribute none.
        for (ti, (labels, s)) in dim_labels.iter().zip(shapes).enumerate() {
            let st = kiln_tensor::strides_of(s);
            for (d, &l) in labels.iter().enumerate() {
                if s[d] == sizes[l] {
                    strides[ti][l] += st[d];
                }
            }
        }
        let out: Vec<usize> = match rhs {
            Some(r) => {
                let t = parse_term(r, &eq)?;
                let mut o = Vec::new();
                for l in t {
                    match l {
                        Some(l) => {
                            let l = l as usize;
                            if !seen[l] || o.contains(&l) {
                                return Err(bad_equation("output labels found in the inputs, each once", &eq));
                            }
                            o.push(l);
                        }
                        None => o.extend(52..nl),
                    }
                }
                o
            }
            None => {
                let mut o: Vec<usize> = (52..nl).collect();
                o.extend((0..52).filter(|&l| count[l] == 1));
                o
            }
        };
        let sum: Vec<usize> = (0..nl).filter(|l| seen[*l] && !out.contains(l)).collect();
        Ok(EinsumPlan {
            sizes,
            out,
            sum,
            strides,
        })
    }

    /// Multiply-accumulates: one per point of the full label space.
    pub fn macs(&self, shapes: &[Vec<usize>]) -> Option<u64> {
        let p = self.plan(shapes).ok()?;
        Some(
            p.out
                .iter()
                .chain(&p.sum)
                .fold(1u64, |a, &l| a.saturating_mul(p.sizes[l] as u64)),
        )
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let ts = args.tensors()?;
        let Some(first) = ts.first() else {
            return Err(OpError::MissingInput { index: 0 });
        };
        let dtype = first.dtype();
        for (i, t) in ts.iter().enumerate() {
            if t.dtype() != dtype {
                return Err(OpError::DTypeMismatch { a: dtype, b: t.dtype() });
            }
            if !(t.dtype().is_float() || t.dtype().is_int()) || t.dtype().is_byte_coded() {
                return Err(OpError::UnsupportedDType {
                    index: i,
                    got: t.dtype(),
                });
            }
        }
        let shapes: Vec<Vec<usize>> = ts.iter().map(|t| t.shape().to_vec()).collect();
        let p = self.plan(&shapes)?;
        let data: Vec<Vec<f64>> = ts.iter().map(|t| t.to_f64_vec()).collect();
        let out_shape: Vec<usize> = p.out.iter().map(|&l| p.sizes[l]).collect();
        let sum_shape: Vec<usize> = p.sum.iter().map(|&l| p.sizes[l]).collect();
        let total = numel(&out_shape)?;
        let nsum = numel(&sum_shape)?;
        let mut y = vec![0.0f64; total];
        let nin = data.len();
        let ostr: Vec<Vec<usize>> = (0..nin)
            .map(|i| p.out.iter().map(|&l| p.strides[i][l]).collect())
            .collect();
        let sstr: Vec<Vec<usize>> = (0..nin)
            .map(|i| p.sum.iter().map(|&l| p.strides[i][l]).collect())
            .collect();
        let mut oi = vec![0usize; out_shape.len()];
        let mut si = vec![0usize; sum_shape.len()];
        let mut base = vec![0usize; nin];
        for yv in y.iter_mut() {
            for i in 0..nin {
                base[i] = oi.iter().zip(&ostr[i]).map(|(a, b)| a * b).sum();
            }
            let mut acc = 0.0;
            if nsum > 0 {
                si.iter_mut().for_each(|v| *v = 0);
                loop {
                    let mut prod = 1.0;
                    for i in 0..nin {
                        let off: usize = base[i] + si.iter().zip(&sstr[i]).map(|(a, b)| a * b).sum::<usize>();
                        prod *= data[i][off];
                    }
                    acc += prod;
                    if !super::pool::step(&mut si, &sum_shape) {
                        break;
                    }
                }
            }
            *yv = acc;
            super::pool::step(&mut oi, &out_shape);
        }
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(dtype, out_shape, &y)?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let shapes: Option<Vec<Vec<usize>>> = (0..inputs.len())
            .map(|i| inputs[i].ty.tensor().and_then(|t| t.fixed_shape()))
            .collect();
        if let Some(shapes) = shapes
            && let Ok(p) = self.plan(&shapes)
        {
            let s = p.out.iter().map(|&l| Dim::Fixed(p.sizes[l])).collect();
            return Ok(vec![tensor_type(dtype, Some(s))]);
        }
        Ok(vec![util::dtype_only(dtype)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: Vec<f32>) -> Value {
        Value::Tensor(Tensor::from_vec(shape, v).unwrap())
    }

    #[test]
    fn matmul_1d_and_batch() {
        // [1 2] . [[3],[4]] as 1-D x 2-D: [1,2] x [[3,4],[5,6]] = [13, 16]
        let a = t(&[2], vec![1.0, 2.0]);
        let b = t(&[2, 2], vec![3.0, 4.0, 5.0, 6.0]);
        let y = MatMul::default().eval(&Args::new(&[Some(&a), Some(&b)])).unwrap();
        let y = y[0].as_tensor().unwrap();
        assert_eq!(y.shape(), &[2]);
        assert_eq!(y.as_slice::<f32>().unwrap(), &[13.0, 16.0]);
    }

    #[test]
    fn matmul_bias_input_and_epilogue() {
        // [[1, -2]] x [[1, 0], [0, 1]] + [0.5, 1] = [[1.5, -1]]; Relu gives [[1.5, 0]].
        let a = t(&[1, 2], vec![1.0, -2.0]);
        let b = t(&[2, 2], vec![1.0, 0.0, 0.0, 1.0]);
        let bias = t(&[2], vec![0.5, 1.0]);
        let y = MatMul::default()
            .eval_with(Some(Activation::Relu), &Args::new(&[Some(&a), Some(&b), Some(&bias)]))
            .unwrap();
        assert_eq!(y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[1.5, 0.0]);
        let y = MatMul::default()
            .eval(&Args::new(&[Some(&a), Some(&b), Some(&bias)]))
            .unwrap();
        assert_eq!(y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[1.5, -1.0]);
    }

    /// A batch of one-row matrices against one B (a seq-first `[S, 1, E]` projection) runs
    /// as one product; plain and prepacked B, with bias and residual, give the per-matrix sums.
    #[test]
    fn matmul_batch_of_rows_against_one_b() {
        let (s, k, n) = (5usize, 3usize, 4usize);
        let av: Vec<f32> = (0..s * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let bv: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.61).cos()).collect();
        let biasv: Vec<f32> = (0..n).map(|j| j as f32 - 1.5).collect();
        let rv: Vec<f32> = (0..s * n).map(|i| i as f32 * 0.25).collect();
        // Expected, one row at a time: sum_p a[r,p] b[p,j] + bias[j] + resid[r,j].
        let mut want = vec![0f32; s * n];
        for r in 0..s {
            for j in 0..n {
                let dot: f32 = (0..k).map(|p| av[r * k + p] * bv[p * n + j]).sum();
                want[r * n + j] = dot + biasv[j] + rv[r * n + j];
            }
        }
        let a = t(&[s, 1, k], av);
        let bias = t(&[n], biasv);
        let resid = t(&[s, 1, n], rv);
        let plain = t(&[k, n], bv.clone());
        let packed =
            kiln_kernels::sgemm::PackedB::pack(kiln_kernels::sgemm::BLayout::NR16, k, n, &bv, MatLayout::row_major(n))
                .unwrap();
        let packed_t = t(&[packed.view().data().len()], packed.view().data().to_vec());
        let packed_plan = crate::fast::Plan::Gemm(crate::fast::GemmPlan {
            activation: None,
            packed_b: Some(crate::fast::PackedWeight {
                k,
                n,
                layout: kiln_kernels::sgemm::BLayout::NR16.tag().to_string(),
            }),
        });
        let op = crate::Op::Nn(crate::nn::NnOp::MatMul(MatMul::default()));
        for (plan, b) in [(None, &plain), (Some(&packed_plan), &packed_t)] {
            let y = crate::fast::eval(&op, plan, &Args::new(&[Some(&a), Some(b), Some(&bias), Some(&resid)])).unwrap();
            let y = y[0].as_tensor().unwrap();
            assert_eq!(y.shape(), &[s, 1, n]);
            for (got, want) in y.as_slice::<f32>().unwrap().iter().zip(&want) {
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{got} vs {want}");
            }
        }
    }

    /// A broadcast batch of small products ([2, 3] x [3] heads, B shared along the first
    /// axis) split one product per thread on a two-thread pool: each matrix is the naive
    /// product, and the bits are those of the run without a pool.
    #[test]
    fn small_batched_products_split_over_the_pool_by_matrix() {
        let (m, k, n) = (7usize, 5usize, 9usize);
        let av: Vec<f32> = (0..2 * 3 * m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let bv: Vec<f32> = (0..3 * k * n).map(|i| (i as f32 * 0.61).cos()).collect();
        let a = t(&[2, 3, m, k], av.clone());
        let b = t(&[1, 3, k, n], bv.clone());
        let args = [Some(&a), Some(&b)];
        let serial = MatMul::default().eval(&Args::new(&args)).unwrap();
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let split = pool.install(|| MatMul::default().eval(&Args::new(&args)).unwrap());
        let (serial, split) = (serial[0].as_tensor().unwrap(), split[0].as_tensor().unwrap());
        assert_eq!(split.shape(), &[2, 3, m, n]);
        let got = split.as_slice::<f32>().unwrap();
        for (bi, h) in (0..2).flat_map(|b| (0..3).map(move |h| (b, h))) {
            for r in 0..m {
                for j in 0..n {
                    let dot: f32 = (0..k)
                        .map(|p| av[((bi * 3 + h) * m + r) * k + p] * bv[(h * k + p) * n + j])
                        .sum();
                    let v = got[((bi * 3 + h) * m + r) * n + j];
                    assert!(
                        (v - dot).abs() <= 1e-5 * dot.abs().max(1.0),
                        "{bi},{h},{r},{j}: {v} vs {dot}"
                    );
                }
            }
        }
        let bits = |t: &Tensor| {
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(split), bits(serial));
    }

    #[test]
    fn gemm_trans_and_bias() {
        // A^T with A = [[1,2],[3,4]] → [[1,3],[2,4]]; times I, alpha 2, + beta 1 * [1, 1].
        let a = t(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let b = t(&[2, 2], vec![1.0, 0.0, 0.0, 1.0]);
        let c = t(&[2], vec![1.0, 1.0]);
        let op = Gemm {
            alpha: 2.0,
            beta: 1.0,
            trans_a: true,
            trans_b: false,
        };
        let y = op.eval(&Args::new(&[Some(&a), Some(&b), Some(&c)])).unwrap();
        assert_eq!(
            y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(),
            &[3.0, 7.0, 5.0, 9.0]
        );
    }

    #[test]
    fn einsum_trace_transpose_and_implicit() {
        let m = t(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let run = |eq: &str| {
            let op = Einsum { equation: eq.into() };
            op.eval(&Args::new(&[Some(&m)])).unwrap()[0]
                .as_tensor()
                .unwrap()
                .clone()
        };
        assert_eq!(run("ii").as_slice::<f32>().unwrap(), &[5.0]);
        assert_eq!(run("ij->ji").as_slice::<f32>().unwrap(), &[1.0, 3.0, 2.0, 4.0]);
        assert_eq!(run("ji").as_slice::<f32>().unwrap(), &[1.0, 3.0, 2.0, 4.0]);
        assert_eq!(run("ii->i").as_slice::<f32>().unwrap(), &[1.0, 4.0]);
        assert_eq!(run("...j->...").as_slice::<f32>().unwrap(), &[3.0, 7.0]);
    }
}
