//! `Buf<T>`: element storage that is either an owned vector or a shared, read-only view of
//! bytes owned elsewhere (a memory-mapped program file), so weights are used in place.
//!
//! A shared view is created only through [`Buf::shared`], which checks alignment and length once;
//! reads then see `&[T]` like a vector. Writing through a shared view first copies it (copy on
//! write), so mapped bytes are never written.
//!
//! The third form is a [`Region`] of the run's planned arena (the memory plan's place for a
//! step's output): read and written in place like a vector of fixed length; growing it,
//! cloning it or taking it as a vector copies it out into an owned vector.

use kiln_kernels::slab::Region;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Bytes owned by something else (a memory map, a vector) that live as long as any view.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Element types whose values may be read straight from little-endian bytes.
pub trait Plain: Clone + Sized + 'static {
    /// Reinterprets `bytes` as elements when its alignment and length fit, else `None`.
    fn cast(bytes: &[u8]) -> Option<&[Self]>;
}

macro_rules! plain_pod {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            fn cast(bytes: &[u8]) -> Option<&[Self]> {
                bytemuck::try_cast_slice(bytes).ok()
            }
        }
    )*};
}
plain_pod!(f32, f64, half::f16, half::bf16, i8, i16, i32, i64, u8, u16, u32, u64);

/// `bool` and `String` have no plain byte form: they are always owned.
macro_rules! plain_never {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            fn cast(_: &[u8]) -> Option<&[Self]> {
                None
            }
        }
    )*};
}
plain_never!(bool, String);

/// Owned, shared or arena element storage; derefs to `[T]`.
pub struct Buf<T> {
    /// The elements when owned; empty while `shared` or `region` is set.
    owned: Vec<T>,
    /// A checked byte range of shared bytes holding the elements.
    shared: Option<Shared>,
    /// The elements' claimed place in the run arena.
    region: Option<Region<T>>,
}

#[derive(Clone)]
struct Shared {
    bytes: SharedBytes,
    start: usize,
    end: usize,
}

impl<T: Plain> Buf<T> {
    /// A view of `bytes[start..end]` as elements, or `None` when the range is out of bounds, not
    /// aligned for `T` or not a whole number of elements (and always for `bool`/`String`).
    pub fn shared(bytes: SharedBytes, start: usize, end: usize) -> Option<Buf<T>> {
        let all: &[u8] = (*bytes).as_ref();
        T::cast(all.get(start..end)?)?;
        Some(Buf {
            owned: Vec::new(),
            shared: Some(Shared { bytes, start, end }),
            region: None,
        })
    }

    /// Whether the elements live in a region of the run arena.
    pub fn is_region(&self) -> bool {
        self.region.is_some()
    }

    /// Whether the elements live in shared bytes (a memory map) rather than an owned vector.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The owned vector, copying a shared view first.
    pub fn make_mut(&mut self) -> &mut Vec<T> {
        if self.shared.is_some() || self.region.is_some() {
            self.owned = self.as_slice().to_vec();
            self.shared = None;
            self.region = None;
        }
        &mut self.owned
    }

    /// The elements, writable in place (a shared view is copied first; a region is not).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if self.region.is_none() {
            return self.make_mut();
        }
        match &mut self.region {
            Some(r) => r.as_mut_slice(),
            None => &mut [],
        }
    }

    /// The elements as an owned vector (no copy when already owned).
    pub fn into_vec(mut self) -> Vec<T> {
        self.make_mut();
        self.owned
    }

    /// The owned vector, or `None` for a shared view or a region (never copies).
    pub fn into_owned(self) -> Option<Vec<T>> {
        match (self.shared, self.region) {
            (None, None) => Some(self.owned),
            _ => None,
        }
    }

    pub fn extend_from_slice(&mut self, other: &[T]) {
        self.make_mut().extend_from_slice(other);
    }

    pub fn push(&mut self, x: T) {
        self.make_mut().push(x);
    }

    pub fn as_slice(&self) -> &[T] {
        if let Some(r) = &self.region {
            return r.as_slice();
        }
        match &self.shared {
            None => &self.owned,
            // `shared` checked the range and the cast; the bytes are immutable, so this holds.
            Some(s) => {
                let all: &[u8] = (*s.bytes).as_ref();
                all.get(s.start..s.end).and_then(T::cast).unwrap_or(&[])
            }
        }
    }
}

