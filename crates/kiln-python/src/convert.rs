//! Values across the boundary: Python option values to JSON (for the configuration), numpy
//! arrays to kiln tensors (read in place when C-contiguous, aligned and native-order; copied
//! once otherwise) and kiln's outputs to ndarrays that own their memory.

use crate::buffer::ArrayBytes;
use crate::errors;
use kiln::{DType, Data, Tensor, Value};
use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::collections::HashMap;
use std::sync::Mutex;

/// A Python option value (None, bool, int, float, str, path, list, tuple, dict) as JSON, the
/// form the configuration validates.
pub(crate) fn to_json(v: &Bound<'_, PyAny>, option: &str) -> PyResult<serde_json::Value> {
    use serde_json::Value as J;
    if v.is_none() {
        return Ok(J::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(J::Bool(b.is_true()));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            return Ok(J::from(i));
        }
        if let Ok(u) = v.extract::<u64>() {
            return Ok(J::from(u));
        }
        return Err(errors::config(format!("{option}: the integer {v} is out of range")));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return serde_json::Number::from_f64(f.value())
            .map(J::Number)
            .ok_or_else(|| errors::config(format!("{option}: {} is not a finite number", f.value())));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(J::String(s.to_string()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut m = serde_json::Map::new();
        for (k, x) in d.iter() {
            let key = k
                .extract::<String>()
                .map_err(|_| errors::config(format!("{option}: dictionary keys must be strings, got {k}")))?;
            m.insert(key, to_json(&x, option)?);
        }
        return Ok(J::Object(m));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for x in v.try_iter()? {
            out.push(to_json(&x?, option)?);
        }
        return Ok(J::Array(out));
    }
    // os.PathLike (pathlib.Path) and numpy scalars.
    if let Ok(p) = v.call_method0("__fspath__") {
        return to_json(&p, option);
    }
    if let Ok(item) = v.call_method0("item")
        && !item.is(v)
    {
        return to_json(&item, option);
    }
    Err(errors::config(format!(
        "{option}: a {} cannot be an option value (expected a bool, number, string, list or dict)",
        v.get_type().name()?
    )))
}

/// JSON (an option's current value) as a Python object.
pub(crate) fn from_json<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::IntoPyObjectExt;
    use serde_json::Value as J;
    Ok(match v {
        J::Null => py.None().into_bound(py),
        J::Bool(b) => b.into_bound_py_any(py)?,
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_bound_py_any(py)?,
            (None, Some(u)) => u.into_bound_py_any(py)?,
            _ => n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)?,
        },
        J::String(s) => s.into_bound_py_any(py)?,
        J::Array(a) => {
            let items = a.iter().map(|x| from_json(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        J::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, from_json(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Arrays kiln reads in place during runs, made read-only for as long as any run uses them
/// (keyed by the array object; the count is how many runs at once). Only touched with the GIL
/// held.
static HELD: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<HashMap<usize, usize>>> {
    HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The user arrays one run reads in place; [`ReadOnlyHolds::release`] makes them writeable again
/// when no other run holds them.
#[derive(Default)]
pub(crate) struct ReadOnlyHolds {
    arrays: Vec<Py<PyAny>>,
}

impl ReadOnlyHolds {
    /// Holds `array` read-only if it is writeable now or held by another run.
    fn hold(&mut self, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = array.as_ptr() as usize;
        let mut map = held();
        let counts = map.get_or_insert_with(HashMap::new);
        if let Some(n) = counts.get_mut(&key) {
            *n += 1;
        } else {
            let flags = array.getattr("flags")?;
            if !flags.getattr("writeable")?.is_truthy()? {
                return Ok(());
            }
            flags.setattr("writeable", false)?;
            counts.insert(key, 1);
        }
        self.arrays.push(array.clone().unbind());
        Ok(())
    }

    /// Gives the arrays back: writeable again once no run holds them.
    pub(crate) fn release(self, py: Python<'_>) {
        let mut map = held();
        let Some(counts) = map.as_mut() else { return };
        for a in self.arrays {
            let key = a.as_ptr() as usize;
            let last = match counts.get_mut(&key) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => true,
                None => false,
            };
            if last {
                counts.remove(&key);
                // Cannot fail for an array that was writeable when held, unless its base was
                // made read-only meanwhile; then it stays read-only, as numpy would have it.
                let _ = a.bind(py).getattr("flags").and_then(|f| f.setattr("writeable", true));
            }
        }
    }
}

/// kiln's element type of a numpy dtype, or `None` when kiln has none.
fn dtype_of(descr: &Bound<'_, numpy::PyArrayDescr>) -> PyResult<Option<DType>> {
    let size = descr.itemsize();
    Ok(match (descr.kind(), size) {
        (b'f', 2) => Some(DType::F16),
        (b'f', 4) => Some(DType::F32),
        (b'f', 8) => Some(DType::F64),
        (b'i', 1) => Some(DType::I8),
        (b'i', 2) => Some(DType::I16),
        (b'i', 4) => Some(DType::I32),
        (b'i', 8) => Some(DType::I64),
        (b'u', 1) => Some(DType::U8),
        (b'u', 2) => Some(DType::U16),
        (b'u', 4) => Some(DType::U32),
        (b'u', 8) => Some(DType::U64),
        (b'b', 1) => Some(DType::Bool),
        (b'U' | b'S' | b'O', _) => Some(DType::String),
        _ => {
            let name: String = descr.getattr("name")?.extract()?;
            ML_DTYPES.iter().find(|(_, n)| *n == name).map(|(d, _)| *d)
        }
    })
}

/// kiln's types numpy has only through the `ml_dtypes` package, by their names there.
const ML_DTYPES: &[(DType, &str)] = &[
    (DType::BF16, "bfloat16"),
    (DType::F8E4M3FN, "float8_e4m3fn"),
    (DType::F8E4M3FNUZ, "float8_e4m3fnuz"),
    (DType::F8E5M2, "float8_e5m2"),
    (DType::F8E5M2FNUZ, "float8_e5m2fnuz"),
    (DType::F8E8M0, "float8_e8m0fnu"),
    (DType::F4E2M1, "float4_e2m1fn"),
    (DType::U4, "uint4"),
    (DType::I4, "int4"),
    (DType::U2, "uint2"),
    (DType::I2, "int2"),
];

/// numpy's name of a kiln dtype (ml_dtypes' for the types numpy lacks).
pub(crate) fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::String => "str",
        other => ML_DTYPES
            .iter()
            .find(|(k, _)| *k == other)
            .map_or_else(|| other.name(), |(_, n)| *n),
    }
}

/// The inputs of one run from `{name: array}`: arrays read in place when they can be (held
/// read-only in `holds`), others converted once. `declared` gives the model's dtype of an
/// input, which a value that is not an ndarray (a list, a scalar) is converted to.
pub(crate) fn feed(
    py: Python<'_>,
    inputs: &Bound<'_, PyDict>,
    holds: &mut ReadOnlyHolds,
    declared: &dyn Fn(&str) -> Option<DType>,
) -> PyResult<Vec<(String, Value)>> {
    let mut out = Vec::with_capacity(inputs.len());
    for (k, v) in inputs.iter() {
        let Ok(name) = k.extract::<String>() else {
            return Err(errors::input(format!("input names must be strings, got {}", k.repr()?)));
        };
        let value = to_value(py, &name, &v, holds, declared)?;
        out.push((name, value));
    }
    Ok(out)
}

/// One input as a kiln tensor: an ndarray, or anything `numpy.asarray` takes (converted to
/// the input's declared dtype when there is one).
fn to_value(
    py: Python<'_>,
    name: &str,
    v: &Bound<'_, PyAny>,
    holds: &mut ReadOnlyHolds,
    declared: &dyn Fn(&str) -> Option<DType>,
) -> PyResult<Value> {
    let array = match v.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => numpy::get_array_module(py)?
            .call_method1(
                "asarray",
                (
                    v,
                    declared(name)
                        .filter(|d| !ML_DTYPES.iter().any(|(m, _)| m == d))
                        .map(numpy_name),
                ),
            )
            .map_err(|e| errors::input(format!("input '{name}': cannot be made a numpy array: {e}")))?
            .cast_into::<PyUntypedArray>()
            .map_err(|e| errors::input(format!("input '{name}': not an array: {e}")))?,
    };
    let user_array = array.is(v);
    Ok(Value::Tensor(to_tensor(py, name, &array, user_array, holds)?))
}

/// An ndarray as a tensor. Plain dtypes are read in place when the layout allows (a user's
/// array is then held read-only for the run); everything else is copied once.
fn to_tensor(
    py: Python<'_>,
    name: &str,
    array: &Bound<'_, PyUntypedArray>,
    user_array: bool,
    holds: &mut ReadOnlyHolds,
) -> PyResult<Tensor> {
    let descr = array.dtype();
    let Some(dtype) = dtype_of(&descr)? else {
        return Err(errors::input(format!(
            "input '{name}': numpy dtype {} has no kiln equivalent",
            descr.str()?
        )));
    };
    let shape: Vec<usize> = array.shape().to_vec();
    let bad = |e: kiln::TensorError| errors::input(format!("input '{name}': {e}"));
    match dtype {
        DType::String => {
            let flat = array.call_method1("reshape", (-1,))?;
            let mut items = Vec::with_capacity(array.len());
            for x in flat.try_iter()? {
                let x = x?;
                let s = match x.extract::<String>() {
                    Ok(s) => s,
                    Err(_) => match x.extract::<Vec<u8>>() {
                        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                        Err(_) => {
                            return Err(errors::input(format!(
                                "input '{name}': an object array must hold strings, found {}",
                                x.get_type().name()?
                            )));
                        }
                    },
                };
                items.push(s);
            }
            Tensor::from_vec(shape, items).map_err(bad)
        }
        DType::Bool => {
            let flat = contiguous(py, array, "bool")?;
            let bytes = flat.call_method0("tobytes")?;
            let b: &[u8] = bytes.extract()?;
            Tensor::from_vec(shape, b.iter().map(|&x| x != 0).collect::<Vec<bool>>()).map_err(bad)
        }
        d if d.is_byte_coded() => {
            let raw = contiguous(py, array, numpy_name(d))?
                .call_method1("view", ("uint8",))?
                .call_method0("tobytes")?;
            let b: &[u8] = raw.extract()?;
            let codes = b
                .iter()
                .map(|&x| match d {
                    DType::I4 | DType::U4 | DType::F4E2M1 => x & 0x0F,
                    DType::I2 | DType::U2 => x & 0x03,
                    _ => x,
                })
                .collect();
            Tensor::from_codes(d, shape, codes).map_err(bad)
        }
        d => {
            let native = descr.is_native_byteorder().unwrap_or(true);
            let in_place = native && array.is_c_contiguous() && array.is_aligned();
            let owner = if in_place {
                if user_array {
                    holds.hold(array.as_any())?;
                }
                array.clone()
            } else {
                contiguous(py, array, numpy_name(d))?
            };
            let nbytes = owner.len() * d.size_of();
            let bytes = ArrayBytes::of(&owner)
                .ok_or_else(|| errors::input(format!("input '{name}': its buffer cannot be read")))?;
            let data = Data::shared(d, bytes.into_shared(), 0, nbytes).ok_or_else(|| {
                errors::input(format!(
                    "input '{name}': its buffer is not aligned for {}",
                    numpy_name(d)
                ))
            })?;
            Tensor::new(d, shape, data).map_err(bad)
        }
    }
}

/// A C-contiguous, aligned, native-order copy of `array` as `dtype` (numpy's own conversion).
fn contiguous<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyUntypedArray>,
    dtype: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let np = numpy::get_array_module(py)?;
    let target = match dtype {
        "bool" | "float32" | "float64" | "float16" | "int8" | "int16" | "int32" | "int64" | "uint8" | "uint16"
        | "uint32" | "uint64" => np.getattr("dtype")?.call1((dtype,))?,
        // ml_dtypes' types: the array's own dtype in native order.
        _ => array.dtype().call_method1("newbyteorder", ("=",))?.into_any(),
    };
    let out = np.call_method1("ascontiguousarray", (array, target))?;
    Ok(out.cast_into::<PyUntypedArray>()?)
}

/// A flat vector as an ndarray of `shape` that owns the vector (no copy).
fn shaped<'py, T: numpy::Element>(py: Python<'py>, v: Vec<T>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let flat = PyArray1::from_vec(py, v);
    Ok(flat.reshape(shape)?.into_any())
}

/// An output tensor as an ndarray owning its memory (float16 natively; bfloat16, float8, int4
/// and the other types numpy lacks as `ml_dtypes` arrays, which must then be installed).
pub(crate) fn tensor_to_numpy<'py>(py: Python<'py>, name: &str, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let (dtype, shape, data) = t.into_parts();
    let shape: Vec<usize> = shape.to_vec();
    Ok(match data {
        Data::F32(b) => shaped(py, b.into_vec(), &shape)?,
        Data::F64(b) => shaped(py, b.into_vec(), &shape)?,
        Data::F16(b) => shaped(py, b.into_vec(), &shape)?,
        Data::I8(b) => shaped(py, b.into_vec(), &shape)?,
        Data::I16(b) => shaped(py, b.into_vec(), &shape)?,
        Data::I32(b) => shaped(py, b.into_vec(), &shape)?,
        Data::I64(b) => shaped(py, b.into_vec(), &shape)?,
        Data::U8(b) => shaped(py, b.into_vec(), &shape)?,
        Data::U16(b) => shaped(py, b.into_vec(), &shape)?,
        Data::U32(b) => shaped(py, b.into_vec(), &shape)?,
        Data::U64(b) => shaped(py, b.into_vec(), &shape)?,
        Data::Bool(b) => shaped(py, b.into_vec(), &shape)?,
        Data::Str(b) => {
            let objs: Vec<Py<PyAny>> = b
                .into_vec()
                .into_iter()
                .map(|s| PyString::new(py, &s).into_any().unbind())
                .collect();
            shaped(py, objs, &shape)?
        }
        Data::BF16(b) => {
            let bits: Vec<u16> = b.into_vec().into_iter().map(|x| x.to_bits()).collect();
            ml_view(py, name, dtype, shaped(py, bits, &shape)?)?
        }
        Data::Coded(b) => {
            let codes: Vec<u8> = b
                .into_vec()
                .into_iter()
                .map(|c| match dtype {
                    // ml_dtypes keeps int4/int2 sign-extended in their byte.
                    DType::I4 => (((c << 4) as i8) >> 4) as u8,
                    DType::I2 => (((c << 6) as i8) >> 6) as u8,
                    _ => c,
                })
                .collect();
            ml_view(py, name, dtype, shaped(py, codes, &shape)?)?
        }
    })
}

