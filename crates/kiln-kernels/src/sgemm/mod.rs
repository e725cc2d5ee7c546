//! f32 GEMM with our own microkernels: `C[m x n] = A[m x k] * B[k x n]`, then a fused
//! epilogue (bias per row or per column, residual add, activation). The SIMD tiles apply it
//! in registers before their last store (measured on 128x1536x384 with AVX-512: bias+Relu
//! +3%, bias+Gelu +18% over the bare product); the portable path applies it to each tile's
//! rows right after the tile, while they are in L1.
//!
//! B is packed once into column panels ([`PackedB`]: the compiler packs weights ahead of time
//! and stores the bytes in the program file). A is read in place, row-major or transposed,
//! with a leading dimension: the microkernels broadcast its elements straight from their rows
//! (8 row streams per tile), which measured as fast as or faster than packing A blocks (in
//! cache: 98-99% of peak either way for transformer shapes; a 512 x 4608 conv weight as A:
//! 73% vs 47%, the packing pass costing more than it saves) and makes M = 1 (GEMV) free of
//! any copy.
//!
//! ## Loop nest (BLIS order) and blocking for Zen 4 (32 KiB L1d, 1 MiB L2 per core)
//!
//! ```text
//! for jc in 0..n step NC            B columns
//!   for pc in 0..k step KC          depth block: C is stored after each (first: overwritten)
//!     for ic in 0..m step ~MC       an MC x KC block of A (192 KiB) stays in L2 (equal
//!                                   blocks, a short remainder folded in: B is read once a block;
//!                                   2 x MC rows when B outgrows L2)
//!       for jr in jc.. step NR      one B micro-panel (KC x NR: 64 KiB for AVX-512, streamed
//!                                   from L2; up to 48 KiB for AVX2, also from L2: KC_AVX2)
//!         for ir in ic.. step MR    the microkernel: an MR x NR tile of C in registers
//!           (last pc: the epilogue, in registers)
//! ```
//!
//! With m <= MR (GEMV-like calls) the depth is not blocked: one pass, C stored once.
//!
//! Threads (not yet): split the `jc` loop (or, when N is small, the `ic` loop) into disjoint
//! ranges, one per thread; B and A are read-only and the C tiles of different ranges never
//! overlap, so no synchronisation is needed inside the call, and no scratch memory either.

mod act;
mod driver;
mod pack;
mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use act::{Act, erf};
pub use pack::{AMatrix, BLayout, PackedB, PackedBRef};

use crate::isa::{self, Isa};

/// Depth of a block. Measured on Zen 4 (single core, shared machine, medians): 512 beat 128
/// and 256 by 2-5% on the resnet50 shapes and matched 768; the tile's A rows (8 x 512 floats,
/// 16 KiB) stay in L1 while its B micro-panel streams from L2.
pub const KC: usize = 512;
/// Longest depth block of the AVX-512 tiles: depths up to 768 run as one block, longer ones
/// as equal blocks of at most 768 (576 had run as 512 + 64, 4608 as nine blocks of 512 with
/// C read and written back after each). Measured on Zen 4, 5 alternating `kiln bench`
/// rounds, 1 thread p50: ResNet-50 67.8 -> 66.8 ms, ResNet-18 24.5 -> 24.2, ViT-tiny 25.8
/// -> 25.4, MiniLM 28.1 -> 27.9; BERT-base lower in 4 of 4 pairs; sgemm bench (cold B)
/// BERT FFN-up 106.5 -> 108.4 GFLOP/s, ResNet-50 conv5_x 3x3 86 -> 94.
pub const KC_MAX: usize = 768;
/// Longest depth block of the 16-column AVX2 tiles: depths up to 768 in one block, longer
/// ones in equal blocks of at most 768 (the B micro-panel streams from L2 past the tile's A
/// rows, and C is read back after fewer blocks). Measured on the AVX2-only EPYC VM (CPUID
/// family 25 model 1, 512 KiB L2 per core), one standalone loop over `sgemm_with` with the
/// depth block alternating in one process, medians of 150-1500 products, 256 -> 768:
/// 2028 x 512 x 1280 48.4 -> 40.9 ms, 196 x 336 x 336 0.70 -> 0.65, 49 x 888 x 888 1.35 ->
/// 1.29, 128 x 3072 x 768 9.84 -> 9.42, 196 x 256 x 1024 1.66 -> 1.63; depths under 256 and
/// in-cache shapes unchanged; few rows against a 3072-deep B lost (48 x 768 x 3072 3.96 ->
/// 4.17, 128 x 768 x 3072 10.00 -> 10.09). 256 had been measured against 512 on a Zen 3 VM
/// before the column calls, the epilogue in registers and the prefetches (ResNet-50's
/// conv2_x 3x3 54 -> 79 GFLOP/s: the 32 KiB micro-panel shared L1 with A and was re-read
/// from L2 by each tile); with those, the re-reads from L2 cost less than C's round trips.
pub const KC_AVX2: usize = 768;
/// Rows of A swept per B micro-panel (a multiple of every MR): MC x KC floats = 192 KiB in
/// L2. 48 lost 5-10%; 96 and 192 measured the same. A shorter depth block sweeps more rows
/// in the same bytes (ViT-tiny's 197-row products in one block: in `kiln profile` its MatMuls 21.3-21.9 ->
/// 20.6-20.9 ms, B read once per product instead of three times).
pub const MC: usize = 96;
/// Columns of B per outer block (a multiple of every panel width); 1024 and 4096 measured
/// the same (B's KC x NC slab is streamed once per MC rows: 48 FLOP per byte).
pub const NC: usize = 4096;

