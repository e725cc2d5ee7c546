//! Integer and quantized linear algebra: `MatMulInteger` and `ConvInteger` (opset 10),
//! `QLinearMatMul` (opsets 10, 21) and `QLinearConv` (opset 10).
//! <https://onnx.ai/onnx/operators/onnx__MatMulInteger.html>,
//! <https://onnx.ai/onnx/operators/onnx__ConvInteger.html>,
//! <https://onnx.ai/onnx/operators/onnx__QLinearMatMul.html>,
//! <https://onnx.ai/onnx/operators/onnx__QLinearConv.html>
//!
//! Values are exact integers held in f64 (products of 8-bit values summed over any realistic
//! reduction stay far below 2^53).

use super::linear::{int_range, int_tensor};
use crate::error::{OpError, Result};
use crate::recurrent::num::{in_shape, round_to, tt};
use crate::util::{broadcast_map, checked_numel};
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{DType, Data, Tensor, broadcast_shapes, formats};

/// Values of an 8-bit integer (or other quantized) tensor, with a dtype check.
fn quant_values(t: &Tensor, index: usize, allow_fp8: bool) -> Result<Vec<f64>> {
    let ok = matches!(t.dtype(), DType::I8 | DType::U8)
        || (allow_fp8
            && matches!(
                t.dtype(),
                DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ
            ));
    if !ok {
        return Err(OpError::UnsupportedDType { index, got: t.dtype() });
    }
    Ok(t.to_f64_vec())
}

/// numpy `matmul` of two tensors held as f64 (the op's inputs `ai` and `bi`): 1-D operands are
/// promoted and the batch dims broadcast. Returns the product and its shape.
fn matmul(
    a: &[f64],
    ashape: &[usize],
    b: &[f64],
    bshape: &[usize],
    [ai, bi]: [usize; 2],
) -> Result<(Vec<f64>, Vec<usize>)> {
    for (i, s) in [(ai, ashape), (bi, bshape)] {
        if s.is_empty() {
            return Err(OpError::input_shape(i, "rank >= 1", s));
        }
    }
    let a2: Vec<usize> = if ashape.len() == 1 {
        vec![1, ashape[0]]
    } else {
        ashape.to_vec()
    };
    let b2: Vec<usize> = if bshape.len() == 1 {
        vec![bshape[0], 1]
    } else {
        bshape.to_vec()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(OpError::inputs(
            ai,
            bi,
            format!("A's columns ({k}) equal to B's rows ({k2})"),
            ashape,
            bshape,
        ));
    }
    let (abatch, bbatch) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = broadcast_shapes(abatch, bbatch)?;
    let amap = broadcast_map(abatch, &batch, ai)?;
    let bmap = broadcast_map(bbatch, &batch, bi)?;
    let nb = amap.len();
    let mut out = vec![0.0; checked_numel(&[nb, m, n])?];
    for bi in 0..nb {
        let (ao, bo, oo) = (amap[bi] * m * k, bmap[bi] * k * n, bi * m * n);
        for i in 0..m {
            for p in 0..k {
                let av = a[ao + i * k + p];
                for j in 0..n {
                    out[oo + i * n + j] += av * b[bo + p * n + j];
                }
            }
        }
    }
    let mut shape = batch;
    if ashape.len() > 1 {
        shape.push(m);
    }
    if bshape.len() > 1 {
        shape.push(n);
    }
    Ok((out, shape.to_vec()))
}

/// Static shape of numpy matmul.
fn matmul_shape(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (ab, bb) = (&a[..a.len().saturating_sub(2)], &b[..b.len().saturating_sub(2)]);
    let mut s = crate::util::broadcast_dims(ab, bb)?;
    if a.len() > 1 {
        s.push(a[a.len() - 2].clone());
    }
    if b.len() > 1 {
        s.push(b[b.len() - 1].clone());
    }
    Some(s)
}

/// Subtracts a zero point (input `index`) from `v` (shape `shape`). The zero point is a scalar,
/// a vector along `vec_axis` from the end (per-row of A: 2, per-column of B: 1), or a tensor
/// that broadcasts to `shape`.
fn sub_zero_point(
    v: &mut [f64],
    shape: &[usize],
    (zp, index): (Option<&Tensor>, usize),
    vec_axis_from_end: usize,
) -> Result<()> {
    let Some(z) = zp else { return Ok(()) };
    let zv = z.to_f64_vec();
    if zv.len() == 1 {
        v.iter_mut().for_each(|x| *x -= zv[0]);
        return Ok(());
    }
    let zshape: Vec<usize> = if z.rank() == 1 && shape.len() >= 2 {
        // An M-vector for A becomes [M, 1]; an N-vector for B stays [N] (broadcast by rows).
        if vec_axis_from_end == 2 {
            vec![zv.len(), 1]
        } else {
            vec![zv.len()]
        }
    } else {
        z.shape().to_vec()
    };
    let map = broadcast_map(&zshape, shape, index)?;
    for (x, &i) in v.iter_mut().zip(&map) {
        *x -= zv[i];
    }
    Ok(())
}

/// `MatMulInteger`: `(A - a_zero_point) x (B - b_zero_point)` in int32.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct MatMulInteger {
    /// B (input 1) and its zero point (input 3) are constants of the program (set by the
    /// compiler): B is then packed for the integer GEMM once, on the first run, and kept.
    #[serde(default)]
    pub b_constant: bool,
    #[serde(skip)]
    pub packed: PackCache,
}

/// The packed B of a [`MatMulInteger`] whose B is constant, made on first use and shared by
/// every later run (on any thread) of the program holding the op.
#[derive(Debug, Clone, Default)]
pub struct PackCache(pub(crate) std::sync::Arc<std::sync::OnceLock<Option<kiln_kernels::igemm::PackedB>>>);

impl PackCache {
    /// The packed weights, made by `pack` on the first call.
    pub(crate) fn get_or_pack(
        &self,
        pack: impl FnOnce() -> Option<kiln_kernels::igemm::PackedB>,
    ) -> Option<&kiln_kernels::igemm::PackedB> {
        self.0.get_or_init(pack).as_ref()
    }
}

/// The packed B of each group of a grouped convolution (as [`PackCache`]).
#[derive(Debug, Clone, Default)]
pub struct GroupsPackCache(std::sync::Arc<std::sync::OnceLock<Option<Vec<kiln_kernels::igemm::PackedB>>>>);

impl GroupsPackCache {
    /// The packed weights of every group, made by `pack` on the first call.
    pub(crate) fn get_or_pack(
        &self,
        pack: impl FnOnce() -> Option<Vec<kiln_kernels::igemm::PackedB>>,
    ) -> Option<&[kiln_kernels::igemm::PackedB]> {
        self.0.get_or_init(pack).as_deref()
    }
}

impl PartialEq for GroupsPackCache {
    /// A cache says nothing about the op: any two compare equal.
    fn eq(&self, _: &GroupsPackCache) -> bool {
        true
    }
}

/// A depthwise convolution's taps as `[tap][channel]` i32 values with their zero points taken
/// out, and the same values in f32 (the f32 depthwise kernel's) and i16 (the integer one's;
/// empty when a value does not fit), made on a plan's first run and kept (as [`PackCache`],
/// the weights are the program's).
#[derive(Debug, Clone, Default)]
pub struct TapsCache(std::sync::Arc<std::sync::OnceLock<Taps>>);

/// The taps a [`TapsCache`] keeps.
#[derive(Debug)]
pub(crate) struct Taps {
    pub ints: Vec<i32>,
    pub floats: Vec<f32>,
    /// Empty when a tap lies beyond i16.
    pub shorts: Vec<i16>,
    /// The taps as i8 packed for `kiln_kernels::qdwconv::QuadBand` (empty when one lies
    /// beyond i8), and each channel's sum of taps.
    pub quads: Vec<i8>,
    pub sums: Vec<i32>,
}

