//! Program-file tests: round trip with weights in place, and every flipped byte, truncation and
//! version change refused with the right section named.

use super::*;
use crate::program::{IoSpec, Step, StepKind};
use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp};
use kiln_ops::{Op, TensorType, Value, ValueType};
use kiln_tensor::{Data, Tensor};

/// y = x + w with a 64-element weight `w` (so it goes to the weights section).
fn program() -> Program {
    let w: Vec<f32> = (0..64).map(|i| i as f32 * 0.5).collect();
    let ty = ValueType::Tensor(TensorType::default());
    let mut p = Program {
        name: "add".into(),
        slot_names: vec!["x".into(), "w".into(), "y".into()],
        inputs: vec![IoSpec {
            name: "x".into(),
            slot: 0,
            ty: ty.clone(),
        }],
        outputs: vec![IoSpec {
            name: "y".into(),
            slot: 2,
            ty,
        }],
        constants: vec![(1, Value::Tensor(Tensor::from_vec(vec![64], w).unwrap()))],
        captures: vec![],
        arena: Default::default(),
        steps: vec![Step {
            name: "add0".into(),
            kind: StepKind::Op(Op::Elementwise(ElementwiseOp::Binary(Binary {
                op: BinaryOp::Add,
                legacy_axis: None,
            }))),
            inputs: vec![Some(0), Some(1)],
            outputs: vec![Some(2)],
            frees: vec![],
            plan: None,
        }],
    };
    p.compute_frees();
    p
}

fn input() -> MetaInput {
    MetaInput {
        source: "add.onnx".into(),
        options: serde_json::json!({"opt_level": 2}),
        memory: None,
        packing: None,
        shapes: Vec::new(),
        model: None,
    }
}

fn bytes() -> Vec<u8> {
    to_bytes(&program(), input()).unwrap().0
}

/// Loads `b` from an aligned copy (as a memory map would be).
fn load(b: &[u8]) -> Result<ProgramFile, FileError> {
    from_shared(Arc::new(Aligned::new(b)))
}

/// Bytes at a 64-byte aligned address, like a page-aligned memory map.
struct Aligned {
    buf: Vec<u64>,
    len: usize,
}
impl Aligned {
    fn new(b: &[u8]) -> Aligned {
        let mut buf = vec![0u64; b.len().div_ceil(8) + 8];
        let shift = (64 - (buf.as_ptr() as usize % 64)) % 64 / 8;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf[shift..]);
        bytes[..b.len()].copy_from_slice(b);
        Aligned { buf, len: b.len() }
    }
}
impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        let shift = (64 - (self.buf.as_ptr() as usize % 64)) % 64 / 8;
        &bytemuck::cast_slice(&self.buf[shift..])[..self.len]
    }
}

#[test]
fn round_trip_runs_with_weights_in_place() {
    let b = bytes();
    assert_eq!(b.len() % ALIGN, 0);
    let f = load(&b).unwrap();
    assert_eq!(f.meta.weights.count, 1);
    assert_eq!(f.meta.weights.bytes, 256);
    assert_eq!(f.meta.source, "add.onnx");
    assert_eq!(f.sections.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), SECTIONS);
    let Some((_, Value::Tensor(w))) = f.program.constants.first() else {
        panic!("constant lost")
    };
    let Data::F32(buf) = w.data() else { panic!("dtype") };
    assert!(buf.is_shared(), "the weight is read in place from the file bytes");
    assert_eq!(buf[3], 1.5);
    let x = Tensor::from_vec(vec![64], vec![1.0f32; 64]).unwrap();
    let out = crate::run(&f.program, vec![("x".into(), Value::Tensor(x))]).unwrap();
    let y = out[0].1.as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec();
    let want: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 * 0.5).collect();
    assert_eq!(y, want);
    // The decoded program equals the original.
    assert_eq!(f.program, program());
}

#[test]
fn every_flipped_byte_is_refused_naming_where() {
    let b = bytes();
    let secs = sections(&b).unwrap();
    for i in 0..b.len() {
        let mut c = b.clone();
        c[i] ^= 0x10;
        let e = match load(&c) {
            Ok(_) => panic!("byte {i} flipped and the file still loaded"),
            Err(e) => e,
        };
        let in_section = secs.iter().find(|s| (s.offset..s.offset + s.len).contains(&(i as u64)));
        match (in_section, &e) {
            (Some(s), FileError::Checksum { section, .. }) => assert_eq!(section, &s.name, "byte {i}"),
            (None, FileError::NotAProgram | FileError::Header(_)) => {}
            _ => panic!(
                "byte {i} (section {:?}): unexpected error {e}",
                in_section.map(|s| &s.name)
            ),
        }
    }
}

#[test]
fn truncation_and_other_versions_are_refused() {
    let b = bytes();
    for cut in [0, 7, 8, 63, 64, 200, b.len() - 64, b.len() - 1] {
        assert!(load(&b[..cut]).is_err(), "cut at {cut} loaded");
    }
    let mut long = b.clone();
    long.extend_from_slice(&[0u8; 64]);
    assert!(matches!(load(&long), Err(FileError::Length { .. })));
    // A file from another format version (with a valid header checksum) is refused as such.
    let other = FORMAT_VERSION + 1;
    let mut v2 = b.clone();
    v2[8..12].copy_from_slice(&other.to_le_bytes());
    v2[24..28].fill(0);
    let table_end = (HEADER_LEN + ENTRY_LEN * 3).next_multiple_of(ALIGN);
    let crc = crc32fast::hash(&v2[..table_end]);
    v2[24..28].copy_from_slice(&crc.to_le_bytes());
    let e = load(&v2).err().unwrap();
    assert!(
        matches!(e, FileError::Version { found, supported } if found == other && supported == FORMAT_VERSION),
        "{e}"
    );
    assert!(matches!(
        load(b"PK\x03\x04 not a program at all"),
        Err(FileError::NotAProgram)
    ));
}
