//! TensorProto → [`Tensor`]: every ONNX storage form (raw little-endian bytes, typed fields,
//! packed 4- and 2-bit elements, strings) and external data files confined to the model folder.

use crate::error::ImportError;
use crate::proto::{TensorProto, tensor_proto::DataLocation};
use kiln_tensor::{DType, Data, MAX_ELEMENTS, Tensor, bf16, f16, formats, numel};
use std::path::{Component, Path, PathBuf};

type Result<T> = std::result::Result<T, ImportError>;

/// Decodes tensors; knows the model's folder for external data.
pub struct TensorLoader<'a> {
    pub(crate) base_dir: Option<&'a Path>,
}

impl<'a> TensorLoader<'a> {
    pub fn new(base_dir: Option<&'a Path>) -> TensorLoader<'a> {
        TensorLoader { base_dir }
    }

    pub fn load(&self, t: &TensorProto) -> Result<Tensor> {
        let name = t.name.as_deref().unwrap_or("<unnamed>");
        let code = t.data_type.unwrap_or(0);
        let dtype = DType::from_onnx(code)
            .ok_or_else(|| ImportError::tensor(name, format!("unsupported data type code {code}")))?;
        let shape = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| ImportError::tensor(name, format!("negative dimension {d}"))))
            .collect::<Result<Vec<usize>>>()?;
        let n = numel(&shape)
            .ok_or_else(|| ImportError::tensor(name, format!("shape {shape:?} exceeds {MAX_ELEMENTS} elements")))?;
        if t.segment.is_some() {
            return Err(ImportError::tensor(name, "segmented tensors are not supported"));
        }
        let external = t.data_location == Some(DataLocation::External as i32);
        let data = if external {
            let bytes = self.external_bytes(t, name)?;
            from_raw(dtype, &bytes, n, name)?
        } else if let Some(raw) = t.raw_data.as_ref().filter(|r| !r.is_empty() || n == 0) {
            if dtype == DType::String {
                return Err(ImportError::tensor(name, "string tensors cannot use raw_data"));
            }
            from_raw(dtype, raw, n, name)?
        } else {
            from_fields(t, dtype, n, name)?
        };
        Tensor::new(dtype, shape, data).map_err(|e| ImportError::from_tensor_error(name, e))
    }

    fn external_bytes(&self, t: &TensorProto, name: &str) -> Result<Vec<u8>> {
        let err = |reason: String| ImportError::ExternalData {
            name: name.to_string(),
            reason,
        };
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for kv in &t.external_data {
            let v = kv.value.as_deref().unwrap_or("");
            match kv.key.as_deref() {
                Some("location") => location = Some(v.to_string()),
                Some("offset") => offset = v.parse().map_err(|_| err(format!("bad offset '{v}'")))?,
                Some("length") => length = Some(v.parse::<u64>().map_err(|_| err(format!("bad length '{v}'")))?),
                _ => {}
            }
        }
        let location = location.ok_or_else(|| err("no 'location' key".into()))?;
        let base = self
            .base_dir
            .ok_or_else(|| err("the model was not loaded from a file, so external data cannot be resolved".into()))?;
        let path = confined_path(base, &location).map_err(err)?;
        let file = std::fs::File::open(&path).map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
        let map = crate::mmap::map_file(&file).map_err(|e| err(format!("cannot map {}: {e}", path.display())))?;
        let len = length.unwrap_or((map.len() as u64).saturating_sub(offset));
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= map.len() as u64)
            .ok_or_else(|| {
                err(format!(
                    "offset {offset} + length {len} runs past the end of {} ({} bytes)",
                    location,
                    map.len()
                ))
            })?;
        Ok(map[offset as usize..end as usize].to_vec())
    }
}

/// Resolves `location` under `base`, refusing absolute paths, `..` and symlinks leading out.
pub fn confined_path(base: &Path, location: &str) -> std::result::Result<PathBuf, String> {
    let rel = Path::new(location);
    if rel.is_absolute() || location.starts_with('/') || location.starts_with('\\') {
        return Err(format!(
            "location '{location}' is absolute; it must be relative to the model's folder"
        ));
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(format!("location '{location}' leaves the model's folder")),
        }
    }
    let joined = base.join(rel);
    let canon_base = base
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", base.display()))?;
    let canon = joined
        .canonicalize()
        .map_err(|e| format!("cannot open {}: {e}", joined.display()))?;
    if !canon.starts_with(&canon_base) {
        return Err(format!("location '{location}' resolves outside the model's folder"));
    }
    Ok(canon)
}

