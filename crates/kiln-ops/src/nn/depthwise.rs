//! Depthwise 2-D convolution in f32 (`group == channels`, one filter per channel): a direct
//! loop per channel, kernel row and kernel column over contiguous output rows, which the compiler
//! vectorises, instead of a GEMM of one row per group. Bias first, then the taps in kernel order,
//! then the activation on the SIMD kernels (`act_slice`).

use kiln_kernels::sgemm::{Act, act_slice};

/// Shape of one depthwise call (all spatial values per axis: height, width).
pub(crate) struct Depthwise {
    pub channels: usize,
    pub input: [usize; 2],
    pub output: [usize; 2],
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pad_begin: [usize; 2],
}

/// The output indices `o` in `0..out` whose input position `o * stride + offset` lies in
/// `0..input`, as a range.
fn valid(out: usize, input: usize, stride: usize, offset: isize) -> std::ops::Range<usize> {
    let s = stride.max(1) as isize;
    // o * s + offset >= 0  =>  o >= ceil(-offset / s)
    let lo = if offset >= 0 { 0 } else { ((-offset) + s - 1) / s };
    // o * s + offset <= input - 1  =>  o <= floor((input - 1 - offset) / s)
    let last = input as isize - 1 - offset;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let (lo, hi) = (lo.max(0) as usize, (hi.max(0) as usize).min(out));
    lo.min(hi)..hi
}

impl Depthwise {
    /// `y = act(bias + conv(x, w))` for one image: `x` is `[C, H, W]`, `w` is `[C, kh, kw]`,
    /// `y` is `[C, OH, OW]`. Returns `false` when a slice does not match the shape.
    pub fn run(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, act: Option<Act>, y: &mut [f32]) -> bool {
        let [ih, iw] = self.input;
        let [oh, ow] = self.output;
        let [kh, kw] = self.kernel;
        let (ip, op, kp) = (ih * iw, oh * ow, kh * kw);
        let c = self.channels;
        if x.len() != c * ip || w.len() != c * kp || y.len() != c * op || bias.is_some_and(|b| b.len() != c) {
            return false;
        }
        if op == 0 {
            return true;
        }
        // Channels in parallel over the current pool: each output plane is its own chunk.
        kiln_kernels::pool::for_each_chunk_mut(y, op, &|ch, out| {
            // The lengths were checked above: channel `ch < c` has its input plane, taps and bias.
            self.channel(
                &x[ch * ip..(ch + 1) * ip],
                &w[ch * kp..(ch + 1) * kp],
                bias.map_or(0.0, |b| b[ch]),
                out,
            );
            if let Some(a) = act {
                act_slice(a, out);
            }
        });
        true
    }

    /// One channel: `out` (`oh x ow`) = bias + the window sums over `xin` (`ih x iw`) with
    /// the `kh x kw` taps `wk`.
    fn channel(&self, xin: &[f32], wk: &[f32], bias: f32, out: &mut [f32]) {
        let [ih, iw] = self.input;
        let [oh, ow] = self.output;
        let [kh, kw] = self.kernel;
        {
            out.fill(bias);
            for ky in 0..kh {
                let offy = (ky * self.dilations[0]) as isize - self.pad_begin[0] as isize;
                for oy in valid(oh, ih, self.strides[0], offy) {
                    let iy = (oy * self.strides[0]) as isize + offy;
                    let in_row = &xin[iy as usize * iw..(iy as usize + 1) * iw];
                    let out_row = &mut out[oy * ow..(oy + 1) * ow];
                    for kx in 0..kw {
                        let wv = wk[ky * kw + kx];
                        let offx = (kx * self.dilations[1]) as isize - self.pad_begin[1] as isize;
                        let r = valid(ow, iw, self.strides[1], offx);
                        if r.is_empty() {
                            continue;
                        }
                        let first = (r.start * self.strides[1]) as isize + offx;
                        if self.strides[1] == 1 {
                            let src = &in_row[first as usize..first as usize + r.len()];
                            for (o, &v) in out_row[r].iter_mut().zip(src) {
                                *o += wv * v;
                            }
                        } else {
                            let s = self.strides[1];
                            for (j, o) in out_row[r].iter_mut().enumerate() {
                                *o += wv * in_row[first as usize + j * s];
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ranges_stay_inside_the_input() {
        // out 5, input 5, stride 1, pad 1 for kernel tap 0: o - 1 in 0..5 => o in 1..5.
        assert_eq!(valid(5, 5, 1, -1), 1..5);
        assert_eq!(valid(5, 5, 1, 1), 0..4);
        // stride 2, out 3, input 5, offset -1: 2o - 1 in 0..5 => o in 1..3.
        assert_eq!(valid(3, 5, 2, -1), 1..3);
        // Nothing valid.
        assert!(valid(3, 2, 1, 5).is_empty());
        assert!(valid(3, 2, 1, -9).is_empty());
    }
}