/// Bias added to the product before the residual and the activation.
#[derive(Debug, Clone, Copy, Default)]
pub enum Bias<'a> {
    #[default]
    None,
    /// One value per row of C (`len == m`): convolution as GEMM with M = output channels.
    Row(&'a [f32]),
    /// One value per column of C (`len == n`): Gemm/MatMul bias, or convolution with N =
    /// output channels (channels-last).
    Col(&'a [f32]),
}

/// A matrix added to the result (`m x n`, element `(i, j)` at `data[i * ld + j]`).
#[derive(Debug, Clone, Copy)]
pub struct Residual<'a> {
    pub data: &'a [f32],
    pub ld: usize,
}

/// What is applied to each element of C after the product, in this order:
/// `post(act(acc + bias + residual))`, each operation rounded to f32 as the unfused ops would.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    pub bias: Bias<'a>,
    pub residual: Option<Residual<'a>>,
    pub act: Option<Act>,
    pub post: Option<Affine>,
    /// PRelu slopes after the bias and residual, one per row or per column of C: `v < 0 ? v
    /// * slope : v`, the standalone op's f32 multiply (a PRelu that followed a convolution).
    /// Not with `act` or `post` ([`sgemm`] refuses the pair).
    pub prelu: Bias<'a>,
}

impl Epilogue<'_> {
    /// No bias, residual or activation.
    pub const NONE: Epilogue<'static> = Epilogue {
        bias: Bias::None,
        residual: None,
        act: None,
        post: None,
        prelu: Bias::None,
    };

    fn is_empty(&self) -> bool {
        matches!(self.bias, Bias::None)
            && self.residual.is_none()
            && self.act.is_none()
            && self.post.is_none()
            && matches!(self.prelu, Bias::None)
    }
}

impl<'a> Bias<'a> {
    /// The vector of the sub-product from row `i0` on (a row vector offset; others as they are).
    fn from_row(self, i0: usize) -> Bias<'a> {
        match self {
            Bias::Row(v) => Bias::Row(v.get(i0..).unwrap_or(&[])),
            other => other,
        }
    }

    /// The vector of the sub-product of columns `j0 .. j0 + n` (a column vector cut; others as
    /// they are).
    fn columns(self, j0: usize, n: usize) -> Bias<'a> {
        match self {
            Bias::Col(v) => Bias::Col(v.get(j0..j0 + n).unwrap_or(&[])),
            other => other,
        }
    }

    /// Its length, checked against `m` rows or `n` columns.
    fn check(self, what: [&'static str; 2], m: usize, n: usize) -> Result<(), SgemmError> {
        match self {
            Bias::Row(v) if v.len() != m => Err(SgemmError::Mismatch {
                what: what[0],
                want: m,
                got: v.len(),
            }),
            Bias::Col(v) if v.len() != n => Err(SgemmError::Mismatch {
                what: what[1],
                want: n,
                got: v.len(),
            }),
            _ => Ok(()),
        }
    }
}

