//! How a Program's constants are stored in a program file: tensors of plain element types go to
//! the weights section (64-byte aligned, read in place after loading), everything else inline.
//!
//! Serde has no per-call context, so writing and reading a file set a thread-local [`Context`]
//! around the (de)serialisation of the program section; outside it constants serialise inline.

use kiln_ops::Value;
use kiln_tensor::{DType, Data, SharedBytes, Tensor};
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cell::RefCell;

/// Alignment of every tensor in the weights section (and of the section itself).
pub const ALIGN: usize = 64;

/// Tensors smaller than this stay inline in the program section.
const MIN_WEIGHT_BYTES: usize = 64;

pub enum Context {
    /// Writing: weight bytes collected so far, and where each distinct content went (the
    /// programs of one file share identical weights).
    Write {
        weights: Vec<u8>,
        count: usize,
        seen: std::collections::HashMap<[u8; 32], u64>,
    },
    /// Reading: the mapped file and the weights section's byte range in it.
    Read {
        bytes: SharedBytes,
        start: usize,
        end: usize,
    },
}

thread_local! {
    static CONTEXT: RefCell<Option<Context>> = const { RefCell::new(None) };
}

/// Runs `f` with `ctx` installed on this thread; returns `f`'s result and the context.
pub fn with_context<R>(ctx: Context, f: impl FnOnce() -> R) -> (R, Option<Context>) {
    CONTEXT.with(|c| *c.borrow_mut() = Some(ctx));
    let r = f();
    let ctx = CONTEXT.with(|c| c.borrow_mut().take());
    (r, ctx)
}

/// Where a weight lives: offsets are relative to the weights section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WeightRef {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub offset: u64,
    pub len: u64,
}

#[derive(Serialize)]
enum EntryRef<'a> {
    Inline(&'a Value),
    Weight(WeightRef),
}

#[derive(Deserialize)]
enum Entry {
    Inline(Value),
    Weight(WeightRef),
}

pub fn serialize<S: Serializer>(consts: &[(usize, Value)], s: S) -> Result<S::Ok, S::Error> {
    let mut entries: Vec<(usize, EntryRef<'_>)> = Vec::with_capacity(consts.len());
    for (slot, v) in consts {
        let entry = match v {
            Value::Tensor(t) => match t.data().as_bytes() {
                Some(b) if b.len() >= MIN_WEIGHT_BYTES => match push_weight(t, b) {
                    Some(r) => EntryRef::Weight(r),
                    None => EntryRef::Inline(v),
                },
                _ => EntryRef::Inline(v),
            },
            _ => EntryRef::Inline(v),
        };
        entries.push((*slot, entry));
    }
    if entries.len() != consts.len() {
        return Err(S::Error::custom("constant table changed while writing"));
    }
    entries.serialize(s)
}

/// Appends a tensor's bytes to the weights being written (aligned), when writing a file.
fn push_weight(t: &Tensor, bytes: &[u8]) -> Option<WeightRef> {
    CONTEXT.with(|c| {
        let mut c = c.borrow_mut();
        let Some(Context::Write { weights, count, seen }) = c.as_mut() else {
            return None;
        };
        let key = *blake3::hash(bytes).as_bytes();
        let stored = seen.get(&key).copied().filter(|&at| {
            usize::try_from(at)
                .ok()
                .and_then(|at| weights.get(at..at.checked_add(bytes.len())?))
                == Some(bytes)
        });
        let offset = match stored {
            Some(at) => at,
            None => {
                let offset = weights.len().next_multiple_of(ALIGN);
                weights.resize(offset, 0);
                weights.extend_from_slice(bytes);
                *count += 1;
                seen.insert(key, offset as u64);
                offset as u64
            }
        };
        Some(WeightRef {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            offset,
            len: bytes.len() as u64,
        })
    })
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(usize, Value)>, D::Error> {
    let entries = Vec::<(usize, Entry)>::deserialize(d)?;
    let mut out = Vec::with_capacity(entries.len());
    for (slot, e) in entries {
        let v = match e {
            Entry::Inline(v) => v,
            Entry::Weight(r) => Value::Tensor(resolve(&r).map_err(D::Error::custom)?),
        };
        out.push((slot, v));
    }
    Ok(out)
}

/// A tensor viewing its bytes in the mapped weights section.
fn resolve(r: &WeightRef) -> Result<Tensor, String> {
    CONTEXT.with(|c| {
        let c = c.borrow();
        let Some(Context::Read { bytes, start, end }) = c.as_ref() else {
            return Err("a weight reference outside a program file".to_string());
        };
        let bad = || {
            format!(
                "weight {} {:?} at offset {} (+{} bytes) lies outside the weights section or is misaligned",
                r.dtype, r.shape, r.offset, r.len
            )
        };
        let off = usize::try_from(r.offset).map_err(|_| bad())?;
        let len = usize::try_from(r.len).map_err(|_| bad())?;
        let a = start.checked_add(off).ok_or_else(bad)?;
        let b = a.checked_add(len).ok_or_else(bad)?;
        if b > *end {
            return Err(bad());
        }
        let data = Data::shared(r.dtype, bytes.clone(), a, b).ok_or_else(bad)?;
        Tensor::new(r.dtype, r.shape.clone(), data).map_err(|e| format!("weight: {e}"))
    })
}
