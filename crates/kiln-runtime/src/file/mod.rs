//! The program file (`.kiln`): a compiled Program with its weights, ready to memory-map.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! header  64 bytes   magic "KILNPROG", format version u32, section count u32, file length u64,
//!                    header checksum u32 (CRC-32 of header + table with this field zeroed), zeros
//! table   32 bytes   per section: name (12 bytes, zero-padded ASCII), CRC-32 u32, offset u64,
//!                    length u64
//! (zeros to the next 64-byte boundary; covered by the header checksum)
//! sections           each at a 64-byte aligned offset, contiguous, the last one ending the file;
//!                    each length includes its zero padding, covered by its checksum
//!   meta     JSON    format version, compiler version, content hash, I/O signature, resolved
//!                    compile options, weight packing, memory plan summary
//!   program  postcard  the Program; tensor constants refer into `weights`
//!   weights  raw     tensors, each 64-byte aligned, used in place from the memory map
//!                    (identical tensors of the programs below are stored once)
//! optional sections, for a model with symbolic input dims:
//!   shapes   postcard  the programs compiled for the shape sets listed at compile time, each
//!                      with its symbol bindings; their tensor constants refer into `weights`
//!   source   raw     the ONNX model the programs came from, so that a session can compile a
//!                    program for input shapes no stored program has (`meta.source` says how)
//! ```
//!
//! Every byte of a file is covered by exactly one checksum, so a flipped byte anywhere is
//! refused at load with the section named. Decoding never trusts a length before checking it
//! against the file, and recursive structures have a nesting bound.

mod consts;
pub mod mmap;

pub(crate) use consts::{deserialize as deserialize_constants, serialize as serialize_constants};

use crate::program::Program;
use consts::{ALIGN, Context};
use kiln_tensor::SharedBytes;
use std::path::Path;
use std::sync::Arc;

pub const MAGIC: [u8; 8] = *b"KILNPROG";
/// Version of the layout and of the program encoding; files of another version are refused.
pub const FORMAT_VERSION: u32 = 12;
const HEADER_LEN: usize = 64;
const ENTRY_LEN: usize = 32;
const NAME_LEN: usize = 12;
const SECTIONS: [&str; 3] = ["meta", "program", "weights"];
/// Optional sections, in the order they follow the required ones.
const SHAPES: &str = "shapes";
const SOURCE: &str = "source";
/// Packing of the weights section today: each tensor dense, row-major, as the kernels read it.
pub const WEIGHT_PACKING: &str = "row-major/v1 (dense, unpacked)";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The cause is part of the message (not a `source()`), so chain-printing callers show it once.
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("not a kiln program file (the first bytes are not the KILNPROG magic)")]
    NotAProgram,
    #[error(
        "program file format version {found} is not supported by this kiln (reads version {supported}); recompile the model with this kiln"
    )]
    Version { found: u32, supported: u32 },
    #[error("program file is truncated or padded: {got} bytes, the header says {expected}")]
    Length { got: u64, expected: u64 },
    #[error("program file header is corrupted: {0}")]
    Header(String),
    #[error("section '{section}' is corrupted: checksum {computed:08x}, stored {stored:08x}")]
    Checksum {
        section: String,
        stored: u32,
        computed: u32,
    },
    #[error("section '{section}' cannot be decoded: {message}")]
    Decode { section: String, message: String },
    #[error("cannot encode the program: {0}")]
    Encode(String),
}

/// What the meta section records (shown by `kiln info`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    pub format_version: u32,
    /// The compiler that wrote the file, e.g. `kiln 0.1.0`.
    pub compiler: String,
    /// BLAKE3 of the program and weights sections: the identity of the compiled content.
    pub content_hash: String,
    /// The model file it was compiled from (file name only).
    pub source: String,
    pub inputs: Vec<IoMeta>,
    pub outputs: Vec<IoMeta>,
    /// The resolved compile options, as given to the compiler.
    pub options: serde_json::Value,
    pub weights: WeightsMeta,
    /// The memory plan summary, when planned.
    pub memory: Option<serde_json::Value>,
    /// Symbol bindings of the shape-specialised programs stored beside the generic one.
    #[serde(default)]
    pub shape_sets: Vec<Vec<(String, u64)>>,
    /// How the embedded model source (the `source` section) is compiled again for new shapes.
    #[serde(default)]
    pub specialize: Option<SourceMeta>,
}

/// What a session needs to compile the embedded ONNX model for new input shapes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourceMeta {
    /// Length of the ONNX bytes in the `source` section (the rest is padding).
    pub bytes: u64,
    /// Symbols the user bound at compile time (`onnx_define_symbol`), bound again on import.
    pub symbols: Vec<(String, u64)>,
    /// The compiler options, as the compiler serialises them.
    pub compile: serde_json::Value,
}

