//! numpy arrays read in place: the bytes of a C-contiguous, aligned, native-order ndarray seen
//! as kiln [`SharedBytes`] for as long as any tensor views them. The one place the bindings use
//! `unsafe`, for the same reason as the mmap loaders: bytes owned by something else.
//!
//! The view keeps a reference to the array, so numpy never frees the buffer under it; the
//! caller ([`crate::convert`]) marks a user's array read-only for the duration of the run, so
//! Python code cannot write it either while kiln reads it (`ReadOnlyHolds`).

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::sync::Arc;

/// The bytes of one ndarray, kept alive by a reference to it.
pub(crate) struct ArrayBytes {
    /// Keeps the array (and so its buffer) alive; never read.
    _owner: Py<PyAny>,
    /// The buffer's address, as an integer so the view is `Send + Sync` (see the impls below).
    addr: usize,
    len: usize,
}

impl ArrayBytes {
    /// The bytes of `array`, which must be C-contiguous and aligned (checked: `None` when it is
    /// not); `len` is `nbytes`.
    pub(crate) fn of(array: &Bound<'_, PyUntypedArray>) -> Option<ArrayBytes> {
        if !array.is_c_contiguous() || !array.is_aligned() {
            return None;
        }
        let itemsize = array.dtype().itemsize();
        let len = array.len().checked_mul(itemsize)?;
        // SAFETY: `as_array_ptr` points at the live PyArrayObject `array` borrows, and the
        // thread is attached to the interpreter (`array` is a `Bound`), which is all
        // `_PyArray_GET_ITEM_DATA` asks; reading the `data` field is a plain field read.
        let data = unsafe { (*numpy::npyffi::objects::_PyArray_GET_ITEM_DATA(array.as_array_ptr())).data };
        let addr = if len == 0 { 0 } else { data as usize };
        Some(ArrayBytes {
            _owner: array.clone().into_any().unbind(),
            addr,
            len,
        })
    }

    pub(crate) fn into_shared(self) -> kiln::SharedBytes {
        Arc::new(self)
    }
}

impl AsRef<[u8]> for ArrayBytes {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 || self.addr == 0 {
            return &[];
        }
        // SAFETY: `addr..addr + len` is the buffer of a C-contiguous ndarray (`of` checked the
        // flags and computed `len` as its nbytes). `_owner` holds a strong reference to the array,
        // so numpy keeps the buffer allocated while `self` lives; the array cannot be resized
        // while referenced (numpy refuses `resize` on a referenced array). Writes from Python are
        // excluded for the run by marking the array read-only (`convert::ReadOnlyHolds`), and
        // kiln never writes through a shared view (copy on write, `kiln_tensor::Buf`).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}