impl TapsCache {
    /// The taps, made by `make` on the first call (an error is returned, not kept).
    /// `kernel` is the window's `(kh, kw)`, the taps `[kh * kw][c]`.
    pub(crate) fn get_or_make(&self, kernel: (usize, usize), make: impl FnOnce() -> Result<Vec<i32>>) -> Result<&Taps> {
        if let Some(t) = self.0.get() {
            return Ok(t);
        }
        let ints = make()?;
        let floats = ints.iter().map(|&t| t as f32).collect();
        let shorts = ints
            .iter()
            .map(|&t| i16::try_from(t).ok())
            .collect::<Option<Vec<i16>>>();
        let taps = (kernel.0 * kernel.1).max(1);
        let c = ints.len() / taps;
        let mut sums = vec![0i32; c];
        for row in ints.chunks_exact(c.max(1)) {
            for (s, &t) in sums.iter_mut().zip(row) {
                *s = s.saturating_add(t);
            }
        }
        let quads = ints
            .iter()
            .map(|&t| i8::try_from(t).ok())
            .collect::<Option<Vec<i8>>>()
            .and_then(|b| kiln_kernels::qdwconv::pack_quad_taps(&b, kernel, c))
            .unwrap_or_default();
        Ok(self.0.get_or_init(|| Taps {
            ints,
            floats,
            shorts: shorts.unwrap_or_default(),
            quads,
            sums,
        }))
    }
}

impl PartialEq for TapsCache {
    /// A cache says nothing about the op: any two compare equal.
    fn eq(&self, _: &TapsCache) -> bool {
        true
    }
}

impl PartialEq for PackCache {
    /// A cache says nothing about the op: any two compare equal.
    fn eq(&self, _: &PackCache) -> bool {
        true
    }
}

/// B of shape `[k, n]` and its zero point (none, one, or one per column) packed for the
/// integer GEMM (for int32 sums alone when `sums`: see [`PackedB::pack_for_sums`]); `None`
/// when the types or shapes are not the GEMM's.
///
/// [`PackedB::pack_for_sums`]: kiln_kernels::igemm::PackedB::pack_for_sums
fn pack_b(b: &Tensor, zp: Option<&Tensor>, sums: bool) -> Option<kiln_kernels::igemm::PackedB> {
    use kiln_kernels::igemm::PackedB;
    let &[k, n] = b.shape() else { return None };
    if zp.is_some_and(|z| z.dtype() != b.dtype() || !(z.len() == 1 || (z.len() == n && z.shape().len() == 1))) {
        return None;
    }
    match b.dtype() {
        DType::I8 => {
            let z = zp.map_or(Ok(&[][..]), |z| z.as_slice::<i8>()).ok()?;
            let pack = if sums { PackedB::pack_for_sums } else { PackedB::pack };
            pack(b.as_slice::<i8>().ok()?, k, n, z).ok()
        }
        DType::U8 => {
            let z = zp.map_or(Ok(&[][..]), |z| z.as_slice::<u8>()).ok()?;
            let pack = if sums { PackedB::pack_for_sums } else { PackedB::pack };
            pack(b.as_slice::<u8>().ok()?, k, n, z).ok()
        }
        _ => None,
    }
}

