//! Layout ops: Transpose, Concat, Split, Slice, Tile, Pad, DepthToSpace, SpaceToDepth,
//! CenterCropPad, Trilu, ReverseSequence.

use super::*;
use crate::util::{checked_numel, const_tensor, dim, input_dtype, norm_axes, norm_axis, read_i64, read_i64s};

/// Builds a tensor whose element at output position `(o_0, .., o_k)` is the input element at
/// `(maps[0][o_0], .., maps[k][o_k])`, or `fill` where any map gives `None`. The source
/// indices are produced one by one as the output is written: no index array (at 16 bytes
/// per element it made a byte-sized Pad output of 2^30 elements a 16 GiB allocation).
pub(crate) fn gather_axes(x: &Tensor, maps: &[Vec<Option<usize>>], fill: Option<&Tensor>) -> Result<Tensor> {
    let out_shape: Vec<usize> = maps.iter().map(Vec::len).collect();
    checked_numel(&out_shape)?;
    let st = strides(x.shape());
    let rank = out_shape.len();
    let misfit = || OpError::input_shape(0, "a shape holding every element the op reads", x.shape());
    if maps.len() != x.rank()
        || maps
            .iter()
            .zip(x.shape())
            .any(|(m, &d)| m.iter().any(|i| i.is_some_and(|i| i >= d)))
    {
        return Err(misfit());
    }
    // Every output element read from X (Tile, reflect/edge/wrap Pad, ...): the typed copy.
    if maps.iter().all(|m| m.iter().all(Option::is_some)) {
        let maps: Vec<Vec<usize>> = maps.iter().map(|m| m.iter().flatten().copied().collect()).collect();
        let typed = match x.dtype() {
            DType::F32 => Some(gather_rows(x.as_slice::<f32>()?, &st, &maps, &out_shape)?),
            DType::I64 => Some(gather_rows(x.as_slice::<i64>()?, &st, &maps, &out_shape)?),
            DType::U8 => Some(gather_rows(x.as_slice::<u8>()?, &st, &maps, &out_shape)?),
            DType::I8 => Some(gather_rows(x.as_slice::<i8>()?, &st, &maps, &out_shape)?),
            _ => None,
        };
        if let Some(t) = typed {
            return Ok(t);
        }
    }
    let ext;
    let src = match fill {
        Some(f) => {
            // The fill value sits right after X's elements: `None` reads it.
            ext = concat_flat(&[x, f])?;
            &ext
        }
        // Callers without a fill map every output position inside X.
        None if maps.iter().any(|m| m.contains(&None)) => return Err(misfit()),
        None => x,
    };
    let outside = x.len();
    let mut pos = vec![0usize; rank];
    let next = || {
        let mut flat = Some(0usize);
        for (d, (&p, m)) in pos.iter().zip(maps).enumerate() {
            flat = match (flat, m.get(p).copied().flatten()) {
                (Some(f), Some(i)) => Some(f + i * st.get(d).copied().unwrap_or(0)),
                _ => None,
            };
        }
        for d in (0..rank).rev() {
            pos[d] += 1;
            if pos[d] < out_shape[d] {
                break;
            }
            pos[d] = 0;
        }
        flat.unwrap_or(outside)
    };
    Ok(src.gather_flat_fn(out_shape.clone(), next)?)
}

