//! The planned `MatMul` and `Gemm`: B prepacked at compile time into the GEMM kernels'
//! panels ([`super::GemmPlan::packed_b`]), and a fused activation in the kernels' epilogue.
//! Without packed weights the op's own evaluation runs, with the plan's activation.

use super::{GemmPlan, PackedWeight};
use crate::error::{OpError, Result};
use crate::nn::matmul::epilogue_bias;
use crate::nn::{Activation, Gemm, MatMul, numel, tensor_type};
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{DType, Shape, Tensor};

/// `MatMul` under `plan`.
pub(crate) fn eval_matmul(op: &MatMul, plan: &GemmPlan, args: &Args<'_>) -> Result<crate::Outputs> {
    let Some(pk) = &plan.packed_b else {
        return op.eval_with(plan.activation, args);
    };
    let (a, b) = MatMul::operands(args)?;
    eval_packed(op, plan.activation, pk, a, b, args.opt_tensor(2)?, args.opt_tensor(3)?)
}

/// `Gemm` under `plan`.
pub(crate) fn eval_gemm(op: &Gemm, plan: &GemmPlan, args: &Args<'_>) -> Result<crate::Outputs> {
    let Some(pk) = &plan.packed_b else {
        return op.eval_with(plan.activation, args);
    };
    let (m, n, y) = run_packed(op, pk, args.tensor(0)?, args.tensor(1)?, args.opt_tensor(2)?)?;
    let y = Tensor::from_buf([m, n].as_slice(), y)?;
    Ok(smallvec::smallvec![
        crate::nn::activation::apply(plan.activation.as_ref(), y)?.into()
    ])
}

/// The output types under `plan`: input 1 holds packed panels, so B's type is the `k x n`
/// the plan records.
pub(crate) fn infer_matmul(op: &MatMul, plan: &GemmPlan, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
    let b = packed_type(plan, false);
    op.infer(&with_b(inputs, b.as_ref()))
}

/// [`infer_matmul`] for Gemm (a packed `op(B)` is `k x n`, transposition applied).
pub(crate) fn infer_gemm(op: &Gemm, plan: &GemmPlan, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
    let b = packed_type(plan, op.trans_b);
    op.infer(&with_b(inputs, b.as_ref()))
}

/// The type B had before packing, when the plan packed it.
fn packed_type(plan: &GemmPlan, trans_b: bool) -> Option<ValueType> {
    let pk = plan.packed_b.as_ref()?;
    let dims = if trans_b { [pk.n, pk.k] } else { [pk.k, pk.n] };
    Some(tensor_type(
        Some(DType::F32),
        Some(dims.into_iter().map(Dim::Fixed).collect()),
    ))
}

/// `inputs` with B's type replaced by `b`, when given.
fn with_b<'a>(inputs: &[InferInput<'a>], b: Option<&'a ValueType>) -> Vec<InferInput<'a>> {
    let mut ins = inputs.to_vec();
    if let (Some(ty), Some(input)) = (b, ins.get_mut(1)) {
        input.ty = ty;
        input.konst = None;
    }
    ins
}

/// A packing tag kiln does not know (only a crafted program gives one).
fn unknown_packing(op: &'static str, pk: &PackedWeight) -> OpError {
    OpError::Plan {
        op,
        plan: format!("packed_b({}x{} {})", pk.k, pk.n, pk.layout),
        reason: "the packing layout is unknown",
    }
}

/// Input 1 not holding the panels its plan says.
fn not_packed(pk: &PackedWeight, e: impl ToString) -> OpError {
    OpError::input_value(1, format!("B packed as {}x{} ({})", pk.k, pk.n, pk.layout), e)
}

