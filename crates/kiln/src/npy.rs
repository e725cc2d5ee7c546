//! NumPy `.npy` arrays in memory, and `.npz` archives written without compression, bounded
//! before allocation (reading `.npz`, which needs inflate, is the CLI's).
//!
//! Supported element types: bool, int8..64, uint8..64, float16/32/64 (little-endian or
//! byte-order-free), and unicode strings (`<U n`). Fortran-ordered arrays are transposed into
//! row-major order. Types numpy has no name for (bfloat16, float8, int4) are written as
//! float32 (or int8/uint8 for the sub-byte integers); [`Written`] says so.

use kiln_tensor::{DType, Data, Tensor, f16};

/// A malformed or unsupported `.npy` file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NpyError(pub String);

fn bad(m: impl Into<String>) -> NpyError {
    NpyError(m.into())
}

const MAGIC: &[u8] = b"\x93NUMPY";
/// A header longer than this is not a real .npy header.
const MAX_HEADER: usize = 1 << 20;

/// Parses a whole .npy file held in memory.
pub fn parse_npy(bytes: &[u8]) -> Result<Tensor, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("missing the \\x93NUMPY magic"));
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header"));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(bad(format!("unsupported .npy format version {v}"))),
    };
    if header_len > MAX_HEADER || start + header_len > bytes.len() {
        return Err(bad(format!("header length {header_len} runs past the end of the file")));
    }
    let header = std::str::from_utf8(&bytes[start..start + header_len]).map_err(|_| bad("header is not text"))?;
    let descr = dict_str(header, "descr").ok_or_else(|| bad("header has no 'descr'"))?;
    let fortran = dict_raw(header, "fortran_order").is_some_and(|v| v.starts_with("True"));
    let shape = dict_shape(header).ok_or_else(|| bad("header has no readable 'shape'"))?;
    let data = &bytes[start + header_len..];
    // A numpy dtype string is ASCII: '<f4', '|b1', '<U8'.
    let unsupported = || bad(format!("unsupported dtype '{descr}'"));
    if !descr.is_ascii() || descr.len() < 3 {
        return Err(unsupported());
    }
    let (order, code) = descr.split_at(1);
    let (kind, size) = code.split_at(1);
    let size: usize = size
        .parse()
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| bad(format!("unsupported dtype '{descr}'")))?;
    if order == ">" && size > 1 {
        return Err(bad(format!(
            "big-endian arrays ('{descr}') are not supported; save with a little-endian dtype"
        )));
    }
    let n = kiln_ops::util::checked_numel(&shape).map_err(|e| bad(e.to_string()))?;
    let need = (if kind == "U" { size.checked_mul(4) } else { Some(size) })
        .and_then(|s| n.checked_mul(s))
        .ok_or_else(|| bad("array too large"))?;
    if data.len() < need {
        return Err(bad(format!(
            "data holds {} bytes, shape {shape:?} of '{descr}' needs {need}",
            data.len()
        )));
    }
    let data = &data[..need];
    let t = match (kind, size) {
        ("b", 1) => Tensor::from_vec(shape.clone(), data.iter().map(|&b| b != 0).collect::<Vec<_>>()),
        ("i", 1) => Tensor::from_vec(shape.clone(), data.iter().map(|&b| b as i8).collect::<Vec<_>>()),
        ("u", 1) => Tensor::from_vec(shape.clone(), data.to_vec()),
        ("i", 2) => Tensor::from_vec(shape.clone(), le(data, i16::from_le_bytes)),
        ("u", 2) => Tensor::from_vec(shape.clone(), le(data, u16::from_le_bytes)),
        ("i", 4) => Tensor::from_vec(shape.clone(), le(data, i32::from_le_bytes)),
        ("u", 4) => Tensor::from_vec(shape.clone(), le(data, u32::from_le_bytes)),
        ("i", 8) => Tensor::from_vec(shape.clone(), le(data, i64::from_le_bytes)),
        ("u", 8) => Tensor::from_vec(shape.clone(), le(data, u64::from_le_bytes)),
        ("f", 2) => Tensor::from_vec(shape.clone(), le(data, |b| f16::from_bits(u16::from_le_bytes(b)))),
        ("f", 4) => Tensor::from_vec(shape.clone(), le(data, f32::from_le_bytes)),
        ("f", 8) => Tensor::from_vec(shape.clone(), le(data, f64::from_le_bytes)),
        ("U", chars) => {
            let strings: Vec<String> = data
                .chunks_exact(chars * 4)
                .map(|c| {
                    c.chunks_exact(4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .take_while(|&u| u != 0)
                        .filter_map(char::from_u32)
                        .collect()
                })
                .collect();
            Tensor::from_vec(shape.clone(), strings)
        }
        _ => return Err(bad(format!("unsupported dtype '{descr}'"))),
    }
    .map_err(|e| bad(e.to_string()))?;
    if fortran && shape.len() > 1 {
        return Ok(from_fortran(&t)?);
    }
    Ok(t)
}