/// [`gather_axes`] with every output element inside X (`maps[d]` X's index along dim `d` of
/// each output position; X's `strides`): an odometer over the output's rows, each row one
/// indexed copy along the last dim.
fn gather_rows<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element>(
    x: &[T],
    strides: &[usize],
    maps: &[Vec<usize>],
    out_shape: &[usize],
) -> Result<Tensor> {
    let n = checked_numel(out_shape)?;
    let mut out = crate::util::out_buf::<T>(n);
    let misfit = || OpError::input_shape(0, "a shape holding every element the op reads", out_shape);
    let (Some(last), Some(&cols)) = (maps.last(), out_shape.last()) else {
        // A scalar: its one element.
        if let (Some(d), Some(&v)) = (out.first_mut(), x.first()) {
            *d = v;
        }
        return Ok(Tensor::from_buf(out_shape.to_vec(), out)?);
    };
    let outer = maps.len() - 1;
    let mut pos = vec![0usize; outer];
    for row in out.chunks_exact_mut(cols.max(1)) {
        let from: usize = pos
            .iter()
            .zip(maps)
            .zip(strides)
            .map(|((&p, m), &st)| m.get(p).copied().unwrap_or(0) * st)
            .sum();
        let src = x.get(from..).ok_or_else(misfit)?;
        for (d, &i) in row.iter_mut().zip(last) {
            *d = *src.get(i).ok_or_else(misfit)?;
        }
        for d in (0..outer).rev() {
            pos[d] += 1;
            if pos[d] < out_shape[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    Ok(Tensor::from_buf(out_shape.to_vec(), out)?)
}

fn identity_maps(shape: &[usize]) -> Vec<Vec<Option<usize>>> {
    shape.iter().map(|&n| (0..n).map(Some).collect()).collect()
}

/// ONNX `Transpose` (opsets 1-25); `perm` defaults to reversing the dims.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Transpose {
    pub perm: Option<Vec<i64>>,
}

impl Transpose {
    fn perm(&self, rank: usize) -> Result<kiln_tensor::Shape> {
        match &self.perm {
            Some(p) => {
                if p.len() != rank {
                    return Err(OpError::attribute(
                        "perm",
                        format!("{rank} axes, the input's rank"),
                        format!("{p:?}"),
                    ));
                }
                norm_axes(p, rank)
            }
            None => Ok((0..rank).rev().collect()),
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?)?)
    }
    /// The transpose of `x`.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let perm = self.perm(x.rank())?;
        let out_shape: kiln_tensor::Shape = perm.iter().map(|&p| x.shape()[p]).collect();
        // Only dims of size 1 move (a `[1, N]` index list turned into `[N, 1]`): the elements
        // keep their order, so the result is a copy of the input under the new shape. Not
        // for the element types below, whose loop nest makes that one copy into a planned or
        // recycled buffer (a clone would allocate every run).
        let recycled = matches!(x.dtype(), DType::F32 | DType::U8 | DType::I8);
        let mut kept = perm.iter().copied().filter(|&p| x.shape().get(p) != Some(&1));
        let in_order = kept
            .next()
            .is_none_or(|first| kept.try_fold(first, |last, p| (last < p).then_some(p)).is_some());
        if !recycled && in_order {
            return Ok(x.clone().reshape(out_shape)?);
        }
        // The loop nest, for each element type it has a matrix block for: `$out` makes the
        // output buffer (planned or recycled for f32 and 8-bit values, whose every element
        // is written, so no copy of the input first), `$block` moves the matrix transposes
        // (8x8 blocks through registers for f32 and bytes, the scalar block for index
        // tensors and f64).
        macro_rules! nest {
            ($t:ty, $out:expr, $block:expr) => {
                if let Ok(v) = x.as_slice::<$t>() {
                    let mut out: kiln_tensor::Buf<$t> = ($out)(v);
                    let block: BlockFn<'_, $t> = $block;
                    if !permute_into(v, x.shape(), &perm, &mut out, block) {
                        return Err(OpError::input_shape(
                            0,
                            format!("a shape of {} elements, as its data", v.len()),
                            x.shape(),
                        ));
                    }
                    return Ok(Tensor::from_buf(out_shape, out)?);
                }
            };
        }
        use kiln_kernels::transpose::{transpose, transpose_bytes, transpose_f32};
        nest!(f32, |v: &[f32]| crate::util::out_f32(v.len()), &transpose_f32);
        nest!(
            u8,
            |v: &[u8]| crate::util::out_buf::<u8>(v.len()),
            &transpose_bytes::<u8>
        );
        nest!(
            i8,
            |v: &[i8]| crate::util::out_buf::<i8>(v.len()),
            &transpose_bytes::<i8>
        );
        nest!(
            i64,
            |v: &[i64]| kiln_tensor::Buf::from_vec(v.to_vec()),
            &transpose::<i64>
        );
        nest!(
            i32,
            |v: &[i32]| kiln_tensor::Buf::from_vec(v.to_vec()),
            &transpose::<i32>
        );
        nest!(
            f64,
            |v: &[f64]| kiln_tensor::Buf::from_vec(v.to_vec()),
            &transpose::<f64>
        );
        let (shape, idx) = transpose_map(x.shape(), &perm)?;
        Ok(x.gather_flat(shape, &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match in_shape(inputs, 0) {
            Some(s) => {
                let perm = self.perm(s.len())?;
                Some(perm.iter().map(|&p| s[p].clone()).collect())
            }
            None => None,
        };
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}

/// `x` (row-major, `shape`) with its dims permuted (`out dim i = in dim perm[i]`), as a loop
/// nest over the output with runs of output dims that are also consecutive in the input
/// merged, so the inner loop is a slice copy when the last dim stays last, a batch of matrix
/// transposes when the last two merged dims swap, and a strided gather otherwise. `perm` is a
/// permutation of `0..shape.len()` (checked by the caller).
#[cfg(test)]
pub(crate) fn permute<T: Copy + Send + Sync>(x: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let mut out = x.to_vec();
    let block: BlockFn<'_, T> = &kiln_kernels::transpose::transpose::<T>;
    assert!(permute_into(x, shape, perm, &mut out, block), "x fills its shape");
    out
}

/// [`permute`] on f32 as Transpose runs it (the matrix transposes on the SIMD kernel).
#[cfg(test)]
pub(crate) fn permute_f32(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let mut out = x.to_vec();
    let block: BlockFn<'_, f32> = &kiln_kernels::transpose::transpose_f32;
    assert!(permute_into(x, shape, perm, &mut out, block), "x fills its shape");
    out
}

/// A matrix transpose as [`kiln_kernels::transpose::transpose_f32`] takes it: `(src, lds,
/// rows, cols, dst, ldd)`, `false` when the slices do not fit.
type BlockFn<'a, T> = &'a (dyn Fn(&[T], usize, usize, usize, &mut [T], usize) -> bool + Sync);

/// [`permute`] into `out` (whatever it holds is overwritten), which has the tensor's element
/// count, its matrix transposes through `block`; `false` (and `out` unspecified) when `x` or
/// `out` does not have `shape`'s count.
pub(crate) fn permute_into<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    perm: &[usize],
    out: &mut [T],
    block: BlockFn<'_, T>,
) -> bool {
    let st = strides(shape);
    // (size, input stride) per output dim, size-1 dims dropped, consecutive ones merged.
    let mut dims: smallvec::SmallVec<[(usize, usize); 6]> = smallvec::SmallVec::new();
    for &p in perm {
        let (n, s) = (shape.get(p).copied().unwrap_or(1), st.get(p).copied().unwrap_or(0));
        if n == 1 {
            continue;
        }
        match dims.last_mut() {
            Some((pn, ps)) if *ps == s * n => {
                *pn *= n;
                *ps = s;
            }
            _ => dims.push((n, s)),
        }
    }
    let total: usize = shape.iter().product();
    let Some(x) = x.get(..total) else { return false };
    if out.len() != total {
        return false;
    }
    if total == 0 {
        return true;
    }
    let Some(&(inner, istride)) = dims.last() else {
        out.copy_from_slice(x);
        return true;
    };
    if let [.., (p, 1), (q, sq)] = dims[..]
        && sq == p
    {
        return batched_transpose(x, &dims[..dims.len() - 2], p, q, out, block);
    }
    let outer = &dims[..dims.len() - 1];
    let mut idx: smallvec::SmallVec<[usize; 6]> = smallvec::smallvec![0usize; outer.len()];
    let mut base = 0usize;
    for dst in out.chunks_exact_mut(inner) {
        if istride == 1 {
            let Some(src) = x.get(base..base + inner) else {
                return false;
            };
            dst.copy_from_slice(src);
        } else {
            for (i, d) in dst.iter_mut().enumerate() {
                let Some(&v) = x.get(base + i * istride) else {
                    return false;
                };
                *d = v;
            }
        }
        for k in (0..outer.len()).rev() {
            idx[k] += 1;
            base += outer[k].1;
            if idx[k] < outer[k].0 {
                break;
            }
            base -= outer[k].1 * outer[k].0;
            idx[k] = 0;
        }
    }
    true
}

/// The permutation `permute` reduces to a batch of 2-D transposes: for each block of the
/// `outer` dims (size, input stride), the input's `[q, p]` matrix becomes the output's
/// `[p, q]`, by `block` (NCHW <-> NHWC is this case); a large matrix is split over the thread
/// pool by output rows. `x` holds exactly the tensor's elements; `false` if `block` refused a
/// matrix.
fn batched_transpose<T: Copy + Send + Sync>(
    x: &[T],
    outer: &[(usize, usize)],
    p: usize,
    q: usize,
    out: &mut [T],
    block: BlockFn<'_, T>,
) -> bool {
    // Output rows per task when a matrix is split over the thread pool: at least 64 Ki
    // elements each, in multiples of 16.
    const PAR_ELEMS: usize = 1 << 16;
    let mat = p * q;
    let rows_per_task = (PAR_ELEMS / q.max(1)).next_multiple_of(16).max(16);
    let mut idx: smallvec::SmallVec<[usize; 6]> = smallvec::smallvec![0usize; outer.len()];
    let mut base = 0usize;
    for dst in out.chunks_exact_mut(mat.max(1)) {
        // Output rows `r0..` of this matrix: input columns `r0..` of its `q` rows (stride `p`).
        let failed = std::sync::atomic::AtomicBool::new(false);
        let rows = |r0: usize, part: &mut [T]| {
            let ok = x
                .get(base + r0..)
                .is_some_and(|src| block(src, p, q, part.len() / q.max(1), part, q));
            if !ok {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        };
        if mat >= 2 * PAR_ELEMS && q > 0 {
            kiln_kernels::pool::for_each_chunk_mut(dst, rows_per_task * q, &|t, part| rows(t * rows_per_task, part));
        } else {
            rows(0, dst);
        }
        // The next block of the outer dims, odometer-style.
        for k in (0..outer.len()).rev() {
            let (n, st) = outer[k];
            idx[k] += 1;
            base += st;
            if idx[k] < n {
                break;
            }
            base -= st * n;
            idx[k] = 0;
        }
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
    }
    true
}

/// Longest run (elements of one input per step of the outer dims) that [`concat_runs`]
/// writes element by element rather than as a copy call.
const NARROW_RUN: usize = 32;

/// Elements of the output per block of rows (a task of the pool).
const NARROW_BLOCK: usize = 1 << 14;

/// [`Concat`] of inputs all of element type `T` (`None` otherwise): per step of the outer
/// dims, each input's run of `axis` rows copied in order. A copy that does not fit (a short
/// input) leaves the result short, which `Tensor::from_buf` refuses.
fn concat_runs<T: kiln_tensor::Element + kiln_kernels::recycle::Recycled + Send + Sync>(
    xs: &[&Tensor],
    (axis, outer, inner, n): (usize, usize, usize, usize),
    out_shape: &kiln_tensor::Shape,
) -> Option<Result<Tensor>> {
    let parts: Option<smallvec::SmallVec<[&[T]; 8]>> = xs.iter().map(|x| x.as_slice::<T>().ok()).collect();
    let parts = parts?;
    let mut out = crate::util::out_buf::<T>(n);
    let chunks: smallvec::SmallVec<[usize; 8]> = xs
        .iter()
        .map(|x| x.shape().get(axis).copied().unwrap_or(0) * inner)
        .collect();
    let step: usize = chunks.iter().sum();
    if step > 0 && step * outer == n {
        // Blocks of output rows over the pool (a channels-last concatenation is a run of
        // each input per pixel: one thread copying them all held SqueezeNet's to the same
        // time on two threads as on one). Short runs (few-channel values, a `stack` of
        // single values) element by element: a call per run costs more than the run.
        let rows = (NARROW_BLOCK / step).max(1);
        let short = std::sync::atomic::AtomicBool::new(false);
        kiln_kernels::pool::for_each_chunk_mut(out.as_mut_slice(), rows * step, &|b, block| {
            let o0 = b * rows;
            let mut off = 0;
            for (part, &c) in parts.iter().zip(&chunks) {
                let nrows = block.len() / step;
                let Some(src) = part.get(o0 * c..(o0 + nrows) * c) else {
                    short.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                };
                if c == 1 {
                    for (row, &v) in block.chunks_exact_mut(step).zip(src) {
                        if let Some(d) = row.get_mut(off) {
                            *d = v;
                        }
                    }
                } else if c > NARROW_RUN {
                    for (row, run) in block.chunks_exact_mut(step).zip(src.chunks_exact(c)) {
                        if let Some(d) = row.get_mut(off..off + c) {
                            d.copy_from_slice(run);
                        }
                    }
                } else if c > 0 {
                    for (row, run) in block.chunks_exact_mut(step).zip(src.chunks_exact(c)) {
                        if let Some(d) = row.get_mut(off..off + c) {
                            for (d, &v) in d.iter_mut().zip(run) {
                                *d = v;
                            }
                        }
                    }
                }
                off += c;
            }
        });
        if short.load(std::sync::atomic::Ordering::Relaxed) {
            out.make_mut().truncate(0);
        }
        return Some(Tensor::from_buf(out_shape.clone(), out).map_err(Into::into));
    }
    let mut pos = 0usize;
    'outer: for o in 0..outer {
        for (x, part) in xs.iter().zip(&parts) {
            let chunk = x.shape().get(axis).copied().unwrap_or(0) * inner;
            let (Some(src), Some(dst)) = (part.get(o * chunk..(o + 1) * chunk), out.get_mut(pos..pos + chunk)) else {
                out.make_mut().truncate(pos);
                break 'outer;
            };
            dst.copy_from_slice(src);
            pos += chunk;
        }
    }
    // The shape inline (no allocation: a steady-state run allocates nothing but outputs).
    Some(Tensor::from_buf(out_shape.clone(), out).map_err(Into::into))
}

/// ONNX `Concat` (opsets 1-13) along `axis`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Concat {
    pub axis: i64,
}

impl Concat {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let xs = args.tensors()?;
        let first = xs.first().ok_or(OpError::MissingInput { index: 0 })?;
        let rank = first.rank();
        let axis = norm_axis(self.axis, rank)?;
        let mut out_shape = kiln_tensor::Shape::from_slice(first.shape());
        out_shape[axis] = 0;
        for (i, x) in xs.iter().enumerate() {
            let s = x.shape();
            if s.len() != rank || s.iter().enumerate().any(|(d, &n)| d != axis && n != first.shape()[d]) {
                return Err(OpError::inputs(
                    0,
                    i,
                    format!("shapes that agree off axis {axis}"),
                    first.shape(),
                    s,
                ));
            }
            out_shape[axis] += s[axis];
        }
        let outer: usize = out_shape[..axis].iter().product();
        let inner: usize = out_shape[axis + 1..].iter().product();
        let n = checked_numel(&out_shape)?;
        // The element types activations have (8-bit ones in quantized models): each input's
        // run of `axis` rows per step of the outer dims, copied in order into a recycled
        // buffer. Other types gather.
        let geometry = (axis, outer, inner, n);
        let copied = match first.dtype() {
            kiln_tensor::DType::F32 => concat_runs::<f32>(&xs, geometry, &out_shape),
            kiln_tensor::DType::U8 => concat_runs::<u8>(&xs, geometry, &out_shape),
            kiln_tensor::DType::I8 => concat_runs::<i8>(&xs, geometry, &out_shape),
            kiln_tensor::DType::I64 => concat_runs::<i64>(&xs, geometry, &out_shape),
            _ => None,
        };
        if let Some(t) = copied {
            return one(t?);
        }
        let all = concat_flat(&xs)?;
        let mut idx = Vec::with_capacity(n);
        // Offset of each input in the flat concatenation.
        let mut base = Vec::with_capacity(xs.len());
        let mut acc = 0;
        for x in &xs {
            base.push(acc);
            acc += x.len();
        }
        for o in 0..outer {
            for (x, &b) in xs.iter().zip(&base) {
                let chunk = x.shape()[axis] * inner;
                idx.extend(b + o * chunk..b + (o + 1) * chunk);
            }
        }
        one(all.gather_flat(out_shape, &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = (0..inputs.len()).find_map(|i| input_dtype(inputs, i));
        let mut shape: Option<Vec<Dim>> = None;
        for i in 0..inputs.len() {
            let Some(s) = in_shape(inputs, i) else {
                return Ok(vec![tensor_type(dtype, None)]);
            };
            let axis = norm_axis(self.axis, s.len())?;
            shape = Some(match shape {
                None => s,
                Some(mut acc) => {
                    if acc.len() != s.len() {
                        // The shapes may hold symbols: evaluation names them when it fails.
                        return match (super::shape::fixed_of(&acc), super::shape::fixed_of(&s)) {
                            (Some(a), Some(b)) => Err(OpError::inputs(0, i, "the same rank", &a, &b)),
                            _ => Ok(vec![tensor_type(dtype, None)]),
                        };
                    }
                    acc[axis] = match (&acc[axis], &s[axis]) {
                        (Dim::Fixed(a), Dim::Fixed(b)) => Dim::Fixed(a + b),
                        _ => return Ok(vec![tensor_type(dtype, None)]),
                    };
                    for d in 0..acc.len() {
                        if d != axis && matches!(acc[d], Dim::Sym(_)) && matches!(s[d], Dim::Fixed(_)) {
                            acc[d] = s[d].clone();
                        }
                    }
                    acc
                }
            });
        }
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Split` (opsets 1-18) along `axis`: sizes from the `split` attribute (opsets < 13),
/// input 1 (opset 13+), `num_outputs` (opset 18, the last chunk smaller), or equal parts,
/// one per node output.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Split {
    pub axis: i64,
    pub split: Option<Vec<i64>>,
    pub num_outputs: Option<usize>,
    /// Number of node outputs.
    pub outputs: usize,
}

impl Split {
    /// The number of equal parts: `num_outputs` when set, which ONNX requires to equal the
    /// node's outputs (checked here, before anything is sized by it), else the outputs.
    fn parts(&self) -> Result<usize> {
        match self.num_outputs {
            Some(k) if k != self.outputs => Err(OpError::attribute(
                "num_outputs",
                format!("{}, the node's number of outputs", self.outputs),
                k,
            )),
            _ if self.outputs == 0 => Err(OpError::attribute("num_outputs", ">= 1", 0)),
            _ => Ok(self.outputs),
        }
    }
    /// Bad split sizes: the attribute's (opsets < 13) or input 1's.
    fn bad_split(&self, expected: String, got: String) -> OpError {
        match self.split {
            Some(_) => OpError::attribute("split", expected, got),
            None => OpError::input_value(1, expected, got),
        }
    }
    fn split_dims(&self, split: &[i64]) -> Result<Vec<usize>> {
        match split.iter().find(|&&v| v < 0) {
            Some(_) => Err(self.bad_split("sizes >= 0".into(), format!("{split:?}"))),
            None => Ok(split.iter().map(|&v| v as usize).collect()),
        }
    }
    /// The part sizes along an axis of size `n`; `None` when there is no split and `n` does
    /// not divide into one equal part per output.
    fn sizes(&self, n: usize, split: Option<std::borrow::Cow<'_, [i64]>>) -> Result<Option<Vec<usize>>> {
        if let Some(s) = split {
            let s = self.split_dims(&s)?;
            if s.iter().sum::<usize>() != n {
                return Err(self.bad_split(format!("sizes adding up to {n}, the axis' size"), format!("{s:?}")));
            }
            return Ok(Some(s));
        }
        let k = self.parts()?;
        if self.num_outputs.is_none() && !n.is_multiple_of(k) {
            return Ok(None);
        }
        let chunk = n.div_ceil(k);
        let mut left = n;
        Ok(Some(
            (0..k)
                .map(|_| {
                    let c = chunk.min(left);
                    left -= c;
                    c
                })
                .collect(),
        ))
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let axis = norm_axis(self.axis, x.rank())?;
        let split = ints_from(&self.split, args, 1, "split")?;
        let sizes = self.sizes(x.shape()[axis], split)?.ok_or_else(|| {
            OpError::input_shape(
                0,
                format!("axis {axis} divisible into {} equal parts", self.outputs),
                x.shape(),
            )
        })?;
        let mut out = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for s in sizes {
            // Each part is a box of X, copied in contiguous runs (the types `box_any` takes).
            let mut starts = vec![0usize; x.rank()];
            let mut lens = x.shape().to_vec();
            if let (Some(b), Some(l)) = (starts.get_mut(axis), lens.get_mut(axis)) {
                (*b, *l) = (start, s);
            }
            let ones = vec![1usize; x.rank()];
            let part = match box_any(x, &starts, &lens, &ones)? {
                Some(t) => t,
                None => {
                    let mut maps = identity_maps(x.shape());
                    maps[axis] = (start..start + s).map(Some).collect();
                    gather_axes(x, &maps, None)?
                }
            };
            start += s;
            out.push(Value::Tensor(part));
        }
        Ok(out.into())
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let unknown = vec![tensor_type(dtype, None); self.parts()?];
        let Some(s) = in_shape(inputs, 0) else {
            return Ok(unknown);
        };
        let axis = norm_axis(self.axis, s.len())?;
        let Ok(split) = const_ints(&self.split, inputs, 1) else {
            return Ok(unknown);
        };
        let sizes = match (&s[axis], split) {
            (Dim::Fixed(n), split) => match self.sizes(*n, split.map(std::borrow::Cow::Owned))? {
                Some(sizes) => sizes,
                None => return Ok(unknown),
            },
            (Dim::Sym(_), Some(split)) => self.split_dims(&split)?,
            _ => return Ok(unknown),
        };
        Ok(sizes
            .into_iter()
            .map(|n| {
                let mut sh = s.clone();
                sh[axis] = Dim::Fixed(n);
                tensor_type(dtype, Some(sh))
            })
            .collect())
    }
}

/// The `starts`/`ends`/`axes` attributes of opset-1 Slice.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SliceAttrs {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
    pub axes: Option<Vec<i64>>,
}

/// ONNX `Slice` (opsets 1-13): attributes before opset 10, inputs `starts, ends, axes,
/// steps` after. Bounds clamp as Python slicing does; steps may be negative.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Slice {
    pub attrs: Option<SliceAttrs>,
}

/// Input positions selected along one dim of size `n` by `start:end:step`.
fn slice_positions(n: usize, start: i64, end: i64, step: i64) -> Result<(i64, usize)> {
    if step == 0 {
        return Err(OpError::input_value(4, "steps other than 0", 0));
    }
    let n = n as i128;
    let (mut s, mut e, t) = (start as i128, end as i128, step as i128);
    if s < 0 {
        s += n;
    }
    if e < 0 {
        e += n;
    }
    let len = if t > 0 {
        s = s.clamp(0, n);
        e = e.clamp(0, n);
        if e > s { (e - s + t - 1) / t } else { 0 }
    } else {
        s = s.clamp(-1, n - 1);
        e = e.clamp(-1, n - 1);
        if s > e { (s - e + (-t) - 1) / (-t) } else { 0 }
    };
    Ok((s as i64, len as usize))
}

/// Per-axis (start, step, len) of a slice of `shape`; axes not sliced are whole.
type SliceSpec = Vec<(usize, i64, i64, i64)>;

/// The slice of a rank-`rank` input; `from_attrs` when starts, ends and axes are the
/// attributes of opsets before 10 (else inputs 1 to 4).
fn slice_spec(
    rank: usize,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
    from_attrs: bool,
) -> Result<SliceSpec> {
    let bad = |attr: &'static str, index: usize, expected: String, got: &[i64]| match from_attrs {
        true => OpError::attribute(attr, expected, format!("{got:?}")),
        false => OpError::input_value(index, expected, format!("{got:?}")),
    };
    let one_per_start = || format!("{} values, one per start", starts.len());
    if starts.len() != ends.len() {
        return Err(bad("ends", 2, one_per_start(), ends));
    }
    let axes = match axes {
        Some(a) => {
            if a.len() != starts.len() {
                return Err(bad("axes", 3, one_per_start(), a));
            }
            norm_axes(a, rank)?
        }
        None => {
            if starts.len() > rank {
                return Err(bad(
                    "starts",
                    1,
                    format!("at most {rank} values, the input's rank"),
                    starts,
                ));
            }
            (0..starts.len()).collect()
        }
    };
    if let Some(s) = steps
        && s.len() != starts.len()
    {
        return Err(bad("steps", 4, one_per_start(), s));
    }
    Ok((0..starts.len())
        .map(|i| (axes[i], starts[i], ends[i], steps.map_or(1, |s| s[i])))
        .collect())
}

impl Slice {
    fn read(&self, args: &Args<'_>, rank: usize) -> Result<SliceSpec> {
        match &self.attrs {
            Some(a) => slice_spec(rank, &a.starts, &a.ends, a.axes.as_deref(), None, true),
            None => {
                let starts = read_i64s(args.tensor(1)?, 1, "starts")?;
                let ends = read_i64s(args.tensor(2)?, 2, "ends")?;
                let axes = args.opt_tensor(3)?.map(|t| read_i64s(t, 3, "axes")).transpose()?;
                let steps = args.opt_tensor(4)?.map(|t| read_i64s(t, 4, "steps")).transpose()?;
                slice_spec(rank, &starts, &ends, axes.as_deref(), steps.as_deref(), false)
            }
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let spec = self.read(args, x.rank())?;
        // Positive steps: a box of the input, copied in contiguous runs.
        if spec.iter().all(|&(_, _, _, step)| step >= 1) {
            let mut starts = vec![0usize; x.rank()];
            let mut lens = x.shape().to_vec();
            let mut steps = vec![1usize; x.rank()];
            for &(axis, start, end, step) in &spec {
                let (Some(s), Some(l), Some(t)) = (starts.get_mut(axis), lens.get_mut(axis), steps.get_mut(axis))
                else {
                    return Err(OpError::Axis {
                        axis: axis as i64,
                        rank: x.rank(),
                    });
                };
                let (first, len) = slice_positions(x.shape()[axis], start, end, step)?;
                (*s, *l, *t) = (first.max(0) as usize, len, step as usize);
            }
            if let Some(t) = box_any(x, &starts, &lens, &steps)? {
                return one(t);
            }
        }
        let mut maps = identity_maps(x.shape());
        for (axis, start, end, step) in spec {
            let (s, len) = slice_positions(x.shape()[axis], start, end, step)?;
            maps[axis] = (0..len as i64).map(|i| Some((s + i * step) as usize)).collect();
        }
        one(gather_axes(x, &maps, None)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let Some(mut s) = in_shape(inputs, 0) else {
            return Ok(vec![tensor_type(dtype, None)]);
        };
        let spec = match &self.attrs {
            Some(a) => slice_spec(s.len(), &a.starts, &a.ends, a.axes.as_deref(), None, true)?,
            None => {
                let get = |i| const_ints(&None, inputs, i);
                match (get(1), get(2), get(3), get(4)) {
                    (Ok(Some(st)), Ok(Some(en)), Ok(ax), Ok(sp)) => {
                        slice_spec(s.len(), &st, &en, ax.as_deref(), sp.as_deref(), false)?
                    }
                    _ => return Ok(vec![tensor_type(dtype, None)]),
                }
            }
        };
        for (axis, start, end, step) in spec {
            s[axis] = match &s[axis] {
                Dim::Fixed(n) => Dim::Fixed(slice_positions(*n, start, end, step)?.1),
                d if start == 0 && step == 1 && end >= i32::MAX as i64 => d.clone(),
                _ => return Ok(vec![tensor_type(dtype, None)]),
            };
        }
        Ok(vec![tensor_type(dtype, Some(s))])
    }
}

/// The contiguous runs of a box of a row-major tensor of `shape`: per dim, `lens[d]` positions
/// from `starts[d]` every `steps[d] >= 1`. Calls `f(offset in the tensor, offset in the box
/// laid out densely, run length)` for each run, in order, and stops at the first `false`;
/// `false` when the box does not fit the shape. The box's trailing dims that it spans whole
/// with step 1, and the one before them when its step is 1, form each run.
fn box_runs(
    shape: &[usize],
    starts: &[usize],
    lens: &[usize],
    steps: &[usize],
    mut f: impl FnMut(usize, usize, usize) -> bool,
) -> bool {
    let rank = shape.len();
    let fits = starts.len() == rank
        && lens.len() == rank
        && steps.len() == rank
        && (0..rank).all(|d| {
            steps[d] >= 1
                && (lens[d] == 0
                    || (lens[d] - 1)
                        .checked_mul(steps[d])
                        .and_then(|v| v.checked_add(starts[d]))
                        .is_some_and(|last| last < shape[d]))
        });
    if !fits {
        return false;
    }
    if lens.contains(&0) {
        return true;
    }
    // Dims `inner..` are whole with step 1: one contiguous block per position of the others.
    let inner = (0..rank)
        .rev()
        .find(|&d| starts[d] != 0 || lens[d] != shape[d] || steps[d] != 1)
        .map_or(0, |d| d + 1);
    let st = strides(shape);
    let block: usize = shape.iter().skip(inner).product();
    // The last iterated dim joins the run when its step is 1.
    let (outer, run) = match inner.checked_sub(1) {
        Some(k) if steps[k] == 1 => (k, lens[k] * block),
        _ => (inner, block),
    };
    let mut pos = vec![0usize; outer];
    let count: usize = lens.iter().take(outer).product();
    for i in 0..count {
        let mut from: usize = (0..outer).map(|d| (starts[d] + pos[d] * steps[d]) * st[d]).sum();
        if outer < rank && outer < inner {
            from += starts[outer] * st[outer];
        }
        if !f(from, i * run, run) {
            return false;
        }
        for d in (0..outer).rev() {
            pos[d] += 1;
            if pos[d] < lens[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    true
}

/// `dst[to..to + run] = src[from..from + run]`; `false` when either range is out of bounds.
fn copy_run<T: Copy>(src: &[T], from: usize, dst: &mut [T], to: usize, run: usize) -> bool {
    match (src.get(from..from + run), dst.get_mut(to..to + run)) {
        (Some(s), Some(d)) => {
            d.copy_from_slice(s);
            true
        }
        _ => false,
    }
}

/// The box of `x` (row-major, `shape`; see [`box_runs`]) as a tensor.
/// [`box_of`] of a tensor of the types it copies in runs (f32, int64, 8-bit, bool: what
/// slices and splits of real models carry), `None` for the others.
fn box_any(x: &Tensor, starts: &[usize], lens: &[usize], steps: &[usize]) -> Result<Option<Tensor>> {
    Ok(Some(match x.dtype() {
        DType::F32 => box_of(x.as_slice::<f32>()?, x.shape(), starts, lens, steps)?,
        DType::I64 => box_of(x.as_slice::<i64>()?, x.shape(), starts, lens, steps)?,
        DType::U8 => box_of(x.as_slice::<u8>()?, x.shape(), starts, lens, steps)?,
        DType::I8 => box_of(x.as_slice::<i8>()?, x.shape(), starts, lens, steps)?,
        DType::Bool => box_of(x.as_slice::<bool>()?, x.shape(), starts, lens, steps)?,
        _ => return Ok(None),
    }))
}

fn box_of<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element>(
    x: &[T],
    shape: &[usize],
    starts: &[usize],
    lens: &[usize],
    steps: &[usize],
) -> Result<Tensor> {
    let n = checked_numel(lens)?;
    let mut out = crate::util::out_buf::<T>(n);
    let ok = box_runs(shape, starts, lens, steps, |from, to, run| {
        copy_run(x, from, &mut out, to, run)
    });
    if !ok {
        return Err(OpError::input_shape(
            0,
            format!("to hold the box of {lens:?} at {starts:?} (steps {steps:?})"),
            shape,
        ));
    }
    Ok(Tensor::from_buf(lens.to_vec(), out)?)
}

/// `x` (shape `lens`) placed at `starts` in a tensor of `shape` filled with `fill`: constant
/// padding by non-negative amounts.
fn padded<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element>(
    x: &[T],
    shape: &[usize],
    starts: &[usize],
    lens: &[usize],
    fill: T,
) -> Result<Tensor> {
    let n = checked_numel(shape)?;
    let mut out = crate::util::out_buf::<T>(n);
    out.fill(fill);
    let ones = vec![1usize; shape.len()];
    let ok = box_runs(shape, starts, lens, &ones, |to, from, run| {
        copy_run(x, from, &mut out, to, run)
    });
    if !ok {
        return Err(OpError::input_shape(
            0,
            format!("a box within the padded shape {shape:?} at {starts:?}"),
            lens,
        ));
    }
    Ok(Tensor::from_buf(shape.to_vec(), out)?)
}

/// `x` (of `shape`) padded by non-negative `pads` in a reflect, edge or wrap `mode`: each
/// output row is the input row copied, with its padded ends mapped through [`pad_source`];
/// padded rows of outer axes repeat the rows they map to.
fn mirrored<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element>(
    x: &[T],
    shape: &[usize],
    pads: &[(i64, i64)],
    mode: PadMode,
) -> Result<Tensor> {
    let too_large = || OpError::too_large("padded shape of", format!("{shape:?} with pads {pads:?}"));
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(pads)
        .map(|(&n, &(b, e))| {
            let (b, e) = (usize::try_from(b).ok()?, usize::try_from(e).ok()?);
            n.checked_add(b)?.checked_add(e)
        })
        .collect::<Option<_>>()
        .ok_or_else(too_large)?;
    let total = checked_numel(&out_shape)?;
    if x.len() != checked_numel(shape)? {
        return Err(OpError::input_shape(0, format!("{} elements", x.len()), shape));
    }
    let mut out = crate::util::out_buf::<T>(total);
    if total > 0 {
        let (Some(&n), Some(&(b, _)), Some(&cols)) = (shape.last(), pads.last(), out_shape.last()) else {
            // A scalar: nothing to pad.
            out.copy_from_slice(x);
            return Ok(Tensor::from_buf(out_shape, out)?);
        };
        let b = b as usize;
        // Output position -> input position along each outer axis.
        let outer: Vec<Vec<usize>> = shape
            .iter()
            .zip(pads)
            .zip(&out_shape)
            .take(shape.len() - 1)
            .map(|((&n, &(b, _)), &o)| (0..o).map(|k| pad_source(mode, k, b, n).unwrap_or(0)).collect())
            .collect();
        let in_strides = strides(shape);
        let edge: Vec<(usize, usize)> = (0..cols)
            .filter(|k| !(b..b + n).contains(k))
            .map(|k| (k, pad_source(mode, k, b as i64, n).unwrap_or(0)))
            .collect();
        let mut pos = vec![0usize; outer.len()];
        for row in out.chunks_exact_mut(cols) {
            let from: usize = pos
                .iter()
                .zip(&outer)
                .zip(&in_strides)
                .map(|((&p, m), &st)| m.get(p).copied().unwrap_or(0) * st)
                .sum();
            let src = x.get(from..from + n).ok_or_else(too_large)?;
            row.get_mut(b..b + n).ok_or_else(too_large)?.copy_from_slice(src);
            for &(k, i) in &edge {
                if let (Some(d), Some(&v)) = (row.get_mut(k), src.get(i)) {
                    *d = v;
                }
            }
            for d in (0..pos.len()).rev() {
                pos[d] += 1;
                if pos[d] < out_shape[d] {
                    break;
                }
                pos[d] = 0;
            }
        }
    }
    Ok(Tensor::from_buf(out_shape, out)?)
}

/// ONNX `Tile` (opsets 1-13): input 1 gives the repeat count of each dim.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Tile;

fn one_repeat_per_axis(rank: usize, reps: &[i64]) -> OpError {
    OpError::input_value(
        1,
        format!("{rank} repeats, one per axis of input 0"),
        format!("{reps:?}"),
    )
}

impl Tile {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let reps = read_i64s(args.tensor(1)?, 1, "repeats")?;
        if reps.len() != x.rank() {
            return Err(one_repeat_per_axis(x.rank(), &reps));
        }
        let mut out_shape = Vec::with_capacity(reps.len());
        for (&n, &r) in x.shape().iter().zip(&reps) {
            out_shape.push(
                n.checked_mul(dim(r, 1, "repeats")?)
                    .ok_or_else(|| OpError::too_large("tiled dim", format!("{n} x {r}")))?,
            );
        }
        checked_numel(&out_shape)?;
        let maps: Vec<Vec<Option<usize>>> = x
            .shape()
            .iter()
            .zip(&out_shape)
            .map(|(&n, &o)| (0..o).map(|i| Some(i % n.max(1))).collect())
            .collect();
        one(gather_axes(x, &maps, None)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match (in_shape(inputs, 0), const_tensor(inputs, 1)) {
            (Some(s), Some(r)) => {
                let reps = read_i64s(r, 1, "repeats")?;
                if reps.len() != s.len() {
                    return Err(one_repeat_per_axis(s.len(), &reps));
                }
                s.iter()
                    .zip(&reps)
                    .map(|(d, &r)| match d {
                        Dim::Fixed(n) => Some(Dim::Fixed(n * r.max(0) as usize)),
                        d if r == 1 => Some(d.clone()),
                        _ => None,
                    })
                    .collect()
            }
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// Padding mode of [`Pad`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

/// ONNX `Pad` (opsets 1-25). Before opset 11 `pads` and `value` are attributes (kept here);
/// after, inputs `pads`, `constant_value` and (opset 18) `axes`. Negative pads crop.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Pad {
    pub mode: PadMode,
    pub pads: Option<Vec<i64>>,
    pub value: f32,
}

/// Input position read by output position `o` along a dim of size `n` padded by `begin`.
fn pad_source(mode: PadMode, o: usize, begin: i64, n: usize) -> Option<usize> {
    let i = o as i64 - begin;
    let n = n as i64;
    if (0..n).contains(&i) {
        return Some(i as usize);
    }
    if n == 0 {
        return None;
    }
    Some(match mode {
        PadMode::Constant => return None,
        PadMode::Edge => i.clamp(0, n - 1) as usize,
        PadMode::Wrap => i.rem_euclid(n) as usize,
        PadMode::Reflect => {
            if n == 1 {
                0
            } else {
                let p = 2 * (n - 1);
                let m = i.rem_euclid(p);
                (if m >= n { p - m } else { m }) as usize
            }
        }
    })
}

impl Pad {
    /// Bad pads: the attribute's (opsets < 11) or input 1's.
    fn bad_pads(&self, expected: String, got: String) -> OpError {
        match self.pads {
            Some(_) => OpError::attribute("pads", expected, got),
            None => OpError::input_value(1, expected, got),
        }
    }
    fn pads_per_axis(&self, pads: &[i64], axes: usize) -> OpError {
        self.bad_pads(
            format!("{} values, a begin and an end per padded axis", 2 * axes),
            format!("{pads:?}"),
        )
    }
    /// Per-dim (begin, end) pads.
    fn pads(&self, args: &Args<'_>, rank: usize) -> Result<Vec<(i64, i64)>> {
        let pads = ints_from(&self.pads, args, 1, "pads")?.ok_or(OpError::MissingInput { index: 1 })?;
        let axes = match args.opt_tensor(3)? {
            Some(t) if self.pads.is_none() => norm_axes(&read_i64s(t, 3, "axes")?, rank)?,
            _ => (0..rank).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(self.pads_per_axis(&pads, axes.len()));
        }
        let mut out = vec![(0, 0); rank];
        for (i, &a) in axes.iter().enumerate() {
            out[a] = (pads[i], pads[i + axes.len()]);
        }
        Ok(out)
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let pads = self.pads(args, x.rank())?;
        let fill = match (&self.pads, args.opt_tensor(2)?) {
            (None, Some(v)) if !v.is_empty() => v.gather_flat(vec![1], &[0])?,
            (None, _) => zero_of(x.dtype())?,
            (Some(_), _) if x.dtype() == DType::String => zero_of(x.dtype())?,
            (Some(_), _) => scalar_of(x.dtype(), self.value as f64)?,
        };
        if fill.dtype() != x.dtype() {
            return Err(OpError::DTypeMismatch {
                a: x.dtype(),
                b: fill.dtype(),
            });
        }
        // Constant padding by non-negative amounts: X copied in runs into the filled output.
        if self.mode == PadMode::Constant && pads.iter().all(|&(b, e)| b >= 0 && e >= 0) {
            let starts: Vec<usize> = pads.iter().map(|&(b, _)| b as usize).collect();
            let shape: Option<Vec<usize>> = x
                .shape()
                .iter()
                .zip(&pads)
                .map(|(&n, &(b, e))| n.checked_add(b as usize)?.checked_add(e as usize))
                .collect();
            let shape = shape
                .ok_or_else(|| OpError::too_large("padded shape of", format!("{:?} with pads {pads:?}", x.shape())))?;
            let out = match x.dtype() {
                DType::F32 => Some(padded(
                    x.as_slice::<f32>()?,
                    &shape,
                    &starts,
                    x.shape(),
                    fill.as_slice::<f32>()?.first().copied().unwrap_or(0.0),
                )?),
                DType::I64 => Some(padded(
                    x.as_slice::<i64>()?,
                    &shape,
                    &starts,
                    x.shape(),
                    fill.as_slice::<i64>()?.first().copied().unwrap_or(0),
                )?),
                _ => None,
            };
            if let Some(t) = out {
                return one(t);
            }
        }
        // Reflect, edge or wrap padding by non-negative amounts of non-empty axes: rows copied,
        // only the padded positions mapped.
        if self.mode != PadMode::Constant
            && pads
                .iter()
                .zip(x.shape())
                .all(|(&(b, e), &n)| b >= 0 && e >= 0 && (n > 0 || b + e == 0))
        {
            let out = match x.dtype() {
                DType::F32 => Some(mirrored(x.as_slice::<f32>()?, x.shape(), &pads, self.mode)?),
                DType::I64 => Some(mirrored(x.as_slice::<i64>()?, x.shape(), &pads, self.mode)?),
                DType::U8 => Some(mirrored(x.as_slice::<u8>()?, x.shape(), &pads, self.mode)?),
                DType::I8 => Some(mirrored(x.as_slice::<i8>()?, x.shape(), &pads, self.mode)?),
                _ => None,
            };
            if let Some(t) = out {
                return one(t);
            }
        }
        let mut maps = Vec::with_capacity(x.rank());
        for (d, (&n, &(b, e))) in x.shape().iter().zip(&pads).enumerate() {
            let out = n as i64 + b + e;
            if out < 0 {
                return Err(self.bad_pads(
                    format!("pads cropping at most the {n} of axis {d}"),
                    format!("({b}, {e}) on axis {d}"),
                ));
            }
            // Negative pads crop first; the (reflect/edge/wrap) padding then reads the
            // cropped data, as onnxruntime does.
            let (crop_b, crop_e) = ((-b).max(0) as usize, (-e).max(0) as usize);
            let kept = n.saturating_sub(crop_b + crop_e);
            if kept == 0 && out > 0 && self.mode != PadMode::Constant {
                return Err(OpError::input_shape(
                    0,
                    format!("axis {d} non-empty after cropping, to pad in {:?} mode", self.mode),
                    x.shape(),
                ));
            }
            checked_numel(&[out as usize])?;
            maps.push(
                (0..out as usize)
                    .map(|o| pad_source(self.mode, o, b.max(0), kept).map(|i| i + crop_b))
                    .collect::<Vec<_>>(),
            );
        }
        checked_numel(&maps.iter().map(Vec::len).collect::<Vec<_>>())?;
        one(gather_axes(x, &maps, Some(&fill))?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let unknown = Ok(vec![tensor_type(dtype, None)]);
        let Some(s) = in_shape(inputs, 0) else {
            return unknown;
        };
        let Ok(Some(pads)) = const_ints(&self.pads, inputs, 1) else {
            return unknown;
        };
        let axes = if self.pads.is_some() {
            (0..s.len()).collect()
        } else {
            match const_ints(&None, inputs, 3) {
                Ok(Some(a)) => norm_axes(&a, s.len())?,
                Ok(None) => (0..s.len()).collect(),
                Err(()) => return unknown,
            }
        };
        if pads.len() != 2 * axes.len() {
            return Err(self.pads_per_axis(&pads, axes.len()));
        }
        let mut out = s.clone();
        for (i, &a) in axes.iter().enumerate() {
            let (b, e) = (pads[i], pads[i + axes.len()]);
            out[a] = match &s[a] {
                Dim::Fixed(n) => Dim::Fixed((*n as i64 + b + e).max(0) as usize),
                d if b == 0 && e == 0 => d.clone(),
                _ => return unknown,
            };
        }
        Ok(vec![tensor_type(dtype, Some(out))])
    }
}

/// ONNX `DepthToSpace` (opsets 1-13): moves channel blocks into `blocksize`² spatial blocks,
/// DCR (depth-column-row, default) or CRD order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DepthToSpace {
    pub blocksize: usize,
    pub crd: bool,
}

fn dims4(x: &Tensor) -> Result<[usize; 4]> {
    match *x.shape() {
        [b, c, h, w] => Ok([b, c, h, w]),
        _ => Err(OpError::input_shape(0, "[N, C, H, W]", x.shape())),
    }
}

fn blocksize(bs: usize) -> Result<usize> {
    match bs {
        0 => Err(OpError::attribute("blocksize", ">= 1", 0)),
        bs => Ok(bs),
    }
}

impl DepthToSpace {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let [b, c, h, w] = dims4(x)?;
        let bs = blocksize(self.blocksize)?;
        if c % (bs * bs) != 0 {
            return Err(OpError::input_shape(
                0,
                format!("channels divisible by blocksize² ({})", bs * bs),
                x.shape(),
            ));
        }
        let cc = c / (bs * bs);
        let (tmp, perm) = if self.crd {
            ([b, cc, bs, bs, h, w], [0, 1, 4, 2, 5, 3])
        } else {
            ([b, bs, bs, cc, h, w], [0, 3, 4, 1, 5, 2])
        };
        let (_, idx) = transpose_map(&tmp, &perm)?;
        one(x.gather_flat(vec![b, cc, h * bs, w * bs], &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let bs = self.blocksize;
        let shape = in_shape(inputs, 0).and_then(|s| match s.as_slice() {
            [b, Dim::Fixed(c), Dim::Fixed(h), Dim::Fixed(w)] if bs > 0 => Some(vec![
                b.clone(),
                Dim::Fixed(c / (bs * bs)),
                Dim::Fixed(h * bs),
                Dim::Fixed(w * bs),
            ]),
            _ => None,
        });
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}

/// ONNX `SpaceToDepth` (opsets 1-28): moves `blocksize`² spatial blocks into channels, DCR
/// (default) or CRD order (opset 28).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SpaceToDepth {
    pub blocksize: usize,
    pub crd: bool,
}

impl SpaceToDepth {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let [b, c, h, w] = dims4(x)?;
        let bs = blocksize(self.blocksize)?;
        if h % bs != 0 || w % bs != 0 {
            return Err(OpError::input_shape(
                0,
                format!("H and W divisible by blocksize {bs}"),
                x.shape(),
            ));
        }
        let tmp = [b, c, h / bs, bs, w / bs, bs];
        let perm = if self.crd {
            [0, 1, 3, 5, 2, 4]
        } else {
            [0, 3, 5, 1, 2, 4]
        };
        let (_, idx) = transpose_map(&tmp, &perm)?;
        one(x.gather_flat(vec![b, c * bs * bs, h / bs, w / bs], &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let bs = self.blocksize;
        let shape = in_shape(inputs, 0).and_then(|s| match s.as_slice() {
            [b, Dim::Fixed(c), Dim::Fixed(h), Dim::Fixed(w)] if bs > 0 => Some(vec![
                b.clone(),
                Dim::Fixed(c * bs * bs),
                Dim::Fixed(h / bs),
                Dim::Fixed(w / bs),
            ]),
            _ => None,
        });
        Ok(vec![tensor_type(input_dtype(inputs, 0), shape)])
    }
}

/// ONNX `CenterCropPad` (opset 18): crops or zero-pads each of `axes` (default all) to input
/// 1's sizes around the centre (odd differences: the extra element on the right).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CenterCropPad {
    pub axes: Option<Vec<i64>>,
}

impl CenterCropPad {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let target = read_i64s(args.tensor(1)?, 1, "shape")?;
        let axes = match &self.axes {
            Some(a) => norm_axes(a, x.rank())?,
            None => (0..x.rank()).collect(),
        };
        if target.len() != axes.len() {
            return Err(OpError::input_value(
                1,
                format!("{} sizes, one per axis", axes.len()),
                format!("{target:?}"),
            ));
        }
        let mut maps = identity_maps(x.shape());
        for (&a, &t) in axes.iter().zip(&target) {
            let t = dim(t, 1, "shape")?;
            let n = x.shape()[a];
            checked_numel(&[t])?;
            let off = if n >= t {
                ((n - t) / 2) as i64
            } else {
                -(((t - n) / 2) as i64)
            };
            maps[a] = (0..t)
                .map(|o| {
                    let i = o as i64 + off;
                    (0..n as i64).contains(&i).then_some(i as usize)
                })
                .collect();
        }
        checked_numel(&maps.iter().map(Vec::len).collect::<Vec<_>>())?;
        one(gather_axes(x, &maps, Some(&zero_of(x.dtype())?))?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match (in_shape(inputs, 0), const_tensor(inputs, 1)) {
            (Some(mut s), Some(t)) => {
                let target = read_i64s(t, 1, "shape")?;
                let axes = match &self.axes {
                    Some(a) => norm_axes(a, s.len())?,
                    None => (0..s.len()).collect(),
                };
                for (&a, &t) in axes.iter().zip(&target) {
                    s[a] = Dim::Fixed(dim(t, 1, "shape")?);
                }
                Some(s)
            }
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Trilu` (opset 14): keeps the upper (`j - i >= k`) or lower (`j - i <= k`) triangle
/// of the last two dims, zeroing the rest; `k` is input 1 (default 0).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Trilu {
    pub upper: bool,
}

impl Trilu {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let k = match args.opt_tensor(1)? {
            Some(t) => read_i64(t, 1, "k")?,
            None => 0,
        };
        let r = x.rank();
        if r < 2 {
            return Err(OpError::input_shape(0, "rank >= 2", x.shape()));
        }
        let (rows, cols) = (x.shape()[r - 2], x.shape()[r - 1]);
        let idx: Vec<Option<usize>> = (0..x.len())
            .map(|f| {
                let j = (f % cols) as i64;
                let i = ((f / cols) % rows) as i64;
                let keep = if self.upper { j - i >= k } else { j - i <= k };
                keep.then_some(f)
            })
            .collect();
        one(gather_or_fill(x, &zero_of(x.dtype())?, x.shape().to_vec(), &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

/// ONNX `ReverseSequence` (opset 10): reverses the first `sequence_lens[b]` elements along
/// `time_axis` of each batch entry `b` along `batch_axis`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ReverseSequence {
    pub batch_axis: i64,
    pub time_axis: i64,
}

impl ReverseSequence {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let lens = read_i64s(args.tensor(1)?, 1, "sequence_lens")?;
        let ba = norm_axis(self.batch_axis, x.rank())?;
        let ta = norm_axis(self.time_axis, x.rank())?;
        if ba == ta {
            return Err(OpError::attribute(
                "time_axis",
                format!("an axis other than batch_axis ({ba})"),
                self.time_axis,
            ));
        }
        let (nb, nt) = (x.shape()[ba], x.shape()[ta]);
        if lens.len() != nb {
            return Err(OpError::input_shape(
                1,
                format!("{nb} lengths, one per batch entry (axis {ba} of input 0)"),
                args.tensor(1)?.shape(),
            ));
        }
        for &l in &lens {
            if l < 0 || l as usize > nt {
                return Err(OpError::IndexOutOfRange { index: l, size: nt });
            }
        }
        let st = strides(x.shape());
        let mut pos = vec![0usize; x.rank()];
        let idx: Vec<usize> = (0..x.len())
            .map(|f| {
                unravel(f, x.shape(), &mut pos);
                let (b, t) = (pos[ba], pos[ta]);
                let l = lens[b] as usize;
                if t < l {
                    f - t * st[ta] + (l - 1 - t) * st[ta]
                } else {
                    f
                }
            })
            .collect();
        one(x.gather_flat(x.shape().to_vec(), &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![tensor_type(input_dtype(inputs, 0), in_shape(inputs, 0))])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod box_tests {
    use super::*;

    /// Runs `op` on `x` (f32, the box-copy paths) and on the same values in f64 (the reference
    /// gather paths); the results must be equal.
    fn same_as_reference(eval: impl Fn(&Args<'_>) -> Result<crate::Outputs>, shape: &[usize], extra: &[Tensor]) {
        let v: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|i| i as f32 * 0.5 - 7.0)
            .collect();
        let run = |x: Tensor| {
            let vals: Vec<Value> = std::iter::once(x)
                .chain(extra.iter().cloned())
                .map(Value::Tensor)
                .collect();
            let ins: Vec<Option<&Value>> = vals.iter().map(Some).collect();
            eval(&Args::new(&ins))
                .unwrap()
                .into_iter()
                .map(|v| v.as_tensor().unwrap().clone())
                .collect::<Vec<_>>()
        };
        let fast = run(Tensor::from_vec(shape.to_vec(), v.clone()).unwrap());
        let slow =
            run(Tensor::from_vec(shape.to_vec(), v.iter().map(|&a| f64::from(a)).collect::<Vec<f64>>()).unwrap());
        assert_eq!(fast.len(), slow.len());
        for (f, s) in fast.iter().zip(&slow) {
            assert_eq!(f.dtype(), DType::F32);
            assert_eq!(f.shape(), s.shape());
            assert_eq!(f.to_f64_vec(), s.to_f64_vec());
        }
    }

    fn i64s(v: &[i64]) -> Tensor {
        Tensor::from_vec(vec![v.len()], v.to_vec()).unwrap()
    }

    #[test]
    fn strided_slices_splits_and_constant_pads_match_the_gather_paths() {
        let slice = Slice { attrs: None };
        // Steps of 2 and 3 (Swin's patch merging), negative starts and clamped ends, whole
        // trailing dims, an empty result, and unit steps on inner dims only.
        for (starts, ends, axes, steps) in [
            (vec![0, 1], vec![i64::MAX, i64::MAX], vec![1, 2], vec![2, 2]),
            (vec![-4, 0, 1], vec![100, 5, 3], vec![0, 1, 3], vec![3, 1, 1]),
            (vec![2], vec![2], vec![1], vec![1]),
            (vec![1], vec![-1], vec![3], vec![2]),
        ] {
            let extra = [i64s(&starts), i64s(&ends), i64s(&axes), i64s(&steps)];
            same_as_reference(|a| slice.eval(a), &[5, 6, 4, 3], &extra);
        }
        let split = Split {
            axis: 2,
            split: Some(vec![1, 3]),
            num_outputs: None,
            outputs: 2,
        };
        same_as_reference(|a| split.eval(a), &[2, 3, 4, 5], &[]);
        let pad = Pad {
            mode: PadMode::Constant,
            pads: Some(vec![0, 1, 0, 2, 0, 0, 3, 1]),
            value: 1.5,
        };
        same_as_reference(|a| pad.eval(a), &[2, 3, 4, 5], &[]);
        let none = Pad {
            pads: Some(vec![0; 8]),
            ..pad
        };
        same_as_reference(|a| none.eval(a), &[2, 3, 4, 5], &[]);
        // Reflect, edge and wrap pads wider than the dims (wrap and reflect go round more
        // than once), of outer and inner axes, of one-element axes, and none at all.
        for mode in [PadMode::Reflect, PadMode::Edge, PadMode::Wrap] {
            for (shape, pads) in [
                (vec![2usize, 3, 4, 5], vec![0, 1, 0, 2, 0, 0, 3, 1]),
                (vec![1, 576], vec![0, 0, 0, 64]),
                (vec![3, 1, 4], vec![2, 3, 5, 1, 2, 9]),
                (vec![2, 3], vec![0, 0, 0, 0]),
            ] {
                let pad = Pad {
                    mode,
                    pads: Some(pads),
                    value: 0.0,
                };
                same_as_reference(|a| pad.eval(a), &shape, &[]);
            }
        }
    }

    #[test]
    fn boxes_outside_the_shape_are_refused() {
        let ok =
            |starts: &[usize], lens: &[usize], steps: &[usize]| box_runs(&[4, 5], starts, lens, steps, |_, _, _| true);
        assert!(ok(&[0, 1], &[4, 2], &[1, 2]));
        assert!(!ok(&[0, 1], &[4, 3], &[1, 2]));
        assert!(!ok(&[1, 0], &[4, 5], &[1, 1]));
        assert!(!ok(&[0, 0], &[1, 1], &[0, 1]));
        assert!(!ok(&[0], &[1], &[1]));
    }
}
