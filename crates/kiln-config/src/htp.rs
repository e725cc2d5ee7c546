//! HTP backend-extension files (the JSON `qnn-context-binary-generator` reads: `context`,
//! `graphs`, `devices[].cores`, `memory`, `groupContext`): the imported document kept in key
//! order for a lossless export, the place of each option in it, and export back to JSON.

use crate::config::Config;
use crate::error::Source;
use crate::kind::Kind;
use crate::registry::{self, Scope};
use crate::tree::Doc;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// An imported backend-extension document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendExtensions {
    /// The file it came from.
    pub path: PathBuf,
    /// Kept as-is: neither validated nor applied to the configuration.
    pub passthrough: bool,
    /// The document, in its key order, with the values as written (unknown fields included).
    pub doc: Doc,
    /// Where each option read from the document sits in it.
    #[serde(skip)]
    pub(crate) bindings: Vec<Binding>,
}

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    Key(String),
    Index(usize),
}

/// An option read from the document at this path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Binding {
    pub path: Vec<Step>,
    pub option: String,
}

/// The backend-extension document of a configuration (see `Config::to_backend_extension_json`).
pub fn export(c: &Config) -> Doc {
    match &c.backend_extensions {
        Some(be) if be.passthrough => be.doc.clone(),
        Some(be) => {
            let mut doc = be.doc.clone();
            for b in &be.bindings {
                let from_this_file =
                    matches!(c.sources.get(&b.option), Some(Source::File { at, .. }) if at.file == be.path);
                if from_this_file {
                    continue;
                }
                let (Some(spec), Some(value)) = (registry::option(&b.option), c.get(&b.option)) else {
                    continue;
                };
                if let Some(slot) = find(&mut doc, &b.path) {
                    let written = match &*slot {
                        Doc::Scalar(v) => spec.kind.normalize(v).ok(),
                        other => spec.kind.normalize(&other.to_json()).ok(),
                    };
                    if written.as_ref() != Some(&value) {
                        let as_int = matches!(&*slot, Doc::Scalar(Value::Number(_)));
                        *slot = Doc::from_json(&htp_value(&spec.kind, value, as_int));
                    }
                }
            }
            doc
        }
        None => build(c),
    }
}

/// HTP writes flags such as `fp16_relaxed_precision` and `dlbc` as 0/1.
fn htp_value(kind: &Kind, v: Value, as_int: bool) -> Value {
    match (kind, &v) {
        (Kind::Bit, Value::Bool(b)) if as_int => Value::from(u8::from(*b)),
        _ => v,
    }
}

fn find<'a>(doc: &'a mut Doc, path: &[Step]) -> Option<&'a mut Doc> {
    let Some((first, rest)) = path.split_first() else {
        return Some(doc);
    };
    let next = match (doc, first) {
        (Doc::Map(entries), Step::Key(k)) => entries.iter_mut().find(|(name, _)| name == k).map(|(_, v)| v),
        (Doc::Seq(items), Step::Index(i)) => items.get_mut(*i),
        _ => None,
    }?;
    find(next, rest)
}

/// A document from the HTP options set away from their defaults, in the layout
/// `HtpConfigHelper.to_backend_extension_dict` writes.
fn build(c: &Config) -> Doc {
    let mut sections: Vec<(Scope, Vec<(String, Doc)>)> = [
        Scope::HtpContext,
        Scope::HtpGraph,
        Scope::HtpDevice,
        Scope::HtpCore,
        Scope::HtpMemory,
        Scope::HtpGroupContext,
    ]
    .into_iter()
    .map(|s| (s, Vec::new()))
    .collect();
    for (spec, value, _) in c.changed() {
        if let Some((scope, key)) = spec.htp_key()
            && let Some((_, entries)) = sections.iter_mut().find(|(s, _)| *s == scope)
        {
            entries.push((key.to_string(), Doc::from_json(&htp_value(&spec.kind, value, true))));
        }
    }
    let mut take = |scope: Scope| -> Vec<(String, Doc)> {
        sections
            .iter_mut()
            .find(|(s, _)| *s == scope)
            .map(|(_, e)| std::mem::take(e))
            .unwrap_or_default()
    };
    let context = take(Scope::HtpContext);
    let graph = take(Scope::HtpGraph);
    let mut device = take(Scope::HtpDevice);
    let core = take(Scope::HtpCore);
    let memory = take(Scope::HtpMemory);
    let group = take(Scope::HtpGroupContext);
    let mut root = Vec::new();
    if !context.is_empty() {
        root.push(("context".to_string(), Doc::Map(context)));
    }
    if !graph.is_empty() {
        root.push(("graphs".to_string(), Doc::Seq(vec![Doc::Map(graph)])));
    }
    if !core.is_empty() {
        device.push(("cores".to_string(), Doc::Seq(vec![Doc::Map(core)])));
    }
    if !device.is_empty() {
        root.push(("devices".to_string(), Doc::Seq(vec![Doc::Map(device)])));
    }
    if !memory.is_empty() {
        root.push(("memory".to_string(), Doc::Map(memory)));
    }
    if !group.is_empty() {
        root.push(("groupContext".to_string(), Doc::Map(group)));
    }
    Doc::Map(root)
}