/// A scale and shift after the activation, `v * scale + shift`, each part optional and each
/// rounded on its own (a multiply, then an add: the `Mul` and `Add` of one-element constants
/// that followed the product, as PP-LCNet's learnable affine blocks write them).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Affine {
    pub scale: Option<f32>,
    pub shift: Option<f32>,
}

impl Affine {
    /// The value of one element.
    #[inline(always)]
    pub fn apply(self, v: f32) -> f32 {
        let v = match self.scale {
            Some(s) => v * s,
            None => v,
        };
        match self.shift {
            Some(b) => v + b,
            None => v,
        }
    }

    /// [`Affine::apply`] on every element, vectorised on the active level.
    pub fn apply_slice(self, v: &mut [f32]) {
        let Affine { scale, shift } = self;
        crate::simd::vectorize(move || match (scale, shift) {
            (Some(s), Some(b)) => v.iter_mut().for_each(|x| *x = *x * s + b),
            (Some(s), None) => v.iter_mut().for_each(|x| *x *= s),
            (None, Some(b)) => v.iter_mut().for_each(|x| *x += b),
            (None, None) => {}
        })
    }
}

/// Why a GEMM call was refused (nothing is written then).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SgemmError {
    /// A slice is shorter than its dimensions and leading dimension require.
    ShortSlice {
        what: &'static str,
        need: usize,
        got: usize,
    },
    /// A leading dimension is below the row width it must step over.
    LeadingDim { what: &'static str, ld: usize, min: usize },
    /// A dimension disagrees with another operand's (B's k or n, a bias length).
    Mismatch {
        what: &'static str,
        want: usize,
        got: usize,
    },
    /// Packed data of the wrong length for its layout and dims.
    PackedLength { want: usize, got: usize },
    /// Packed bytes not aligned to 4 bytes.
    Misaligned,
    /// Packed bytes are little-endian; this target is big-endian.
    BigEndian,
    /// A size overflows `usize`.
    TooLarge,
    /// The kernels of this level cannot run on this CPU.
    Unsupported(Isa),
    /// Epilogue parts that do not go together.
    Epilogue(&'static str),
}

impl std::fmt::Display for SgemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SgemmError::ShortSlice { what, need, got } => {
                write!(f, "sgemm: {what} has {got} elements, its shape needs {need}")
            }
            SgemmError::LeadingDim { what, ld, min } => {
                write!(
                    f,
                    "sgemm: leading dimension {ld} of {what} is below its row width {min}"
                )
            }
            SgemmError::Mismatch { what, want, got } => write!(f, "sgemm: {what} is {got}, expected {want}"),
            SgemmError::PackedLength { want, got } => {
                write!(f, "sgemm: packed B has {got} floats, its layout needs {want}")
            }
            SgemmError::Misaligned => write!(f, "sgemm: packed B bytes are not 4-byte aligned"),
            SgemmError::BigEndian => write!(f, "sgemm: packed B bytes are little-endian, this target is not"),
            SgemmError::TooLarge => write!(f, "sgemm: a size overflows"),
            SgemmError::Unsupported(i) => write!(f, "sgemm: the {} kernels cannot run on this CPU", i.name()),
            SgemmError::Epilogue(what) => write!(f, "sgemm: the epilogue has {what}"),
        }
    }
}

impl std::error::Error for SgemmError {}

/// `C = epilogue(A * B)` on the active kernels ([`crate::isa::active`]). `c` holds `m` rows of
/// `b.n()` columns with leading dimension `ldc`; its previous contents are ignored (never read).
pub fn sgemm(
    m: usize,
    a: AMatrix<'_>,
    b: PackedBRef<'_>,
    c: &mut [f32],
    ldc: usize,
    epilogue: &Epilogue<'_>,
) -> Result<(), SgemmError> {
    sgemm_with(isa::active(), m, a, b, c, ldc, epilogue)
}

