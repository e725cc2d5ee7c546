//! The `RoiAlign` fast path for f32 averages (the detectors' box heads: hundreds of rois over a
//! feature map of hundreds of channels). The sampling points and bilinear weights are the
//! reference's (`RoiAlign::samples`, in f64); each roi's bins are then summed over a
//! channels-last copy of its image, so every tap adds one contiguous, vectorised run of all
//! channels, in f32 where the reference sums in f64 (a few ulp apart). Rois go over the pool.
//! Max mode and other element types run on the reference.

use crate::Outputs;
use crate::error::Result;
use crate::nn::{RoiAlign, RoiAlignMode, numel};
use crate::util;
use crate::value::{Args, Value};
use kiln_tensor::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};

kiln_kernels::scratch_kinds! {
    /// One roi's sums, `[bins][c]` (per thread).
    RoiBin: Vec<f32>;
}

/// Runs `op` on the fast path where it has one (see the module doc), else on the reference.
pub(crate) fn eval(op: &RoiAlign, args: &Args<'_>) -> Result<Outputs> {
    let (x, rois, bi) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let (Ok(xv), &[nb, c, h, w]) = (x.as_slice::<f32>(), x.shape()) else {
        return op.eval(args);
    };
    let nr = bi.len();
    if op.mode != RoiAlignMode::Avg || rois.shape() != [nr, 4] || bi.rank() != 1 || c == 0 {
        return op.eval(args);
    }
    let Ok(bd) = util::read_i64s(bi, 2, "batch_indices") else {
        return op.eval(args);
    };
    // Any roi of a batch entry that does not exist: the reference names it.
    if bd.iter().any(|&b| usize::try_from(b).map_or(true, |b| b >= nb)) {
        return op.eval(args);
    }
    let rd = rois.to_f64_vec();
    let (plane, bins) = (h * w, op.output_height * op.output_width);
    let total = numel(&[nr, c, bins])?;
    // The images channels-last, `[nb][h * w][c]`.
    let mut xt = vec![0f32; numel(&[nb, plane, c])?];
    for (src, dst) in xv.chunks_exact(c * plane).zip(xt.chunks_exact_mut(c * plane)) {
        if !kiln_kernels::transpose::transpose_f32(src, plane, c, plane, dst, c) {
            return op.eval(args);
        }
    }
    let mut y = util::out_f32(total);
    let failed = AtomicBool::new(false);
    kiln_kernels::pool::for_each_chunk_mut(&mut y, c * bins, &|r, out| {
        let (Some(roi), Some(&b)) = (rd.get(r * 4..r * 4 + 4), bd.get(r)) else {
            failed.store(true, Ordering::Relaxed);
            return;
        };
        let image = xt
            .get(b as usize * plane * c..(b as usize + 1) * plane * c)
            .unwrap_or_default();
        let Ok(s) = op.samples([roi[0], roi[1], roi[2], roi[3]], h, w) else {
            failed.store(true, Ordering::Relaxed);
            return;
        };
        let inv = (1.0 / s.count()) as f32;
        // The roi's sums bin-major (`[bins][c]`), scaled, then transposed into its
        // channel-major output block.
        let mut acc = kiln_kernels::recycle::lend::<RoiBin>();
        acc.clear();
        acc.resize(bins * c, 0.0);
        for (bin, sums) in acc.chunks_exact_mut(c).enumerate() {
            let taps = s.taps.get(bin * s.per_bin..(bin + 1) * s.per_bin).unwrap_or_default();
            kiln_kernels::simd::vectorize(|| {
                for &(off, wt) in taps.iter().flatten() {
                    if wt == 0.0 {
                        continue;
                    }
                    let Some(row) = image.get(off * c..(off + 1) * c) else {
                        continue;
                    };
                    let wt = wt as f32;
                    for (a, &v) in sums.iter_mut().zip(row) {
                        *a += wt * v;
                    }
                }
                sums.iter_mut().for_each(|a| *a *= inv);
            });
        }
        if !kiln_kernels::transpose::transpose_f32(&acc, c, bins, c, out, bins) {
            failed.store(true, Ordering::Relaxed);
        }
    });
    if failed.load(Ordering::Relaxed) {
        return op.eval(args);
    }
    let y = Tensor::from_buf(vec![nr, c, op.output_height, op.output_width], y)?;
    Ok(smallvec::smallvec![Value::Tensor(y)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<T: kiln_tensor::Element>(shape: &[usize], v: Vec<T>) -> Value {
        Value::Tensor(Tensor::from_vec(shape.to_vec(), v).unwrap())
    }

    /// The fast path against the reference: two images, rois inside, across and outside the
    /// image, degenerate and inverted, fixed and adaptive sampling, both coordinate modes, on
    /// the 2-thread pool; max mode and a bad batch index go to the reference.
    #[test]
    fn averages_match_the_reference() {
        let (nb, c, h, w) = (2usize, 19usize, 6usize, 7usize);
        let x: Vec<f32> = (0..nb * c * h * w)
            .map(|i| ((i * 7919 % 1000) as f32) / 250.0 - 2.0)
            .collect();
        let rois: Vec<f32> = vec![
            0.0, 0.0, 6.0, 5.0, //
            1.5, 0.5, 4.2, 3.7, //
            -3.0, -2.0, 9.0, 8.0, //
            20.0, 20.0, 30.0, 25.0, //
            2.0, 2.0, 2.0, 2.0, //
            5.0, 4.0, 1.0, 1.0, //
            0.2, 3.1, 13.9, 11.7,
        ];
        let nr = rois.len() / 4;
        let batch: Vec<i64> = (0..nr as i64).map(|r| r % 2).collect();
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (half_pixel, sampling_ratio, scale) in
            [(true, 2, 1.0f32), (false, 0, 1.0), (true, 0, 0.5), (false, 3, 0.75)]
        {
            let op = RoiAlign {
                half_pixel,
                mode: RoiAlignMode::Avg,
                output_height: 3,
                output_width: 4,
                sampling_ratio,
                spatial_scale: scale,
            };
            let inputs = [
                t(&[nb, c, h, w], x.clone()),
                t(&[nr, 4], rois.clone()),
                t(&[nr], batch.clone()),
            ];
            let refs: Vec<Option<&Value>> = inputs.iter().map(Some).collect();
            let args = Args::new(&refs);
            let want = op.eval(&args).unwrap();
            let got = pool.install(|| eval(&op, &args)).unwrap();
            let (want, got) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
            assert_eq!(got.shape(), want.shape());
            let (wv, gv) = (want.as_slice::<f32>().unwrap(), got.as_slice::<f32>().unwrap());
            assert!(wv.iter().any(|&v| v != 0.0));
            for (i, (&a, &b)) in wv.iter().zip(gv).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                    "{half_pixel} {sampling_ratio} at {i}: {a} vs {b}"
                );
            }
        }
        // A batch index past the images: the reference's error.
        let op = RoiAlign {
            half_pixel: true,
            mode: RoiAlignMode::Avg,
            output_height: 2,
            output_width: 2,
            sampling_ratio: 1,
            spatial_scale: 1.0,
        };
        let inputs = [
            t(&[nb, c, h, w], x),
            t(&[1, 4], vec![0.0f32, 0.0, 2.0, 2.0]),
            t(&[1], vec![2i64]),
        ];
        let refs: Vec<Option<&Value>> = inputs.iter().map(Some).collect();
        assert!(eval(&op, &Args::new(&refs)).is_err());
    }
}
