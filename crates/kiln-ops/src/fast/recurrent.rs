//! The f32 fast path of `RNN`, `GRU` and `LSTM`: per direction, the input projections of
//! every time step in one GEMM (`X · Wᵀ`, biases in its epilogue), then per step one GEMM of
//! the batch's hidden states against the recurrent weights (`H · Rᵀ`, all gates at once,
//! packed once per call), and the gate arithmetic in f32 on the kernels' vectorised
//! activations. The two directions of a bidirectional op run on two threads when a pool is
//! current. Everything the reference supports is taken (`sequence_lens`, `layout`, initial
//! states, peepholes, `clip`, `input_forget`, GRU's `linear_before_reset`) except activations
//! the GEMM epilogue lacks (Affine, ThresholdedRelu, ScaledTanh, Elu, Softsign, Softplus) and
//! other dtypes: those, and any input the reference would refuse, run the reference.
//!
//! Rounding: f32 products and sums where the reference uses f64; measured against it in the
//! tests below within 1e-5 of the outputs' magnitude.

use crate::Outputs;
use crate::error::Result;
use crate::recurrent::{Activation, Cell, Direction, Recurrent};
use crate::util::checked_numel;
use crate::value::Args;
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::sgemm::{AMatrix, Act, BLayout, Bias, Epilogue, PackedB, act_slice, sgemm};
use kiln_tensor::{DType, Tensor};
use std::sync::Mutex;

/// Runs `op` on the fast path when it applies, else on the reference; with `cache` (W and R
/// are the program's constants), the weights packed on the first call serve every later one.
pub(crate) fn eval(op: &Recurrent, cache: Option<&PackedWeightsCache>, args: &Args<'_>) -> Result<Outputs> {
    match fast(op, cache, args)? {
        Some(out) => Ok(out),
        None => op.eval(args),
    }
}

/// One direction's weights packed for the GEMM: W (`k` = input), R's gates (all, or GRU's
/// update and reset gates) and GRU's candidate gate apart.
#[derive(Debug)]
pub struct PackedDirection {
    w: PackedB,
    r: PackedB,
    r_h: Option<PackedB>,
    /// R (all gates) as int8 codes, when its values are such codes times a scale per
    /// direction or per row (the dequantized weights of a quantized model).
    r_codes: Option<Codes>,
}

/// How far (relative) a weight may be from its code times the scale: a few ulps.
const TOLERANCE: f32 = 1.0 / 1_048_576.0;

/// Weights `[n, k]` held as int8 codes `q` with a scale per row: `w[j][p] = scale[j] * q[j][p]`
/// to within a few ulps of every weight ([`Codes::of`]).
#[derive(Debug)]
pub struct Codes {
    q: Vec<i8>,
    scale: Vec<f32>,
    k: usize,
}

impl Codes {
    /// `w` (`n` rows of `k`) as codes, if every weight is `scale * q` with an integer `q` in
    /// [-127, 127] for one scale per row, to within a few ulps (`|w - scale q| <= 2^-20 |w|`:
    /// the scale is recovered from the weights, two roundings away from the model's):
    /// the scales tried are the largest magnitude over 127 and the smallest nonzero one, for
    /// the whole matrix (a per-tensor quantization) and then per row (per output channel). A product over such codes is
    /// that of the weights within the f32 rounding of the sums. `None` otherwise (any model
    /// whose weights are not on such a grid).
    fn of(w: &[f32], n: usize, k: usize) -> Option<Codes> {
        let w = w.get(..n.checked_mul(k)?)?;
        if k == 0 || n == 0 {
            return None;
        }
        let largest = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
        // The smallest nonzero magnitude: code 1 where the largest code is not 127 (a scale
        // shared with another direction or tensor).
        let smallest = |v: &[f32]| {
            v.iter()
                .map(|x| x.abs())
                .filter(|&x| x > 0.0)
                .fold(f32::INFINITY, f32::min)
        };
        // Codes of one row for scale `s` (a row of zeros has scale 0 and codes 0).
        let on_grid = |row: &[f32], s: f32, q: &mut [i8]| -> bool {
            if s == 0.0 {
                return row.iter().all(|&x| x == 0.0);
            }
            s.is_finite()
                && row.iter().zip(q.iter_mut()).all(|(&x, c)| {
                    let r = (x / s).round();
                    *c = r as i8;
                    r.abs() <= 127.0 && (x - r * s).abs() <= x.abs() * TOLERANCE
                })
        };
        let mut q = vec![0i8; w.len()];
        for whole in [largest(w) / 127.0, smallest(w)] {
            if w.chunks_exact(k)
                .zip(q.chunks_exact_mut(k))
                .all(|(row, qr)| on_grid(row, whole, qr))
            {
                return Some(Codes {
                    q,
                    scale: vec![whole; n],
                    k,
                });
            }
        }
        let mut scale = vec![0f32; n];
        for ((row, qr), s) in w.chunks_exact(k).zip(q.chunks_exact_mut(k)).zip(scale.iter_mut()) {
            *s = if row.iter().all(|&x| x == 0.0) {
                0.0
            } else {
                [largest(row) / 127.0, smallest(row)]
                    .into_iter()
                    .find(|&s| on_grid(row, s, qr))?
            };
        }
        Some(Codes { q, scale, k })
    }
}

/// A recurrent op's packed weights per direction, made on its first run and shared by every
/// later run (on any thread) of the program holding it; `None` inside when they cannot be
/// packed (the call then runs as without a cache).
#[derive(Debug, Clone, Default)]
pub struct PackedWeightsCache(std::sync::Arc<std::sync::OnceLock<Option<Vec<PackedDirection>>>>);

