//! The f32 `InstanceNormalization`: each `(n, c)` row's statistics in f64 and its
//! normalisation in one pass with the kernels' layer-norm row (`vector::layer_norm_row`), then
//! the channel's scale and bias, rows spread over the compute threads. The reference computes
//! every element in f64; this rounds the normalised value to f32 before the affine, within a
//! few ulp of the output's magnitude. Other dtypes, and inputs the reference refuses, run the
//! reference.

use crate::Outputs;
use crate::error::Result;
use crate::reduce::InstanceNorm;
use crate::value::Args;
use kiln_tensor::{DType, Tensor};

pub(crate) fn eval(op: &InstanceNorm, args: &Args<'_>) -> Result<Outputs> {
    let (x, scale, bias) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let shape = x.shape();
    let (Some(&n), Some(&c)) = (shape.first(), shape.get(1)) else {
        return op.eval(args);
    };
    let sp: usize = shape.iter().skip(2).product();
    let f32s = [x, scale, bias].iter().all(|t| t.dtype() == DType::F32);
    if !f32s || shape.len() < 3 || scale.len() != c || bias.len() != c || sp == 0 || n * c == 0 {
        return op.eval(args);
    }
    let (xd, sd, bd) = (x.as_slice::<f32>()?, scale.as_slice::<f32>()?, bias.as_slice::<f32>()?);
    let mut y = crate::util::out_f32(xd.len());
    let ones = vec![1f32; sp];
    let eps = f64::from(op.epsilon);
    kiln_kernels::pool::for_each_chunk_mut(&mut y, sp, &|row, out| {
        let ch = row % c;
        let (Some(src), Some(&s), Some(&b)) = (xd.get(row * sp..(row + 1) * sp), sd.get(ch), bd.get(ch)) else {
            return;
        };
        kiln_kernels::vector::layer_norm_row(src, out, &ones, None, eps);
        for v in out.iter_mut() {
            *v = *v * s + b;
        }
    });
    Ok(smallvec::smallvec![Tensor::from_buf(shape, y)?.into()])
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
        let got = eval(&op, &args).unwrap();
        let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
        assert_eq!(w.shape(), g.shape());
        for (a, b) in w.as_slice::<f32>().unwrap().iter().zip(g.as_slice::<f32>().unwrap()) {
            assert!((a - b).abs() <= 4e-6 * 4.0, "{a} vs {b}");
        }
    }
}