impl<T> Buf<T> {
    /// Owned storage (a plain function, so `collect()` into it infers `Vec<T>`).
    pub fn from_vec(v: Vec<T>) -> Buf<T> {
        Buf {
            owned: v,
            shared: None,
            region: None,
        }
    }

    /// Storage in a claimed region of the run arena.
    pub fn from_region(r: Region<T>) -> Buf<T> {
        Buf {
            owned: Vec::new(),
            shared: None,
            region: Some(r),
        }
    }
}

impl<T> From<Vec<T>> for Buf<T> {
    fn from(v: Vec<T>) -> Buf<T> {
        Buf::from_vec(v)
    }
}

impl<T: Plain> FromIterator<T> for Buf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Buf<T> {
        Buf::from(iter.into_iter().collect::<Vec<T>>())
    }
}

impl<'a, T: Plain> IntoIterator for &'a Buf<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl<T: Plain> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Plain> DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

/// A region is copied out into an owned vector (a claim has one owner).
impl<T: Plain> Clone for Buf<T> {
    fn clone(&self) -> Buf<T> {
        match &self.region {
            Some(r) => Buf::from_vec(r.as_slice().to_vec()),
            None => Buf {
                owned: self.owned.clone(),
                shared: self.shared.clone(),
                region: None,
            },
        }
    }
}

impl<T: Plain + fmt::Debug> fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl<T: Plain + PartialEq> PartialEq for Buf<T> {
    fn eq(&self, other: &Buf<T>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Plain + serde::Serialize> serde::Serialize for Buf<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(s)
    }
}

impl<'de, T: Plain + serde::Deserialize<'de>> serde::Deserialize<'de> for Buf<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Buf<T>, D::Error> {
        Vec::<T>::deserialize(d).map(Buf::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(v: &[f32]) -> SharedBytes {
        // A Vec<f32> viewed as bytes is 4-byte aligned.
        let mut b = Vec::with_capacity(v.len() * 4 + 64);
        b.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        Arc::new(AlignedBytes(b))
    }

    struct AlignedBytes(Vec<u8>);
    impl AsRef<[u8]> for AlignedBytes {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    #[test]
    fn shared_view_reads_and_copies_on_write() {
        let bytes = bytes_of(&[1.0, 2.0, 3.0, 4.0]);
        let aligned = (*bytes).as_ref().as_ptr() as usize % 4 == 0;
        if !aligned {
            return; // the allocator gave an unaligned byte vector: nothing to view
        }
        let mut b = Buf::<f32>::shared(bytes.clone(), 4, 12).expect("aligned view");
        assert!(b.is_shared());
        assert_eq!(&*b, &[2.0, 3.0]);
        let c = b.clone();
        b[0] = 9.0;
        assert!(!b.is_shared());
        assert_eq!(&*b, &[9.0, 3.0]);
        assert_eq!(&*c, &[2.0, 3.0], "the clone still reads the untouched bytes");
    }

    #[test]
    fn bad_views_are_refused() {
        let bytes = bytes_of(&[1.0, 2.0]);
        assert!(Buf::<f32>::shared(bytes.clone(), 0, 12).is_none(), "out of range");
        assert!(Buf::<f32>::shared(bytes.clone(), 0, 6).is_none(), "partial element");
        assert!(Buf::<f32>::shared(bytes.clone(), 1, 5).is_none(), "misaligned");
        assert!(
            Buf::<bool>::shared(bytes.clone(), 0, 4).is_none(),
            "bool is never shared"
        );
        assert!(Buf::<String>::shared(bytes, 0, 0).is_none(), "String is never shared");
    }
}