/// Reorders a tensor whose elements were stored column-major into row-major order.
fn from_fortran(t: &Tensor) -> Result<Tensor, NpyError> {
    let shape = t.shape().to_vec();
    let rank = shape.len();
    // Column-major strides.
    let mut fstrides = vec![1usize; rank];
    for i in 1..rank {
        fstrides[i] = fstrides[i - 1] * shape[i - 1];
    }
    let n = t.len();
    let mut idx = Vec::with_capacity(n);
    let mut pos = vec![0usize; rank];
    for _ in 0..n {
        idx.push(pos.iter().zip(&fstrides).map(|(p, s)| p * s).sum());
        for d in (0..rank).rev() {
            pos[d] += 1;
            if pos[d] < shape[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    t.gather_flat(shape, &idx).map_err(|e| bad(e.to_string()))
}

fn le<const N: usize, T>(raw: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    raw.chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; N];
            b.copy_from_slice(c);
            f(b)
        })
        .collect()
}

fn dict_raw<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let at = header.find(&format!("'{key}'"))?;
    let rest = header[at + key.len() + 2..].trim_start();
    Some(rest.strip_prefix(':')?.trim_start())
}

fn dict_str<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let v = dict_raw(header, key)?;
    let v = v.strip_prefix('\'')?;
    Some(&v[..v.find('\'')?])
}

fn dict_shape(header: &str) -> Option<Vec<usize>> {
    let v = dict_raw(header, "shape")?.strip_prefix('(')?;
    let inner = &v[..v.find(')')?];
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().ok())
        .collect()
}

/// What happened to a tensor written in a dtype numpy lacks.
pub struct Written {
    pub converted_from: Option<DType>,
}