impl PartialEq for PackedWeightsCache {
    /// A cache says nothing about the op: any two compare equal.
    fn eq(&self, _: &PackedWeightsCache) -> bool {
        true
    }
}

/// W and R of every direction packed (`split`: R's columns packed together, the rest apart).
fn pack_directions(
    layout: BLayout,
    (nd, gh, input, hs, split): (usize, usize, usize, usize, usize),
    w: &[f32],
    r: &[f32],
) -> Option<Vec<PackedDirection>> {
    let pack = |k: usize, n: usize, v: &[f32]| PackedB::pack(layout, k, n, v, MatLayout::transposed(k)).ok();
    (0..nd)
        .map(|d| {
            let (wd, rd) = (
                w.get(d * gh * input..(d + 1) * gh * input)?,
                r.get(d * gh * hs..(d + 1) * gh * hs)?,
            );
            Some(PackedDirection {
                w: pack(input, gh, wd)?,
                r_codes: if split == gh { Codes::of(rd, gh, hs) } else { None },
                r: pack(hs, split, rd.get(..split * hs)?)?,
                r_h: if split < gh {
                    Some(pack(hs, hs, rd.get(split * hs..)?)?)
                } else {
                    None
                },
            })
        })
        .collect()
}

/// The GEMM epilogue's twin of a recurrent activation, when it has one.
fn act_of(a: Activation) -> Option<Act> {
    Some(match a {
        Activation::Relu => Act::Relu,
        Activation::Tanh => Act::Tanh,
        Activation::Sigmoid => Act::Sigmoid,
        Activation::HardSigmoid { alpha, beta } => Act::HardSigmoid { alpha, beta },
        Activation::LeakyRelu { alpha } => Act::LeakyRelu { alpha },
        _ => return None,
    })
}

/// Sizes of one call.
#[derive(Clone, Copy)]
struct Dims {
    seq: usize,
    batch: usize,
    input: usize,
    hs: usize,
    nd: usize,
    gates: usize,
    batch_first: bool,
}

impl Dims {
    /// Row of X (and of the input projections) holding time `t` of batch entry `b`.
    fn x_row(&self, t: usize, b: usize) -> usize {
        if self.batch_first {
            b * self.seq + t
        } else {
            t * self.batch + b
        }
    }

    /// Offset of direction `d`'s state of batch entry `b` in an initial or final state.
    fn state_at(&self, d: usize, b: usize) -> usize {
        if self.batch_first {
            (b * self.nd + d) * self.hs
        } else {
            (d * self.batch + b) * self.hs
        }
    }
}

/// What one direction reads.
struct DirInput<'a> {
    reverse: bool,
    /// `[gates*H, I]`, `[gates*H, H]`, `[2*gates*H]`, `[3*H]`.
    w: &'a [f32],
    r: &'a [f32],
    b: Option<&'a [f32]>,
    p: Option<&'a [f32]>,
    acts: Vec<Act>,
    /// [`Recurrent::quantized_state`].
    quantized_state: bool,
}

/// What one direction gives: Y as `[seq, batch, H]` (zeros past each sequence's length) and
/// the last hidden and cell states as `[batch, H]`.
struct DirOutput {
    y: Vec<f32>,
    h: Vec<f32>,
    c: Vec<f32>,
}

