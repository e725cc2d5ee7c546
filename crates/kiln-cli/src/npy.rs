//! Reading and writing NumPy files for the CLI: `.npy` through `kiln::npy`, and `.npz`
//! archives (inflate through the zip crate), whose decompressed bytes are bounded before they
//! are allocated (no zip bombs).

use anyhow::{Context, Result, bail};
use kiln::Tensor;
pub use kiln::npy::{Written, parse_npy, to_npy};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Most bytes an `.npz` archive may decompress to, all entries together (4 GiB: an input of
/// 2^30 float32 elements, kiln's bound on one tensor).
pub const MAX_NPZ_BYTES: u64 = 1 << 32;

pub fn read_npy_file(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(parse_npy(&bytes).with_context(|| format!("{} is not a readable .npy file", path.display()))?)
}

/// Reads every array of an .npz archive as `(name, tensor)`, names without `.npy`.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    read_npz_from(file, &path.display().to_string(), MAX_NPZ_BYTES)
}

/// [`read_npz`] from any reader (`what` names it in messages), decompressing at most `limit`
/// bytes in all: an entry whose declared or actual size passes what is left is refused before
/// more is read.
pub fn read_npz_from<R: Read + Seek>(reader: R, what: &str, limit: u64) -> Result<Vec<(String, Tensor)>> {
    let mut zip = zip::ZipArchive::new(reader).with_context(|| format!("{what} is not an .npz (zip) archive"))?;
    let mut left = limit;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let entry = zip.by_index(i).with_context(|| format!("{what}: entry {i}"))?;
        let name = entry.name().trim_end_matches(".npy").to_string();
        let declared = entry.size();
        if declared > left {
            bail!(
                "{what}: entry '{name}' declares {declared} bytes, more than the {left} left of the archive's \
                 bound of {limit} decompressed bytes"
            );
        }
        // Never more than declared is kept, whatever the stream says; the allocation grows
        // with what is actually read.
        let mut bytes = Vec::with_capacity(usize::try_from(declared.min(1 << 26)).unwrap_or(0));
        entry
            .take(declared.saturating_add(1))
            .read_to_end(&mut bytes)
            .with_context(|| format!("{what}: entry '{name}'"))?;
        if bytes.len() as u64 > declared {
            bail!("{what}: entry '{name}' decompresses to more than the {declared} bytes it declares");
        }
        left -= bytes.len() as u64;
        let t = parse_npy(&bytes).with_context(|| format!("{what}: entry '{name}'"))?;
        out.push((name, t));
    }
    Ok(out)
}

pub fn write_npy(path: &Path, t: &Tensor) -> Result<Written> {
    let (bytes, w) = to_npy(t);
    let mut f = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(&bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(arrays: &[(String, Tensor)]) -> Vec<u8> {
        kiln::npy::npz_bytes(arrays).unwrap()
    }

    #[test]
    fn stored_archives_round_trip_within_the_bound() {
        let a = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::from_vec(vec![3], vec![7i64, 8, 9]).unwrap();
        let bytes = archive(&[("a".into(), a.clone()), ("b".into(), b.clone())]);
        let got = read_npz_from(std::io::Cursor::new(&bytes), "t.npz", 1 << 20).unwrap();
        assert_eq!(got, vec![("a".to_string(), a), ("b".to_string(), b)]);
        // The first entry alone needs more than 64 bytes: refused before it is read.
        let e = read_npz_from(std::io::Cursor::new(&bytes), "t.npz", 64).unwrap_err();
        assert!(format!("{e:#}").contains("declares"), "{e:#}");
    }

    #[test]
    fn a_deflated_bomb_is_stopped_at_the_bound() {
        // 64 MiB of zeros deflate to ~64 KiB; with a 1 MiB bound nothing past it is read.
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        w.start_file("x.npy", opts).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            w.write_all(&zeros).unwrap();
        }
        let bytes = w.finish().unwrap().into_inner();
        assert!(bytes.len() < 1 << 20);
        let e = read_npz_from(std::io::Cursor::new(&bytes), "bomb.npz", 1 << 20).unwrap_err();
        assert!(format!("{e:#}").contains("bound of 1048576"), "{e:#}");
    }
}
