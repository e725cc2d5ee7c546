//! The f32 `InstanceNormalization` and `GroupNormalization`: each group's statistics (an
//! instance norm's group is one channel) in f64 and its normalisation in one pass with the
//! kernels' layer-norm row (`vector::layer_norm_row`), then each channel's (or group's) scale
//! and bias, groups spread over the compute threads. The reference computes every element in
//! f64; this rounds the normalised value to f32 before the affine, within a few ulp of the
//! output's magnitude. Other dtypes, and inputs the reference refuses, run the reference.

use crate::Outputs;
use crate::error::Result;
use crate::reduce::{GroupNorm, InstanceNorm};
use crate::value::Args;
use kiln_tensor::{DType, Tensor};

pub(crate) fn eval_instance(op: &InstanceNorm, args: &Args<'_>) -> Result<Outputs> {
    let c = args.tensor(0)?.shape().get(1).copied().unwrap_or(0);
    match normalize(args, c, op.epsilon)? {
        Some(out) => Ok(out),
        None => op.eval(args),
    }
}

pub(crate) fn eval_group(op: &GroupNorm, args: &Args<'_>) -> Result<Outputs> {
    let groups = usize::try_from(op.num_groups).unwrap_or(0);
    match normalize(args, groups, op.epsilon)? {
        Some(out) => Ok(out),
        None => op.eval(args),
    }
}

/// X `[N, C, ...]` normalised over each of `groups` channel groups, scale and bias per channel
/// or per group; `None` when the fast path does not apply.
fn normalize(args: &Args<'_>, groups: usize, epsilon: f32) -> Result<Option<Outputs>> {
    let (x, scale, bias) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let shape = x.shape();
    let (Some(&n), Some(&c)) = (shape.first(), shape.get(1)) else {
        return Ok(None);
    };
    let sp: usize = shape.iter().skip(2).product();
    let f32s = [x, scale, bias].iter().all(|t| t.dtype() == DType::F32);
    if !f32s || shape.len() < 3 || groups == 0 || c % groups != 0 || sp == 0 || n * c == 0 {
        return Ok(None);
    }
    let per_channel = scale.len() == c && bias.len() == c;
    if !per_channel && !(scale.len() == groups && bias.len() == groups) {
        return Ok(None);
    }
    let (xd, sd, bd) = (x.as_slice::<f32>()?, scale.as_slice::<f32>()?, bias.as_slice::<f32>()?);
    let cpg = c / groups;
    let block = cpg * sp;
    let mut y = crate::util::out_f32(xd.len());
    let ones = vec![1f32; block];
    let eps = f64::from(epsilon);
    kiln_kernels::pool::for_each_chunk_mut(&mut y, block, &|row, out| {
        let group = row % groups;
        let Some(src) = xd.get(row * block..(row + 1) * block) else {
            return;
        };
        kiln_kernels::vector::layer_norm_row(src, out, &ones, None, eps);
        for (k, plane) in out.chunks_exact_mut(sp).enumerate() {
            let p = if per_channel { group * cpg + k } else { group };
            let (Some(&s), Some(&b)) = (sd.get(p), bd.get(p)) else {
                return;
            };
            for v in plane.iter_mut() {
                *v = *v * s + b;
            }
        }
    });
    Ok(Some(smallvec::smallvec![Tensor::from_buf(shape, y)?.into()]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn instance_norm_matches_the_reference() {
        let (n, c, h, w) = (2, 3, 5, 7);
        let xs: Vec<f32> = (0..n * c * h * w)
            .map(|i| ((i * 7919 % 1000) as f32) / 100.0 - 3.0)
            .collect();
        let x = Value::Tensor(Tensor::from_vec(vec![n, c, h, w], xs).unwrap());
        let s = Value::Tensor(Tensor::from_vec(vec![c], vec![0.5f32, -1.5, 2.0]).unwrap());
        let b = Value::Tensor(Tensor::from_vec(vec![c], vec![0.25f32, 0.0, -1.0]).unwrap());
        let op = InstanceNorm { epsilon: 1e-5 };
        let args = [Some(&x), Some(&s), Some(&b)];
        let args = Args::new(&args);
        let want = op.eval(&args).unwrap();
        let got = eval_instance(&op, &args).unwrap();
        let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
        assert_eq!(w.shape(), g.shape());
        for (a, b) in w.as_slice::<f32>().unwrap().iter().zip(g.as_slice::<f32>().unwrap()) {
            assert!((a - b).abs() <= 4e-6 * 4.0, "{a} vs {b}");
        }
    }

    #[test]
    fn group_norm_matches_the_reference_per_channel_and_per_group() {
        let (n, c, h, w) = (2, 6, 3, 5);
        let xs: Vec<f32> = (0..n * c * h * w)
            .map(|i| ((i * 7919 % 1000) as f32) / 100.0 - 3.0)
            .collect();
        let x = Value::Tensor(Tensor::from_vec(vec![n, c, h, w], xs).unwrap());
        for params in [c, 3] {
            let sv: Vec<f32> = (0..params).map(|k| 0.5 + k as f32 * 0.25).collect();
            let bv: Vec<f32> = (0..params).map(|k| k as f32 * -0.5).collect();
            let s = Value::Tensor(Tensor::from_vec(vec![params], sv).unwrap());
            let b = Value::Tensor(Tensor::from_vec(vec![params], bv).unwrap());
            let op = GroupNorm {
                num_groups: 3,
                epsilon: 1e-5,
                stash_type: DType::F32,
            };
            let args = [Some(&x), Some(&s), Some(&b)];
            let args = Args::new(&args);
            let want = op.eval(&args).unwrap();
            let got = eval_group(&op, &args).unwrap();
            let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
            for (a, b) in w.as_slice::<f32>().unwrap().iter().zip(g.as_slice::<f32>().unwrap()) {
                assert!((a - b).abs() <= 2e-5, "{a} vs {b}");
            }
        }
    }
}