impl MatMulInteger {
    /// The integer GEMM path: A of u8/i8 `[..., M, K]` with one zero point, B of u8/i8
    /// `[K, N]` with one zero point or one per column. `None` for anything else (the general
    /// path then computes it).
    fn eval_gemm(&self, args: &Args<'_>) -> Result<Option<Tensor>> {
        let (a, b) = (args.tensor(0)?, args.tensor(1)?);
        let cache = self.b_constant.then_some(&self.packed);
        match integer_product(a, args.opt_tensor(2)?, b, args.opt_tensor(3)?, cache)? {
            Some((c, shape)) => Ok(Some(Tensor::from_vec(shape, c)?)),
            None => Ok(None),
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if let Some(t) = self.eval_gemm(args)? {
            return Ok(smallvec::smallvec![t.into()]);
        }
        let (a, b) = (args.tensor(0)?, args.tensor(1)?);
        let mut av = quant_values(a, 0, false)?;
        let mut bv = quant_values(b, 1, false)?;
        sub_zero_point(&mut av, a.shape(), (args.opt_tensor(2)?, 2), 2)?;
        sub_zero_point(&mut bv, b.shape(), (args.opt_tensor(3)?, 3), 1)?;
        let (y, shape) = matmul(&av, a.shape(), &bv, b.shape(), [0, 1])?;
        Ok(smallvec::smallvec![
            Tensor::from_vec(shape, y.iter().map(|&x| x as i32).collect::<Vec<i32>>())?.into(),
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let s = match (in_shape(inputs, 0), in_shape(inputs, 1)) {
            (Some(a), Some(b)) => matmul_shape(&a, &b),
            _ => None,
        };
        Ok(vec![tt(Some(DType::I32), s)])
    }
}

/// The exact `(A - za) x (B - zb)` of 8-bit A `[..., M, K]` (one zero point) and B `[K, N]`
/// (zero point one or one per column) by the integer GEMM, with its shape; B packed once into
/// `cache` when given (a constant B). `None` for anything else (the general path then runs).
fn integer_product(
    a: &Tensor,
    za: Option<&Tensor>,
    b: &Tensor,
    zb: Option<&Tensor>,
    cache: Option<&PackCache>,
) -> Result<Option<(Vec<i32>, Vec<usize>)>> {
    use kiln_kernels::igemm::{PackedB, igemm};
    let (ashape, bshape) = (a.shape(), b.shape());
    if bshape.len() > 2 {
        return batched_product(a, za, b, zb);
    }
    let (Some(&k), [bk, n]) = (ashape.last(), bshape) else {
        return Ok(None);
    };
    if ashape.len() < 2 || k != *bk || za.is_some_and(|z| z.len() != 1 || z.dtype() != a.dtype()) {
        return Ok(None);
    }
    let a_zero = match za {
        None => 0,
        Some(z) => match z.dtype() {
            DType::U8 => z.as_slice::<u8>().map(|v| v.first().map_or(0, |&x| i32::from(x)))?,
            DType::I8 => z.as_slice::<i8>().map(|v| v.first().map_or(0, |&x| i32::from(x)))?,
            _ => return Ok(None),
        },
    };
    let fresh;
    let packed: &PackedB = match cache {
        Some(c) => match c.0.get_or_init(|| pack_b(b, zb, true)) {
            Some(p) => p,
            None => return Ok(None),
        },
        None => match pack_b(b, zb, true) {
            Some(p) => {
                fresh = p;
                &fresh
            }
            None => return Ok(None),
        },
    };
    if packed.depth() != k || packed.columns() != *n {
        return Ok(None);
    }
    let m: usize = ashape.iter().rev().skip(1).product();
    let mut shape = ashape.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = *n;
    }
    let mut c = vec![0i32; checked_numel(&shape)?];
    let r = match a.dtype() {
        DType::U8 => igemm(m, k, a.as_slice::<u8>()?, k, a_zero, packed, &mut c, *n),
        DType::I8 => igemm(m, k, a.as_slice::<i8>()?, k, a_zero, packed, &mut c, *n),
        _ => return Ok(None),
    };
    r.map_err(|e| OpError::input_value(0, "a product whose exact sums fit int32", e.to_string()))?;
    Ok(Some((c, shape)))
}

/// Output bytes per block of rows in [`fused_product`] (with their i32 scratch, in L2).
const FUSED_BLOCK_BYTES: usize = 256 * 1024;

/// QLinearMatMul with a 2-D B, one A scale and zero point and an 8-bit output, fused: the
/// integer GEMM requantizes each micro-tile as it leaves the registers (the f64 arithmetic
/// of the unfused path below, the same bits: the VNNI tile through its f32 twin), in blocks
/// of rows over the pool. `None` when the operands do not fit that form.
fn fused_product(
    a: &Tensor,
    (sa, za): (&Tensor, Option<&Tensor>),
    (b, sb, zb): (&Tensor, &Tensor, Option<&Tensor>),
    (sy, zy): (&Tensor, Option<&Tensor>),
    cache: Option<&PackCache>,
) -> Result<Option<Tensor>> {
    let odt = zy.map_or(a.dtype(), Tensor::dtype);
    let sdt = sa.dtype();
    let (ashape, &[k, n]) = (a.shape(), b.shape()) else {
        return Ok(None);
    };
    let fits = sa.len() == 1
        && matches!(odt, DType::U8 | DType::I8)
        && matches!(a.dtype(), DType::U8 | DType::I8)
        && matches!(sdt, DType::F32 | DType::F16 | DType::BF16)
        && sb.dtype() == sdt
        && sy.dtype() == sdt
        && ashape.len() >= 2
        && ashape.last() == Some(&k)
        && za.is_none_or(|z| z.len() == 1 && z.dtype() == a.dtype())
        && zy.is_none_or(|z| z.len() == 1);
    let Some(range) = int_range(odt).filter(|_| fits && n > 0 && k > 0) else {
        return Ok(None);
    };
    let a_zero = za.map_or(0.0, |z| params(z).first().copied().unwrap_or(0.0)) as i32;
    let fresh;
    let packed = match cache {
        Some(c) => c.0.get_or_init(|| pack_b(b, zb, false)).as_ref(),
        None => {
            fresh = pack_b(b, zb, false);
            fresh.as_ref()
        }
    };
    let Some(packed) = packed.filter(|p| p.depth() == k && p.columns() == n) else {
        return Ok(None);
    };
    let (zy0, mults) = column_mults(sa, sb, (sy, zy), n)?;
    // Not finite (a NaN or infinite scale): the unfused path's saturation, which differs.
    if !(zy0.is_finite() && mults.iter().all(|v| v.is_finite())) {
        return Ok(None);
    }
    let bias = vec![0.0f64; n];
    let twin = kiln_kernels::igemm::TwinParams::of(&bias, &mults, zy0);
    let stage = kiln_kernels::igemm::Requantize {
        scales: kiln_kernels::igemm::Scales::F64 {
            bias: &bias,
            mult: &mults,
            zero_point: zy0,
            twin: twin.as_ref().map(|t| t.columns(0..n)),
        },
        range: (range.0 as i32, range.1 as i32),
        sum: None,
    };
    let m: usize = ashape.iter().rev().skip(1).product();
    let mut shape = ashape.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    let t = match (a.dtype(), odt) {
        (DType::U8, DType::U8) => fused_rows::<u8, u8>(a.as_slice::<u8>()?, a_zero, packed, (m, k, n), stage, shape)?,
        (DType::U8, DType::I8) => fused_rows::<u8, i8>(a.as_slice::<u8>()?, a_zero, packed, (m, k, n), stage, shape)?,
        (DType::I8, DType::U8) => fused_rows::<i8, u8>(a.as_slice::<i8>()?, a_zero, packed, (m, k, n), stage, shape)?,
        (DType::I8, DType::I8) => fused_rows::<i8, i8>(a.as_slice::<i8>()?, a_zero, packed, (m, k, n), stage, shape)?,
        _ => return Ok(None),
    };
    Ok(Some(t))
}

/// QLinearMatMul's output zero point and its `n` per-column multipliers for one A scale:
/// `round(round(sa * sb[j]) / sy)` in the scales' type.
fn column_mults(sa: &Tensor, sb: &Tensor, (sy, zy): (&Tensor, Option<&Tensor>), n: usize) -> Result<(f64, Vec<f64>)> {
    let sdt = sa.dtype();
    let (sav, sbv, syv) = (params(sa), params(sb), params(sy));
    let zy0 = pick(&zy.map(params).unwrap_or_else(|| vec![0.0]), 0, 7)?;
    let (sa0, sy0) = (pick(&sav, 0, 1)?, pick(&syv, 0, 6)?);
    let mults = (0..n)
        .map(|col| Ok(round_to(sdt, round_to(sdt, sa0 * pick(&sbv, col, 4)?) / sy0)))
        .collect::<Result<Vec<f64>>>()?;
    Ok((zy0, mults))
}

/// [`fused_product`]'s rows: blocks of whole micro-tiles whose outputs and sums stay in
/// cache, about two per thread when there are several.
fn fused_rows<T, O>(
    a: &[T],
    a_zero: i32,
    packed: &kiln_kernels::igemm::PackedB,
    (m, k, n): (usize, usize, usize),
    stage: kiln_kernels::igemm::Requantize<'_>,
    shape: Vec<usize>,
) -> Result<Tensor>
where
    T: kiln_kernels::igemm::Int8 + crate::fast::qconv_nhwc::FromZeroPoint + Sync,
    O: kiln_kernels::igemm::Int8
        + kiln_kernels::quant::Q8
        + kiln_kernels::recycle::Recycled
        + kiln_tensor::Element
        + Send,
{
    let mut y = crate::util::out_buf::<O>(checked_numel(&[m, n])?);
    let isa = kiln_kernels::isa::active();
    let what = "a product whose exact sums fit int32";
    if kiln_kernels::igemm::splits_by_columns(m, k, n) {
        // Too few rows for two blocks of micro-tiles: the threads take whole panels instead.
        kiln_kernels::igemm::igemm_requant_columns(isa, (m, k), a, k, a_zero, packed, stage, &mut y, n)
            .map_err(|e| OpError::input_value(0, what, e.to_string()))?;
        return Ok(Tensor::from_buf(shape, y)?);
    }
    let threads = kiln_kernels::pool::current_threads().max(1);
    // Each block reads all of B: when B outgrows the cache, as few blocks as threads.
    let big_b = k.saturating_mul(n) > FUSED_BLOCK_BYTES;
    let split = if threads == 1 {
        1
    } else if big_b {
        threads
    } else {
        2 * threads
    };
    let mut rows = (FUSED_BLOCK_BYTES / (4 * n)).clamp(8, 512);
    if big_b {
        rows = rows.max(128);
    }
    let rows = rows.min(m.div_ceil(split)).div_ceil(8) * 8;
    crate::fast::qconv_nhwc::over_blocks::<T, O>(&mut y, rows, n, what, &|p0, r, out, scratch| {
        let (c, _) = scratch.parts(r * n, 0);
        let rows_of_a = a.get(p0 * k..(p0 + r) * k).unwrap_or_default();
        kiln_kernels::igemm::igemm_requant_serial(isa, (r, k), rows_of_a, k, a_zero, packed, c, stage, out, n)
    })?;
    Ok(Tensor::from_buf(shape, y)?)
}

/// [`integer_product`] of batched operands with the same batch dims (`[..., M, K]` by
/// `[..., K, N]`, as attention's products of activations), one zero point each: each B
/// matrix packed on the spot.
fn batched_product(
    a: &Tensor,
    za: Option<&Tensor>,
    b: &Tensor,
    zb: Option<&Tensor>,
) -> Result<Option<(Vec<i32>, Vec<usize>)>> {
    let (ashape, bshape) = (a.shape(), b.shape());
    let r = ashape.len();
    if r != bshape.len() || r < 3 || ashape.get(..r - 2) != bshape.get(..r - 2) {
        return Ok(None);
    }
    if za.is_some_and(|z| z.len() != 1) || zb.is_some_and(|z| z.len() != 1 || z.dtype() != b.dtype()) {
        return Ok(None);
    }
    let (m, k, n) = (ashape[r - 2], ashape[r - 1], bshape[r - 1]);
    if bshape[r - 2] != k {
        return Ok(None);
    }
    let batches: usize = ashape[..r - 2].iter().product();
    let mut shape = ashape.to_vec();
    shape[r - 1] = n;
    let mut out = Vec::with_capacity(checked_numel(&shape)?);
    for i in 0..batches {
        let slice = |t: &Tensor, len: usize| -> Result<Tensor> {
            let s = t.shape();
            let two = vec![s[r - 2], s[r - 1]];
            Ok(match t.dtype() {
                DType::U8 => Tensor::from_vec(
                    two,
                    t.as_slice::<u8>()?.get(i * len..(i + 1) * len).unwrap_or(&[]).to_vec(),
                )?,
                DType::I8 => Tensor::from_vec(
                    two,
                    t.as_slice::<i8>()?.get(i * len..(i + 1) * len).unwrap_or(&[]).to_vec(),
                )?,
                other => return Err(OpError::UnsupportedDType { index: 0, got: other }),
            })
        };
        if !matches!(a.dtype(), DType::U8 | DType::I8) || !matches!(b.dtype(), DType::U8 | DType::I8) {
            return Ok(None);
        }
        let (ai, bi) = (slice(a, m * k)?, slice(b, k * n)?);
        match integer_product(&ai, za, &bi, zb, None)? {
            Some((c, _)) => out.extend(c),
            None => return Ok(None),
        }
    }
    Ok(Some((out, shape)))
}

/// Per-tensor or 1-D quantization parameter read as f64 values.
fn params(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

/// Quantizes real values `v` to `odt` with zero point `zp` (per-tensor): integer types round
/// half to even and saturate, float8 types saturate.
fn requantize(odt: DType, shape: Vec<usize>, v: Vec<f64>) -> Result<Tensor> {
    if let Some((lo, hi)) = int_range(odt) {
        let r: Vec<f64> = v.iter().map(|&x| x.round_ties_even().clamp(lo, hi)).collect();
        return int_tensor(odt, shape, &r);
    }
    let codes = v.iter().map(|&x| formats::encode_float(odt, x as f32, true)).collect();
    Ok(Tensor::from_codes(odt, shape, codes)?)
}

/// Picks element `i` of a per-tensor (1 element) or per-`axis` parameter vector, the values
/// of input `index`.
fn pick(p: &[f64], i: usize, index: usize) -> Result<f64> {
    match p.len() {
        1 => Ok(p[0]),
        n if i < n => Ok(p[i]),
        n => Err(OpError::input_value(
            index,
            format!("one value, or one per row or channel (at least {})", i + 1),
            format!("{n} values"),
        )),
    }
}

/// `QLinearMatMul`: `quantize(dequantize(a) x dequantize(b))` with per-tensor (or per-row of
/// `a` / per-column of `b`) scales and zero points.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct QLinearMatMul {
    /// B (input 3) and its zero point (input 5) are program constants (set by the compiler):
    /// B is then packed for the integer GEMM once, on the first run, and kept.
    #[serde(default)]
    pub b_constant: bool,
    #[serde(skip)]
    pub packed: PackCache,
}

impl QLinearMatMul {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (a, b) = (args.tensor(0)?, args.tensor(3)?);
        let (sa, sb, sy) = (args.tensor(1)?, args.tensor(4)?, args.tensor(6)?);
        let (za, zb, zy) = (args.opt_tensor(2)?, args.opt_tensor(5)?, args.opt_tensor(7)?);
        let odt = zy.map_or(a.dtype(), Tensor::dtype);
        let cache = self.b_constant.then_some(&self.packed);
        if let Some(t) = fused_product(a, (sa, za), (b, sb, zb), (sy, zy), cache)? {
            return Ok(smallvec::smallvec![t.into()]);
        }
        let fast = integer_product(a, za, b, zb, cache)?;
        // One A scale (the multiplier then depends on the column only) and an 8-bit output:
        // requantized in one pass, in the same f64 arithmetic as below.
        if let Some((c, shape)) = &fast
            && sa.len() == 1
            && matches!(odt, DType::U8 | DType::I8)
            && matches!(sa.dtype(), DType::F32 | DType::F16 | DType::BF16)
            && sb.dtype() == sa.dtype()
            && sy.dtype() == sa.dtype()
            && let Some(range) = int_range(odt)
        {
            let n = shape.last().copied().unwrap_or(1).max(1);
            let (zy0, mults) = column_mults(sa, sb, (sy, zy), n)?;
            let t = if odt == DType::U8 {
                Tensor::from_vec(shape.clone(), requantize_columns(c, &mults, zy0, range, |v| v as u8))?
            } else {
                Tensor::from_vec(shape.clone(), requantize_columns(c, &mults, zy0, range, |v| v as i8))?
            };
            return Ok(smallvec::smallvec![t.into()]);
        }
        let (c, shape) = match fast {
            Some((c, shape)) => (c.into_iter().map(f64::from).collect::<Vec<f64>>(), shape),
            None => {
                let mut av = quant_values(a, 0, true)?;
                let mut bv = quant_values(b, 3, true)?;
                sub_zero_point(&mut av, a.shape(), (za, 2), 2)?;
                sub_zero_point(&mut bv, b.shape(), (zb, 5), 1)?;
                matmul(&av, a.shape(), &bv, b.shape(), [0, 3])?
            }
        };
        let sdt = sa.dtype();
        for (t, i) in [(sa, 1), (sb, 4), (sy, 6)] {
            if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
                return Err(OpError::UnsupportedDType {
                    index: i,
                    got: t.dtype(),
                });
            }
        }
        let (sav, sbv, syv) = (params(sa), params(sb), params(sy));
        let zyv = zy.map(params).unwrap_or_else(|| vec![0.0]);
        let n = shape.last().copied().unwrap_or(1).max(1);
        let m = if a.rank() > 1 && shape.len() >= 2 {
            shape[shape.len() - 2]
        } else {
            1
        };
        let bcols = b.rank() > 1;
        let mut y = Vec::with_capacity(c.len());
        for (i, &cv) in c.iter().enumerate() {
            let col = if bcols { i % n } else { 0 };
            let row = if bcols { (i / n) % m } else { i % m };
            let mult = round_to(
                sdt,
                round_to(sdt, pick(&sav, row, 1)? * pick(&sbv, col, 4)?) / pick(&syv, 0, 6)?,
            );
            y.push(cv * mult + pick(&zyv, 0, 7)?);
        }
        Ok(smallvec::smallvec![requantize(odt, shape, y)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let s = match (in_shape(inputs, 0), in_shape(inputs, 3)) {
            (Some(a), Some(b)) => matmul_shape(&a, &b),
            _ => None,
        };
        let dt = crate::util::input_dtype(inputs, 7).or_else(|| crate::util::input_dtype(inputs, 0));
        Ok(vec![tt(dt, s)])
    }
}

/// Padding mode of a convolution.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Convolution attributes (empty vectors mean the ONNX defaults: 1s and 0s).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ConvAttrs {
    pub auto_pad: AutoPad,
    pub dilations: Vec<usize>,
    pub group: usize,
    pub kernel_shape: Option<Vec<usize>>,
    /// Begins then ends.
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

/// Resolved geometry of one convolution.
pub(crate) struct Geometry {
    pub(crate) spatial_in: Vec<usize>,
    pub(crate) kernel: Vec<usize>,
    pub(crate) out: Vec<usize>,
    pub(crate) pad_begin: Vec<usize>,
    pub(crate) strides: Vec<usize>,
    pub(crate) dilations: Vec<usize>,
}

impl ConvAttrs {
    /// The geometry of X `x` (input 0) and W `w` (input `wi`).
    pub(crate) fn geometry(&self, x: &[usize], w: &[usize], wi: usize) -> Result<Geometry> {
        if x.len() < 3 {
            return Err(OpError::input_shape(0, "[N, C, spatial...]", x));
        }
        if w.len() != x.len() {
            return Err(OpError::inputs(0, wi, "X and W of the same rank", x, w));
        }
        let ns = x.len() - 2;
        let spatial_in = x[2..].to_vec();
        let kernel = w[2..].to_vec();
        if let Some(k) = &self.kernel_shape
            && k != &kernel
        {
            return Err(OpError::attribute(
                "kernel_shape",
                format!("W's window {kernel:?}"),
                format!("{k:?}"),
            ));
        }
        let or1 = |v: &Vec<usize>, attr: &'static str| -> Result<Vec<usize>> {
            if v.is_empty() {
                Ok(vec![1; ns])
            } else if v.len() == ns && v.iter().all(|&s| s > 0) {
                Ok(v.clone())
            } else {
                Err(OpError::attribute(attr, format!("{ns} values >= 1"), format!("{v:?}")))
            }
        };
        let strides = or1(&self.strides, "strides")?;
        let dilations = or1(&self.dilations, "dilations")?;
        let mut pad_begin = vec![0; ns];
        let mut out = vec![0; ns];
        for d in 0..ns {
            let ek = dilations[d] * (kernel[d].max(1) - 1) + 1;
            let (pb, pe) = match self.auto_pad {
                AutoPad::NotSet => {
                    if self.pads.is_empty() {
                        (0, 0)
                    } else if self.pads.len() == 2 * ns {
                        (self.pads[d], self.pads[d + ns])
                    } else {
                        return Err(OpError::attribute(
                            "pads",
                            format!("{} values", 2 * ns),
                            format!("{:?}", self.pads),
                        ));
                    }
                }
                AutoPad::Valid => (0, 0),
                AutoPad::SameUpper | AutoPad::SameLower => {
                    let o = spatial_in[d].div_ceil(strides[d]);
                    let total = ((o.max(1) - 1) * strides[d] + ek).saturating_sub(spatial_in[d]);
                    let small = total / 2;
                    if self.auto_pad == AutoPad::SameUpper {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    }
                }
            };
            let padded = spatial_in[d] + pb + pe;
            if padded < ek {
                return Err(OpError::inputs(
                    0,
                    wi,
                    format!("a dilated window ({ek} on spatial axis {d}) within the padded input ({padded})"),
                    x,
                    w,
                ));
            }
            out[d] = (padded - ek) / strides[d] + 1;
            pad_begin[d] = pb;
        }
        Ok(Geometry {
            spatial_in,
            kernel,
            out,
            pad_begin,
            strides,
            dilations,
        })
    }

    /// `y[n, m, o] = sum_{c, k} x[n, g*C/G + c, o*s - p + k*d] * w[m, c, k]`, x and w as f64.
    /// W is input `wi`.
    fn conv(&self, x: &[f64], xs: &[usize], w: &[f64], ws: &[usize], wi: usize) -> Result<(Vec<f64>, Vec<usize>)> {
        let g = self.geometry(xs, ws, wi)?;
        let (n, c, m, cg) = (xs[0], xs[1], ws[0], ws[1]);
        let groups = self.group.max(1);
        if c != cg * groups || m % groups != 0 {
            return Err(OpError::inputs(
                0,
                wi,
                format!("X's channels = W's dim 1 x group {groups}, and W's dim 0 divisible by the group"),
                xs,
                ws,
            ));
        }
        let mut oshape = vec![n, m];
        oshape.extend_from_slice(&g.out);
        let total = checked_numel(&oshape)?;
        let opix: usize = g.out.iter().product();
        let kpix: usize = g.kernel.iter().product();
        let ipix: usize = g.spatial_in.iter().product();
        let ns = g.out.len();
        let ostr = kiln_tensor::strides_of(&g.out);
        let kstr = kiln_tensor::strides_of(&g.kernel);
        let istr = kiln_tensor::strides_of(&g.spatial_in);
        let mut y = vec![0.0; total];
        let mpg = m / groups;
        for ni in 0..n {
            for mi in 0..m {
                let gi = mi / mpg;
                for op in 0..opix {
                    let mut acc = 0.0;
                    for ci in 0..cg {
                        let ic = gi * cg + ci;
                        let xbase = (ni * c + ic) * ipix;
                        let wbase = (mi * cg + ci) * kpix;
                        'k: for kp in 0..kpix {
                            let mut off = 0;
                            for d in 0..ns {
                                let o = (op / ostr[d]) % g.out[d];
                                let k = (kp / kstr[d]) % g.kernel[d];
                                let pos = (o * g.strides[d] + k * g.dilations[d]) as isize - g.pad_begin[d] as isize;
                                if pos < 0 || pos as usize >= g.spatial_in[d] {
                                    continue 'k;
                                }
                                off += pos as usize * istr[d];
                            }
                            acc += x[xbase + off] * w[wbase + kp];
                        }
                    }
                    y[(ni * m + mi) * opix + op] = acc;
                }
            }
        }
        Ok((y, oshape))
    }

