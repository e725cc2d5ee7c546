//! `PointwiseDepthwise`: a channels-last 1x1 convolution and the depthwise convolution that
//! alone reads its output, as one op: the expansion and depthwise layers of an inverted
//! residual block (MobileNet-v2/v3, EfficientNet, MnasNet). Set by the compiler's
//! `pointwise_depthwise` pass, never by the importer.
//!
//! Inputs: X `[N, H, W, C]`, the pointwise W and optional bias, the depthwise W and optional
//! bias (each as its own Conv takes it: packed panels and tap-major taps after prepacking).
//! Output: the depthwise convolution's `[N, OH, OW, E]`.
//!
//! Run separately, the expansion writes `E/C` times its input (MobileNet-v2's first one a
//! 4.8 MB tensor), out of the L2 cache, and the depthwise layer reads it back. Fused, each
//! thread walks its band of output rows and keeps only the expanded input rows their windows
//! need, in a ring that stays in L2: when an output row's window lacks rows, the rows the
//! next few output rows of the band read are expanded into it with them (consecutive rows in
//! one GEMM of about [`GROUP_PIXELS`] pixels, with the pointwise bias and activation in its
//! epilogue), then the depthwise kernel reads the ring in place of the image. A thread's rows are
//! contiguous, so only the rows at the edge between two threads' bands are expanded twice.
//!
//! When the rows expanded twice would exceed a tenth of the image (small images on several
//! threads), the expansion runs whole into a recycled buffer and the depthwise layer reads
//! that, as the two Convs would. Without packed weights (or another dtype) the two
//! convolutions run one after the other: the reference semantics.

use super::ConvPlan;
use super::conv::{Planned, f32_bias};
use super::depthwise::split_act;
use crate::error::{OpError, Result};
use crate::nn::{Conv, numel};
use crate::value::{Args, InferInput, ValueType};
use kiln_kernels::recycle::{ScratchKey, lend};
use kiln_kernels::sgemm::{AMatrix, act_slice};
use kiln_tensor::{DType, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Floats (512 KiB: Zen 3's L2, half of Zen 4's) of the ring or of the pointwise weights
/// beyond which the stages run apart.
const FUSED_L2_FLOATS: usize = 128 * 1024;

/// Input pixels the fused path aims to expand in one GEMM: a 14-pixel row of a 14 x 14
/// image made GEMMs of 6 + 4 + 4 rows with the weights streamed from L2 for each.
const GROUP_PIXELS: usize = 96;

/// Input rows one expansion lists at most: its list of missing rows stays on the stack.
const GROUP_ROWS: usize = 32;

/// Output rows whose input rows one expansion of the fused loop serves: enough for about
/// [`GROUP_PIXELS`] new input pixels (`sh` input rows of `iw` each per output row), no more
/// than a ring of [`FUSED_L2_FLOATS`] holds (a `window`-row window of `row_len` floats a row),
/// their windows spanning at most [`GROUP_ROWS`] input rows (unless one window does).
fn rows_per_group(sh: usize, iw: usize, window: usize, row_len: usize) -> usize {
    let sh = sh.max(1);
    let want = GROUP_PIXELS.div_ceil(sh * iw.max(1));
    let room = (FUSED_L2_FLOATS / row_len.max(1)).saturating_sub(window) / sh + 1;
    let span = GROUP_ROWS.saturating_sub(window) / sh + 1;
    want.min(room).min(span).max(1)
}

/// The fused op: `depthwise(pointwise(X))`, both channels-last Convs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct PointwiseDepthwise {
    /// 1x1, stride 1, no padding, group 1, no residual.
    pub pointwise: ConvStage,
    /// `group` = its channels, no residual.
    pub depthwise: ConvStage,
}

/// One convolution of a fused op: the Conv as imported and the plan it runs under.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ConvStage {
    pub conv: Conv,
    pub plan: ConvPlan,
}

impl ConvStage {
    pub(crate) fn planned(&self) -> Planned<'_> {
        Planned::new(&self.conv, &self.plan)
    }
}

/// The expanded input rows one thread holds: row `iy` of the image in slot `iy % slots`,
/// tagged with the call it belongs to.
#[derive(Default)]
struct Ring {
    rows: Vec<f32>,
    /// Per slot: `(call, iy)` of the row it holds.
    tags: Vec<(u64, usize)>,
    /// `(call, oy)` of the output row this thread computed last.
    last: (u64, usize),
}

/// A run state's scratch, per thread.
impl ScratchKey for Ring {
    type Value = Ring;
}

/// Identifies one (call, image): a ring's rows from an earlier one are stale.
static CALLS: AtomicU64 = AtomicU64::new(1);