/// The fast path's result, or `None` when it does not apply (see the module docs).
fn fast(op: &Recurrent, cache: Option<&PackedWeightsCache>, args: &Args<'_>) -> Result<Option<Outputs>> {
    let (x, w, r) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    if [x, w, r].iter().any(|t| t.dtype() != DType::F32 || t.rank() != 3) {
        return Ok(None);
    }
    let Some(acts) = op.activations.iter().map(|&a| act_of(a)).collect::<Option<Vec<Act>>>() else {
        return Ok(None);
    };
    let (nd, gates, apd) = (
        op.direction.count(),
        op.cell.gates(),
        op.cell.activations_per_direction(),
    );
    let xs = x.shape();
    let (seq, batch, input) = if op.batch_first {
        (xs[1], xs[0], xs[2])
    } else {
        (xs[0], xs[1], xs[2])
    };
    let hs = r.shape()[2];
    let gh = gates * hs;
    if acts.len() != nd * apd
        || op.hidden_size.is_some_and(|h| h != hs)
        || w.shape() != [nd, gh, input]
        || r.shape() != [nd, gh, hs]
    {
        return Ok(None);
    }
    // An optional input: `Some(None)` when absent, `None` when it is not an f32 of `shape`.
    let opt = |i: usize, shape: &[usize]| -> Result<Option<Option<&[f32]>>> {
        Ok(match args.opt_tensor(i)? {
            None => Some(None),
            Some(t) if t.dtype() == DType::F32 && t.shape() == shape => Some(Some(t.as_slice::<f32>()?)),
            Some(_) => None,
        })
    };
    let Some(b) = opt(3, &[nd, 2 * gh])? else {
        return Ok(None);
    };
    let lens: Vec<usize> = match args.opt_tensor(4)? {
        None => vec![seq; batch],
        Some(t) => {
            let Some(v) = t.to_i64_vec() else { return Ok(None) };
            let lens: Option<Vec<usize>> = v
                .iter()
                .map(|&l| usize::try_from(l).ok().filter(|&l| l <= seq))
                .collect();
            match lens {
                Some(l) if l.len() == batch => l,
                _ => return Ok(None),
            }
        }
    };
    let state_shape = if op.batch_first {
        [batch, nd, hs]
    } else {
        [nd, batch, hs]
    };
    let is_lstm = matches!(op.cell, Cell::Lstm { .. });
    let Some(h0) = opt(5, &state_shape)? else {
        return Ok(None);
    };
    let (c0, p) = if is_lstm {
        let (Some(c0), Some(p)) = (opt(6, &state_shape)?, opt(7, &[nd, 3 * hs])?) else {
            return Ok(None);
        };
        (c0, p)
    } else {
        (None, None)
    };
    let dims = Dims {
        seq,
        batch,
        input,
        hs,
        nd,
        gates,
        batch_first: op.batch_first,
    };
    let y_len = checked_numel(&[seq, nd, batch, hs])?;
    let (xd, wd, rd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?, r.as_slice::<f32>()?);
    let dir = |d: usize| DirInput {
        reverse: op.direction == Direction::Reverse || d == 1,
        w: wd.get(d * gh * input..(d + 1) * gh * input).unwrap_or(&[]),
        r: rd.get(d * gh * hs..(d + 1) * gh * hs).unwrap_or(&[]),
        b: b.and_then(|b| b.get(d * 2 * gh..(d + 1) * 2 * gh)),
        p: p.and_then(|p| p.get(d * 3 * hs..(d + 1) * 3 * hs)),
        acts: acts.get(d * apd..(d + 1) * apd).unwrap_or(&[]).to_vec(),
        quantized_state: op.quantized_state,
    };
    let split = if matches!(op.cell, Cell::Gru { .. }) {
        2 * hs
    } else {
        gh
    };
    let layout = BLayout::for_isa(kiln_kernels::isa::active());
    let packed = cache.and_then(|c| {
        c.0.get_or_init(|| pack_directions(layout, (nd, gh, input, hs, split), wd, rd))
            .as_deref()
    });
    let results: Vec<Mutex<Option<DirOutput>>> = (0..nd).map(|_| Mutex::new(None)).collect();
    // One batch row whose recurrent weights outgrow a core's L2: the directions one after the
    // other, each step's product split by columns over the pool (each thread the same
    // columns every step, so its share of R stays in its core's cache); otherwise the
    // directions side by side, one thread each.
    let coded = batch <= CODES_ROWS && packed.is_some_and(|p| p.iter().all(|d| d.r_codes.is_some()));
    let split_steps = batch == 1
        && kiln_kernels::pool::current_threads() > 1
        && gh.saturating_mul(hs).saturating_mul(if coded { 1 } else { 4 }) > SPLIT_R_BYTES;
    let task = |d: usize| {
        let packed = packed.and_then(|p| p.get(d));
        let out = run_direction(
            op.cell,
            op.clip,
            &dims,
            &dir(d),
            d,
            xd,
            &lens,
            (h0, c0),
            packed,
            split_steps,
        );
        if let Some(slot) = results.get(d) {
            *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = out;
        }
    };
    if split_steps {
        (0..nd).for_each(task);
    } else {
        kiln_kernels::pool::parallel_for(nd, &task);
    }
    let mut dirs = Vec::with_capacity(nd);
    for slot in results {
        match slot.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(o) => dirs.push(o),
            None => return Ok(None),
        }
    }
    // Back to ONNX's layouts: Y [seq, dirs, batch, H] or [batch, seq, dirs, H]; the states
    // [dirs, batch, H] or [batch, dirs, H].
    let mut y = vec![0f32; y_len];
    let mut yh = vec![0f32; nd * batch * hs];
    let mut yc = vec![0f32; nd * batch * hs];
    for (d, o) in dirs.iter().enumerate() {
        for t in 0..seq {
            for bi in 0..batch {
                let src = (t * batch + bi) * hs;
                let dst = if op.batch_first {
                    ((bi * seq + t) * nd + d) * hs
                } else {
                    ((t * nd + d) * batch + bi) * hs
                };
                if let (Some(to), Some(from)) = (y.get_mut(dst..dst + hs), o.y.get(src..src + hs)) {
                    to.copy_from_slice(from);
                }
            }
        }
        for bi in 0..batch {
            let at = dims.state_at(d, bi);
            let src = bi * hs..(bi + 1) * hs;
            if let (Some(to), Some(from)) = (yh.get_mut(at..at + hs), o.h.get(src.clone())) {
                to.copy_from_slice(from);
            }
            if let (Some(to), Some(from)) = (yc.get_mut(at..at + hs), o.c.get(src)) {
                to.copy_from_slice(from);
            }
        }
    }
    let y_shape = if op.batch_first {
        vec![batch, seq, nd, hs]
    } else {
        vec![seq, nd, batch, hs]
    };
    let mut outs: Outputs = smallvec::smallvec![
        Tensor::from_vec(y_shape, y)?.into(),
        Tensor::from_vec(state_shape.to_vec(), yh)?.into(),
    ];
    if is_lstm {
        outs.push(Tensor::from_vec(state_shape.to_vec(), yc)?.into());
    }
    Ok(Some(outs))
}

/// Recurrent weights of one direction past which a one-row step's product is split by
/// columns over the threads (directions then run one after the other): ddddocr's 512-wide
/// bidirectional LSTM has 4 MB of R per direction, read from L3 at every one of its 80 steps
/// by one thread per direction; split, each core keeps its half of one direction in L2.
const SPLIT_R_BYTES: usize = 1 << 20;

/// Batch rows up to which a step multiplies R's int8 codes ([`Codes`]), when it has them,
/// rather than its packed floats: each row reads the codes once (a quarter of the floats'
/// bytes), where the packed product reads its weights once for all rows.
const CODES_ROWS: usize = 4;

