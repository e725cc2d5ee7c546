//! Operands of the f32 GEMM: `PackedB` (the right-hand matrix, typically weights, cut into
//! column panels once, at compile time) and `AMatrix` (the left-hand one, read in place).
//!
//! ## Layout of a packed B (`f32/nr{NR}/v1`)
//!
//! B (`k x n`) is cut into `ceil(n / NR)` column panels of `NR` columns; panel `q` holds
//! `B[p][q*NR + j]` at float index `q*k*NR + p*NR + j` (k-major inside a panel, so a kernel
//! reads one contiguous `NR`-float row per step of k). Columns past `n` in the last panel are
//! zero. Floats are little-endian IEEE binary32; with `NR` a multiple of 16 every panel starts
//! on a 64-byte boundary when the buffer does. The layout does not depend on the cache
//! blocking (a KC block of panel `q` starts at `q*k*NR + p0*NR`), so it is fixed per `NR` and
//! any kernel whose width divides `NR` reads it (AVX-512: 32 columns; AVX2 and portable: 16).

use super::SgemmError;
use crate::gemm::MatLayout;
use crate::isa::Isa;

/// A 64-byte aligned line of 16 floats: the storage unit of packed buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A float buffer whose start is 64-byte aligned (cache line and AVX-512 vector).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct AlignedVec {
    lines: Vec<Line>,
    len: usize,
}

/// Line vectors of dropped [`AlignedVec`]s, shared by all threads, for the next ones: B panels
/// packed at run time (attention heads, MatMul with two computed inputs) then reuse their
/// storage, also when one thread packs what another drops (a head's panels shared by the
/// tasks of its query blocks are dropped by the caller).
const KEEP_LINES: usize = 16;
/// Largest line vector kept (8 MiB) and most kept in all (32 MiB), so the weights of a dropped
/// program are not held.
const KEEP_MAX_LINES: usize = (8 << 20) / 64;
const KEEP_TOTAL_LINES: usize = (32 << 20) / 64;

static SPARE_LINES: std::sync::Mutex<Vec<Vec<Line>>> = std::sync::Mutex::new(Vec::new());

