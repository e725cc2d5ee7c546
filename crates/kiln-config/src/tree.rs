//! Configuration files as a tree with positions: YAML (and JSON, a subset of it) parsed by
//! serde-saphyr into `Node`s that keep each key's and value's line and column and the order of
//! keys; and a JSON writer for such trees (indent 4, key order kept) used to export
//! backend-extension files losslessly.

use crate::error::{ConfigError, Location};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;
use serde_saphyr::Spanned;
use std::fmt;
use std::path::Path;

/// A parsed value and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: NodeValue,
    pub line: u32,
    pub column: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeValue {
    Scalar(Value),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// A mapping key and where it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub line: u32,
    pub column: u32,
}

impl Node {
    pub fn at(&self, file: &Path) -> Location {
        Location {
            file: file.to_path_buf(),
            line: self.line,
            column: self.column,
        }
    }

    /// The value as plain JSON (mapping order is not kept).
    pub fn to_json(&self) -> Value {
        match &self.value {
            NodeValue::Scalar(v) => v.clone(),
            NodeValue::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeValue::Map(entries) => {
                Value::Object(entries.iter().map(|(k, v)| (k.name.clone(), v.to_json())).collect())
            }
        }
    }

    /// The value as an ordered document (for lossless export).
    pub fn to_doc(&self) -> Doc {
        match &self.value {
            NodeValue::Scalar(v) => Doc::Scalar(v.clone()),
            NodeValue::Seq(items) => Doc::Seq(items.iter().map(Node::to_doc).collect()),
            NodeValue::Map(entries) => Doc::Map(entries.iter().map(|(k, v)| (k.name.clone(), v.to_doc())).collect()),
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match &self.value {
            NodeValue::Scalar(Value::Null) => "null",
            NodeValue::Scalar(_) => "a scalar",
            NodeValue::Seq(_) => "a list",
            NodeValue::Map(_) => "a mapping",
        }
    }
}

/// Renders a value compactly, cut to a readable length.
pub fn render_json(v: &Value) -> String {
    let s = serde_json::to_string(v).unwrap_or_default();
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// The format of a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// JSON for `.json` files and for text starting with `{`; YAML otherwise.
    pub fn detect(path: &Path, text: &str) -> Format {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("json") => Format::Json,
            Some("yaml" | "yml") => Format::Yaml,
            _ if text.trim_start().starts_with('{') => Format::Json,
            _ => Format::Yaml,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Yaml => "YAML",
            Format::Json => "JSON",
        }
    }
}

/// Parses a file's text. JSON is checked strictly first (YAML would accept a trailing comma).
pub fn parse(text: &str, path: &Path, format: Format) -> Result<Node, ConfigError> {
    if format == Format::Json
        && let Err(e) = serde_json::from_str::<Value>(text)
    {
        let message = e.to_string();
        let message = match message.rfind(" at line ") {
            Some(i) => message[..i].to_string(),
            None => message,
        };
        return Err(ConfigError::Syntax {
            at: Location {
                file: path.to_path_buf(),
                line: u32::try_from(e.line()).unwrap_or(u32::MAX),
                column: u32::try_from(e.column()).unwrap_or(u32::MAX),
            },
            format: format.name(),
            message,
        });
    }
    serde_saphyr::from_str::<Node>(text).map_err(|e| {
        let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
        ConfigError::Syntax {
            at: Location {
                file: path.to_path_buf(),
                line: pos(line).max(1),
                column: pos(column).max(1),
            },
            format: format.name(),
            message: strip_position(&e.without_snippet().to_string()),
        }
    })
}

