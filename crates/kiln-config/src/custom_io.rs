//! qaic's custom I/O file (`custom_io_list_file`, and the template
//! `dump_custom_io_config_template_file` writes): a YAML list with one entry per model input
//! or output to change,
//!
//! ```yaml
//! - IOName: input          # a graph input or output, by name
//!   Layout: NHWC           # NCHW (the model's) or NHWC; rank-4 tensors only
//!   Precision: uint8       # float, float16, uint8 or int8
//!   Scale: 0.0186          # uint8 / int8: the quantization scale ...
//!   Offset: 114            # ... and zero point (default 0)
//! ```
//!
//! An 8-bit input is dequantized as it enters (`(q - Offset) * Scale`) and an 8-bit output
//! quantized as it leaves; a float16 one converted; an NHWC one transposed. Entries are
//! typed here; the graph edits are the compiler's.

use crate::error::{ConfigError, Location};
use std::path::Path;

/// One entry of the file.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CustomIoEntry {
    #[serde(rename = "IOName")]
    pub name: String,
    #[serde(rename = "Layout", default)]
    pub layout: Option<IoLayout>,
    #[serde(rename = "Precision", default)]
    pub precision: Option<IoPrecision>,
    #[serde(rename = "Scale", default)]
    pub scale: Option<f32>,
    #[serde(rename = "Offset", default)]
    pub offset: Option<i32>,
}

/// A rank-4 tensor's layout at the program's boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum IoLayout {
    #[serde(rename = "NCHW")]
    Nchw,
    #[serde(rename = "NHWC")]
    Nhwc,
}

/// A tensor's element type at the program's boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoPrecision {
    Float,
    Float16,
    Uint8,
    Int8,
}

/// Reads and checks a custom I/O file: YAML syntax, known keys and values, a positive finite
/// Scale on (and only on) 8-bit entries, an Offset within the type, each name once.
pub fn load_custom_io(path: &Path) -> Result<Vec<CustomIoEntry>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_custom_io(&text, path)
}

/// [`load_custom_io`] of text already read (`path` names it in errors).
pub fn parse_custom_io(text: &str, path: &Path) -> Result<Vec<CustomIoEntry>, ConfigError> {
    let at = |line: usize, column: usize| Location {
        file: path.to_path_buf(),
        line: u32::try_from(line).unwrap_or(u32::MAX).max(1),
        column: u32::try_from(column).unwrap_or(u32::MAX).max(1),
    };
    let entries: Vec<CustomIoEntry> = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
        ConfigError::Syntax {
            at: at(line as usize, column as usize),
            format: "custom I/O YAML",
            message: e.without_snippet().to_string(),
        }
    })?;
    let mut seen = std::collections::HashSet::new();
    for e in &entries {
        let bad = |expected: &str, found: String| ConfigError::InvalidValue {
            option: format!("custom_io_list_file entry '{}'", e.name),
            value: found,
            expected: expected.to_string(),
            at: Some(at(1, 1)),
        };
        if !seen.insert(e.name.as_str()) {
            return Err(bad("each IOName once", format!("'{}' twice", e.name)));
        }
        let eight_bit = matches!(e.precision, Some(IoPrecision::Uint8 | IoPrecision::Int8));
        match (eight_bit, e.scale) {
            (true, None) => return Err(bad("a Scale for an 8-bit Precision", "none".into())),
            (true, Some(s)) if !(s.is_finite() && s > 0.0) => {
                return Err(bad("a positive finite Scale", s.to_string()));
            }
            (false, Some(s)) => return Err(bad("Scale only with Precision uint8 or int8", s.to_string())),
            _ => {}
        }
        let range = match e.precision {
            Some(IoPrecision::Uint8) => 0..=255,
            Some(IoPrecision::Int8) => -128..=127,
            _ => 0..=0,
        };
        if let Some(o) = e.offset
            && !(eight_bit && range.contains(&o))
        {
            return Err(bad(
                "an Offset within the 8-bit Precision's range (uint8 0..255, int8 -128..127)",
                o.to_string(),
            ));
        }
    }
    Ok(entries)
}

/// The template of a model's I/O: one entry per input then output, as the model has them
/// (`layout` given for rank-4 tensors, as NCHW), to edit and pass back as
/// `custom_io_list_file`.
pub fn custom_io_template(io: &[(String, &'static str, Option<usize>)]) -> String {
    let mut out = String::from(
        "# kiln custom I/O configuration (qaic's custom_io_list_file): edit an entry's Layout\n\
         # (NCHW or NHWC, rank-4 only) or Precision (float, float16, uint8, int8; 8-bit ones take\n\
         # Scale and Offset), delete the entries to keep as they are.\n",
    );
    for (name, role, rank) in io {
        out.push_str(&format!("# {role}\n- IOName: {}\n", yaml_string(name)));
        if *rank == Some(4) {
            out.push_str("  Layout: NCHW\n");
        }
        out.push_str("  Precision: float\n");
    }
    out
}

/// `s` as a YAML scalar: double-quoted (with escapes) unless plain characters only.
fn yaml_string(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        && !s.starts_with(['-', '.'])
        && s.parse::<f64>().is_err();
    if plain { s.to_string() } else { format!("{s:?}") }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_bad_ones_are_named() {
        let p = Path::new("io.yaml");
        let ok = "- IOName: input\n  Layout: NHWC\n  Precision: uint8\n  Scale: 0.5\n  Offset: 3\n- IOName: output\n  Precision: float16\n";
        let e = parse_custom_io(ok, p).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].layout, Some(IoLayout::Nhwc));
        assert_eq!(e[0].precision, Some(IoPrecision::Uint8));
        assert_eq!((e[0].scale, e[0].offset), (Some(0.5), Some(3)));
        assert_eq!(e[1].precision, Some(IoPrecision::Float16));
        for (text, needle) in [
            ("- IOName: x\n  Precision: int8\n", "a Scale for an 8-bit Precision"),
            (
                "- IOName: x\n  Precision: int8\n  Scale: 1\n  Offset: 200\n",
                "Offset within",
            ),
            ("- IOName: x\n  Scale: 2\n", "Scale only with"),
            ("- IOName: x\n- IOName: x\n", "each IOName once"),
            ("- IOName: x\n  Layout: CHWN\n", "malformed"),
            ("- IOName: x\n  Colour: red\n", "malformed"),
        ] {
            let err = parse_custom_io(text, p).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_template_parses_back_to_the_models_io() {
        let io = vec![
            ("input.1".to_string(), "input", Some(4)),
            ("a name: with colon".to_string(), "output", Some(2)),
        ];
        let t = custom_io_template(&io);
        let e = parse_custom_io(&t, Path::new("t.yaml")).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "input.1");
        assert_eq!(e[0].layout, Some(IoLayout::Nchw));
        assert_eq!(e[1].name, "a name: with colon");
        assert_eq!(e[1].layout, None);
        assert!(e.iter().all(|x| x.precision == Some(IoPrecision::Float)));
    }
}
