//! The f32 `ConvTranspose`: the reference's GEMM + col2im, with the product on the packed f32
//! GEMM kernels (`col = Wᵀ · X` per image and group, X packed once per call) instead of the
//! generic scalar GEMM, and the bias added in the same pass that zeroes nothing twice. The
//! col2im scatter is the reference's own (`kiln_kernels::conv::col2im_add`), so geometry
//! (pads, output_padding, output_shape, auto_pad, dilations, groups) has one source. f32 sums
//! where the reference may use f64 for small types; within 1e-5 of the output's magnitude.

use crate::Outputs;
use crate::error::Result;
use crate::nn::conv::ConvTranspose;
use crate::nn::spatial_attr;
use crate::value::Args;
use kiln_kernels::conv::{ConvGeometry, col2im_add};
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::sgemm::{AMatrix, BLayout, Epilogue, PackedB, sgemm};
use kiln_tensor::{DType, Tensor};

/// Runs `op` on the fast path for f32, else on the reference (which also reports errors).
pub(crate) fn eval(op: &ConvTranspose, args: &Args<'_>) -> Result<Outputs> {
    match fast(op, args)? {
        Some(y) => Ok(smallvec::smallvec![y.into()]),
        None => op.eval(args),
    }
}

fn fast(op: &ConvTranspose, args: &Args<'_>) -> Result<Option<Tensor>> {
    let (x, w, b) = (args.tensor(0)?, args.tensor(1)?, args.opt_tensor(2)?);
    if x.dtype() != DType::F32 || w.dtype() != DType::F32 || b.is_some_and(|b| b.dtype() != DType::F32) {
        return Ok(None);
    }
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Ok(None);
    }
    let g = op.group.max(1);
    let (batch, c) = (xs[0], xs[1]);
    if ws[0] != c || c % g != 0 {
        return Ok(None);
    }
    let (cg, mg) = (c / g, ws[1]);
    let m = mg * g;
    let n = xs.len() - 2;
    let (grid, kernel) = (&xs[2..], &ws[2..]);
    let Ok((out, pad_begin)) = op.geometry(grid, kernel) else {
        return Ok(None);
    };
    let strides = spatial_attr(&op.strides, n, 1, "strides")?;
    let dilations = spatial_attr(&op.dilations, n, 1, "dilations")?;
    let prod = |d: &[usize]| d.iter().try_fold(1usize, |a, &v| a.checked_mul(v));
    let (Some(isz), Some(osz), Some(ksz)) = (prod(grid), prod(&out), prod(kernel)) else {
        return Ok(None);
    };
    let rows = mg * ksz;
    let mut yshape = vec![batch, m];
    yshape.extend(&out);
    let Some(total) = prod(&yshape) else { return Ok(None) };
    crate::util::checked_numel(&yshape)?;
    let bias = match b {
        Some(b) if b.len() == m => Some(b.as_slice::<f32>()?),
        Some(_) => return Ok(None),
        None => None,
    };
    let (xd, wd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
    let tiles = n == 2
        && strides.as_slice() == kernel
        && dilations.iter().all(|&d| d == 1)
        && pad_begin.iter().all(|&p| p == 0)
        && out
            .iter()
            .zip(grid)
            .zip(kernel)
            .all(|((&o, &i), &k)| Some(o) == i.checked_mul(k));
    if tiles {
        let mut y = crate::util::out_f32(total);
        let ok = tiles_2d(
            Tiles {
                batch,
                g,
                cg,
                mg,
                grid: [grid[0], grid[1]],
                kernel: [kernel[0], kernel[1]],
            },
            xd,
            wd,
            bias,
            &mut y,
        );
        return Ok(if ok { Some(Tensor::from_buf(yshape, y)?) } else { None });
    }
    let mut y = vec![0f32; total];
    if let Some(bias) = bias {
        for (plane, &bv) in y.chunks_exact_mut(osz.max(1)).zip(bias.iter().cycle()) {
            plane.fill(bv);
        }
    }
    let Some(col_len) = rows.checked_mul(isz) else {
        return Ok(None);
    };
    let mut col = vec![0f32; col_len];
    let geom = ConvGeometry {
        image: &out,
        kernel,
        grid,
        strides: &strides,
        dilations: &dilations,
        pad_begin: &pad_begin,
    };
    let layout = BLayout::for_isa(kiln_kernels::isa::active());
    for bn in 0..batch {
        for gi in 0..g {
            let (Some(xg), Some(wg)) = (
                xd.get((bn * c + gi * cg) * isz..(bn * c + (gi + 1) * cg) * isz),
                wd.get(gi * cg * rows..(gi + 1) * cg * rows),
            ) else {
                return Ok(None);
            };
            // col [rows, isz] = Wgᵀ [rows, cg] · Xg [cg, isz]: Wg is [cg, rows] row-major.
            let Ok(xp) = PackedB::pack(layout, cg, isz, xg, MatLayout::row_major(isz)) else {
                return Ok(None);
            };
            if sgemm(
                rows,
                AMatrix::transposed(wg, rows),
                xp.view(),
                &mut col,
                isz,
                &Epilogue::NONE,
            )
            .is_err()
            {
                return Ok(None);
            }
            let Some(yg) = y.get_mut((bn * m + gi * mg) * osz..(bn * m + (gi + 1) * mg) * osz) else {
                return Ok(None);
            };
            if !col2im_add(&geom, mg, &col, yg) {
                return Ok(None);
            }
        }
    }
    Ok(Some(Tensor::from_vec(yshape, y)?))
}