/// [`sgemm`] on the kernels of a given level (tests and benchmarks compare levels with it).
pub fn sgemm_with(
    isa: Isa,
    m: usize,
    a: AMatrix<'_>,
    b: PackedBRef<'_>,
    c: &mut [f32],
    ldc: usize,
    epilogue: &Epilogue<'_>,
) -> Result<(), SgemmError> {
    if !isa.is_supported() {
        return Err(SgemmError::Unsupported(isa));
    }
    validate(m, &a, &b, c.len(), ldc, epilogue)?;
    let kernels = driver::Kernels::select(isa, b.layout(), m);
    let threads = crate::pool::current_threads();
    let work = m.saturating_mul(b.n()).saturating_mul(b.k());
    if threads < 2 || work < PAR_MIN_WORK {
        driver::run(&kernels, m, &a, &b, c, ldc, epilogue);
        return Ok(());
    }
    // Rows or whole B panels per thread, whichever splits more evenly (few rows, such as a
    // deep convolution's 49 pixels, split badly).
    let panels = b.n().div_ceil(b.layout().nr());
    let tasks = threads.min(m / kernels.mr);
    let rows_per = m.div_ceil(tasks.max(1));
    let panel_balance = panels as f64 / (threads * panels.div_ceil(threads)) as f64;
    let row_balance = m as f64 / (threads as f64 * row_cost(rows_per, kernels.mr));
    // A B of more than twice A's size (a transformer's weights against its 128-197 rows)
    // splits by panels when they balance: split by rows, each thread streams all of B, and
    // when the host places the two vCPUs far apart (no shared L3) that is twice the memory
    // traffic. Measured, alternating, 2 threads: vit_b_16 far 230 -> 208 ms, BERT-base far
    // 131 -> 120 ms; near, both unchanged (177-180, 108-113 ms), as are MiniLM, ViT-tiny and
    // ResNet-50 either way.
    let wide_b = b.n() > 2 * m && panel_balance >= 0.9;
    if panels >= 2 && (tasks < 2 || wide_b || panel_balance > row_balance + 0.05) {
        split_columns(&kernels, threads, m, &a, &b, c, ldc, epilogue);
        return Ok(());
    }
    if tasks < 2 {
        driver::run(&kernels, m, &a, &b, c, ldc, epilogue);
        return Ok(());
    }
    // Split C by rows, one block of `ceil(m / tasks)` rows per thread (not rounded to whole
    // tiles: 49 rows run as 25 + 24, a 1-row tile more on one side, where whole tiles gave
    // 32 + 17): each block is a disjoint `&mut` chunk of C with the matching rows of A, the
    // row bias and the residual; B is shared (read-only).
    let chunk = rows_per.saturating_mul(ldc).max(1);
    let blocks: smallvec::SmallVec<[std::sync::Mutex<&mut [f32]>; 4]> =
        c.chunks_mut(chunk).map(std::sync::Mutex::new).collect();
    crate::pool::parallel_for(blocks.len(), &|t| {
        let i0 = t * rows_per;
        let rows = rows_per.min(m.saturating_sub(i0));
        let Some(block) = blocks.get(t) else { return };
        let mut guard = block.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let a_off = if a.transposed { i0 } else { i0 * a.ld };
        let sub_a = AMatrix {
            data: a.data.get(a_off..).unwrap_or(&[]),
            ..a
        };
        let sub_epi = Epilogue {
            bias: epilogue.bias.from_row(i0),
            residual: epilogue.residual.map(|r| Residual {
                data: r.data.get(i0 * r.ld..).unwrap_or(&[]),
                ld: r.ld,
            }),
            act: epilogue.act,
            post: epilogue.post,
            prelu: epilogue.prelu.from_row(i0),
        };
        // The sub-problem satisfies `validate` because the whole did: its rows are a subset.
        driver::run(&kernels, rows, &sub_a, &b, &mut guard, ldc, &sub_epi);
    });
    Ok(())
}