fn need(raw: &[u8], bytes: usize, name: &str) -> Result<()> {
    if raw.len() != bytes {
        return Err(ImportError::tensor(
            name,
            format!("raw data holds {} bytes, the shape needs {bytes}", raw.len()),
        ));
    }
    Ok(())
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

fn from_raw(dtype: DType, raw: &[u8], n: usize, name: &str) -> Result<Data> {
    let bits = dtype.packed_bits();
    if dtype.is_byte_coded() {
        let bytes = (n * bits).div_ceil(8);
        need(raw, bytes, name)?;
        let codes = formats::unpack(dtype, raw, n).ok_or_else(|| ImportError::tensor(name, "packed data too short"))?;
        return Ok(Data::Coded(codes.into()));
    }
    let size = bits / 8;
    need(raw, n * size, name)?;
    Ok(match dtype {
        DType::F32 => Data::F32(le(raw, f32::from_le_bytes).into()),
        DType::F64 => Data::F64(le(raw, f64::from_le_bytes).into()),
        DType::F16 => Data::F16(le(raw, |b| f16::from_bits(u16::from_le_bytes(b))).into()),
        DType::BF16 => Data::BF16(le(raw, |b| bf16::from_bits(u16::from_le_bytes(b))).into()),
        DType::I8 => Data::I8(raw.iter().map(|&b| b as i8).collect()),
        DType::U8 => Data::U8(raw.to_vec().into()),
        DType::I16 => Data::I16(le(raw, i16::from_le_bytes).into()),
        DType::U16 => Data::U16(le(raw, u16::from_le_bytes).into()),
        DType::I32 => Data::I32(le(raw, i32::from_le_bytes).into()),
        DType::U32 => Data::U32(le(raw, u32::from_le_bytes).into()),
        DType::I64 => Data::I64(le(raw, i64::from_le_bytes).into()),
        DType::U64 => Data::U64(le(raw, u64::from_le_bytes).into()),
        DType::Bool => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
        _ => {
            return Err(ImportError::tensor(
                name,
                format!("dtype {dtype} cannot be read from raw data"),
            ));
        }
    })
}

fn count(got: usize, n: usize, name: &str, field: &str) -> Result<()> {
    if got != n {
        return Err(ImportError::tensor(
            name,
            format!("{field} holds {got} values, the shape needs {n}"),
        ));
    }
    Ok(())
}

fn from_fields(t: &TensorProto, dtype: DType, n: usize, name: &str) -> Result<Data> {
    let i32s = &t.int32_data;
    Ok(match dtype {
        DType::F32 => {
            count(t.float_data.len(), n, name, "float_data")?;
            Data::F32(t.float_data.clone().into())
        }
        DType::F64 => {
            count(t.double_data.len(), n, name, "double_data")?;
            Data::F64(t.double_data.clone().into())
        }
        DType::I64 => {
            count(t.int64_data.len(), n, name, "int64_data")?;
            Data::I64(t.int64_data.clone().into())
        }
        DType::U64 => {
            count(t.uint64_data.len(), n, name, "uint64_data")?;
            Data::U64(t.uint64_data.clone().into())
        }
        DType::U32 => {
            count(t.uint64_data.len(), n, name, "uint64_data")?;
            Data::U32(t.uint64_data.iter().map(|&v| v as u32).collect())
        }
        DType::String => {
            count(t.string_data.len(), n, name, "string_data")?;
            Data::Str(
                t.string_data
                    .iter()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .collect(),
            )
        }
        DType::I32 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::I32(i32s.clone().into())
        }
        DType::I16 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::I16(i32s.iter().map(|&v| v as i16).collect())
        }
        DType::I8 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::I8(i32s.iter().map(|&v| v as i8).collect())
        }
        DType::U16 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::U16(i32s.iter().map(|&v| v as u16).collect())
        }
        DType::U8 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::U8(i32s.iter().map(|&v| v as u8).collect())
        }
        DType::Bool => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::Bool(i32s.iter().map(|&v| v != 0).collect())
        }
        DType::F16 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::F16(i32s.iter().map(|&v| f16::from_bits(v as u16)).collect())
        }
        DType::BF16 => {
            count(i32s.len(), n, name, "int32_data")?;
            Data::BF16(i32s.iter().map(|&v| bf16::from_bits(v as u16)).collect())
        }
        _ => {
            // Byte-coded types: int32_data holds one byte of (packed) storage per value.
            let bytes: Vec<u8> = i32s.iter().map(|&v| v as u8).collect();
            let codes = formats::unpack(dtype, &bytes, n).ok_or_else(|| {
                ImportError::tensor(
                    name,
                    format!("int32_data holds {} values, too few for {n} elements", i32s.len()),
                )
            })?;
            Data::Coded(codes.into())
        }
    })
}

/// Encodes a tensor as a TensorProto with raw data (used to write test data and by tools).
pub fn to_proto(t: &Tensor, name: &str) -> TensorProto {
    let mut p = TensorProto {
        name: Some(name.to_string()),
        data_type: Some(t.dtype().onnx_code()),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        ..Default::default()
    };
    let raw: Vec<u8> = match t.data() {
        Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Data::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Data::I8(v) => v.iter().map(|&x| x as u8).collect(),
        Data::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U8(v) => v.to_vec(),
        Data::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        Data::Str(v) => {
            p.string_data = v.iter().map(|s| bytes::Bytes::from(s.clone().into_bytes())).collect();
            return p;
        }
        Data::Coded(v) => formats::pack(t.dtype(), v),
    };
    p.raw_data = Some(bytes::Bytes::from(raw));
    p
}
