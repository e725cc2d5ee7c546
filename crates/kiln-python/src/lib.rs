//! The `kiln._kiln` extension module behind the Python package `kiln` (`python/kiln`): qaic's
//! Session API over numpy, built by maturin (`pip install .` at the repository root).
//!
//! - `session.rs`: `kiln.Session` and `kiln.compile`;
//! - `convert.rs`: option values, numpy arrays in and out;
//! - `buffer.rs`: ndarrays read in place (the crate's only `unsafe`);
//! - `errors.rs`: the exception classes and the mapping of kiln's errors onto them.

use pyo3::prelude::*;

mod buffer;
mod convert;
mod errors;
mod session;

/// kiln's allocator, as in the `kiln` binary: freed activation buffers kept for the next
/// inference, and large blocks on 64-byte boundaries (see `kiln_kernels::alloc`).
#[global_allocator]
static ALLOC: kiln::CachingAlloc = kiln::CachingAlloc::new();

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<session::Session>()?;
    m.add_class::<session::RunOptions>()?;
    m.add_function(wrap_pyfunction!(session::compile, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