/// [`sgemm_with`]'s column split: each task computes all rows of whole B panels, writing its
/// own columns of C (disjoint element sets of one matrix) through a raw pointer.
#[allow(clippy::too_many_arguments)]
fn split_columns(
    kernels: &driver::Kernels,
    threads: usize,
    m: usize,
    a: &AMatrix<'_>,
    b: &PackedBRef<'_>,
    c: &mut [f32],
    ldc: usize,
    epilogue: &Epilogue<'_>,
) {
    let nr = b.layout().nr();
    let panels = b.n().div_ceil(nr);
    let tasks = threads.min(panels);
    let per = panels.div_ceil(tasks);
    let cm = driver::CMut {
        ptr: c.as_mut_ptr(),
        ldc,
    };
    crate::pool::parallel_for(tasks, &|t| {
        let (p0, p1) = (t * per, ((t + 1) * per).min(panels));
        let Some(sub_b) = b.panels(p0, p1) else { return };
        let j0 = p0 * nr;
        let sub_epi = Epilogue {
            bias: epilogue.bias.columns(j0, sub_b.n()),
            residual: epilogue.residual.map(|r| Residual {
                data: r.data.get(j0..).unwrap_or(&[]),
                ld: r.ld,
            }),
            act: epilogue.act,
            post: epilogue.post,
            prelu: epilogue.prelu.columns(j0, sub_b.n()),
        };
        let sub_c = cm.at_column(j0);
        // SAFETY: `validate` checked C's `m x n` elements with `ldc` for the whole product;
        // this task writes rows `< m`, columns `j0 .. j0 + sub_b.n() <= n` only, and the
        // tasks' column ranges are disjoint (whole panels `p0..p1` each), while the caller's
        // exclusive borrow of `c` keeps everyone else out. The sub-operands are the whole's
        // restricted to those columns (bias and residual offset by `j0`), so they pass
        // `validate` too.
        unsafe { driver::run_raw(kernels, m, a, &sub_b, sub_c, &sub_epi) };
    });
}

/// What `rows` rows of C cost in rows of full `mr`-row tiles: a partial tile of `q` rows
/// costs at least a quarter of a full one (its few accumulators wait on the FMA latency).
fn row_cost(rows: usize, mr: usize) -> f64 {
    let q = rows % mr;
    let partial = if q == 0 { 0.0 } else { q.max(mr.div_ceil(4)) as f64 };
    (rows - q) as f64 + partial
}

/// Multiply-adds below which a GEMM runs on one thread (a fork-join costs about a
/// microsecond; this is ~5 us of single-core work).
const PAR_MIN_WORK: usize = 1 << 19;

/// Applies an activation to every element with the kernels of the active level.
pub fn act_slice(act: Act, v: &mut [f32]) {
    act_slice_with_isa(isa::active(), act, v);
}

/// `v += residual` (when given, of `v`'s length), then the activation, in one pass on the
/// active level: the epilogue a convolution applies after its own output stage.
pub fn residual_act(v: &mut [f32], residual: Option<&[f32]>, act: Option<Act>) {
    if residual.is_some() || act.is_some() {
        epilogue_pass(isa::active(), v, residual, act);
    }
}

/// `epi` over `c` as rows of `n` columns, with the active level's kernels: row `i`'s
/// residual at `i * ld`, a row bias or PRelu slope by row, a column one by column (the
/// epilogue of kernels that write their products into C first, e.g. [`crate::planar`]).
/// `false`, changing nothing, when a vector or the residual is shorter than `c` needs.
pub fn epilogue_rows(c: &mut [f32], n: usize, epi: &Epilogue<'_>) -> bool {
    let rows = c.len().checked_div(n).unwrap_or(0);
    if rows == 0 || epi.is_empty() {
        return true;
    }
    let fits = |b: Bias<'_>| match b {
        Bias::None => true,
        Bias::Row(v) => v.len() >= rows,
        Bias::Col(v) => v.len() == n,
    };
    let resid_ok = epi
        .residual
        .is_none_or(|r| r.ld >= n && r.data.len() >= (rows.saturating_sub(1)) * r.ld + n);
    if !(fits(epi.bias) && fits(epi.prelu) && resid_ok) {
        return false;
    }
    let isa = isa::active();
    let kernels = driver::Kernels::select(isa, BLayout::for_isa(isa), 0);
    // A costly activation (SiLU, GELU, ...) over all the rows in one pass, after the sums:
    // the rows of a kernel with few columns (a stem's 32 channels) are as short as the
    // activation's setup, which a pass per row repeated for every pixel.
    if let (Some(act), Bias::None) = (epi.act.filter(|a| !a.is_cheap()), epi.prelu) {
        let sums = Epilogue {
            act: None,
            post: None,
            ..*epi
        };
        if !sums.is_empty() {
            for (i, row) in c.chunks_exact_mut(n).enumerate() {
                driver::finish_row(&kernels, &sums, i, 0, row);
            }
        }
        let all = &mut c[..rows * n];
        (kernels.epi)(all, None, None, None, Some(act));
        if let Some(post) = epi.post {
            post.apply_slice(all);
        }
        return true;
    }
    for (i, row) in c.chunks_exact_mut(n).enumerate() {
        driver::finish_row(&kernels, epi, i, 0, row);
    }
    true
}