/// Rows of A (projections over a whole call) up to which a product reads its weights in
/// place as dot products instead of packing them: packing costs a pass over the weights, as
/// much as one row's product, so a call of a step or two (a streaming VAD's one chunk) spent
/// half its time packing.
const DIRECT_ROWS: usize = 4;

/// Weights `[n, k]` (row-major: W or R of one direction) as the B of `A · Wᵀ`: packed, or
/// read in place when the call multiplies few rows by them.
enum Weights<'a> {
    Packed(PackedB),
    /// Packed on an earlier call ([`PackedWeightsCache`]).
    Kept(&'a PackedB),
    Rows {
        w: &'a [f32],
        k: usize,
        n: usize,
    },
    /// Int8 codes with a scale per row ([`Codes`]): a quarter of the bytes to read per step.
    Codes(&'a Codes),
    /// [`Weights::Codes`] multiplying the state's 16-bit codes
    /// ([`kiln_kernels::vector::quantize_state`]) in exact integer sums, where the op allows
    /// its state quantized ([`Recurrent::quantized_state`]); a state without codes (a NaN or
    /// an infinity) takes the f32 product.
    StateCodes(&'a Codes),
}

impl<'a> Weights<'a> {
    /// Packed when the call's products take more than [`DIRECT_ROWS`] rows in all.
    fn new(layout: BLayout, rows: usize, k: usize, n: usize, w: &'a [f32]) -> Option<Weights<'a>> {
        if rows <= DIRECT_ROWS {
            let w = w.get(..k.checked_mul(n)?)?;
            return Some(Weights::Rows { w, k, n });
        }
        PackedB::pack(layout, k, n, w, MatLayout::transposed(k))
            .ok()
            .map(Weights::Packed)
    }

    /// [`Weights::new`], or the kept packing when there is one.
    fn kept_or_new(
        kept: Option<&'a PackedB>,
        layout: BLayout,
        rows: usize,
        k: usize,
        n: usize,
        w: &'a [f32],
    ) -> Option<Weights<'a>> {
        match kept {
            Some(p) if p.k() == k && p.n() == n => Some(Weights::Kept(p)),
            _ => Weights::new(layout, rows, k, n, w),
        }
    }

    /// [`Weights::product`] of one row, its columns split over the current pool in whole
    /// panels: thread `t` takes the `t`-th range every call
    /// ([`kiln_kernels::pool::for_each_chunk_mut`]), so its share of packed weights stays in
    /// its core's cache from one call to the next.
    fn product_row_split(&self, a: &[f32], out: &mut [f32]) -> Option<()> {
        let p = match self {
            Weights::Packed(p) | &Weights::Kept(p) => p,
            Weights::Rows { .. } => return self.product(1, a, out, None),
            &Weights::Codes(c) | &Weights::StateCodes(c) => {
                // Whole blocks of 16 rows per piece, thread `t` the same piece every call.
                let n = c.scale.len();
                let threads = kiln_kernels::pool::current_threads().max(1);
                let width = n.div_ceil(16).div_ceil(threads) * 16;
                let a = a.get(..c.k)?;
                let mut codes = kiln_kernels::recycle::lend::<StateCodeScratch>();
                let state = match self {
                    Weights::StateCodes(_) => kiln_kernels::vector::quantize_state(a, &mut codes),
                    _ => None,
                };
                let codes: &[i16] = &codes;
                kiln_kernels::pool::for_each_chunk_mut(out.get_mut(..n)?, width, &|i, piece| {
                    let j0 = i * width;
                    let q = c.q.get(j0 * c.k..(j0 + piece.len()) * c.k).unwrap_or(&[]);
                    let scale = c.scale.get(j0..j0 + piece.len()).unwrap_or(&[]);
                    match state {
                        Some(step) => kiln_kernels::vector::dot_rows_i8_state(codes, step, q, scale, piece),
                        None => kiln_kernels::vector::dot_rows_i8(a, q, scale, piece),
                    }
                });
                return Some(());
            }
        };
        let (n, nr) = (p.n(), p.layout().nr().max(1));
        let threads = kiln_kernels::pool::current_threads().max(1);
        let width = n.div_ceil(nr).div_ceil(threads) * nr;
        let view = p.view();
        let failed = std::sync::atomic::AtomicBool::new(false);
        kiln_kernels::pool::for_each_chunk_mut(out.get_mut(..n)?, width, &|i, piece| {
            let p0 = i * width / nr;
            let done = view
                .panels(p0, p0 + width / nr)
                .and_then(|b| sgemm(1, AMatrix::row_major(a, p.k()), b, piece, piece.len(), &Epilogue::NONE).ok());
            if done.is_none() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        (!failed.into_inner()).then_some(())
    }

    /// `out[r, j] = bias[j] + a[r, :] · w[j, :]` for `r < rows`.
    fn product(&self, rows: usize, a: &[f32], out: &mut [f32], bias: Option<&[f32]>) -> Option<()> {
        match self {
            Weights::Packed(p) | &Weights::Kept(p) => {
                let epi = Epilogue {
                    bias: bias.map_or(Bias::None, Bias::Col),
                    ..Epilogue::NONE
                };
                sgemm(rows, AMatrix::row_major(a, p.k()), p.view(), out, p.n(), &epi).ok()
            }
            &Weights::Rows { w, k, n } => {
                let a = a.get(..rows.checked_mul(k)?)?;
                let out = out.get_mut(..rows.checked_mul(n)?)?;
                kiln_kernels::simd::vectorize(|| {
                    for (ar, or) in a.chunks_exact(k.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
                        for (j, (o, wr)) in or.iter_mut().zip(w.chunks_exact(k.max(1))).enumerate() {
                            let b = bias.and_then(|b| b.get(j)).copied().unwrap_or(0.0);
                            *o = b + kiln_kernels::vector::dot16(ar, wr);
                        }
                    }
                });
                Some(())
            }
            &Weights::Codes(c) | &Weights::StateCodes(c) => {
                let (k, n) = (c.k, c.scale.len());
                let a = a.get(..rows.checked_mul(k)?)?;
                let out = out.get_mut(..rows.checked_mul(n)?)?;
                let quantize = matches!(self, Weights::StateCodes(_));
                let mut codes = kiln_kernels::recycle::lend::<StateCodeScratch>();
                for (ar, or) in a.chunks_exact(k.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
                    match quantize
                        .then(|| kiln_kernels::vector::quantize_state(ar, &mut codes))
                        .flatten()
                    {
                        Some(step) => kiln_kernels::vector::dot_rows_i8_state(&codes, step, &c.q, &c.scale, or),
                        None => kiln_kernels::vector::dot_rows_i8(ar, &c.q, &c.scale, or),
                    }
                    if let Some(b) = bias {
                        or.iter_mut().zip(b).for_each(|(o, b)| *o += b);
                    }
                }
                Some(())
            }
        }
    }
}

kiln_kernels::scratch_kinds! {
    /// [`Weights::StateCodes`]' 16-bit codes of the state, one step's (per thread).
    StateCodeScratch: Vec<i16>;
}

/// One direction over the whole sequence; `None` if a GEMM refuses its operands (never for
/// the shapes checked above), which sends the call to the reference.
#[allow(clippy::too_many_arguments)]
fn run_direction(
    cell: Cell,
    clip: Option<f32>,
    dims: &Dims,
    dir: &DirInput<'_>,
    d: usize,
    x: &[f32],
    lens: &[usize],
    (h0, c0): (Option<&[f32]>, Option<&[f32]>),
    packed: Option<&PackedDirection>,
    split_steps: bool,
) -> Option<DirOutput> {
    let Dims {
        seq, batch, input, hs, ..
    } = *dims;
    let gh = dims.gates * hs;
    let layout = BLayout::for_isa(kiln_kernels::isa::active());
    let rows = seq.checked_mul(batch)?;
    // Input projections of every step: Gx = X · Wᵀ + bias, rows in X's order.
    let wt = Weights::kept_or_new(packed.map(|p| &p.w), layout, rows, input, gh, dir.w)?;
    let (wb, rb) = match dir.b {
        Some(b) => (b.get(..gh)?, Some(b.get(gh..2 * gh)?)),
        None => (&[][..], None),
    };
    let mut bias = vec![0f32; gh];
    for (j, v) in bias.iter_mut().enumerate() {
        *v = wb.get(j).copied().unwrap_or(0.0);
        // GRU's candidate gate adds its recurrent bias inside the reset product.
        let candidate = matches!(cell, Cell::Gru { .. }) && j >= 2 * hs;
        if !candidate {
            *v += rb.and_then(|rb| rb.get(j)).copied().unwrap_or(0.0);
        }
    }
    let mut gx = vec![0f32; rows.checked_mul(gh)?];
    wt.product(rows, x, &mut gx, Some(&bias))?;
    drop(wt);
    // Recurrent weights: Rᵀ for all gates, except GRU's candidate gate, packed apart (its
    // product takes the reset-gated state when linear_before_reset is 0).
    let split = if matches!(cell, Cell::Gru { .. }) { 2 * hs } else { gh };
    let steps = lens.iter().copied().max().unwrap_or(0);
    let products = steps.checked_mul(batch)?;
    let rt = match packed.and_then(|p| p.r_codes.as_ref()).filter(|_| batch <= CODES_ROWS) {
        Some(codes) if dir.quantized_state => Weights::StateCodes(codes),
        Some(codes) => Weights::Codes(codes),
        None => Weights::kept_or_new(
            packed.map(|p| &p.r),
            layout,
            products,
            hs,
            split,
            dir.r.get(..split * hs)?,
        )?,
    };
    let rt_h = if split < gh {
        let kept = packed.and_then(|p| p.r_h.as_ref());
        Some(Weights::kept_or_new(
            kept,
            layout,
            products,
            hs,
            hs,
            dir.r.get(split * hs..gh * hs)?,
        )?)
    } else {
        None
    };
    let rb_h: Option<&[f32]> = rb.and_then(|rb| rb.get(2 * hs..3 * hs));
    let init = |s: Option<&[f32]>| -> Option<Vec<f32>> {
        let mut v = vec![0f32; batch * hs];
        if let Some(s) = s {
            for bi in 0..batch {
                let at = dims.state_at(d, bi);
                v.get_mut(bi * hs..(bi + 1) * hs)?.copy_from_slice(s.get(at..at + hs)?);
            }
        }
        Some(v)
    };
    let mut h = init(h0)?;
    let mut c = init(c0)?;
    let mut y = vec![0f32; rows * hs];
    let mut ghm = vec![0f32; batch * split];
    let mut gh_h = vec![0f32; if rt_h.is_some() { batch * hs } else { 0 }];
    let mut reset_h = vec![0f32; gh_h.len()];
    let mut pre = vec![0f32; gh];
    let mut tmp = vec![0f32; hs];
    let clamp = |v: &mut [f32]| {
        if let Some(cl) = clip {
            v.iter_mut().for_each(|x| *x = x.clamp(-cl, cl));
        }
    };
    for step in 0..steps {
        if split_steps {
            rt.product_row_split(&h, &mut ghm)?;
        } else {
            rt.product(batch, &h, &mut ghm, None)?;
        }
        // Time index and projection row of each batch entry still running at this step.
        let at = |bi: usize| -> Option<(usize, usize)> {
            let len = *lens.get(bi)?;
            (step < len).then(|| {
                let t = if dir.reverse { len - 1 - step } else { step };
                (t, dims.x_row(t, bi))
            })
        };
        match cell {
            Cell::Rnn => {
                for bi in 0..batch {
                    let Some((t, row)) = at(bi) else { continue };
                    let hb = h.get_mut(bi * hs..(bi + 1) * hs)?;
                    let gxr = gx.get(row * gh..(row + 1) * gh)?;
                    let ghr = ghm.get(bi * split..(bi + 1) * split)?;
                    for ((o, a), b) in hb.iter_mut().zip(gxr).zip(ghr) {
                        *o = a + b;
                    }
                    clamp(hb);
                    act_slice(*dir.acts.first()?, hb);
                    y.get_mut((t * batch + bi) * hs..(t * batch + bi + 1) * hs)?
                        .copy_from_slice(hb);
                }
            }
            Cell::Lstm { input_forget } => {
                let (f, g, hact) = (*dir.acts.first()?, *dir.acts.get(1)?, *dir.acts.get(2)?);
                for bi in 0..batch {
                    let Some((t, row)) = at(bi) else { continue };
                    let gxr = gx.get(row * gh..(row + 1) * gh)?;
                    let ghr = ghm.get(bi * gh..(bi + 1) * gh)?;
                    for ((o, a), b) in pre.iter_mut().zip(gxr).zip(ghr) {
                        *o = a + b;
                    }
                    let cb = c.get_mut(bi * hs..(bi + 1) * hs)?;
                    // Gate order i, o, f, c; peepholes i, o, f.
                    let (gi, rest) = pre.split_at_mut(hs);
                    let (go, rest) = rest.split_at_mut(hs);
                    let (gf, gc) = rest.split_at_mut(hs);
                    if let Some(p) = dir.p {
                        for ((v, pk), ck) in gi.iter_mut().zip(p.get(..hs)?).zip(cb.iter()) {
                            *v += pk * ck;
                        }
                        for ((v, pk), ck) in gf.iter_mut().zip(p.get(2 * hs..3 * hs)?).zip(cb.iter()) {
                            *v += pk * ck;
                        }
                    }
                    clamp(gi);
                    act_slice(f, gi);
                    if input_forget {
                        for (v, i) in gf.iter_mut().zip(gi.iter()) {
                            *v = 1.0 - i;
                        }
                    } else {
                        clamp(gf);
                        act_slice(f, gf);
                    }
                    clamp(gc);
                    act_slice(g, gc);
                    for (((ck, fk), ik), gk) in cb.iter_mut().zip(gf.iter()).zip(gi.iter()).zip(gc.iter()) {
                        *ck = fk * *ck + ik * gk;
                    }
                    if let Some(p) = dir.p {
                        for ((v, pk), ck) in go.iter_mut().zip(p.get(hs..2 * hs)?).zip(cb.iter()) {
                            *v += pk * ck;
                        }
                    }
                    clamp(go);
                    act_slice(f, go);
                    tmp.copy_from_slice(cb);
                    act_slice(hact, &mut tmp);
                    let hb = h.get_mut(bi * hs..(bi + 1) * hs)?;
                    for ((o, a), b) in hb.iter_mut().zip(go.iter()).zip(tmp.iter()) {
                        *o = a * b;
                    }
                    y.get_mut((t * batch + bi) * hs..(t * batch + bi + 1) * hs)?
                        .copy_from_slice(hb);
                }
            }
            Cell::Gru { linear_before_reset } => {
                let (f, g) = (*dir.acts.first()?, *dir.acts.get(1)?);
                let rt_h = rt_h.as_ref()?;
                // Gates z and r of every running entry (in place in ghm), and the state the
                // candidate's product takes: H itself, or r ∘ H.
                for bi in 0..batch {
                    let Some((_, row)) = at(bi) else { continue };
                    let gxr = gx.get(row * gh..row * gh + split)?;
                    let zr = ghm.get_mut(bi * split..(bi + 1) * split)?;
                    for (o, a) in zr.iter_mut().zip(gxr) {
                        *o += a;
                    }
                    clamp(zr);
                    act_slice(f, zr);
                    if !linear_before_reset {
                        let hb = h.get(bi * hs..(bi + 1) * hs)?;
                        let rg = zr.get(hs..2 * hs)?;
                        for ((o, r), hk) in reset_h.get_mut(bi * hs..(bi + 1) * hs)?.iter_mut().zip(rg).zip(hb) {
                            *o = r * hk;
                        }
                    }
                }
                let a = if linear_before_reset { &h } else { &reset_h };
                rt_h.product(batch, a, &mut gh_h, None)?;
                for bi in 0..batch {
                    let Some((t, row)) = at(bi) else { continue };
                    let gxh = gx.get(row * gh + split..(row + 1) * gh)?;
                    let zr = ghm.get(bi * split..(bi + 1) * split)?;
                    let (z, rg) = zr.split_at(hs);
                    let ghh = gh_h.get(bi * hs..(bi + 1) * hs)?;
                    for k in 0..hs {
                        let rbk = rb_h.and_then(|v| v.get(k)).copied().unwrap_or(0.0);
                        let rec = if linear_before_reset {
                            rg.get(k)? * (ghh.get(k)? + rbk)
                        } else {
                            ghh.get(k)? + rbk
                        };
                        *tmp.get_mut(k)? = gxh.get(k)? + rec;
                    }
                    clamp(&mut tmp);
                    act_slice(g, &mut tmp);
                    let hb = h.get_mut(bi * hs..(bi + 1) * hs)?;
                    for ((hk, zk), nk) in hb.iter_mut().zip(z).zip(tmp.iter()) {
                        *hk = (1.0 - zk) * nk + zk * *hk;
                    }
                    y.get_mut((t * batch + bi) * hs..(t * batch + bi + 1) * hs)?
                        .copy_from_slice(hb);
                }
            }
        }
    }
    Some(DirOutput { y, h, c })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    /// Deterministic values in [-scale, scale).
    fn data(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn t(shape: &[usize], seed: u64, scale: f32) -> Value {
        let n = shape.iter().product();
        Value::Tensor(Tensor::from_vec(shape.to_vec(), data(n, seed, scale)).unwrap())
    }

    /// Every output of the fast path against the reference, within `tol` of its magnitude.
    fn check(op: &Recurrent, inputs: &[Option<Value>]) {
        check_within(op, inputs, 2e-5);
    }

    /// [`check`] within `tol` of the largest reference value.
    fn check_within(op: &Recurrent, inputs: &[Option<Value>], tol: f32) {
        let refs: Vec<Option<&Value>> = inputs.iter().map(Option::as_ref).collect();
        let args = Args::new(&refs);
        let want = op.eval(&args).unwrap();
        // Without a cache, then twice with one (the first call packs the weights into it, the
        // second multiplies by the kept packing, whatever its row count).
        let cache = PackedWeightsCache::default();
        for cached in [None, Some(&cache), Some(&cache)] {
            let got = fast(op, cached, &args).unwrap().expect("the fast path applies");
            assert_eq!(want.len(), got.len());
            for (w, g) in want.iter().zip(got.iter()) {
                let (w, g) = (w.as_tensor().unwrap(), g.as_tensor().unwrap());
                assert_eq!(w.shape(), g.shape());
                let (w, g) = (w.as_slice::<f32>().unwrap(), g.as_slice::<f32>().unwrap());
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
                for (a, b) in w.iter().zip(g) {
                    assert!((a - b).abs() <= tol * scale, "{a} vs {b} ({op:?})");
                }
            }
        }
        assert!(
            cache.0.get().is_some_and(Option::is_some),
            "the weights were packed and kept"
        );
    }

    fn op(cell: Cell, direction: Direction, batch_first: bool, clip: Option<f32>) -> Recurrent {
        let nd = direction.count();
        let acts = match cell {
            Cell::Rnn => vec![Activation::Tanh],
            Cell::Gru { .. } => vec![Activation::Sigmoid, Activation::Tanh],
            Cell::Lstm { .. } => vec![Activation::Sigmoid, Activation::Tanh, Activation::Tanh],
        };
        Recurrent {
            cell,
            hidden_size: None,
            direction,
            activations: acts.iter().cycle().take(nd * acts.len()).copied().collect(),
            clip,
            batch_first,
            quantized_state: false,
        }
    }

    /// Recurrent weights past `SPLIT_R_BYTES` on a two-thread pool, one batch row: the
    /// directions one after the other, each step's product split by columns over the
    /// threads; the same values as the reference, for LSTM and GRU (whose candidate gate's
    /// weights stay apart), both directions.
    #[test]
    fn large_recurrent_weights_split_over_threads_match_the_reference() {
        let hs = 300;
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (ci, cell) in [
            Cell::Lstm { input_forget: false },
            Cell::Gru {
                linear_before_reset: false,
            },
        ]
        .into_iter()
        .enumerate()
        {
            let (nd, g) = (2, cell.gates());
            assert!(g * hs * hs * 4 > SPLIT_R_BYTES, "the split path is taken");
            let seed = 900 + ci as u64;
            let ins = vec![
                Some(t(&[4, 1, 7], seed, 1.0)),
                Some(t(&[nd, g * hs, 7], seed + 1, 0.3)),
                Some(t(&[nd, g * hs, hs], seed + 2, 0.06)),
                Some(t(&[nd, 2 * g * hs], seed + 3, 0.3)),
            ];
            pool.install(|| check(&op(cell, Direction::Bidirectional, false, None), &ins));
        }
    }

    /// R on an int8 grid (a quantized model's dequantized weights, one scale per direction,
    /// then one per row): the steps multiply its codes ([`Codes`]); the same values as the
    /// reference within f32 rounding, for RNN and LSTM, one and three batch rows, on one and
    /// two threads (one large R split by columns). Weights off the grid keep the floats.
    #[test]
    fn recurrent_weights_on_an_int8_grid_run_as_codes() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let grid = |shape: &[usize], seed: u64, per_row: bool| -> Value {
            let (rows, k) = (shape[0] * shape[1], shape[2]);
            let mut codes = data(rows * k, seed, 127.0);
            // Symmetric quantization gives each row's (per-row) or the matrix's largest
            // weight the code 127; one direction's largest may be less (a shared scale).
            for row in codes
                .chunks_mut(k)
                .skip(usize::from(!per_row))
                .step_by(if per_row { 1 } else { rows })
            {
                row[0] = 127.0;
            }
            let v: Vec<f32> = codes
                .chunks(k)
                .enumerate()
                .flat_map(|(j, row)| {
                    let s = if per_row { 0.0004 * (1 + j % 7) as f32 } else { 0.00047 };
                    row.iter().map(move |&c| c.round() * s).collect::<Vec<f32>>()
                })
                .collect();
            Value::Tensor(Tensor::from_vec(shape.to_vec(), v).unwrap())
        };
        for (case, (cell, hs, batch, per_row)) in [
            (Cell::Lstm { input_forget: false }, 40, 1, false),
            (Cell::Lstm { input_forget: false }, 37, 3, true),
            (Cell::Rnn, 24, 1, true),
            (Cell::Lstm { input_forget: false }, 300, 1, true),
        ]
        .into_iter()
        .enumerate()
        {
            let (nd, g) = (2, cell.gates());
            let seed = 1300 + 10 * case as u64;
            let r = grid(&[nd, g * hs, hs], seed + 2, per_row);
            let rv = r.as_tensor().unwrap().as_slice::<f32>().unwrap();
            let codes = Codes::of(rv.get(..g * hs * hs).unwrap(), g * hs, hs).expect("R is on the grid");
            assert!(codes.q.iter().any(|&c| c.abs() > 100));
            let ins = vec![
                Some(t(&[5, batch, 6], seed, 1.0)),
                Some(t(&[nd, g * hs, 6], seed + 1, 0.3)),
                Some(r),
                Some(t(&[nd, 2 * g * hs], seed + 3, 0.3)),
            ];
            let op = op(cell, Direction::Bidirectional, false, None);
            check(&op, &ins);
            pool.install(|| check(&op, &ins));
            // The state quantized to 16 bits (DynamicQuantizeLSTM): within its rounding of
            // the f64 reference, and not the f32 state's bits (the integer product ran).
            let quantized = Recurrent {
                quantized_state: true,
                ..op.clone()
            };
            check_within(&quantized, &ins, 2e-4);
            pool.install(|| check_within(&quantized, &ins, 2e-4));
            let refs: Vec<Option<&Value>> = ins.iter().map(Option::as_ref).collect();
            let args = Args::new(&refs);
            let y = |op: &Recurrent| {
                // With a cache: the codes are made with the packing.
                let cache = PackedWeightsCache::default();
                let out = fast(op, Some(&cache), &args).unwrap().unwrap();
                out[0].as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec()
            };
            assert_ne!(y(&op), y(&quantized), "case {case}: the state's codes were used");
        }
        // Off the grid by more than the tolerance: no codes.
        let mut w: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.01).collect();
        assert!(Codes::of(&w, 8, 8).is_some());
        w[5] *= 1.0001;
        assert!(Codes::of(&w, 8, 8).is_none());
        assert!(Codes::of(&data(64, 5, 1.0), 8, 8).is_none());
    }

    #[test]
    fn every_cell_direction_and_layout_matches_the_reference() {
        let cells = [
            Cell::Rnn,
            Cell::Gru {
                linear_before_reset: true,
            },
            Cell::Gru {
                linear_before_reset: false,
            },
            Cell::Lstm { input_forget: false },
            Cell::Lstm { input_forget: true },
        ];
        // Many rows (weights packed), and calls of one or two steps (weights read in place);
        // a sequence of one row a step.
        for (seq, batch, input, hs) in [(7, 3, 5, 20), (1, 1, 19, 20), (2, 2, 5, 33), (9, 1, 6, 17)] {
            for (ci, cell) in cells.into_iter().enumerate() {
                for direction in [Direction::Forward, Direction::Reverse, Direction::Bidirectional] {
                    for batch_first in [false, true] {
                        for (with_all, clip) in [(false, None), (true, Some(0.7))] {
                            let o = op(cell, direction, batch_first, clip);
                            let (nd, g) = (direction.count(), cell.gates());
                            let seed = ci as u64 * 100 + nd as u64 * 10 + u64::from(batch_first);
                            let x = if batch_first {
                                t(&[batch, seq, input], seed, 1.0)
                            } else {
                                t(&[seq, batch, input], seed, 1.0)
                            };
                            let state = if batch_first { [batch, nd, hs] } else { [nd, batch, hs] };
                            let mut ins = vec![
                                Some(x),
                                Some(t(&[nd, g * hs, input], seed + 1, 0.5)),
                                Some(t(&[nd, g * hs, hs], seed + 2, 0.5)),
                            ];
                            if with_all {
                                let lens: Vec<i64> = (0..batch as i64).map(|b| (seq as i64 - 2 * b).max(0)).collect();
                                ins.push(Some(t(&[nd, 2 * g * hs], seed + 3, 0.3)));
                                ins.push(Some(Value::Tensor(Tensor::from_vec(vec![batch], lens).unwrap())));
                                ins.push(Some(t(&state, seed + 4, 0.8)));
                                if matches!(cell, Cell::Lstm { .. }) {
                                    ins.push(Some(t(&state, seed + 5, 0.8)));
                                    ins.push(Some(t(&[nd, 3 * hs], seed + 6, 0.4)));
                                }
                            }
                            check(&o, &ins);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn activations_without_a_kernel_run_the_reference() {
        let mut o = op(Cell::Rnn, Direction::Forward, false, None);
        o.activations = vec![Activation::Softsign];
        let ins = [t(&[2, 1, 3], 1, 1.0), t(&[1, 4, 3], 2, 0.5), t(&[1, 4, 4], 3, 0.5)];
        let refs: Vec<Option<&Value>> = ins.iter().map(Some).collect();
        assert!(fast(&o, None, &Args::new(&refs)).unwrap().is_none());
        assert!(eval(&o, None, &Args::new(&refs)).is_ok());
    }
}
