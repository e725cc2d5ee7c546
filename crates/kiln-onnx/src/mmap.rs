//! Read-only memory maps of model and external-data files: the one place in kiln-onnx that
//! needs `unsafe`.

use std::fs::File;

/// Maps a whole file read-only.
pub fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and kiln never writes through it. If another process
    // truncates or rewrites the file while it is mapped, reads may see the new bytes or fault
    // (the usual mmap caveat, accepted for model files that are not modified while loaded).
    unsafe { memmap2::Mmap::map(file) }
}