    pub(crate) fn infer_shape(&self, x: Option<Vec<Dim>>, w: Option<Vec<Dim>>) -> Option<Vec<Dim>> {
        let (x, w) = (x?, w?);
        let xs: Option<Vec<usize>> = x.iter().map(crate::recurrent::num::fixed).collect();
        let ws: Option<Vec<usize>> = w.iter().map(crate::recurrent::num::fixed).collect();
        let (xs, ws) = (xs?, ws?);
        let g = self.geometry(&xs, &ws, 1).ok()?;
        let mut s = vec![Dim::Fixed(xs[0]), Dim::Fixed(ws[0])];
        s.extend(g.out.into_iter().map(Dim::Fixed));
        Some(s)
    }
}

/// Per-output-channel zero point (input `index`) subtraction on a weight `[M, ...]`.
fn sub_channel_zp(w: &mut [f64], ws: &[usize], zp: Option<&Tensor>, index: usize) -> Result<()> {
    let Some(z) = zp else { return Ok(()) };
    let zv = z.to_f64_vec();
    let m = ws.first().copied().unwrap_or(0);
    let per = w.len().checked_div(m).unwrap_or(0);
    if zv.len() != 1 && zv.len() != m {
        return Err(OpError::input_shape(
            index,
            format!("one element, or {m} (one per output channel)"),
            z.shape(),
        ));
    }
    for (i, x) in w.iter_mut().enumerate() {
        *x -= if zv.len() == 1 { zv[0] } else { zv[i / per.max(1)] };
    }
    Ok(())
}