fn pos(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// serde-saphyr's message without its "error: line L column C: " prefix.
fn strip_position(s: &str) -> String {
    let first = s.lines().next().unwrap_or(s);
    let rest = first.strip_prefix("error: ").unwrap_or(first);
    let rest = match rest.find(": ") {
        Some(i) if rest.starts_with("line ") => &rest[i + 2..],
        _ => rest,
    };
    match rest.rfind(" at line ") {
        Some(i) => rest[..i].to_string(),
        None => rest.to_string(),
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Spanned::<NodeValue>::deserialize(d)?;
        Ok(Node {
            line: pos(s.referenced.line()),
            column: pos(s.referenced.column()),
            value: s.value,
        })
    }
}

impl<'de> Deserialize<'de> for NodeValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = NodeValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_unit<E>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::Null))
    }
    fn visit_none<E>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<NodeValue, D::Error> {
        NodeValue::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::from(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<NodeValue, E> {
        serde_json::Number::from_f64(v)
            .map(|n| NodeValue::Scalar(Value::Number(n)))
            .ok_or_else(|| E::custom(format!("{v} is not a finite number")))
    }
    fn visit_str<E>(self, v: &str) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<NodeValue, E> {
        Ok(NodeValue::Scalar(Value::String(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<NodeValue, A::Error> {
        let mut items = Vec::new();
        while let Some(n) = a.next_element::<Node>()? {
            items.push(n);
        }
        Ok(NodeValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<NodeValue, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = a.next_key::<Spanned<String>>()? {
            let v = a.next_value::<Node>()?;
            let key = Key {
                name: k.value,
                line: pos(k.referenced.line()),
                column: pos(k.referenced.column()),
            };
            entries.push((key, v));
        }
        Ok(NodeValue::Map(entries))
    }
}

/// An ordered JSON document: mappings keep their key order, numbers their written form
/// (`3` stays an integer, `3.0` a float).
#[derive(Debug, Clone, PartialEq)]
pub enum Doc {
    Scalar(Value),
    Seq(Vec<Doc>),
    Map(Vec<(String, Doc)>),
}

impl Doc {
    /// JSON text with 4-space indentation, the layout of Python's `json.dumps(indent=4)`.
    pub fn to_json_pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |out: &mut String, d: usize| {
            for _ in 0..d {
                out.push_str("    ");
            }
        };
        match self {
            Doc::Scalar(v) => out.push_str(&serde_json::to_string(v).unwrap_or_else(|_| "null".into())),
            Doc::Seq(items) if items.is_empty() => out.push_str("[]"),
            Doc::Map(entries) if entries.is_empty() => out.push_str("{}"),
            Doc::Seq(items) => {
                out.push_str("[\n");
                for (i, it) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    it.write(out, depth + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, depth);
                out.push(']');
            }
            Doc::Map(entries) => {
                out.push_str("{\n");
                for (i, (k, v)) in entries.iter().enumerate() {
                    pad(out, depth + 1);
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                    out.push_str(": ");
                    v.write(out, depth + 1);
                    out.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
                }
                pad(out, depth);
                out.push('}');
            }
        }
    }

    /// Plain JSON (mapping order is not kept).
    pub fn to_json(&self) -> Value {
        match self {
            Doc::Scalar(v) => v.clone(),
            Doc::Seq(items) => Value::Array(items.iter().map(Doc::to_json).collect()),
            Doc::Map(entries) => Value::Object(entries.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }

    pub fn from_json(v: &Value) -> Doc {
        match v {
            Value::Array(items) => Doc::Seq(items.iter().map(Doc::from_json).collect()),
            Value::Object(m) => Doc::Map(m.iter().map(|(k, v)| (k.clone(), Doc::from_json(v))).collect()),
            other => Doc::Scalar(other.clone()),
        }
    }
}

impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Doc::Scalar(v) => v.serialize(s),
            Doc::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for it in items {
                    seq.serialize_element(it)?;
                }
                seq.end()
            }
            Doc::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct DocVisitor;
        impl<'de> Visitor<'de> for DocVisitor {
            type Value = Doc;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Doc, E> {
                Ok(Doc::Scalar(Value::Null))
            }
            fn visit_none<E>(self) -> Result<Doc, E> {
                Ok(Doc::Scalar(Value::Null))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Doc, E> {
                Ok(Doc::Scalar(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Doc, E> {
                Ok(Doc::Scalar(Value::from(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Doc, E> {
                Ok(Doc::Scalar(Value::from(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Doc, E> {
                Ok(Doc::Scalar(
                    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
                ))
            }
            fn visit_str<E>(self, v: &str) -> Result<Doc, E> {
                Ok(Doc::Scalar(Value::String(v.to_string())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Doc, A::Error> {
                let mut items = Vec::new();
                while let Some(x) = a.next_element::<Doc>()? {
                    items.push(x);
                }
                Ok(Doc::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Doc, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Doc>()? {
                    entries.push((k, v));
                }
                Ok(Doc::Map(entries))
            }
        }
        d.deserialize_any(DocVisitor)
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn yaml_keeps_positions_and_order() {
        let n = parse("b: 1\na:\n  x: [1, 2]\n", Path::new("f.yaml"), Format::Yaml).unwrap_or_else(|e| panic!("{e}"));
        let NodeValue::Map(entries) = &n.value else {
            panic!("not a map")
        };
        let keys: Vec<(&str, u32, u32)> = entries
            .iter()
            .map(|(k, _)| (k.name.as_str(), k.line, k.column))
            .collect();
        assert_eq!(keys, vec![("b", 1, 1), ("a", 2, 1)]);
        assert_eq!((entries[1].1.line, entries[1].1.column), (3, 3));
    }

    #[test]
    fn strict_json_rejects_a_trailing_comma_with_its_position() {
        let e = parse("{\n  \"a\": 1,\n}", Path::new("f.json"), Format::Json)
            .err()
            .map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("f.json:3:1: malformed JSON: trailing comma"));
    }

    #[test]
    fn pretty_json_matches_python_indent_4() {
        let text = "{\n    \"a\": [\n        1,\n        2.5\n    ],\n    \"b\": {},\n    \"c\": []\n}\n";
        let n = parse(text, Path::new("f.json"), Format::Json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n.to_doc().to_json_pretty(), text);
    }
}