impl PointwiseDepthwise {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if let Some(y) = self.fused(args)? {
            return Ok(smallvec::smallvec![y.into()]);
        }
        let pw = [args.value(0), args.value(1), args.value(2)];
        let mid = self
            .pointwise
            .planned()
            .eval(&Args::new(&pw))?
            .into_iter()
            .next()
            .ok_or_else(|| self.pointwise.planned().misfit("the pointwise stage gave no output"))?;
        let dw = [Some(&mid), args.value(3), args.value(4)];
        self.depthwise.planned().eval(&Args::new(&dw))
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        const ABSENT: InferInput<'static> = InferInput {
            ty: &ValueType::Unknown,
            konst: None,
            present: false,
        };
        let at = |i: usize| inputs.get(i).copied().unwrap_or(ABSENT);
        let mid = self.pointwise.planned().infer(&[at(0), at(1), at(2)])?;
        let mid = mid.first().cloned().unwrap_or(ValueType::Unknown);
        let x = InferInput {
            ty: &mid,
            konst: None,
            present: true,
        };
        self.depthwise.planned().infer(&[x, at(3), at(4)])
    }

    /// The fused evaluation (see the module docs); `None` when the operands are not f32 or
    /// the weights not packed.
    fn fused(&self, args: &Args<'_>) -> Result<Option<Tensor>> {
        use kiln_kernels::sgemm::{BLayout, Bias, Epilogue, PackedBRef, sgemm};
        let (Some(p1), Some(p2)) = (self.pointwise.plan.packed, self.depthwise.plan.packed) else {
            return Ok(None);
        };
        let ts = [0, 1, 2, 3, 4].map(|i| args.opt_tensor(i));
        let [Ok(Some(x)), Ok(Some(w1)), Ok(b1), Ok(Some(w2)), Ok(b2)] = ts else {
            return Ok(None);
        };
        let f32s = [Some(x), Some(w1), b1, Some(w2), b2]
            .iter()
            .flatten()
            .all(|t| t.dtype() == DType::F32);
        if !f32s {
            return Ok(None);
        }
        let &[batch, ih, iw, c] = x.shape() else {
            return Err(OpError::input_shape(0, "[N, H, W, C]", x.shape()));
        };
        let e = p1.m;
        if p1.c != c {
            return Err(OpError::input_shape(
                0,
                format!("{} channels, as the pointwise weights", p1.c),
                x.shape(),
            ));
        }
        if (p1.kh, p1.kw) != (1, 1) || (p2.m, p2.c) != (e, 1) || self.depthwise.conv.group != e {
            return Err(OpError::Plan {
                op: "PointwiseDepthwise",
                plan: format!(
                    "pointwise {}, depthwise {} (group {})",
                    super::Plan::Conv(self.pointwise.plan).summary(),
                    super::Plan::Conv(self.depthwise.plan).summary(),
                    self.depthwise.conv.group
                ),
                reason: "the stages' packed weights do not chain",
            });
        }
        let geo = self
            .depthwise
            .planned()
            .geometry_nhwc(&[batch, ih, iw, e], e, 1, p2.kh, p2.kw)?;
        let packed = PackedBRef::new(BLayout::NR32, c, e, w1.as_slice::<f32>()?)
            .map_err(|err| OpError::input_value(1, format!("pointwise weights packed for W [{e}, {c}, 1, 1]"), err))?;
        let taps = w2.as_slice::<f32>()?;
        let n_taps = p2.kh * p2.kw * e;
        if taps.len() != n_taps {
            return Err(OpError::input_value(
                3,
                format!("the {n_taps} depthwise taps of {}x{}x{e}", p2.kh, p2.kw),
                format!("{} values", taps.len()),
            ));
        }
        let bias1 = f32_bias(b1, e, 2)?.map_or(Bias::None, Bias::Col);
        let bias2 = f32_bias(b2, e, 4)?;
        let epi = Epilogue {
            bias: bias1,
            residual: None,
            act: self.pointwise.plan.activation.map(|a| a.kernel_act()),
            post: None,
            prelu: kiln_kernels::sgemm::Bias::None,
        };
        let dw_act = self.depthwise.plan.activation.map(|a| a.kernel_act());
        let (clamp, after) = split_act(dw_act);
        let dw = geo.depthwise();
        // The ring: the rows the windows of `group` output rows read; each `iw * e` floats.
        let window = (geo.kh.max(1) - 1) * geo.dh + 1;
        let row_len = iw * e;
        numel(&[window, row_len])?;
        // Each thread's own range of output rows, and how many of them one expansion serves.
        let per = kiln_kernels::pool::own_range(geo.oh);
        let group = rows_per_group(geo.sh, iw, window, row_len);
        let slots = (group - 1) * geo.sh + window;
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![batch, geo.oh, geo.ow, e];
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let xd = x.as_slice::<f32>()?;
        let (ip, op) = (ih * iw * c, geo.oh * geo.ow * e);
        // Where two threads' bands meet, the rows both windows need are expanded twice: when
        // that is more than a tenth of the image (a few rows per thread), the expansion runs
        // whole, then the depthwise layer (MobileNet-v2's 14x14 blocks on 2 threads: 0.78 ->
        // 0.74 ms together).
        let threads = kiln_kernels::pool::current_threads().min(geo.oh);
        let twice = (threads.max(1) - 1) * window.saturating_sub(geo.sh);
        // So too when the ring or the pointwise weights outgrow L2 (a dilated 5x5 window's 9
        // rows of 49 x 960 channels, 1.7 MB, in DeepLab-v3's backbone; its 160 x 960 weights,
        // 614 KB, streamed again for every 49-pixel row): fused saves no memory traffic there,
        // and its one-row products ran at 54 GFLOP/s against 80 whole (10.7 -> 7.9 ms).
        let beyond_l2 = window * row_len > FUSED_L2_FLOATS || c * e > FUSED_L2_FLOATS;
        let apart = twice * 10 > ih || beyond_l2;
        let inconsistent = || OpError::input_shape(0, "a shape that fits both stages' packed weights", x.shape());
        for n in 0..batch {
            let (Some(xi), Some(yi)) = (xd.get(n * ip..(n + 1) * ip), y.get_mut(n * op..(n + 1) * op)) else {
                return Err(OpError::input_shape(
                    0,
                    format!("a shape of {} elements, as its data", xd.len()),
                    x.shape(),
                ));
            };
            if apart {
                let mut mid = kiln_kernels::recycle::take(numel(&[ih, iw, e])?);
                let ok = sgemm(ih * iw, AMatrix::row_major(xi, c), packed, &mut mid, e, &epi).is_ok()
                    && dw.run_nhwc(&mid, taps, bias2, (dw_act, None), yi);
                kiln_kernels::recycle::give(mid);
                if !ok {
                    return Err(inconsistent());
                }
                continue;
            }
            let call = CALLS.fetch_add(1, Ordering::Relaxed);
            let failed = std::sync::atomic::AtomicBool::new(false);
            kiln_kernels::pool::for_each_chunk_mut(yi, geo.ow * e, &|oy, out| {
                let mut lent = lend::<Ring>();
                let ring = &mut *lent;
                ring.rows.resize(slots * row_len, 0.0);
                ring.tags.resize(slots, (0, 0));
                // When output row `oy`'s window lacks rows, the rows the windows of the
                // next `group` output rows of this thread's range read are expanded with
                // them (they span at most `slots` rows, so each has its own slot, and
                // none evicts a row `oy` reads), a run of consecutive rows and slots at a
                // time: one GEMM of up to `group * sh * iw` pixels. The rows stay one
                // piece each, so the threads' ranges stay even.
                let (kh, sh, dh, ph) = (geo.kh, geo.sh, geo.dh, geo.ph);
                let in_window = move |oy: usize| {
                    (0..kh).filter_map(move |ky| (oy * sh + ky * dh).checked_sub(ph).filter(|&iy| iy < ih))
                };
                let lacks = |ring: &Ring, iy: usize| ring.tags.get(iy % slots) != Some(&(call, iy));
                let mut ok = true;
                if in_window(oy).any(|iy| lacks(ring, iy)) {
                    // Only walking forward through the range: a row taken from the back of
                    // another thread's range (`for_each_chunk_mut`) comes before the rows this
                    // thread took just before it, whose windows it already holds.
                    let forward = oy % per == 0 || ring.last == (call, oy.wrapping_sub(1));
                    let ahead = if forward { group } else { 1 };
                    let last = (oy + ahead).min((oy / per + 1) * per).min(geo.oh);
                    // Each row once (the windows overlap): as many as the group's slots.
                    let mut missing = smallvec::SmallVec::<[usize; GROUP_ROWS]>::new();
                    for iy in (oy..last).flat_map(in_window) {
                        if lacks(ring, iy) && !missing.contains(&iy) {
                            missing.push(iy);
                        }
                    }
                    missing.sort_unstable();
                    let mut at = 0;
                    while let Some(&r0) = missing.get(at) {
                        let mut len = 1;
                        while missing.get(at + len) == Some(&(r0 + len)) && (r0 + len) % slots != 0 {
                            len += 1;
                        }
                        let s0 = r0 % slots;
                        let (Some(a), Some(dst)) = (
                            xi.get(r0 * iw * c..(r0 + len) * iw * c),
                            ring.rows.get_mut(s0 * row_len..(s0 + len) * row_len),
                        ) else {
                            ok = false;
                            break;
                        };
                        ok &= sgemm(len * iw, AMatrix::row_major(a, c), packed, dst, e, &epi).is_ok();
                        for iy in r0..r0 + len {
                            if let Some(t) = ring.tags.get_mut(iy % slots) {
                                *t = (call, iy);
                            }
                        }
                        at += len;
                    }
                }
                let mut windows = lend::<super::depthwise::RowWindows>();
                ok = ok && dw.nhwc_row(&mut windows, &ring.rows, |iy| iy % slots, taps, bias2, clamp, oy, out);
                ring.last = (call, oy);
                drop(lent);
                if let Some(a) = after {
                    act_slice(a, out);
                }
                if !ok {
                    failed.store(true, Ordering::Relaxed);
                }
            });
            if failed.load(Ordering::Relaxed) {
                return Err(inconsistent());
            }
        }
        Ok(Some(Tensor::from_buf(shape, y)?))
    }
}
