//! CRCs of a run's inputs and outputs (AIC's `gen_crc` / qaic's `io_crc`, with
//! `crc_stride` / `io_crc_stride`).
//!
//! **What is summed.** The CRC-32 (IEEE, as zlib's `crc32`) of a tensor's elements as
//! little-endian bytes (bool as one byte 0/1; a string as its 8-byte little-endian length then
//! its UTF-8 bytes), sampled: of every `stride`-byte section of those bytes, its first
//! [`SAMPLE`] bytes (all of them when `stride <= SAMPLE`), then the total byte length as 8
//! little-endian bytes. So `stride = 256` reads 1/32 of a tensor, and `stride = 1` all of it.
//!
//! **When.** Each input's CRC is taken when the run starts. Inputs whose elements the run
//! reads in place from memory that others can write (a numpy array from Python, any shared
//! buffer) are summed again when the run ends: a different CRC means the buffer changed
//! during the run, and the run fails with [`CrcMismatch`]. Inputs the run owns cannot change
//! and are not summed twice. Each output's CRC is taken when it is returned.
//!
//! The default is off, as qaic's `io_crc` (AIC's own `gen_crc` defaults to on; its sums guard
//! transfers to a device, which kiln does not make).

use kiln_ops::Value;
use kiln_tensor::{Data, Tensor};

/// Bytes read at the start of each stride section.
pub const SAMPLE: usize = 8;

/// `crc_stride`'s default.
pub const DEFAULT_STRIDE: u32 = 256;

/// The CRCs of one run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IoCrc {
    /// The stride they were sampled with.
    pub stride: u32,
    /// `(name, crc)` of every tensor input, in the order given.
    pub inputs: Vec<(String, u32)>,
    /// `(name, crc)` of every tensor output, in the model's order.
    pub outputs: Vec<(String, u32)>,
}

/// An input whose bytes changed while the run read them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "input '{input}' changed during the run (io_crc: CRC-32 {before:08x} when it started, {after:08x} when it ended, stride {stride}); its buffer must not be written while a run reads it"
)]
pub struct CrcMismatch {
    pub input: String,
    pub before: u32,
    pub after: u32,
    pub stride: u32,
}

/// The sampled CRC of a tensor (see the module docs).
pub fn tensor_crc(t: &Tensor, stride: u32) -> u32 {
    let stride = (stride as usize).max(1);
    let mut h = crc32fast::Hasher::new();
    let mut total: u64 = 0;
    let mut feed = |bytes: &[u8], h: &mut crc32fast::Hasher| {
        if stride <= SAMPLE {
            h.update(bytes);
        } else {
            for section in bytes.chunks(stride) {
                h.update(section.get(..SAMPLE).unwrap_or(section));
            }
        }
        total = total.saturating_add(bytes.len() as u64);
    };
    match t.data() {
        Data::Bool(b) => {
            let bytes: Vec<u8> = b.iter().map(|&v| u8::from(v)).collect();
            feed(&bytes, &mut h);
        }
        Data::Str(s) => {
            let mut bytes = Vec::new();
            for v in s.iter() {
                bytes.extend_from_slice(&(v.len() as u64).to_le_bytes());
                bytes.extend_from_slice(v.as_bytes());
            }
            feed(&bytes, &mut h);
        }
        d => feed(d.as_bytes().unwrap_or(&[]), &mut h),
    }
    h.update(&total.to_le_bytes());
    h.finalize()
}

/// CRCs of the tensor values among `values`.
pub(crate) fn crcs(values: &[(String, Value)], stride: u32) -> Vec<(String, u32)> {
    values
        .iter()
        .filter_map(|(n, v)| Some((n.clone(), tensor_crc(v.as_tensor()?, stride))))
        .collect()
}

/// The inputs to sum again when the run ends: views of memory others may write (cheap clones
/// of the view), with the CRC taken now.
pub(crate) fn watch(values: &[(String, Value)], stride: u32) -> Vec<(String, Tensor, u32)> {
    values
        .iter()
        .filter_map(|(n, v)| {
            let t = v.as_tensor()?;
            t.data()
                .is_shared()
                .then(|| (n.clone(), t.clone(), tensor_crc(t, stride)))
        })
        .collect()
}

/// Sums the watched inputs again: the first that changed, if any.
pub(crate) fn recheck(watched: &[(String, Tensor, u32)], stride: u32) -> Result<(), CrcMismatch> {
    for (name, t, before) in watched {
        let after = tensor_crc(t, stride);
        if after != *before {
            return Err(CrcMismatch {
                input: name.clone(),
                before: *before,
                after,
                stride,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_stride_is_zlibs_crc_of_the_bytes_and_length() {
        let t = Tensor::from_vec(vec![2], vec![1.0f32, -2.0]).unwrap_or_else(|_| unreachable!());
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1.0f32.to_le_bytes());
        bytes.extend_from_slice(&(-2.0f32).to_le_bytes());
        bytes.extend_from_slice(&8u64.to_le_bytes());
        assert_eq!(tensor_crc(&t, 1), crc32fast::hash(&bytes));
        assert_eq!(tensor_crc(&t, 8), crc32fast::hash(&bytes));
    }

    #[test]
    fn a_stride_samples_the_start_of_each_section() {
        let v: Vec<u8> = (0..=255).collect();
        let t = Tensor::from_vec(vec![256], v.clone()).unwrap_or_else(|_| unreachable!());
        let mut sampled = Vec::new();
        for s in v.chunks(64) {
            sampled.extend_from_slice(&s[..SAMPLE]);
        }
        sampled.extend_from_slice(&256u64.to_le_bytes());
        assert_eq!(tensor_crc(&t, 64), crc32fast::hash(&sampled));
        // A change inside a sampled range is seen; one between samples is not.
        let mut w = v.clone();
        w[64] ^= 1;
        assert_ne!(
            tensor_crc(&Tensor::from_vec(vec![256], w).unwrap_or_else(|_| unreachable!()), 64),
            tensor_crc(&t, 64)
        );
        let mut w = v;
        w[65 + SAMPLE] ^= 1;
        assert_eq!(
            tensor_crc(&Tensor::from_vec(vec![256], w).unwrap_or_else(|_| unreachable!()), 64),
            tensor_crc(&t, 64)
        );
    }
}