/// [`act_slice`] on a given level; a level this CPU lacks runs the portable code.
pub fn act_slice_with_isa(isa: Isa, act: Act, v: &mut [f32]) {
    epilogue_pass(isa, v, None, Some(act));
}

/// The GEMM epilogue of `isa` (portable when the CPU lacks it) over `v` as one row: the
/// residual added, then the activation.
fn epilogue_pass(isa: Isa, v: &mut [f32], residual: Option<&[f32]>, act: Option<Act>) {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    let epi = driver::Kernels::select(isa, BLayout::for_isa(isa), 0).epi;
    epi(v, None, None, residual, act);
}

fn need(what: &'static str, got: usize, need: Option<usize>) -> Result<(), SgemmError> {
    let need = need.ok_or(SgemmError::TooLarge)?;
    if got < need {
        return Err(SgemmError::ShortSlice { what, need, got });
    }
    Ok(())
}

fn validate(
    m: usize,
    a: &AMatrix<'_>,
    b: &PackedBRef<'_>,
    c_len: usize,
    ldc: usize,
    epi: &Epilogue<'_>,
) -> Result<(), SgemmError> {
    let (k, n) = (b.k(), b.n());
    m.checked_mul(n).ok_or(SgemmError::TooLarge)?;
    m.checked_mul(k).ok_or(SgemmError::TooLarge)?;
    let (a_rows, a_cols) = if a.transposed { (k, m) } else { (m, k) };
    if a_rows > 0 && a.ld < a_cols && !(a.windows && !a.transposed) {
        return Err(SgemmError::LeadingDim {
            what: "A",
            ld: a.ld,
            min: a_cols,
        });
    }
    need("A", a.data.len(), pack::span(a_rows, a_cols, a.ld, 1))?;
    if m > 0 && ldc < n {
        return Err(SgemmError::LeadingDim {
            what: "C",
            ld: ldc,
            min: n,
        });
    }
    need("C", c_len, pack::span(m, n, ldc, 1))?;
    epi.bias.check(["row bias length", "column bias length"], m, n)?;
    epi.prelu
        .check(["row PRelu slopes length", "column PRelu slopes length"], m, n)?;
    if !matches!(epi.prelu, Bias::None) && (epi.act.is_some() || epi.post.is_some()) {
        return Err(SgemmError::Epilogue(
            "PRelu slopes with an activation or an affine after it",
        ));
    }
    if let Some(r) = epi.residual {
        if m > 0 && r.ld < n {
            return Err(SgemmError::LeadingDim {
                what: "residual",
                ld: r.ld,
                min: n,
            });
        }
        need("residual", r.data.len(), pack::span(m, n, r.ld, 1))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::gemm::MatLayout;

    #[test]
    fn small_product_every_level() {
        // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50], + column bias [1 2], relu after -100 residual.
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [5.0f32, 6.0, 7.0, 8.0];
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            for layout in [BLayout::NR16, BLayout::NR32] {
                let pb = PackedB::pack(layout, 2, 2, &b, MatLayout::row_major(2)).unwrap();
                let mut c = [f32::NAN; 4];
                sgemm_with(isa, 2, AMatrix::row_major(&a, 2), pb.view(), &mut c, 2, &Epilogue::NONE).unwrap();
                assert_eq!(c, [19.0, 22.0, 43.0, 50.0], "{isa:?}");
                let resid = [0.0f32, -100.0, 0.0, 0.0];
                let epi = Epilogue {
                    bias: Bias::Col(&[1.0, 2.0]),
                    residual: Some(Residual { data: &resid, ld: 2 }),
                    act: Some(Act::Relu),
                    post: None,
                    prelu: Bias::None,
                };
                sgemm_with(isa, 2, AMatrix::transposed(&a, 2), pb.view(), &mut c, 2, &epi).unwrap();
                assert_eq!(c, [27.0, 0.0, 39.0, 46.0], "{isa:?}");
            }
        }
    }

    #[test]
    fn row_blocks_are_even_and_never_more_than_the_plain_split() {
        // 196 rows (a 14 x 14 layer) around a 192-row target: one block, not 192 + 4.
        assert_eq!(driver::row_block(196, 192, 6), 198);
        // 784 rows: four blocks of 198 (the last 190), not 4 x 192 + 16.
        assert_eq!(driver::row_block(784, 192, 6), 198);
        for mr in [4, 6, 8] {
            for target in [96, 192, 3072] {
                for m in mr + 1..2000 {
                    let mc = driver::row_block(m, target, mr);
                    assert_eq!(mc % mr, 0, "m {m} target {target} mr {mr}");
                    let blocks = m.div_ceil(mc);
                    assert!(blocks <= m.div_ceil(target), "m {m} target {target}: {blocks} blocks");
                    assert!(mc <= target + target / 4 + mr, "m {m} target {target}: {mc} rows");
                    // Equal blocks: the last is short by less than one tile per block.
                    let last = m - (blocks - 1) * mc;
                    assert!(last + blocks * mr > mc, "m {m} target {target}: last {last} of {mc}");
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let pb = PackedB::pack(BLayout::NR32, 3, 2, &[1.0; 6], MatLayout::row_major(2)).unwrap();
        let a = [1.0f32; 6];
        let mut c = [0.0f32; 4];
        let e = Epilogue::NONE;
        assert!(sgemm(2, AMatrix::row_major(&a, 3), pb.view(), &mut c, 2, &e).is_ok());
        assert!(matches!(
            sgemm(2, AMatrix::row_major(&a, 2), pb.view(), &mut c, 2, &e),
            Err(SgemmError::LeadingDim { .. })
        ));
        // Overlapping rows only when asked for: windows one float apart over [1, 2, 3, 4].
        let w = [1.0f32, 2.0, 3.0, 4.0];
        assert!(sgemm(2, AMatrix::windows(&w, 1), pb.view(), &mut c, 2, &e).is_ok());
        // B is all ones: each output is its window's sum (1+2+3, 2+3+4).
        assert_eq!(c, [6.0, 6.0, 9.0, 9.0]);
        assert!(matches!(
            sgemm(2, AMatrix::windows(&w[..3], 1), pb.view(), &mut c, 2, &e),
            Err(SgemmError::ShortSlice { what: "A", .. })
        ));
        assert!(matches!(
            sgemm(3, AMatrix::row_major(&a, 3), pb.view(), &mut c, 2, &e),
            Err(SgemmError::ShortSlice { what: "A", .. })
        ));
        assert!(matches!(
            sgemm(2, AMatrix::row_major(&a, 3), pb.view(), &mut c[..3], 2, &e),
            Err(SgemmError::ShortSlice { what: "C", .. })
        ));
        let bad_bias = Epilogue {
            bias: Bias::Row(&[1.0]),
            ..Epilogue::NONE
        };
        assert!(sgemm(2, AMatrix::row_major(&a, 3), pb.view(), &mut c, 2, &bad_bias).is_err());
        let bad_resid = Epilogue {
            residual: Some(Residual { data: &[0.0; 3], ld: 2 }),
            ..Epilogue::NONE
        };
        assert!(sgemm(2, AMatrix::row_major(&a, 3), pb.view(), &mut c, 2, &bad_resid).is_err());
        // Huge dims overflow instead of wrapping.
        assert!(sgemm(usize::MAX, AMatrix::row_major(&a, 3), pb.view(), &mut c, 2, &e).is_err());
    }
}