/// A program compiled for one set of symbol bindings (`shape_specializations`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShapeProgram {
    /// Each symbol of the model's inputs and its size, sorted by name.
    pub bindings: Vec<(String, u64)>,
    #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
    pub program: Program,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoMeta {
    pub name: String,
    /// The static type, as printed (e.g. `tensor(float)[batch,3,224,224]`).
    pub ty: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WeightsMeta {
    pub count: usize,
    pub bytes: u64,
    pub packing: String,
    pub alignment: usize,
}

/// One entry of the section table.
#[derive(Debug, Clone, PartialEq)]
pub struct SectionInfo {
    pub name: String,
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
}

/// A loaded program file.
pub struct ProgramFile {
    pub program: Program,
    /// Programs specialised for the shape sets given at compile time.
    pub shapes: Vec<ShapeProgram>,
    /// The embedded ONNX model (`meta.specialize` says how to compile it), viewed in the map.
    pub source: Option<SourceBytes>,
    pub meta: Meta,
    pub sections: Vec<SectionInfo>,
    /// Total file size in bytes.
    pub size: u64,
}

/// What the caller supplies for the meta section.
pub struct MetaInput {
    pub source: String,
    pub options: serde_json::Value,
    pub memory: Option<serde_json::Value>,
    /// How the weights are packed, when some are packed for the kernels (else row-major).
    pub packing: Option<String>,
    /// Programs for the shape sets given at compile time.
    pub shapes: Vec<ShapeProgram>,
    /// The ONNX model's bytes and how to compile them again, for a model with symbolic dims.
    pub model: Option<(Vec<u8>, SourceMeta)>,
}

/// The embedded ONNX model's bytes, a range of the shared file bytes.
#[derive(Clone)]
pub struct SourceBytes {
    bytes: SharedBytes,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for SourceBytes {
    fn as_ref(&self) -> &[u8] {
        (*self.bytes).as_ref().get(self.start..self.end).unwrap_or(&[])
    }
}

impl std::fmt::Debug for SourceBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SourceBytes({} bytes)", self.end - self.start)
    }
}

/// Encodes a program and its weights into program-file bytes.
pub fn to_bytes(program: &Program, input: MetaInput) -> Result<(Vec<u8>, Meta), FileError> {
    let ctx = Context::Write {
        weights: Vec::new(),
        count: 0,
        seen: std::collections::HashMap::new(),
    };
    let ((encoded, shapes), ctx) = consts::with_context(ctx, || {
        let shapes = (!input.shapes.is_empty()).then(|| postcard::to_allocvec(&input.shapes));
        (postcard::to_allocvec(program), shapes)
    });
    let encoded = encoded.map_err(|e| FileError::Encode(e.to_string()))?;
    let shapes = shapes.transpose().map_err(|e| FileError::Encode(e.to_string()))?;
    let Some(Context::Write { weights, count, .. }) = ctx else {
        return Err(FileError::Encode("weight collection was lost".into()));
    };
    let mut hasher = blake3::Hasher::new();
    hasher.update(&encoded);
    hasher.update(&weights);
    if let Some(s) = &shapes {
        hasher.update(s);
    }
    if let Some((bytes, _)) = &input.model {
        hasher.update(bytes);
    }
    let io = |specs: &[crate::program::IoSpec]| {
        specs
            .iter()
            .map(|s| IoMeta {
                name: s.name.clone(),
                ty: s.ty.to_string(),
            })
            .collect()
    };
    let meta = Meta {
        format_version: FORMAT_VERSION,
        compiler: format!("kiln {}", env!("CARGO_PKG_VERSION")),
        content_hash: hasher.finalize().to_hex().to_string(),
        source: input.source,
        inputs: io(&program.inputs),
        outputs: io(&program.outputs),
        options: input.options,
        weights: WeightsMeta {
            count,
            bytes: weights.len() as u64,
            packing: input.packing.unwrap_or_else(|| WEIGHT_PACKING.into()),
            alignment: ALIGN,
        },
        memory: input.memory,
        shape_sets: input.shapes.iter().map(|s| s.bindings.clone()).collect(),
        specialize: input.model.as_ref().map(|(_, m)| m.clone()),
    };
    let meta_json = serde_json::to_vec_pretty(&meta).map_err(|e| FileError::Encode(e.to_string()))?;
    let mut sections: Vec<(&str, &[u8])> = vec![
        (SECTIONS[0], &meta_json),
        (SECTIONS[1], &encoded),
        (SECTIONS[2], &weights),
    ];
    if let Some(s) = &shapes {
        sections.push((SHAPES, s));
    }
    if let Some((bytes, _)) = &input.model {
        sections.push((SOURCE, bytes));
    }
    Ok((assemble(&sections), meta))
}

