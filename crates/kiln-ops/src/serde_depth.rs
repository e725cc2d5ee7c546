//! A nesting bound for deserialising recursive types (optional-of-sequence types, sub-programs),
//! so a crafted program file cannot overflow the stack: each recursive field passes through
//! [`nested`], which counts the depth on this thread and refuses to go deeper than [`MAX_DEPTH`].

use serde::{Deserialize, Deserializer, de::Error};
use std::cell::Cell;

/// Deepest nesting of recursive fields a deserialised value may have.
pub const MAX_DEPTH: usize = 64;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Deserialises `T` one nesting level deeper (for `#[serde(deserialize_with = ...)]` on a
/// recursive field).
pub fn nested<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    let depth = DEPTH.with(|c| {
        let v = c.get() + 1;
        c.set(v);
        v
    });
    let _guard = Guard;
    if depth > MAX_DEPTH {
        return Err(D::Error::custom(format!("nesting deeper than {MAX_DEPTH} levels")));
    }
    T::deserialize(d)
}

#[cfg(test)]
mod tests {
    use crate::value::ValueType;

    #[test]
    fn deep_types_are_refused_and_shallow_ones_load() {
        let mut json = String::from("\"Unknown\"");
        for _ in 0..10 {
            json = format!("{{\"Sequence\":{json}}}");
        }
        let shallow: ValueType = serde_json::from_str(&json).unwrap();
        assert!(matches!(shallow, ValueType::Sequence(_)));
        for _ in 0..100 {
            json = format!("{{\"Optional\":{json}}}");
        }
        let deep = serde_json::from_str::<ValueType>(&json).unwrap_err();
        assert!(deep.to_string().contains("nesting deeper than 64"), "{deep}");
    }
}
