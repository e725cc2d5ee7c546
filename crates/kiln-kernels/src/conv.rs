//! Reference im2col / col2im for N-d convolutions: lay out every (channel, kernel offset) row
//! of input patches so a convolution becomes one GEMM, and scatter such a matrix back (the
//! transposed convolution).

/// Geometry shared by [`im2col`] and [`col2im_add`]: an image of `image` spatial dims, a
/// sliding window of `kernel` dims placed at every point of a `grid` (the convolution output,
/// or the transposed convolution input). Grid point `o` and kernel offset `k` touch image
/// coordinate `o * stride - pad_begin + k * dilation` (per dim), or padding when that falls
/// outside the image.
#[derive(Debug, Clone, Copy)]
pub struct ConvGeometry<'a> {
    pub image: &'a [usize],
    pub kernel: &'a [usize],
    pub grid: &'a [usize],
    pub strides: &'a [usize],
    pub dilations: &'a [usize],
    pub pad_begin: &'a [usize],
}

impl ConvGeometry<'_> {
    fn valid(&self) -> bool {
        let n = self.image.len();
        n > 0
            && self.kernel.len() == n
            && self.grid.len() == n
            && self.strides.len() == n
            && self.dilations.len() == n
            && self.pad_begin.len() == n
    }

    /// Per dim: for kernel offset `k` and grid point `o`, the image coordinate at
    /// `[k * grid + o]`, or -1 in the padding.
    fn tables(&self) -> Vec<Vec<isize>> {
        (0..self.image.len())
            .map(|i| {
                let (img, kern, grid) = (self.image[i] as isize, self.kernel[i], self.grid[i]);
                let mut t = Vec::with_capacity(kern * grid);
                for k in 0..kern {
                    for o in 0..grid {
                        let c = (o * self.strides[i]) as isize - self.pad_begin[i] as isize
                            + (k * self.dilations[i]) as isize;
                        t.push(if c >= 0 && c < img { c } else { -1 });
                    }
                }
                t
            })
            .collect()
    }
}

fn product(s: &[usize]) -> Option<usize> {
    s.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Advances a row-major multi-index; returns false after the last one.
fn step(idx: &mut [usize], dims: &[usize]) -> bool {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return true;
        }
        idx[d] = 0;
    }
    false
}

/// Walks every (channel, kernel offset, grid row) of the geometry, calling
/// `f(image_channel_offset, col_row_offset, table_of_last_dim, base)` where the row's image
/// elements are `image_channel_offset + base + table[j]` for `table[j] >= 0` (and `base` is
/// `None` when the whole row lies in the padding).
fn walk(g: &ConvGeometry<'_>, channels: usize, mut f: impl FnMut(usize, usize, &[isize], Option<usize>)) -> bool {
    if !g.valid() {
        return false;
    }
    let n = g.image.len();
    let (Some(img_sz), Some(ksz), Some(osz)) = (product(g.image), product(g.kernel), product(g.grid)) else {
        return false;
    };
    let tabs = g.tables();
    let mut img_strides = vec![1usize; n];
    for i in (0..n - 1).rev() {
        img_strides[i] = img_strides[i + 1] * g.image[i + 1];
    }
    let last = n - 1;
    let ol = g.grid[last];
    if osz == 0 || ksz == 0 {
        return true;
    }
    let mut row = 0usize;
    let mut kidx = vec![0usize; n];
    let mut oidx = vec![0usize; last];
    for c in 0..channels {
        kidx.iter_mut().for_each(|x| *x = 0);
        loop {
            // Stopped (`crate::stop`): the rest of the rows are left as they are.
            if crate::stop::requested() {
                return true;
            }
            oidx.iter_mut().for_each(|x| *x = 0);
            let t = &tabs[last][kidx[last] * ol..(kidx[last] + 1) * ol];
            let mut ob = 0usize;
            loop {
                let mut base = 0usize;
                let mut inside = true;
                for i in 0..last {
                    let v = tabs[i][kidx[i] * g.grid[i] + oidx[i]];
                    if v < 0 {
                        inside = false;
                        break;
                    }
                    base += v as usize * img_strides[i];
                }
                f(c * img_sz, row * osz + ob * ol, t, inside.then_some(base));
                ob += 1;
                if !step(&mut oidx, &g.grid[..last]) {
                    break;
                }
            }
            row += 1;
            if !step(&mut kidx, g.kernel) {
                break;
            }
        }
    }
    true
}