/// `ConvInteger`: integer convolution of zero-point-shifted inputs, int32 output.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ConvInteger {
    pub conv: ConvAttrs,
    /// W (input 1) and its zero point (input 3) are program constants (set by the compiler):
    /// W is then packed for the integer GEMM once, on the first run, and kept.
    #[serde(default)]
    pub w_constant: bool,
    #[serde(skip)]
    pub packed: PackCache,
}

/// The general path's sums of an integer convolution in f64 (any rank, any 8-bit layout):
/// `[x, x_zero_point, w, w_zero_point]` are the op's input indices of those four.
fn general_sums(attrs: &ConvAttrs, args: &Args<'_>, [xi, zxi, wi, zwi]: [usize; 4]) -> Result<(Vec<f64>, Vec<usize>)> {
    let (x, w) = (args.tensor(xi)?, args.tensor(wi)?);
    let mut xv = quant_values(x, xi, false)?;
    let mut wv = quant_values(w, wi, false)?;
    if let Some(z) = args.opt_tensor(zxi)? {
        let zv = z.to_f64_vec();
        if zv.len() != 1 {
            return Err(OpError::input_shape(zxi, "one element (x_zero_point)", z.shape()));
        }
        xv.iter_mut().for_each(|v| *v -= zv[0]);
    }
    sub_channel_zp(&mut wv, w.shape(), args.opt_tensor(zwi)?, zwi)?;
    attrs.conv(&xv, x.shape(), &wv, w.shape(), wi)
}

impl ConvInteger {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, w) = (args.tensor(0)?, args.tensor(1)?);
        let cache = self.w_constant.then_some(&self.packed);
        if let Some((y, shape)) = conv_fast(&self.conv, x, args.opt_tensor(2)?, w, args.opt_tensor(3)?, 1, cache)? {
            return Ok(smallvec::smallvec![Tensor::from_vec(shape, y)?.into()]);
        }
        let (y, shape) = general_sums(&self.conv, args, [0, 2, 1, 3])?;
        Ok(smallvec::smallvec![
            Tensor::new(DType::I32, shape, Data::I32(y.iter().map(|&v| v as i32).collect()))?.into(),
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tt(
            Some(DType::I32),
            self.conv.infer_shape(in_shape(inputs, 0), in_shape(inputs, 1)),
        )])
    }
}

