//! Calibration data for quantizing (`--calibration-data PATH`, the `calibration_data` option):
//! a folder of `.npz` files, one sample each (arrays named after the model inputs, taken in
//! file-name order), or one `.npz` whose arrays carry a leading sample axis (each array split
//! along axis 0; all arrays must agree on the number of samples).

use crate::npy::{MAX_NPZ_BYTES, read_npz};
use anyhow::{Context, Result, bail};
use kiln::{Sample, Tensor, Value};
use std::path::Path;

/// Most calibration samples read (qaic's calibration sets are tens to hundreds).
pub const MAX_SAMPLES: usize = 100_000;

/// The samples at `path`.
pub fn load(path: &Path) -> Result<Vec<Sample>> {
    let meta = std::fs::metadata(path).with_context(|| format!("calibration data {}", path.display()))?;
    if meta.is_dir() {
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("cannot list calibration data folder {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("npz")))
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("calibration data folder {} holds no .npz files", path.display());
        }
        if files.len() > MAX_SAMPLES {
            bail!(
                "calibration data folder {} holds {} .npz files, more than {MAX_SAMPLES}",
                path.display(),
                files.len()
            );
        }
        let mut total = 0u64;
        files
            .iter()
            .map(|f| {
                let arrays = read_npz(f)?;
                total += arrays.iter().map(|(_, t)| bytes(t)).sum::<u64>();
                if total > MAX_NPZ_BYTES {
                    bail!(
                        "calibration data folder {}: the samples up to {} pass {} GiB in all",
                        path.display(),
                        f.display(),
                        MAX_NPZ_BYTES >> 30
                    );
                }
                Ok(arrays.into_iter().map(|(n, t)| (n, Value::Tensor(t))).collect())
            })
            .collect()
    } else {
        split(read_npz(path)?, &path.display().to_string())
    }
}

fn bytes(t: &Tensor) -> u64 {
    (t.len() as u64).saturating_mul(t.dtype().size_of() as u64)
}

/// Splits arrays with a leading sample axis into samples.
fn split(arrays: Vec<(String, Tensor)>, what: &str) -> Result<Vec<Sample>> {
    let Some(n) = arrays.first().map(|(_, t)| t.shape().first().copied().unwrap_or(0)) else {
        bail!("{what}: the archive holds no arrays");
    };
    for (name, t) in &arrays {
        match t.shape().first() {
            None => bail!(
                "{what}: array '{name}' is a scalar; one .npz of calibration data needs a leading sample axis \
                 (rank = the input's rank + 1), or pass a folder of one .npz per sample"
            ),
            Some(&m) if m != n => bail!(
                "{what}: array '{name}' has {m} samples on its leading axis, '{}' has {n}",
                arrays.first().map_or("", |(n, _)| n.as_str())
            ),
            _ => {}
        }
    }
    if n == 0 {
        bail!("{what}: the arrays hold no samples (leading axis of size 0)");
    }
    if n > MAX_SAMPLES {
        bail!("{what}: {n} samples, more than {MAX_SAMPLES}");
    }
    let mut samples: Vec<Sample> = (0..n).map(|_| Vec::with_capacity(arrays.len())).collect();
    for (name, t) in &arrays {
        let inner: Vec<usize> = t.shape().get(1..).unwrap_or(&[]).to_vec();
        let per = inner.iter().product::<usize>();
        for (i, sample) in samples.iter_mut().enumerate() {
            let idx: Vec<usize> = (i * per..(i + 1) * per).collect();
            let part = t
                .gather_flat(inner.clone(), &idx)
                .with_context(|| format!("{what}: sample {i} of array '{name}'"))?;
            sample.push((name.clone(), Value::Tensor(part)));
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_archive_splits_along_its_leading_axis() {
        let x = Tensor::from_vec(vec![3, 2], vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let m = Tensor::from_vec(vec![3], vec![7i64, 8, 9]).unwrap();
        let s = split(vec![("x".into(), x), ("m".into(), m)], "t.npz").unwrap();
        assert_eq!(s.len(), 3);
        let x1 = s[1][0].1.as_tensor().unwrap();
        assert_eq!(x1.shape(), &[2]);
        assert_eq!(x1.as_slice::<f32>().unwrap(), &[3.0, 4.0]);
        let m2 = s[2][1].1.as_tensor().unwrap();
        assert_eq!(m2.shape(), &[] as &[usize]);
        assert_eq!(m2.as_slice::<i64>().unwrap(), &[9]);
    }

    #[test]
    fn disagreeing_or_scalar_arrays_are_refused() {
        let a = Tensor::from_vec(vec![3, 2], vec![0f32; 6]).unwrap();
        let b = Tensor::from_vec(vec![2, 2], vec![0f32; 4]).unwrap();
        let e = split(vec![("a".into(), a.clone()), ("b".into(), b)], "t.npz").unwrap_err();
        assert!(e.to_string().contains("'b' has 2 samples"), "{e}");
        let e = split(vec![("s".into(), Tensor::scalar(1f32))], "t.npz").unwrap_err();
        assert!(e.to_string().contains("leading sample axis"), "{e}");
    }
}