/// Fills `col` (`[channels * prod(kernel), prod(grid)]`, row-major) with the patches of `x`
/// (`[channels, image...]`); padding reads as `T::default()`. Returns false (col untouched
/// or partly written) when the geometry is inconsistent or a slice is too short.
pub fn im2col<T: Copy + Default>(g: &ConvGeometry<'_>, channels: usize, x: &[T], col: &mut [T]) -> bool {
    let (Some(img), Some(k), Some(o)) = (product(g.image), product(g.kernel), product(g.grid)) else {
        return false;
    };
    if x.len() < channels * img || col.len() < channels * k * o {
        return false;
    }
    walk(g, channels, |ch, dst, t, base| {
        let out = &mut col[dst..dst + t.len()];
        match base {
            None => out.fill(T::default()),
            Some(b) => {
                let src = &x[ch + b..];
                for (d, &v) in out.iter_mut().zip(t) {
                    *d = if v < 0 { T::default() } else { src[v as usize] };
                }
            }
        }
    })
}

/// Adds every element of `col` (`[channels * prod(kernel), prod(grid)]`) into the image
/// position it came from in `y` (`[channels, image...]`); padding positions are dropped.
pub fn col2im_add<T: Copy + std::ops::Add<Output = T>>(
    g: &ConvGeometry<'_>,
    channels: usize,
    col: &[T],
    y: &mut [T],
) -> bool {
    let (Some(img), Some(k), Some(o)) = (product(g.image), product(g.kernel), product(g.grid)) else {
        return false;
    };
    if y.len() < channels * img || col.len() < channels * k * o {
        return false;
    }
    walk(g, channels, |ch, src, t, base| {
        if let Some(b) = base {
            let s = &col[src..src + t.len()];
            let dst = &mut y[ch + b..];
            for (&v, &c) in t.iter().zip(s) {
                if v >= 0 {
                    dst[v as usize] = dst[v as usize] + c;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn im2col_2d_with_padding() {
        // 1 channel 2x2 image [1 2; 3 4], 2x2 kernel, pad 1 begin, stride 2 → grid 2x2 (with
        // pad_end 1). Grid (0,0) covers image rows -1..0, cols -1..0.
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let g = ConvGeometry {
            image: &[2, 2],
            kernel: &[2, 2],
            grid: &[2, 2],
            strides: &[2, 2],
            dilations: &[1, 1],
            pad_begin: &[1, 1],
        };
        let mut col = [9.0f32; 16];
        assert!(im2col(&g, 1, &x, &mut col));
        // Row (k=0,0): image (o*2-1, o*2-1): only o=(1,1) → (1,1)=4.
        assert_eq!(&col[0..4], &[0.0, 0.0, 0.0, 4.0]);
        // Row (k=0,1): image (2o-1, 2o): o=(1,0) → (1,0)=3.
        assert_eq!(&col[4..8], &[0.0, 0.0, 3.0, 0.0]);
        // Row (k=1,0): (2o, 2o-1): o=(0,1) → (0,1)=2.
        assert_eq!(&col[8..12], &[0.0, 2.0, 0.0, 0.0]);
        // Row (k=1,1): (2o, 2o): o=(0,0) → 1.
        assert_eq!(&col[12..16], &[1.0, 0.0, 0.0, 0.0]);
        // Scattering back adds each image element once.
        let mut y = [0.0f32; 4];
        assert!(col2im_add(&g, 1, &col, &mut y));
        assert_eq!(y, x);
    }
}

/// A 2-D convolution's geometry for [`im2col_panel_2d`]: `c` input channels of `ih x iw`, a
/// `kh x kw` window with strides, dilations and leading pads, over an `oh x ow` output grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2d {
    pub c: usize,
    pub ih: usize,
    pub iw: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub ph: usize,
    pub pw: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Conv2d {
    /// Rows of the im2col matrix (`c * kh * kw`).
    pub fn k(&self) -> usize {
        self.c * self.kh * self.kw
    }
    /// Columns of the im2col matrix (`oh * ow`).
    pub fn n(&self) -> usize {
        self.oh * self.ow
    }
}

/// Writes panel `q` of the im2col matrix of `x` (`c x ih x iw`, row-major) packed as the f32
/// GEMM's B operand (`sgemm::BLayout` of width `nr`): columns `q*nr .. q*nr + nr` (output
/// positions), for each of the `k()` rows (channel, window row, window column) `nr`
/// consecutive floats, zero past the last column and in the padding. `panel` must hold
/// `k() * nr` floats; returns false (writing nothing useful) when it or `x` is too short.
///
/// The im2col matrix never exists whole: each panel is built from runs of consecutive output
/// columns in one output row, copied as slices when the stride is 1.
pub fn im2col_panel_2d(g: &Conv2d, x: &[f32], nr: usize, q: usize, panel: &mut [f32]) -> bool {
    if !holds(x.len(), [g.c, g.ih, g.iw, 1]) {
        return false;
    }
    fill_panel(g, nr, q, panel, &mut |ci, y, first, dst| {
        let row = (ci * g.ih + y) * g.iw;
        let Some(src) = x.get(row + first..row + g.iw) else {
            return;
        };
        if g.sw == 1 {
            if let Some(s) = src.get(..dst.len()) {
                dst.copy_from_slice(s);
            }
        } else {
            for (d, s) in dst.iter_mut().zip(src.iter().step_by(g.sw)) {
                *d = *s;
            }
        }
    })
}

/// The panel skeleton of both im2col writers: splits panel `q`'s columns into runs within one
/// output row, zeroes the padding and the columns past the matrix, and calls
/// `copy(channel, input row, first input column, dst)` for each run's valid part, `dst`
/// taking input columns `first, first + sw, ...`. False when `panel` is too short or `q` is
/// past the last panel.
fn fill_panel(
    g: &Conv2d,
    nr: usize,
    q: usize,
    panel: &mut [f32],
    copy: &mut dyn FnMut(usize, usize, usize, &mut [f32]),
) -> bool {
    let n = g.n();
    let j0 = q * nr;
    if panel.len() < g.k() * nr || j0 >= n.max(1) || g.ow == 0 {
        return false;
    }
    let w = nr.min(n - j0);
    // Runs of columns within one output row: (offset in the panel, length, output row,
    // first output column).
    let mut runs: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(4);
    let mut j = j0;
    while j < j0 + w {
        let (r, c0) = (j / g.ow, j % g.ow);
        let len = (g.ow - c0).min(j0 + w - j);
        runs.push((j - j0, len, r, c0));
        j += len;
    }
    let (ih, iw, sw) = (g.ih as isize, g.iw as isize, g.sw.max(1) as isize);
    let mut rows = panel.chunks_exact_mut(nr);
    for ci in 0..g.c {
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let Some(row) = rows.next() else { return false };
                row[w..].fill(0.0);
                for &(s0, len, r, c0) in &runs {
                    let dst = &mut row[s0..s0 + len];
                    let y = (r * g.sh + ky * g.dh) as isize - g.ph as isize;
                    if y < 0 || y >= ih {
                        dst.fill(0.0);
                        continue;
                    }
                    // Valid t: 0 <= x0 + t*sw < iw, a range; outside it the padding.
                    let x0 = (c0 * g.sw + kx * g.dw) as isize - g.pw as isize;
                    let lo = if x0 >= 0 { 0 } else { ((-x0 + sw - 1) / sw) as usize }.min(len);
                    let hi = if x0 >= iw { 0 } else { ((iw - 1 - x0) / sw + 1) as usize }.clamp(lo, len);
                    dst[..lo].fill(0.0);
                    dst[hi..].fill(0.0);
                    if hi > lo {
                        copy(ci, y as usize, (x0 + lo as isize * sw) as usize, &mut dst[lo..hi]);
                    }
                }
            }
        }
    }
    true
}

/// Whether `len` floats hold the product of `dims` (false when it overflows: a geometry from
/// a file may ask for any size).
fn holds(len: usize, dims: [usize; 4]) -> bool {
    product(&dims).is_some_and(|n| len >= n)
}

/// Floats per phase row of [`split_phases`]'s output: `ceil(iw / sw)`.
pub fn phase_len(g: &Conv2d) -> usize {
    g.iw.div_ceil(g.sw.max(1))
}

/// Splits every input row into its `sw` column phases for [`im2col_panel_2d_phased`]:
/// `out[((ci * ih + y) * sw + r) * plen + i] = x[ci][y][i * sw + r]` (0 past the row's end),
/// `plen = phase_len(g)`. `out` must hold `c * ih * sw * plen` floats; false otherwise.
pub fn split_phases(g: &Conv2d, x: &[f32], out: &mut [f32]) -> bool {
    let sw = g.sw.max(1);
    let plen = phase_len(g);
    if !holds(out.len(), [g.c, g.ih, sw, plen]) || !holds(x.len(), [g.c, g.ih, g.iw, 1]) || g.iw == 0 {
        return false;
    }
    for (row, dst) in x
        .chunks_exact(g.iw)
        .take(g.c * g.ih)
        .zip(out.chunks_exact_mut(sw * plen))
    {
        for (r, phase) in dst.chunks_exact_mut(plen).enumerate() {
            phase.fill(0.0);
            for (d, &v) in phase.iter_mut().zip(row.iter().skip(r).step_by(sw)) {
                *d = v;
            }
        }
    }
    true
}

/// [`im2col_panel_2d`] for a strided convolution, reading the phase-split input of
/// [`split_phases`] (`xph`): every run of output columns then reads consecutive elements of
/// one phase row, copied as a slice. Same panel layout and result.
pub fn im2col_panel_2d_phased(g: &Conv2d, xph: &[f32], nr: usize, q: usize, panel: &mut [f32]) -> bool {
    let sw = g.sw.max(1);
    let plen = phase_len(g);
    if !holds(xph.len(), [g.c, g.ih, sw, plen]) {
        return false;
    }
    fill_panel(g, nr, q, panel, &mut |ci, y, first, dst| {
        let base = ((ci * g.ih + y) * sw + first % sw) * plen + first / sw;
        if let Some(src) = xph.get(base..base + dst.len()) {
            dst.copy_from_slice(src);
        }
    })
}