/// `QLinearConv`: quantized convolution with optional int32 bias, requantized to the output
/// zero point's type.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct QLinearConv {
    pub conv: ConvAttrs,
}

/// The exact int32 sums of an 8-bit 2-D convolution by [`super::qconv`], with the output
/// shape; `None` where that path does not apply (the general path then runs).
fn conv_fast(
    attrs: &ConvAttrs,
    x: &Tensor,
    zx: Option<&Tensor>,
    w: &Tensor,
    zw: Option<&Tensor>,
    wi: usize,
    cache: Option<&PackCache>,
) -> Result<Option<(Vec<i32>, Vec<usize>)>> {
    let (xs, ws) = (x.shape(), w.shape());
    let (Ok(g), [_, _, _, _], [m, _, _, _]) = (attrs.geometry(xs, ws, wi), xs, ws) else {
        return Ok(None);
    };
    let zx = match zx {
        None => 0,
        Some(z) if z.len() == 1 && z.dtype() == x.dtype() => z.to_f64_vec().first().map_or(0, |&v| v as i32),
        Some(_) => return Ok(None),
    };
    if zw.is_some_and(|z| z.dtype() != w.dtype() || !(z.len() == 1 || z.len() == *m)) {
        return Ok(None);
    }
    let Some(acc) = super::qconv::conv2d(attrs, &g, x, zx, w, zw, cache)? else {
        return Ok(None);
    };
    let mut shape = vec![xs[0], *m];
    shape.extend_from_slice(&g.out);
    Ok(Some((acc, shape)))
}

/// `v` rounded half to even and clamped to `[lo, hi]` (NaN stays NaN), as `requantize` does,
/// in two vectorisable operations: adding and subtracting 1.5 * 2^52 rounds exactly below 2^51
/// in magnitude, and larger values saturate either way, so they are clamped to 2^50 first.
#[inline(always)]
pub(crate) fn round_saturate(v: f64, lo: f64, hi: f64) -> f64 {
    const BIG: f64 = 1_125_899_906_842_624.0; // 2^50
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
    ((v.clamp(-BIG, BIG) + ROUND) - ROUND).clamp(lo, hi)
}

/// QLinearConv's requantization of exact int32 sums straight to u8/i8, in the general path's
/// f64 arithmetic (`(acc + bias) * mult[ch] + zy`, rounded half to even, saturated): one pass
/// instead of its f64 vectors.
fn requantize_sums<T: kiln_tensor::Element + Copy + Default + Send>(
    acc: &[i32],
    bias: Option<&[f64]>,
    mults: &[f64],
    zy: f64,
    opix: usize,
    (lo, hi): (f64, f64),
    cast: fn(f64) -> T,
) -> Vec<T> {
    let m = mults.len().max(1);
    let mut out: Vec<T> = vec![T::default(); acc.len()];
    // One output plane per task, over the current pool.
    kiln_kernels::pool::for_each_chunk_mut(&mut out, opix.max(1), &|row, dst| {
        let ch = row % m;
        let mult = mults.get(ch).copied().unwrap_or(0.0);
        let b = bias.and_then(|b| b.get(ch)).copied().unwrap_or(0.0);
        let src = acc.get(row * opix..).unwrap_or(&[]);
        kiln_kernels::simd::vectorize(|| {
            for (o, &a) in dst.iter_mut().zip(src) {
                *o = cast(round_saturate((f64::from(a) + b) * mult + zy, lo, hi));
            }
        });
    });
    out
}

/// QLinearMatMul's requantization of exact int32 products `[..., N]` to u8/i8 with one
/// multiplier per column (`acc * mult[col] + zy`, rounded half to even, saturated), in f64.
fn requantize_columns<T: Copy>(
    acc: &[i32],
    mults: &[f64],
    zy: f64,
    (lo, hi): (f64, f64),
    cast: fn(f64) -> T,
) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(acc.len());
    kiln_kernels::simd::vectorize(|| {
        for row in acc.chunks(mults.len().max(1)) {
            out.extend(
                row.iter()
                    .zip(mults)
                    .map(|(&a, &mult)| cast(round_saturate(f64::from(a) * mult + zy, lo, hi))),
            );
        }
    });
    out
}

/// QLinearConv's per-output-channel requantization of `m` channels: the bias (input 8, one
/// value per channel, checked), the multipliers `f32(f32(sx * sw[ch]) / sy)` and the output
/// zero point.
pub(crate) fn conv_requant(args: &Args<'_>, m: usize) -> Result<(Option<Vec<f64>>, Vec<f64>, f64)> {
    let (sx, sw, sy) = (args.tensor(1)?, args.tensor(4)?, args.tensor(6)?);
    let bias = match args.opt_tensor(8)? {
        Some(b) if b.len() != m => {
            return Err(OpError::input_shape(
                8,
                format!("{m} elements (one per output channel)"),
                b.shape(),
            ));
        }
        Some(b) => Some(b.to_f64_vec()),
        None => None,
    };
    let (sxv, swv, syv) = (params(sx), params(sw), params(sy));
    let zyv = args.opt_tensor(7)?.map(params).unwrap_or_else(|| vec![0.0]);
    let (sx0, sy0, zy0) = (pick(&sxv, 0, 1)?, pick(&syv, 0, 6)?, pick(&zyv, 0, 7)?);
    let mults = (0..m.max(1))
        .map(|ch| {
            Ok(round_to(
                DType::F32,
                round_to(DType::F32, sx0 * pick(&swv, ch, 4)?) / sy0,
            ))
        })
        .collect::<Result<Vec<f64>>>()?;
    Ok((bias, mults, zy0))
}