/// The product with a prepacked B (f32 only): every matrix of A's batch against the same
/// panels, a bias along the last axis, a residual of the output's shape and the
/// activation in the kernels' epilogue.
fn eval_packed(
    op: &MatMul,
    act: Option<Activation>,
    pk: &PackedWeight,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    resid: Option<&Tensor>,
) -> Result<crate::Outputs> {
    use kiln_kernels::sgemm::{AMatrix, BLayout, Bias, Epilogue, PackedBRef, Residual, sgemm};
    let layout = BLayout::from_tag(&pk.layout).ok_or_else(|| unknown_packing("MatMul", pk))?;
    let (k, n) = (pk.k, pk.n);
    let packed = PackedBRef::new(layout, k, n, b.as_slice::<f32>()?).map_err(|e| not_packed(pk, e))?;
    let ad = a.as_slice::<f32>()?;
    let ashape = a.shape();
    let (batch, m): (&[usize], usize) = match ashape {
        [] => return Err(OpError::input_shape(0, "rank >= 1", ashape)),
        [kk] => (&[], if *kk == k { 1 } else { 0 }),
        [lead @ .., mm, kk] => (lead, if *kk == k { *mm } else { usize::MAX }),
    };
    if m == usize::MAX || (ashape.len() == 1 && ashape != [k]) {
        return Err(OpError::input_shape(
            0,
            format!("a last dim of {k}, to meet the packed {k}x{n} B"),
            ashape,
        ));
    }
    let mut out = Shape::from_slice(batch);
    if ashape.len() >= 2 {
        out.push(m);
    }
    out.push(n);
    // A is row-major and every matrix of its batch meets the same B, so the batch is one
    // product of `batch * m` rows: B's panels stream once, not once per matrix (a
    // `[197, 1, k]` A would otherwise be 197 one-row products).
    let rows = numel(batch)?
        .checked_mul(m)
        .ok_or_else(|| OpError::too_large("A of shape", format!("{ashape:?}")))?;
    // Every element is written below: a recycled buffer needs no clearing.
    let mut y = crate::util::out_f32(numel(&out)?);
    let col_bias = bias.and_then(|t| epilogue_bias(t, n, out.len()));
    // A residual goes into the epilogue when it is f32 of exactly the output's shape;
    // otherwise bias, residual and activation all follow the plain product.
    let resid_data = match resid {
        Some(r) if r.dtype() == DType::F32 && r.shape() == out.as_slice() => Some(Some(r.as_slice::<f32>()?)),
        Some(_) => None,
        None => Some(None),
    };
    let fuse = (bias.is_none() || col_bias.is_some()) && resid_data.is_some();
    let short = |index: usize, t: &Tensor, len: usize| {
        OpError::input_shape(index, format!("a shape of {len} elements, as its data"), t.shape())
    };
    let a_rows = ad.get(..rows.saturating_mul(k)).ok_or_else(|| short(0, a, ad.len()))?;
    let residual = match (resid_data.flatten(), resid) {
        (Some(r), Some(rt)) => Some(r.get(..rows.saturating_mul(n)).ok_or_else(|| short(3, rt, r.len()))?),
        _ => None,
    };
    let epilogue = if fuse {
        Epilogue {
            bias: col_bias.map_or(Bias::None, Bias::Col),
            residual: residual.map(|data| Residual { data, ld: n }),
            act: act.map(|a| a.kernel_act()),
            post: None,
            prelu: kiln_kernels::sgemm::Bias::None,
        }
    } else {
        Epilogue::NONE
    };
    sgemm(rows, AMatrix::row_major(a_rows, k), packed, &mut y, n, &epilogue)
        .map_err(|e| OpError::input_value(1, format!("a packed B that meets A {ashape:?}"), e))?;
    let y = Tensor::from_buf(out, y)?;
    if fuse {
        return Ok(smallvec::smallvec![y.into()]);
    }
    op.finish(y, bias, resid, act)
}

/// The product with a prepacked `op(B)` (f32 only).
fn run_packed(
    op: &Gemm,
    pk: &PackedWeight,
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
) -> Result<(usize, usize, kiln_tensor::Buf<f32>)> {
    use kiln_kernels::sgemm::{AMatrix, BLayout, Epilogue, PackedBRef, sgemm};
    let layout = BLayout::from_tag(&pk.layout).ok_or_else(|| unknown_packing("Gemm", pk))?;
    let (k, n) = (pk.k, pk.n);
    let packed = PackedBRef::new(layout, k, n, b.as_slice::<f32>()?).map_err(|e| not_packed(pk, e))?;
    let (m, ka) = match (a.shape(), op.trans_a) {
        ([r, c], false) => (*r, *c),
        ([r, c], true) => (*c, *r),
        (s, _) => return Err(OpError::input_shape(0, "a 2-D A", s)),
    };
    if ka != k {
        let side = if op.trans_a { "rows (transA)" } else { "columns" };
        return Err(OpError::input_shape(
            0,
            format!("{k} {side}, to meet the packed {k}x{n} B"),
            a.shape(),
        ));
    }
    let ad = a.as_slice::<f32>()?;
    let am = if op.trans_a {
        AMatrix::transposed(ad, m)
    } else {
        AMatrix::row_major(ad, k)
    };
    // Every element is written below: a recycled buffer needs no clearing.
    let mut y = crate::util::out_f32(numel(&[m, n])?);
    sgemm(m, am, packed, &mut y, n, &Epilogue::NONE)
        .map_err(|e| OpError::input_value(1, format!("a packed B that meets A {:?}", a.shape()), e))?;
    op.scale_and_add(&mut y, c, m, n)?;
    Ok((m, n, y))
}
