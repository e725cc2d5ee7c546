//! kiln-tensor: element types, shapes and the owned [`Tensor`] every other crate exchanges.
//!
//! No I/O and no internal dependencies. Sub-byte and 8-bit float formats are kept one element
//! per byte ([`Data::Coded`]); [`formats`] converts them to and from f32.

mod buf;
mod compare;
mod dtype;
pub mod formats;
mod tensor;

pub use buf::{Buf, Plain, SharedBytes};
pub use compare::{Mismatch, compare};
pub use dtype::DType;
pub use half::{bf16, f16};
pub use smallvec;
pub use tensor::{Data, Element, MAX_ELEMENTS, Shape, Tensor, TensorError, broadcast_shapes, numel, strides_of};