impl QLinearConv {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, w) = (args.tensor(0)?, args.tensor(3)?);
        let fast = conv_fast(&self.conv, x, args.opt_tensor(2)?, w, args.opt_tensor(5)?, 3, None)?;
        let zy = args.opt_tensor(7)?;
        let odt = zy.map_or(x.dtype(), Tensor::dtype);
        if let Some((acc, shape)) = &fast
            && let (Some(&m), Some((lo, hi))) = (
                shape.get(1),
                int_range(odt).filter(|_| matches!(odt, DType::U8 | DType::I8)),
            )
        {
            let opix: usize = shape.get(2..).map_or(1, |s| s.iter().product());
            let (bias, mults, zy0) = conv_requant(args, m)?;
            let b = bias.as_deref();
            let t = if odt == DType::U8 {
                Tensor::from_vec(
                    shape.clone(),
                    requantize_sums(acc, b, &mults, zy0, opix, (lo, hi), |v| v as u8),
                )?
            } else {
                Tensor::from_vec(
                    shape.clone(),
                    requantize_sums(acc, b, &mults, zy0, opix, (lo, hi), |v| v as i8),
                )?
            };
            return Ok(smallvec::smallvec![t.into()]);
        }
        let (mut acc, shape) = match fast {
            Some((acc, shape)) => (acc.into_iter().map(f64::from).collect::<Vec<f64>>(), shape),
            None => general_sums(&self.conv, args, [0, 2, 3, 5])?,
        };
        let m = shape[1];
        let opix: usize = shape[2..].iter().product();
        let (bias, mults, zy0) = conv_requant(args, m)?;
        if let Some(bv) = bias {
            for (i, a) in acc.iter_mut().enumerate() {
                *a += bv.get((i / opix.max(1)) % m).copied().unwrap_or(0.0);
            }
        }
        let mut y = Vec::with_capacity(acc.len());
        for (i, &a) in acc.iter().enumerate() {
            let ch = (i / opix.max(1)) % m.max(1);
            y.push(a * mults.get(ch).copied().unwrap_or(0.0) + zy0);
        }
        Ok(smallvec::smallvec![requantize(odt, shape, y)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = crate::util::input_dtype(inputs, 7).or_else(|| crate::util::input_dtype(inputs, 0));
        Ok(vec![tt(
            dt,
            self.conv.infer_shape(in_shape(inputs, 0), in_shape(inputs, 3)),
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    /// The integer GEMM path (B packed once, kept, and reused) against sums computed by hand,
    /// on batched u8 x s8 with per-column zero points and s8 x u8 with scalar ones.
    #[test]
    fn gemm_path_matches_sums_by_hand() {
        let (m, k, n) = (9usize, 37usize, 21usize);
        let a: Vec<u8> = (0..2 * m * k).map(|i| (i * 29 % 256) as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (i * 11 % 256) as u8 as i8).collect();
        let zb: Vec<i8> = (0..n).map(|j| (j * 5) as i8).collect();
        let va = Value::Tensor(Tensor::from_vec(vec![2, m, k], a.clone()).unwrap());
        let vb = Value::Tensor(Tensor::from_vec(vec![k, n], b.clone()).unwrap());
        let za = Value::Tensor(Tensor::scalar(7u8));
        let zbv = Value::Tensor(Tensor::from_vec(vec![n], zb.clone()).unwrap());
        let inputs = [Some(&va), Some(&vb), Some(&za), Some(&zbv)];
        let fast = MatMulInteger {
            b_constant: true,
            ..MatMulInteger::default()
        };
        let got = fast
            .eval_gemm(&Args::new(&inputs))
            .unwrap()
            .expect("the GEMM path applies");
        let again = fast.eval(&Args::new(&inputs)).unwrap().remove(0);
        let mut want = vec![0i32; 2 * m * n];
        for r in 0..2 * m {
            for j in 0..n {
                let s: i64 = (0..k)
                    .map(|p| (i64::from(a[r * k + p]) - 7) * (i64::from(b[p * n + j]) - i64::from(zb[j])))
                    .sum();
                want[r * n + j] = s as i32;
            }
        }
        assert_eq!(got.shape(), &[2, m, n]);
        assert_eq!(got.as_slice::<i32>().unwrap(), &want[..]);
        assert_eq!(again.as_tensor().unwrap().as_slice::<i32>().unwrap(), &want[..]);
        // s8 activations, u8 weights, scalar zero points, B packed on the spot.
        let a8: Vec<i8> = (0..m * k).map(|i| (i * 13 % 256) as u8 as i8).collect();
        let b8: Vec<u8> = (0..k * n).map(|i| (i * 7 % 256) as u8).collect();
        let va = Value::Tensor(Tensor::from_vec(vec![m, k], a8.clone()).unwrap());
        let vb = Value::Tensor(Tensor::from_vec(vec![k, n], b8.clone()).unwrap());
        let za = Value::Tensor(Tensor::scalar(-3i8));
        let zb = Value::Tensor(Tensor::scalar(200u8));
        let inputs = [Some(&va), Some(&vb), Some(&za), Some(&zb)];
        let got = MatMulInteger::default()
            .eval_gemm(&Args::new(&inputs))
            .unwrap()
            .expect("the GEMM path applies");
        for r in 0..m {
            for j in 0..n {
                let s: i64 = (0..k)
                    .map(|p| (i64::from(a8[r * k + p]) + 3) * (i64::from(b8[p * n + j]) - 200))
                    .sum();
                assert_eq!(i64::from(got.as_slice::<i32>().unwrap()[r * n + j]), s);
            }
        }
    }

    /// The fused QLinearMatMul (requantized in the GEMM's tiles, row blocks over the pool)
    /// against its formula by hand in f64: `round_half_even(sum * f32(f32(sa sb[j]) / sy) +
    /// zy)`, saturated; u8 and i8 outputs, per-column B scales and zero points, rows not a
    /// multiple of the tile's, B constant (packed once) and not.
    #[test]
    fn fused_qlinear_matmul_matches_the_formula() {
        let (m, k, n) = (2 * 21usize, 70usize, 45usize);
        let a: Vec<u8> = (0..m * k).map(|i| (i * 29 % 251) as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (i * 11 % 256) as u8 as i8).collect();
        let zb: Vec<i8> = (0..n).map(|j| (j % 9) as i8 - 4).collect();
        let sb: Vec<f32> = (0..n).map(|j| 0.001 + 0.0003 * (j % 7) as f32).collect();
        let (sa, sy, za) = (0.02f32, 0.05f32, 3u8);
        let t = |v: Tensor| Value::Tensor(v);
        let (va, vb) = (
            t(Tensor::from_vec(vec![2, m / 2, k], a.clone()).unwrap()),
            t(Tensor::from_vec(vec![k, n], b.clone()).unwrap()),
        );
        let (vsa, vza, vsb, vzb, vsy) = (
            t(Tensor::scalar(sa)),
            t(Tensor::scalar(za)),
            t(Tensor::from_vec(vec![n], sb.clone()).unwrap()),
            t(Tensor::from_vec(vec![n], zb.clone()).unwrap()),
            t(Tensor::scalar(sy)),
        );
        for (zy, lo, hi) in [
            (Tensor::scalar(120u8), 0.0, 255.0),
            (Tensor::scalar(-7i8), -128.0, 127.0),
        ] {
            let vzy = t(zy.clone());
            let inputs = [
                Some(&va),
                Some(&vsa),
                Some(&vza),
                Some(&vb),
                Some(&vsb),
                Some(&vzb),
                Some(&vsy),
                Some(&vzy),
            ];
            let zyf = params(&zy)[0];
            let mut want = vec![0.0f64; m * n];
            for r in 0..m {
                for j in 0..n {
                    let s: i64 = (0..k)
                        .map(|p| {
                            (i64::from(a[r * k + p]) - i64::from(za)) * (i64::from(b[p * n + j]) - i64::from(zb[j]))
                        })
                        .sum();
                    let mult = f64::from((sa * sb[j]) / sy);
                    want[r * n + j] = (s as f64 * mult + zyf).round_ties_even().clamp(lo, hi);
                }
            }
            for b_constant in [true, false] {
                let op = QLinearMatMul {
                    b_constant,
                    ..QLinearMatMul::default()
                };
                for _ in 0..2 {
                    let got = op.eval(&Args::new(&inputs)).unwrap().remove(0);
                    let got = got.as_tensor().unwrap();
                    assert_eq!(got.shape(), &[2, m / 2, n]);
                    assert_eq!(got.to_f64_vec(), want);
                }
            }
            assert!(want.iter().any(|&v| v != want[0]));
        }
    }

    /// ConvInteger's pixel-major path (weights packed once as the GEMM's B, kept when
    /// constant; u8 weights whose zero points leave `W - zw` outside i8 held about their
    /// center) against the general f64 path: u8 and i8 inputs and weights, per-channel zero
    /// points anywhere in the type, padding, stride and dilation, depths past one AMX chunk.
    #[test]
    fn conv_integer_by_pixels_matches_the_general_path() {
        fn run<X, W>(n: usize, c: usize, m: usize, hw: usize, seed: usize, stride: usize, pads: [usize; 4], ks: usize)
        where
            X: kiln_tensor::Element + Copy + TryFrom<i32>,
            W: kiln_tensor::Element + Copy + TryFrom<i32>,
            <X as TryFrom<i32>>::Error: std::fmt::Debug,
            <W as TryFrom<i32>>::Error: std::fmt::Debug,
        {
            let (lo_x, lo_w) = (
                if X::DTYPE == DType::I8 { -128 } else { 0 },
                if W::DTYPE == DType::I8 { -128 } else { 0 },
            );
            let val = |i: usize, mul: usize, lo: i32| (((i * mul + seed * 31) % 256) as i32) + lo;
            let x: Vec<X> = (0..n * c * hw * hw)
                .map(|i| X::try_from(val(i, 37, lo_x)).unwrap())
                .collect();
            let w: Vec<W> = (0..m * c * ks * ks)
                .map(|i| W::try_from(val(i, 53, lo_w)).unwrap())
                .collect();
            // Zero points across the whole type: W - zw leaves i8 for most channels.
            let zw: Vec<W> = (0..m).map(|j| W::try_from(val(j, 97, lo_w)).unwrap()).collect();
            let zx = X::try_from(val(3, 11, lo_x)).unwrap();
            let attrs = ConvAttrs {
                auto_pad: AutoPad::NotSet,
                dilations: vec![1, 1 + seed % 2],
                group: 1,
                kernel_shape: Some(vec![ks, ks]),
                pads: pads.to_vec(),
                strides: vec![stride, stride],
            };
            let xt = Value::Tensor(Tensor::from_vec(vec![n, c, hw, hw], x).unwrap());
            let wt = Value::Tensor(Tensor::from_vec(vec![m, c, ks, ks], w).unwrap());
            let zxt = Value::Tensor(Tensor::scalar(zx));
            let zwt = Value::Tensor(Tensor::from_vec(vec![m], zw).unwrap());
            let inputs = [Some(&xt), Some(&wt), Some(&zxt), Some(&zwt)];
            let args = Args::new(&inputs);
            let (want, shape) = general_sums(&attrs, &args, [0, 2, 1, 3]).unwrap();
            for w_constant in [false, true] {
                let op = ConvInteger {
                    conv: attrs.clone(),
                    w_constant,
                    packed: PackCache::default(),
                };
                for _ in 0..2 {
                    let y = op.eval(&args).unwrap();
                    let t = y[0].as_tensor().unwrap();
                    assert_eq!(t.shape(), shape.as_slice());
                    let got: Vec<f64> = t.as_slice::<i32>().unwrap().iter().map(|&v| f64::from(v)).collect();
                    assert_eq!(got, want, "{:?} x {:?}, c={c} m={m} seed={seed}", X::DTYPE, W::DTYPE);
                }
            }
        }
        run::<u8, u8>(1, 24, 24, 9, 0, 1, [1, 1, 1, 1], 3);
        run::<u8, u8>(2, 16, 40, 8, 1, 2, [1, 0, 0, 1], 3);
        run::<i8, u8>(1, 8, 20, 11, 2, 1, [0, 0, 0, 0], 3);
        run::<u8, i8>(1, 12, 17, 7, 3, 1, [2, 2, 2, 2], 3);
        run::<i8, i8>(1, 4, 5, 6, 4, 1, [1, 1, 1, 1], 3);
        // Pointwise: the channels-last rows read in place; and strided.
        run::<u8, u8>(2, 70, 33, 6, 6, 1, [0, 0, 0, 0], 1);
        run::<u8, i8>(1, 20, 16, 7, 7, 2, [0, 0, 0, 0], 1);
        // Fewer than four channels: the channel-major path.
        run::<u8, u8>(1, 1, 24, 9, 5, 2, [1, 1, 1, 1], 3);
        // An image past one piece of the layout transposes (1024 pixels of 70 channels in,
        // 80 channels of 1024 out), on two threads.
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        pool.install(|| run::<u8, u8>(1, 70, 80, 32, 8, 1, [1, 1, 1, 1], 3));
    }

    /// The integer convolution path (im2col + integer GEMM per group, the depthwise loop)
    /// against the general f64 path, over strides, dilations, padding, groups and zero points.
    #[test]
    fn integer_convolutions_match_the_general_path() {
        let cases: [(usize, usize, usize, usize, [usize; 2], [usize; 2], [usize; 4], usize); 6] = [
            // (n, c, m, hw, kernel, strides/dilations packed below, pads, group)
            (1, 3, 4, 7, [3, 3], [1, 1], [1, 1, 1, 1], 1),
            (2, 4, 6, 6, [3, 2], [2, 1], [0, 1, 2, 0], 2),
            (1, 5, 5, 9, [3, 3], [1, 1], [1, 1, 1, 1], 5),
            (1, 6, 6, 8, [3, 3], [2, 2], [1, 0, 0, 1], 6),
            (1, 8, 16, 5, [1, 1], [1, 1], [0, 0, 0, 0], 1),
            (1, 4, 4, 10, [3, 3], [1, 2], [2, 2, 2, 2], 4),
        ];
        for (case, &(n, c, m, hw, kernel, strides, pads, group)) in cases.iter().enumerate() {
            let dil = if case % 2 == 0 { vec![1, 1] } else { vec![2, 1] };
            let attrs = ConvAttrs {
                auto_pad: AutoPad::NotSet,
                dilations: dil,
                group,
                kernel_shape: Some(kernel.to_vec()),
                pads: pads.to_vec(),
                strides: strides.to_vec(),
            };
            let cg = c / group;
            let xs = vec![n, c, hw, hw];
            let ws = vec![m, cg, kernel[0], kernel[1]];
            let xv: Vec<u8> = (0..n * c * hw * hw).map(|i| ((i * 37 + case) % 256) as u8).collect();
            let wv: Vec<i8> = (0..m * cg * kernel[0] * kernel[1])
                .map(|i| ((i * 53 + 7 * case) % 256) as u8 as i8)
                .collect();
            let zw: Vec<i8> = (0..m).map(|j| (j as i8).wrapping_mul(5)).collect();
            let (zx, x) = (13u8, Tensor::from_vec(xs.clone(), xv.clone()).unwrap());
            let w = Tensor::from_vec(ws.clone(), wv.clone()).unwrap();
            let zxt = Tensor::scalar(zx);
            let zwt = Tensor::from_vec(vec![m], zw.clone()).unwrap();
            let (got, shape) = conv_fast(&attrs, &x, Some(&zxt), &w, Some(&zwt), 3, None)
                .unwrap()
                .expect("the integer path applies");
            let xf: Vec<f64> = xv.iter().map(|&v| f64::from(v) - f64::from(zx)).collect();
            let kp = cg * kernel[0] * kernel[1];
            let wf: Vec<f64> = wv
                .iter()
                .enumerate()
                .map(|(i, &v)| f64::from(v) - f64::from(zw[i / kp]))
                .collect();
            let (want, wshape) = attrs.conv(&xf, &xs, &wf, &ws, 3).unwrap();
            assert_eq!(shape, wshape, "case {case}");
            let got: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
            assert_eq!(got, want, "case {case}");
        }
    }

    #[test]
    fn matmul_integer_with_zero_points() {
        // (A - 1) x (B - 2): A = [[3, 4]], B = [[2], [5]] -> [[2, 3]] x [[0], [3]] = [[9]].
        let a = Value::Tensor(Tensor::from_vec(vec![1, 2], vec![3u8, 4]).unwrap());
        let b = Value::Tensor(Tensor::from_vec(vec![2, 1], vec![2u8, 5]).unwrap());
        let za = Value::Tensor(Tensor::scalar(1u8));
        let zb = Value::Tensor(Tensor::scalar(2u8));
        let y = MatMulInteger::default()
            .eval(&Args::new(&[Some(&a), Some(&b), Some(&za), Some(&zb)]))
            .unwrap();
        assert_eq!(y[0].as_tensor().unwrap().as_slice::<i32>().unwrap(), &[9]);
    }

    #[test]
    fn conv_integer_padded_by_hand() {
        // 2x2 input [[1,2],[3,4]], 2x2 kernel of ones, pads 1 -> 3x3 output of window sums.
        let x = Value::Tensor(Tensor::from_vec(vec![1, 1, 2, 2], vec![1u8, 2, 3, 4]).unwrap());
        let w = Value::Tensor(Tensor::from_vec(vec![1, 1, 2, 2], vec![1u8; 4]).unwrap());
        let op = ConvInteger {
            conv: ConvAttrs {
                auto_pad: AutoPad::NotSet,
                dilations: vec![],
                group: 1,
                kernel_shape: None,
                pads: vec![1, 1, 1, 1],
                strides: vec![],
            },
            w_constant: false,
            packed: PackCache::default(),
        };
        let y = op.eval(&Args::new(&[Some(&x), Some(&w)])).unwrap();
        let t = y[0].as_tensor().unwrap();
        assert_eq!(t.shape(), &[1, 1, 3, 3]);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 3, 2, 4, 10, 6, 3, 7, 4]);
    }
}