/// A 2-D transposed convolution whose stride is its kernel (no dilation, padding or output
/// padding): every input pixel's `kh x kw` tile of outputs is its own, so each tile is a row
/// of one product and lands where it belongs, with no overlap to sum.
#[derive(Clone, Copy)]
struct Tiles {
    batch: usize,
    g: usize,
    cg: usize,
    mg: usize,
    grid: [usize; 2],
    kernel: [usize; 2],
}

/// [`Tiles`]: per image and group, the planar product `T [mg*kh*kw, pixels] = Wᵀ · X` a band
/// of input rows at a time (X channels-first, its band packed as B; the bias per row in the
/// epilogue), the bands over the pool; then each output channel's plane over the pool, woven
/// from the runs of each (channel, kernel row, kx). `false` if an operand is shorter than the
/// shapes say.
fn tiles_2d(t: Tiles, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) -> bool {
    let ([ih, iw], [kh, kw]) = (t.grid, t.kernel);
    let (isz, cols) = (ih * iw, t.mg * kh * kw);
    let osz = ih * iw * kh * kw;
    let (c, m) = (t.cg * t.g, t.mg * t.g);
    if cols == 0 || isz == 0 {
        return true;
    }
    let layout = BLayout::for_isa(kiln_kernels::isa::active());
    // Few columns (a detector's upsampling head to one map: 4): each column a vector sum over
    // X's channels in place, planar, as a product that narrow wastes most of its tiles (24 ->
    // 1 channel 2x2 over 368 x 736: 9.4 -> 5.4 ms). Bands of about 64 Ki floats of product
    // (and of X's band, when read in place).
    // Otherwise the product is planar too, `Wᵀ · X` with X's band packed as B: row-major
    // `[pixels, cols]` (X transposed first) had made each output plane's scatter read every
    // line of the product, `cols` floats apart, once per four channels (PP-OCR's 24 -> 24 2x2
    // upsampling over 184 x 368: two thirds of its 33 ms in the scatter).
    let vector_sum = cols <= 4;
    let per_row = iw * (cols + t.cg);
    let band = (64 * 1024 / per_row.max(1)).clamp(1, ih);
    // The whole image's product, band after band (each band planar, `[cols, pixels]`).
    let mut tile = kiln_kernels::recycle::take(isz * cols);
    let failed = std::sync::atomic::AtomicBool::new(false);
    for gi in 0..t.g {
        let Some(wg) = w.get(gi * t.cg * cols..(gi + 1) * t.cg * cols) else {
            return false;
        };
        let col_bias: Option<Vec<f32>> = match bias {
            Some(b) => match b.get(gi * t.mg..(gi + 1) * t.mg) {
                Some(bg) => Some(bg.iter().flat_map(|&v| std::iter::repeat_n(v, kh * kw)).collect()),
                None => return false,
            },
            None => None,
        };
        // The product's rows are the columns `(channel, ky, kx)`: the bias is per row.
        let epi = Epilogue {
            bias: col_bias
                .as_deref()
                .map_or(kiln_kernels::sgemm::Bias::None, kiln_kernels::sgemm::Bias::Row),
            residual: None,
            act: None,
            post: None,
            prelu: kiln_kernels::sgemm::Bias::None,
        };
        for bn in 0..t.batch {
            let x0 = (bn * c + gi * t.cg) * isz;
            let y0 = (bn * m + gi * t.mg) * osz;
            let Some(xg) = x.get(x0..x0 + t.cg * isz) else {
                return false;
            };
            kiln_kernels::pool::for_each_chunk_mut(&mut tile, band * iw * cols, &|b, out| {
                let (iy0, rows) = (b * band, out.len() / cols);
                let Some(xa) = xg.get(iy0 * iw..(t.cg - 1) * isz + iy0 * iw + rows) else {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                };
                if vector_sum {
                    for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                        o.fill(col_bias.as_ref().and_then(|b| b.get(j)).copied().unwrap_or(0.0));
                        for ch in 0..t.cg {
                            let (Some(&wv), Some(xs)) = (wg.get(ch * cols + j), xa.get(ch * isz..ch * isz + rows))
                            else {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return;
                            };
                            for (a, &xv) in o.iter_mut().zip(xs) {
                                *a += wv * xv;
                            }
                        }
                    }
                    return;
                }
                // `out [cols, pixels] = Wgᵀ [cols, cg] · X's band [cg, pixels]` (Wg is
                // `[cg, cols]` row-major; the band's rows are X's planes, `isz` apart).
                let ok = PackedB::pack(layout, t.cg, rows, xa, MatLayout::row_major(isz))
                    .is_ok_and(|xp| sgemm(cols, AMatrix::transposed(wg, cols), xp.view(), out, rows, &epi).is_ok());
                if !ok {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
            let Some(yg) = y.get_mut(y0..y0 + t.mg * osz) else {
                return false;
            };
            let tile = &tile;
            kiln_kernels::pool::for_each_chunk_mut(yg, osz, &|mi, plane| {
                for (b, out) in tile.chunks(band * iw * cols).enumerate() {
                    let (iy0, rows) = (b * band, out.len() / cols);
                    if !scatter_planar(out, rows, iw, [kh, kw], iy0, plane, mi) {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
            if failed.load(std::sync::atomic::Ordering::Relaxed) {
                return false;
            }
        }
    }
    kiln_kernels::recycle::give(tile);
    true
}

/// Copies output channel `mi`'s part of a band's planar product (`[cols, rows]`: column
/// `(mi*kh + ky)*kw + kx` is `rows` contiguous pixels) into its output plane `y`: an output
/// row weaves `kw` column runs. `false` if a slice is short.
fn scatter_planar(
    out: &[f32],
    rows: usize,
    iw: usize,
    [kh, kw]: [usize; 2],
    iy0: usize,
    y: &mut [f32],
    mi: usize,
) -> bool {
    let ow = iw * kw;
    for dy in 0..rows / iw.max(1) {
        for ky in 0..kh {
            let at = ((iy0 + dy) * kh + ky) * ow;
            let Some(dst) = y.get_mut(at..at + ow) else {
                return false;
            };
            let from = (mi * kh + ky) * kw * rows + dy * iw;
            if kw == 2 {
                // Two runs interleaved pair by pair, which the compiler vectorises (a
                // strided store per element was most of the scatter's time).
                let (Some(s0), Some(s1)) = (out.get(from..from + iw), out.get(from + rows..from + rows + iw)) else {
                    return false;
                };
                kiln_kernels::simd::vectorize(|| {
                    for ((d, &a), &b) in dst.chunks_exact_mut(2).zip(s0).zip(s1) {
                        if let [d0, d1] = d {
                            (*d0, *d1) = (a, b);
                        }
                    }
                });
                continue;
            }
            for kx in 0..kw {
                let at = from + kx * rows;
                let Some(src) = out.get(at..at + iw) else {
                    return false;
                };
                for (d, &s) in dst.iter_mut().skip(kx).step_by(kw).zip(src) {
                    *d = s;
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn t(shape: &[usize], seed: usize) -> Value {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i + seed) * 7919 % 1000) as f32) / 500.0 - 1.0)
            .collect();
        Value::Tensor(Tensor::from_vec(shape.to_vec(), v).unwrap())
    }

    fn strided(strides: &[usize], group: usize) -> ConvTranspose {
        ConvTranspose {
            strides: strides.to_vec(),
            group,
            ..Default::default()
        }
    }

    #[test]
    fn strides_pads_groups_and_dilations_match_the_reference() {
        let cases: Vec<(ConvTranspose, [usize; 4], [usize; 4], bool)> = vec![
            // Stride = kernel: each input pixel's own tile of outputs (2x2 and 3x2, groups,
            // one output channel, bands of input rows: 200 rows of 60 x 12 columns, three bands).
            (strided(&[2, 2], 1), [1, 4, 5, 6], [4, 3, 2, 2], true),
            (strided(&[3, 2], 2), [2, 6, 4, 5], [6, 2, 3, 2], true),
            (strided(&[2, 2], 1), [1, 5, 3, 7], [5, 1, 2, 2], false),
            (strided(&[2, 2], 1), [1, 3, 200, 60], [3, 3, 2, 2], true),
            // 3x3 (the weave of three runs) and 24 -> 24 2x2 (PP-OCR's upsampling head).
            (strided(&[3, 3], 1), [2, 4, 7, 9], [4, 5, 3, 3], true),
            (strided(&[2, 2], 1), [1, 24, 9, 37], [24, 24, 2, 2], true),
            (
                ConvTranspose {
                    strides: vec![2, 1],
                    pads: vec![1, 0, 1, 1],
                    output_padding: vec![1, 0],
                    ..Default::default()
                },
                [2, 3, 4, 4],
                [3, 5, 3, 3],
                false,
            ),
            (
                ConvTranspose {
                    group: 2,
                    dilations: vec![2, 2],
                    strides: vec![1, 2],
                    ..Default::default()
                },
                [1, 4, 3, 5],
                [4, 2, 3, 2],
                true,
            ),
        ];
        for (op, xs, ws, with_bias) in cases {
            let (x, w) = (t(&xs, 1), t(&ws, 2));
            let m = ws[1] * op.group.max(1);
            let b = t(&[m], 3);
            let args = [Some(&x), Some(&w), with_bias.then_some(&b)];
            let args = Args::new(&args);
            let want = op.eval(&args).unwrap();
            // One thread, then two (bands and output planes over the pool).
            let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
            let one = fast(&op, &args).unwrap().expect("the fast path applies");
            let two = pool.install(|| fast(&op, &args).unwrap().expect("the fast path applies"));
            for got in [one, two] {
                let w = want[0].as_tensor().unwrap();
                assert_eq!(w.shape(), got.shape());
                for (a, b) in w.as_slice::<f32>().unwrap().iter().zip(got.as_slice::<f32>().unwrap()) {
                    assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
                }
            }
        }
    }
}