impl AlignedVec {
    pub(crate) fn zeroed(len: usize) -> AlignedVec {
        let n = len.div_ceil(16);
        let reused = {
            let mut s = SPARE_LINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            s.iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= n && v.capacity() / 2 <= n)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i)
                .map(|i| s.swap_remove(i))
        };
        let lines = match reused {
            Some(mut v) => {
                v.clear();
                v.resize(n, Line([0.0; 16]));
                v
            }
            None => vec![Line([0.0; 16]); n],
        };
        AlignedVec { lines, len }
    }

    pub(crate) fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` (size 64, no padding), so the vector's
        // buffer holds `16 * lines.len() >= len` initialised, contiguous f32s.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`; the unique borrow of `self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl Drop for AlignedVec {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.lines);
        if v.capacity() == 0 || v.capacity() > KEEP_MAX_LINES {
            return;
        }
        let mut s = SPARE_LINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: usize = s.iter().map(Vec::capacity).sum();
        if s.len() < KEEP_LINES && total + v.capacity() <= KEEP_TOTAL_LINES {
            s.push(v);
        }
    }
}

/// Panel width of a packed B: the portable description of its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BLayout {
    nr: usize,
}

impl BLayout {
    /// 32-column panels: native for AVX-512, read by every kernel.
    pub const NR32: BLayout = BLayout { nr: 32 };
    /// 16-column panels: native for AVX2 and the portable kernel.
    pub const NR16: BLayout = BLayout { nr: 16 };

    /// The layout the kernels of `isa` read fastest. Portable gets 32-column panels too, so a
    /// program packed on a machine without SIMD still runs at full speed on an AVX-512 one.
    pub fn for_isa(isa: Isa) -> BLayout {
        match isa {
            Isa::Avx2Fma => BLayout::NR16,
            Isa::Portable | Isa::Avx512 => BLayout::NR32,
        }
    }

    /// Panel width in columns.
    pub fn nr(self) -> usize {
        self.nr
    }

    /// The portable layout tag (`f32/nr32/v1`): all a reader needs to interpret the bytes.
    pub fn tag(self) -> &'static str {
        if self.nr == 32 { "f32/nr32/v1" } else { "f32/nr16/v1" }
    }

    /// The format tag naming the kernel family the layout is tuned for (`f32/avx512/nr32/v1`).
    pub fn format_tag(self) -> &'static str {
        if self.nr == 32 {
            "f32/avx512/nr32/v1"
        } else {
            "f32/avx2/nr16/v1"
        }
    }

    /// Parses either tag form.
    pub fn from_tag(tag: &str) -> Option<BLayout> {
        [BLayout::NR32, BLayout::NR16]
            .into_iter()
            .find(|l| l.tag() == tag || l.format_tag() == tag)
    }

    /// Floats of a packed `k x n` matrix, None on overflow.
    pub fn packed_len(self, k: usize, n: usize) -> Option<usize> {
        n.div_ceil(self.nr).checked_mul(k)?.checked_mul(self.nr)
    }
}

/// A borrowed packed B: the floats of the layout above, viewed in place (e.g. in a mapped
/// program file), or rows `k0..k1` of every panel of such a matrix ([`PackedBRef::rows`]):
/// panel `p` starts at `data[p * stride]` and holds `k` rows of `nr` floats, so `data` has
/// `(panels - 1) * stride + k * nr` floats. A gathered view ([`PackedBRef::gather`]) reads
/// chosen row ranges of such a matrix in turn as its depths.
#[derive(Debug, Clone, Copy)]
pub struct PackedBRef<'a> {
    layout: BLayout,
    /// Depth of the product: the rows the view reads (the ranges' total when gathered).
    k: usize,
    n: usize,
    /// Floats from one panel's start to the next's (`k * nr` unless a row range).
    stride: usize,
    data: &'a [f32],
    /// Rows of the packed matrix that make the view's depths, in order (empty: all of them,
    /// `0..k`). Each range lies inside the matrix `data` holds.
    picks: &'a [std::ops::Range<usize>],
}

impl<'a> PackedBRef<'a> {
    /// Views packed floats; their count must be exactly `layout.packed_len(k, n)`.
    pub fn new(layout: BLayout, k: usize, n: usize, data: &'a [f32]) -> Result<PackedBRef<'a>, SgemmError> {
        let want = layout.packed_len(k, n).ok_or(SgemmError::TooLarge)?;
        if data.len() != want {
            return Err(SgemmError::PackedLength { want, got: data.len() });
        }
        Ok(PackedBRef {
            layout,
            k,
            n,
            stride: k * layout.nr(),
            data,
            picks: &[],
        })
    }

    /// Views packed bytes (little-endian f32, as written by [`PackedB::as_bytes`]). The bytes
    /// must be 4-byte aligned (64 is best: every panel then starts on a cache line).
    pub fn from_bytes(layout: BLayout, k: usize, n: usize, bytes: &'a [u8]) -> Result<PackedBRef<'a>, SgemmError> {
        if cfg!(target_endian = "big") {
            return Err(SgemmError::BigEndian);
        }
        // SAFETY: every bit pattern is a valid f32, so reinterpreting the aligned middle part
        // of the byte slice is sound; `align_to` puts only whole, aligned f32s in the middle.
        let (head, floats, tail) = unsafe { bytes.align_to::<f32>() };
        if !head.is_empty() {
            return Err(SgemmError::Misaligned);
        }
        if !tail.is_empty() {
            return Err(SgemmError::PackedLength {
                want: layout.packed_len(k, n).unwrap_or(usize::MAX),
                got: floats.len(),
            });
        }
        PackedBRef::new(layout, k, n, floats)
    }

    pub fn layout(&self) -> BLayout {
        self.layout
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
    /// Floats from one panel's first row to the next panel's.
    pub fn stride(&self) -> usize {
        self.stride
    }
    /// The packed floats (see the type's docs for where each panel starts).
    pub fn data(&self) -> &'a [f32] {
        self.data
    }

    /// Panels `p0..p1` (columns `p0*nr .. min(p1*nr, n)`) as a packed matrix of their own:
    /// a sub-slice, as panels are laid out one after the other. `None` for an empty or
    /// out-of-range panel range.
    pub fn panels(&self, p0: usize, p1: usize) -> Option<PackedBRef<'a>> {
        let nr = self.layout.nr();
        let j0 = p0.checked_mul(nr)?;
        let j1 = p1.checked_mul(nr)?.min(self.n);
        if j0 >= j1 {
            return None;
        }
        let count = (j1 - j0).div_ceil(nr);
        let start = p0.checked_mul(self.stride)?;
        let len = (count - 1)
            .checked_mul(self.stride)?
            .checked_add(self.k.checked_mul(nr)?)?;
        let data = self.data.get(start..start.checked_add(len)?)?;
        Some(PackedBRef {
            layout: self.layout,
            k: self.k,
            n: j1 - j0,
            stride: self.stride,
            data,
            picks: self.picks,
        })
    }

    /// Rows `k0..k1` of every panel (depths `k0..k1` of B) as a packed matrix of their own,
    /// read in place: the product of A's matching columns only (a convolution's taps that
    /// fall in the padding for a whole block of output rows). `None` unless `k0 <= k1 <= k`.
    pub fn rows(&self, k0: usize, k1: usize) -> Option<PackedBRef<'a>> {
        if k0 > k1 || k1 > self.k || !self.picks.is_empty() {
            return None;
        }
        let nr = self.layout.nr();
        let panels = self.n.div_ceil(nr);
        if panels == 0 {
            return None;
        }
        let start = k0.checked_mul(nr)?;
        let end = (panels - 1)
            .checked_mul(self.stride)?
            .checked_add(k1.checked_mul(nr)?)?;
        let data = self.data.get(start..end)?;
        Some(PackedBRef {
            layout: self.layout,
            k: k1 - k0,
            n: self.n,
            stride: self.stride,
            data,
            picks: &[],
        })
    }

    /// The rows of each range in turn (every panel's), read in place as the depths of a
    /// product with A's matching columns: a convolution's taps that read the image for a
    /// region of output pixels, when those taps are not one run of rows (a dilated window's
    /// live columns in each live kernel row). `None` unless every range is non-empty and
    /// inside `0..k`, or if this view is gathered already.
    pub fn gather<'r>(&self, ranges: &'r [std::ops::Range<usize>]) -> Option<PackedBRef<'r>>
    where
        'a: 'r,
    {
        if !self.picks.is_empty() || ranges.is_empty() {
            return None;
        }
        let mut k = 0usize;
        for r in ranges {
            if r.start >= r.end || r.end > self.k {
                return None;
            }
            k = k.checked_add(r.end - r.start)?;
        }
        Some(PackedBRef {
            layout: self.layout,
            k,
            n: self.n,
            stride: self.stride,
            data: self.data,
            picks: ranges,
        })
    }

    /// The view's depth runs: `(first depth, first packed row, rows)`, in depth order; one
    /// run `(0, 0, k)` unless gathered.
    pub(crate) fn runs(&self) -> smallvec::SmallVec<[(usize, usize, usize); 8]> {
        if self.picks.is_empty() {
            return smallvec::smallvec![(0, 0, self.k)];
        }
        let mut depth = 0;
        self.picks
            .iter()
            .map(|r| {
                let run = (depth, r.start, r.end - r.start);
                depth += r.end - r.start;
                run
            })
            .collect()
    }
}

/// An owned packed B in a 64-byte aligned buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedB {
    layout: BLayout,
    k: usize,
    n: usize,
    data: AlignedVec,
}

impl PackedB {
    /// Packs `B` (`k x n`, element `(p, j)` at `b[p * lb.row_stride + j * lb.col_stride]`):
    /// `MatLayout::row_major(n)` for a MatMul weight, `MatLayout::transposed(k)` for a Gemm
    /// weight stored `n x k` (transB).
    pub fn pack(layout: BLayout, k: usize, n: usize, b: &[f32], lb: MatLayout) -> Result<PackedB, SgemmError> {
        let len = layout.packed_len(k, n).ok_or(SgemmError::TooLarge)?;
        let need = span(k, n, lb.row_stride, lb.col_stride).ok_or(SgemmError::TooLarge)?;
        if b.len() < need {
            return Err(SgemmError::ShortSlice {
                what: "B",
                need,
                got: b.len(),
            });
        }
        let mut data = AlignedVec::zeroed(len);
        let nr = layout.nr;
        let out = data.as_mut_slice();
        if k > 0 {
            for (q, panel) in out.chunks_exact_mut(k * nr).enumerate() {
                let j0 = q * nr;
                let w = nr.min(n - j0);
                for (p, row) in panel.chunks_exact_mut(nr).enumerate() {
                    let base = p * lb.row_stride + j0 * lb.col_stride;
                    if lb.col_stride == 1 {
                        row[..w].copy_from_slice(&b[base..base + w]);
                    } else {
                        for (j, d) in row[..w].iter_mut().enumerate() {
                            *d = b[base + j * lb.col_stride];
                        }
                    }
                }
            }
        }
        Ok(PackedB { layout, k, n, data })
    }

    /// Copies packed bytes (e.g. read from a program file) into an owned, aligned buffer.
    pub fn from_bytes(layout: BLayout, k: usize, n: usize, bytes: &[u8]) -> Result<PackedB, SgemmError> {
        if cfg!(target_endian = "big") {
            return Err(SgemmError::BigEndian);
        }
        let len = layout.packed_len(k, n).ok_or(SgemmError::TooLarge)?;
        if Some(bytes.len()) != len.checked_mul(4) {
            return Err(SgemmError::PackedLength {
                want: len,
                got: bytes.len() / 4,
            });
        }
        let mut data = AlignedVec::zeroed(len);
        for (d, s) in data.as_mut_slice().iter_mut().zip(bytes.chunks_exact(4)) {
            *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
        Ok(PackedB { layout, k, n, data })
    }

    /// The packed floats as little-endian bytes (what a program file stores, 64-byte aligned).
    pub fn as_bytes(&self) -> &[u8] {
        let f = self.data.as_slice();
        // SAFETY: f32 has no padding and u8 has alignment 1, so the floats' memory is
        // `4 * f.len()` initialised bytes; on little-endian targets these are the LE encoding.
        unsafe { std::slice::from_raw_parts(f.as_ptr().cast::<u8>(), std::mem::size_of_val(f)) }
    }

    /// Borrowed view for [`super::sgemm`].
    pub fn view(&self) -> PackedBRef<'_> {
        PackedBRef {
            layout: self.layout,
            k: self.k,
            n: self.n,
            stride: self.k * self.layout.nr(),
            data: self.data.as_slice(),
            picks: &[],
        }
    }

    pub fn layout(&self) -> BLayout {
        self.layout
    }
    /// The format tag of this buffer's layout (`f32/avx512/nr32/v1`).
    pub fn format_tag(&self) -> &'static str {
        self.layout.format_tag()
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
}

/// Elements spanned by an `r x c` matrix with the given strides (0 when empty), None on overflow.
pub(crate) fn span(r: usize, c: usize, rs: usize, cs: usize) -> Option<usize> {
    if r == 0 || c == 0 {
        return Some(0);
    }
    (r - 1)
        .checked_mul(rs)?
        .checked_add((c - 1).checked_mul(cs)?)?
        .checked_add(1)
}

/// The left operand: `m x k`, element `(i, p)` at `data[i * ld + p]`, or with `transposed` at
/// `data[p * ld + i]` (A stored as its `k x m` transpose).
#[derive(Debug, Clone, Copy)]
pub struct AMatrix<'a> {
    pub data: &'a [f32],
    pub ld: usize,
    pub transposed: bool,
    /// Row-major rows that may overlap (`ld < k`): [`AMatrix::windows`].
    pub windows: bool,
}

impl<'a> AMatrix<'a> {
    /// Row-major `m x k` with leading dimension `ld >= k`.
    pub fn row_major(data: &'a [f32], ld: usize) -> AMatrix<'a> {
        AMatrix {
            data,
            ld,
            transposed: false,
            windows: false,
        }
    }
    /// Stored as the row-major `k x m` transpose with leading dimension `ld >= m`.
    pub fn transposed(data: &'a [f32], ld: usize) -> AMatrix<'a> {
        AMatrix {
            data,
            ld,
            transposed: true,
            windows: false,
        }
    }
    /// Row-major rows `step` floats apart that may overlap (`step < k`): row `i` is
    /// `data[i * step .. i * step + k]`, the sliding windows of a signal (a convolution's
    /// im2col rows when each is a contiguous run of its input, read in place). A is only read.
    pub fn windows(data: &'a [f32], step: usize) -> AMatrix<'a> {
        AMatrix {
            data,
            ld: step,
            transposed: false,
            windows: true,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pack_layout_and_bytes() {
        // B 2x3 row-major, 16-column panels: one panel, columns 3.. zero.
        let b = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let pb = PackedB::pack(BLayout::NR16, 2, 3, &b, MatLayout::row_major(3)).unwrap();
        let d = pb.view().data();
        assert_eq!(d.len(), 32);
        assert_eq!(&d[..4], &[1.0, 2.0, 3.0, 0.0]);
        assert_eq!(&d[16..20], &[4.0, 5.0, 6.0, 0.0]);
        assert_eq!(d.as_ptr() as usize % 64, 0);
        // Same from the transposed storage.
        let bt = [1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0];
        let pt = PackedB::pack(BLayout::NR16, 2, 3, &bt, MatLayout::transposed(2)).unwrap();
        assert_eq!(pt, pb);
        // Round trip through bytes, owned and borrowed.
        let back = PackedB::from_bytes(BLayout::NR16, 2, 3, pb.as_bytes()).unwrap();
        assert_eq!(back, pb);
        let view = PackedBRef::from_bytes(BLayout::NR16, 2, 3, pb.as_bytes()).unwrap();
        assert_eq!(view.data(), pb.view().data());
        assert!(PackedBRef::from_bytes(BLayout::NR16, 2, 4, pb.as_bytes()).is_ok());
        assert!(PackedBRef::from_bytes(BLayout::NR16, 3, 3, pb.as_bytes()).is_err());
        assert!(PackedBRef::from_bytes(BLayout::NR16, 2, 3, &pb.as_bytes()[1..]).is_err());
        assert!(PackedB::pack(BLayout::NR16, 2, 3, &b[..5], MatLayout::row_major(3)).is_err());
        assert_eq!(BLayout::from_tag("f32/avx512/nr32/v1"), Some(BLayout::NR32));
        assert_eq!(BLayout::from_tag("f32/nr16/v1"), Some(BLayout::NR16));
        assert_eq!(BLayout::from_tag("f32/nr8/v1"), None);
    }

    /// A row range reads the same floats as the whole matrix's rows there, panel by panel.
    #[test]
    fn row_ranges_view_each_panels_rows() {
        let (k, n) = (5, 40);
        let b: Vec<f32> = (0..k * n).map(|i| i as f32).collect();
        let pb = PackedB::pack(BLayout::NR16, k, n, &b, MatLayout::row_major(n)).unwrap();
        let v = pb.view().rows(1, 4).unwrap();
        assert_eq!((v.k(), v.n(), v.stride()), (3, 40, k * 16));
        for j in 0..n {
            for p in 0..3 {
                let at = (j / 16) * v.stride() + p * 16 + j % 16;
                assert_eq!(v.data()[at], b[(p + 1) * n + j], "row {p} column {j}");
            }
        }
        // Its panels, and the empty and out-of-range cases.
        let last = v.panels(2, 3).unwrap();
        assert_eq!((last.n(), last.data()[0]), (8, b[n + 32]));
        assert!(pb.view().rows(3, 6).is_none());
        assert!(pb.view().rows(2, 2).is_some_and(|e| e.k() == 0));
    }

    /// Packing from the transposed storage (columns contiguous, with a padded leading
    /// dimension) gives the same panels as from row-major B, edge panel included.
    #[test]
    fn transposed_sources_pack_like_row_major_ones() {
        for layout in [BLayout::NR16, BLayout::NR32] {
            for (k, n) in [(1, 1), (5, 17), (64, 197), (33, 40)] {
                let b: Vec<f32> = (0..k * n).map(|i| i as f32 * 0.5 - 3.0).collect();
                let ld = k + 3;
                let mut bt = vec![f32::NAN; n * ld];
                for p in 0..k {
                    for j in 0..n {
                        bt[j * ld + p] = b[p * n + j];
                    }
                }
                let rows = PackedB::pack(layout, k, n, &b, MatLayout::row_major(n)).unwrap();
                let cols = PackedB::pack(layout, k, n, &bt, MatLayout::transposed(ld)).unwrap();
                assert_eq!(rows, cols, "{layout:?} k {k} n {n}");
            }
        }
    }
}
