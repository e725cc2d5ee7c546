//! Read-only memory maps of program files: the one place in kiln-runtime that needs `unsafe`.

use std::fs::File;

/// A whole file mapped read-only, owned so views of it can outlive the opening call.
pub struct Mapped(memmap2::Mmap);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Maps `file` read-only.
pub fn map_file(file: &File) -> std::io::Result<Mapped> {
    // SAFETY: the map is read-only and kiln never writes through it. If another process
    // truncates or rewrites the file while it is mapped, reads may see the new bytes or fault
    // (the usual mmap caveat, accepted for program files that are not modified while loaded).
    unsafe { memmap2::Mmap::map(file) }.map(Mapped)
}