/// `bits` (uint8/uint16 codes) viewed as the `ml_dtypes` type of `dtype`.
fn ml_view<'py>(py: Python<'py>, name: &str, dtype: DType, bits: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let ml = py.import("ml_dtypes").map_err(|_| {
        errors::KilnError::new_err(format!(
            "output '{name}' is {}, which numpy has only through the ml_dtypes package: pip install ml_dtypes",
            numpy_name(dtype)
        ))
    })?;
    let t = ml.getattr(numpy_name(dtype))?;
    bits.call_method1("view", (t,))
}

/// A kiln value as Python: an ndarray, a list of them (a sequence) or None (an empty optional).
pub(crate) fn value_to_py<'py>(py: Python<'py>, name: &str, v: Value) -> PyResult<Bound<'py, PyAny>> {
    match v {
        Value::Tensor(t) => tensor_to_numpy(py, name, t),
        Value::Sequence(s) => {
            let items = s
                .items
                .into_iter()
                .map(|t| tensor_to_numpy(py, name, t))
                .collect::<PyResult<Vec<_>>>()?;
            Ok(PyList::new(py, items)?.into_any())
        }
        Value::Optional(None, _) => Ok(py.None().into_bound(py)),
        Value::Optional(Some(inner), _) => value_to_py(py, name, *inner),
    }
}