/// A complete file from raw meta, program and weights section bodies, checksums computed (for
/// tools that build files from parts, such as the program-file fuzz target).
pub fn assemble_sections(meta: &[u8], program: &[u8], weights: &[u8]) -> Vec<u8> {
    assemble(&[(SECTIONS[0], meta), (SECTIONS[1], program), (SECTIONS[2], weights)])
}

/// Lays out header, table and sections.
fn assemble(bodies: &[(&str, &[u8])]) -> Vec<u8> {
    let table_end = HEADER_LEN + ENTRY_LEN * bodies.len();
    let mut offset = table_end.next_multiple_of(ALIGN);
    let mut entries = Vec::new();
    for (name, body) in bodies {
        let len = body.len().next_multiple_of(ALIGN);
        entries.push((name, offset, len));
        offset += len;
    }
    let total = offset;
    let mut out = vec![0u8; total];
    out[..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(bodies.len() as u32).to_le_bytes());
    out[16..24].copy_from_slice(&(total as u64).to_le_bytes());
    for (i, ((name, off, len), (_, body))) in entries.iter().zip(bodies).enumerate() {
        out[*off..*off + body.len()].copy_from_slice(body);
        let crc = crc32fast::hash(&out[*off..*off + *len]);
        let e = HEADER_LEN + i * ENTRY_LEN;
        out[e..e + name.len()].copy_from_slice(name.as_bytes());
        out[e + 12..e + 16].copy_from_slice(&crc.to_le_bytes());
        out[e + 16..e + 24].copy_from_slice(&(*off as u64).to_le_bytes());
        out[e + 24..e + 32].copy_from_slice(&(*len as u64).to_le_bytes());
    }
    let crc = crc32fast::hash(&out[..table_end.next_multiple_of(ALIGN)]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Writes a program file (through a temporary file renamed into place).
pub fn write(path: &Path, program: &Program, input: MetaInput) -> Result<Meta, FileError> {
    let (bytes, meta) = to_bytes(program, input)?;
    let io = |cause| FileError::Io {
        path: path.display().to_string(),
        cause,
    };
    let tmp = path.with_extension("kiln.partial");
    std::fs::write(&tmp, &bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(meta)
}

/// Opens and memory-maps a program file; weights are used in place from the map.
pub fn read(path: &Path) -> Result<ProgramFile, FileError> {
    let io = |cause| FileError::Io {
        path: path.display().to_string(),
        cause,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        return Err(FileError::NotAProgram);
    }
    let map = mmap::map_file(&file).map_err(io)?;
    from_shared(Arc::new(map))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// Reads the sections of a file's bytes (checked), without decoding them.
pub fn sections(b: &[u8]) -> Result<Vec<SectionInfo>, FileError> {
    if b.len() < 8 || b.get(..8) != Some(&MAGIC[..]) {
        return Err(FileError::NotAProgram);
    }
    if b.len() < HEADER_LEN {
        return Err(FileError::Length {
            got: b.len() as u64,
            expected: HEADER_LEN as u64,
        });
    }
    let version = u32_at(b, 8);
    let count = u32_at(b, 12) as usize;
    let expected = u64_at(b, 16);
    let stored = u32_at(b, 24);
    // The header checksum first: a flipped version or length byte is corruption, not a version.
    let table_end = count
        .checked_mul(ENTRY_LEN)
        .and_then(|t| t.checked_add(HEADER_LEN))
        .map(|t| t.next_multiple_of(ALIGN));
    let header_ok = table_end.and_then(|t| b.get(..t)).map(|h| {
        let mut h = h.to_vec();
        h[24..28].fill(0);
        crc32fast::hash(&h) == stored
    });
    if expected != b.len() as u64 && header_ok == Some(true) {
        return Err(FileError::Length {
            got: b.len() as u64,
            expected,
        });
    }
    if header_ok != Some(true) {
        return Err(FileError::Header(
            "header checksum mismatch (the header or section table was modified)".into(),
        ));
    }
    if version != FORMAT_VERSION {
        return Err(FileError::Version {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if b.get(28..HEADER_LEN).is_some_and(|r| r.iter().any(|&x| x != 0)) {
        return Err(FileError::Header("reserved header bytes are not zero".into()));
    }
    let mut out = Vec::with_capacity(count.min(16));
    let mut next = table_end.unwrap_or(HEADER_LEN) as u64;
    for i in 0..count {
        let e = HEADER_LEN + i * ENTRY_LEN;
        let raw = b.get(e..e + NAME_LEN).unwrap_or(&[]);
        let name_end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
        let name = String::from_utf8_lossy(raw.get(..name_end).unwrap_or(&[])).into_owned();
        let s = SectionInfo {
            name,
            crc: u32_at(b, e + 12),
            offset: u64_at(b, e + 16),
            len: u64_at(b, e + 24),
        };
        if s.offset != next || s.len % ALIGN as u64 != 0 {
            return Err(FileError::Header(format!(
                "section '{}' at offset {} (+{}) does not follow the previous one at {next}",
                s.name, s.offset, s.len
            )));
        }
        next = s.offset.saturating_add(s.len);
        out.push(s);
    }
    if next != b.len() as u64 {
        return Err(FileError::Header(format!(
            "sections end at byte {next} but the file has {} bytes",
            b.len()
        )));
    }
    for s in &out {
        let body = b.get(s.offset as usize..(s.offset + s.len) as usize).unwrap_or(&[]);
        let computed = crc32fast::hash(body);
        if computed != s.crc {
            return Err(FileError::Checksum {
                section: s.name.clone(),
                stored: s.crc,
                computed,
            });
        }
    }
    Ok(out)
}

/// Decodes a program file held in shared bytes (a memory map or a buffer).
pub fn from_shared(bytes: SharedBytes) -> Result<ProgramFile, FileError> {
    let all: &[u8] = (*bytes).as_ref();
    let secs = sections(all)?;
    let find = |name: &str| {
        secs.iter().find(|s| s.name == name).ok_or_else(|| FileError::Decode {
            section: name.into(),
            message: "the section is missing".into(),
        })
    };
    let body = |s: &SectionInfo| all.get(s.offset as usize..(s.offset + s.len) as usize).unwrap_or(&[]);
    let meta_s = find("meta")?;
    let meta_text = body(meta_s);
    let meta_text = &meta_text[..meta_text.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1)];
    let meta: Meta = serde_json::from_slice(meta_text).map_err(|e| FileError::Decode {
        section: "meta".into(),
        message: e.to_string(),
    })?;
    if meta.format_version != FORMAT_VERSION {
        return Err(FileError::Version {
            found: meta.format_version,
            supported: FORMAT_VERSION,
        });
    }
    let prog_s = find("program")?;
    let weights_s = find("weights")?;
    let ctx = Context::Read {
        bytes: bytes.clone(),
        start: weights_s.offset as usize,
        end: (weights_s.offset + weights_s.len) as usize,
    };
    let encoded = body(prog_s);
    // postcard stops at the end of the value; the rest of the section is padding.
    let (program, _) = consts::with_context(ctx, || postcard::take_from_bytes::<Program>(encoded));
    let (program, rest) = program.map_err(|e| FileError::Decode {
        section: "program".into(),
        message: e.to_string(),
    })?;
    if rest.len() >= ALIGN || rest.iter().any(|&c| c != 0) {
        return Err(FileError::Decode {
            section: "program".into(),
            message: format!("{} unexpected bytes after the program", rest.len()),
        });
    }
    program.validate().map_err(|(step, e)| FileError::Decode {
        section: "program".into(),
        message: format!("step '{step}': {e}"),
    })?;
    let shapes = match secs.iter().find(|s| s.name == SHAPES) {
        None => Vec::new(),
        Some(s) => {
            let ctx = Context::Read {
                bytes: bytes.clone(),
                start: weights_s.offset as usize,
                end: (weights_s.offset + weights_s.len) as usize,
            };
            let decode = |message: String| FileError::Decode {
                section: SHAPES.into(),
                message,
            };
            let (shapes, _) = consts::with_context(ctx, || postcard::take_from_bytes::<Vec<ShapeProgram>>(body(s)));
            let (shapes, _) = shapes.map_err(|e| decode(e.to_string()))?;
            for sp in &shapes {
                sp.program
                    .validate()
                    .map_err(|(step, e)| decode(format!("step '{step}': {e}")))?;
            }
            shapes
        }
    };
    let source = match (secs.iter().find(|s| s.name == SOURCE), &meta.specialize) {
        (None, None) => None,
        (Some(s), Some(m)) if m.bytes <= s.len => Some(SourceBytes {
            bytes: bytes.clone(),
            start: s.offset as usize,
            end: (s.offset + m.bytes) as usize,
        }),
        (s, _) => {
            return Err(FileError::Decode {
                section: SOURCE.into(),
                message: match s {
                    Some(s) => format!("the meta section gives no length of {} bytes or less", s.len),
                    None => "the meta section describes a source the file does not have".into(),
                },
            });
        }
    };
    Ok(ProgramFile {
        program,
        shapes,
        source,
        meta,
        sections: secs,
        size: all.len() as u64,
    })
}

#[cfg(test)]
mod tests;