/// Encodes a tensor as .npy bytes.
pub fn to_npy(t: &Tensor) -> (Vec<u8>, Written) {
    let mut converted_from = None;
    let (descr, body): (String, Vec<u8>) = match t.data() {
        Data::Bool(v) => ("|b1".into(), v.iter().map(|&b| b as u8).collect()),
        Data::I8(v) => ("|i1".into(), v.iter().map(|&x| x as u8).collect()),
        Data::U8(v) => ("|u1".into(), v.to_vec()),
        Data::I16(v) => ("<i2".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::U16(v) => ("<u2".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::I32(v) => ("<i4".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::U32(v) => ("<u4".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::I64(v) => ("<i8".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::U64(v) => ("<u8".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::F16(v) => ("<f2".into(), v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()),
        Data::F32(v) => ("<f4".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::F64(v) => ("<f8".into(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::Str(v) => {
            let width = v.iter().map(|s| s.chars().count()).max().unwrap_or(0).max(1);
            let mut body = Vec::with_capacity(v.len() * width * 4);
            for s in v {
                let mut k = 0;
                for c in s.chars() {
                    body.extend_from_slice(&(c as u32).to_le_bytes());
                    k += 1;
                }
                body.extend(std::iter::repeat_n(0u8, (width - k) * 4));
            }
            (format!("<U{width}"), body)
        }
        Data::BF16(_) | Data::Coded(_) => {
            converted_from = Some(t.dtype());
            let dt = t.dtype();
            if dt.is_int() {
                let v = t.to_i64_vec().unwrap_or_default();
                if dt.is_signed_int() {
                    ("|i1".into(), v.iter().map(|&x| x as i8 as u8).collect())
                } else {
                    ("|u1".into(), v.iter().map(|&x| x as u8).collect())
                }
            } else {
                (
                    "<f4".into(),
                    t.to_f64_vec().iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
                )
            }
        }
    };
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        s => format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so the data starts 64-byte aligned; the header ends with a newline.
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&body);
    (out, Written { converted_from })
}

/// An `.npz` archive of `arrays` (each `NAME.npy`), stored without compression (numpy's
/// `np.savez`): a zip of local headers, the files and a central directory, with CRC-32s.
/// Fails only when the archive would pass zip's 4 GiB / 65,535-entry limits.
pub fn npz_bytes(arrays: &[(String, Tensor)]) -> Result<Vec<u8>, NpyError> {
    let too_big = || bad("the arrays exceed the 4 GiB or 65,535 entries of a zip without zip64");
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, t) in arrays {
        let (data, _) = to_npy(t);
        let file = format!("{name}.npy");
        let crc = crc32fast::hash(&data);
        let size = u32::try_from(data.len()).map_err(|_| too_big())?;
        let offset = u32::try_from(out.len()).map_err(|_| too_big())?;
        let name_len = u16::try_from(file.len()).map_err(|_| too_big())?;
        // Local file header: version 2.0, no flags, stored, no time.
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&name_len.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(file.as_bytes());
        out.extend_from_slice(&data);
        // Its central directory entry.
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&name_len.to_le_bytes());
        central.extend_from_slice(&[0; 8]);
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(file.as_bytes());
    }
    let entries = u16::try_from(arrays.len()).map_err(|_| too_big())?;
    let cd_offset = u32::try_from(out.len()).map_err(|_| too_big())?;
    let cd_len = u32::try_from(central.len()).map_err(|_| too_big())?;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&entries.to_le_bytes());
    out.extend_from_slice(&entries.to_le_bytes());
    out.extend_from_slice(&cd_len.to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_numbers_and_strings() {
        let t = Tensor::from_vec(vec![2, 3], vec![1.0f32, -2.5, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let (bytes, _) = to_npy(&t);
        assert_eq!((bytes.len() - 128) % 4, 0);
        assert_eq!(parse_npy(&bytes).unwrap(), t);
        let s = Tensor::from_vec(vec![2], vec!["héllo".to_string(), "x".to_string()]).unwrap();
        assert_eq!(parse_npy(&to_npy(&s).0).unwrap(), s);
        let b = Tensor::from_vec(vec![], vec![true]).unwrap();
        assert_eq!(parse_npy(&to_npy(&b).0).unwrap(), b);
    }

    #[test]
    fn fortran_order_is_transposed() {
        // [[1,2,3],[4,5,6]] stored column-major is 1 4 2 5 3 6.
        let mut bytes = Vec::new();
        let header = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }\n";
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        for v in [1i32, 4, 2, 5, 3, 6] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let t = parse_npy(&bytes).unwrap();
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn zero_width_overflowing_and_non_ascii_dtypes_are_errors() {
        // "\u{359}..." found by the read_npy fuzz target: a split inside a character.
        for descr in [
            "<U0",
            "<f0",
            "<U4611686018427387904",
            "<i99999999999999999999",
            "\u{359}",
            "<\u{359}4",
            "f",
            "",
        ] {
            let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2,), }}\n");
            let mut b = Vec::new();
            b.extend_from_slice(MAGIC);
            b.extend_from_slice(&[1, 0]);
            b.extend_from_slice(&(header.len() as u16).to_le_bytes());
            b.extend_from_slice(header.as_bytes());
            b.extend_from_slice(&[0; 64]);
            assert!(parse_npy(&b).is_err(), "{descr}");
        }
    }

    /// The read_npy fuzz target's first finding (2026-11-26): a header whose 'descr' starts
    /// with a two-byte character made the dtype split panic.
    #[test]
    fn fuzz_finding_a_dtype_split_inside_a_character() {
        const FOUND: &[u8] = &[
            147, 78, 85, 77, 80, 89, 1, 0, 118, 0, 123, 39, 100, 101, 115, 99, 114, 39, 58, 32, 39, 205, 153, 0, 118,
            0, 123, 39, 100, 101, 115, 99, 114, 39, 58, 32, 39, 60, 102, 50, 33, 44, 32, 39, 49, 70, 44, 32, 102, 111,
            114, 116, 114, 97, 110, 95, 111, 114, 100, 101, 114, 39, 58, 32, 70, 97, 108, 115, 101, 44, 32, 39, 115,
            104, 97, 112, 101, 39, 58, 32, 40, 50, 44, 32, 50, 41, 44, 32, 125, 32, 32, 32, 50, 39, 44, 32, 39, 102,
            111, 114, 116, 114, 97, 110, 95, 50, 0, 0, 0, 114, 39, 58, 32, 70, 97, 108, 115, 101, 44, 32, 39, 115, 104,
            97, 112, 101, 39, 58, 32, 40, 50, 44, 32, 50, 41, 44, 32, 125, 32, 32, 32, 32, 32, 32, 32, 32, 32, 11, 11,
            11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11,
            11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
            32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
            32, 32, 32, 32, 32, 32, 32, 32, 10, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert!(parse_npy(FOUND).is_err());
    }

    #[test]
    fn truncated_and_absurd_files_are_errors() {
        let t = Tensor::from_vec(vec![4], vec![1i64, 2, 3, 4]).unwrap();
        let (bytes, _) = to_npy(&t);
        assert!(parse_npy(&bytes[..bytes.len() - 1]).is_err());
        assert!(parse_npy(&bytes[..5]).is_err());
        let huge = String::from_utf8(bytes.clone()).unwrap_or_default();
        let _ = huge;
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }\n";
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        assert!(parse_npy(&b).is_err());
    }
}
