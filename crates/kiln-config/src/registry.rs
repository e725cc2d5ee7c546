//! The option registry: one `OptionSpec` per option (declared beside its typed field in
//! `options.rs`), the seed documents each option comes from and the spelling each uses, its
//! status on this target, and name lookup with aliases, scopes and "did you mean".

use crate::kind::Kind;
use serde::Serialize;
use std::sync::OnceLock;

/// The option surfaces kiln accepts (the seed documents), plus kiln's own additions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum SeedDoc {
    /// `qaic.Session` keyword arguments and the options YAML.
    Qaic,
    /// QAIRT `AicCompilerConfig`.
    AicCompilerConfig,
    /// QAIRT `AicRuntimeConfig`.
    AicRuntimeConfig,
    /// QAIRT `CompileConfig` (and its `set_mode("weight_sharing", ...)` keywords).
    CompileConfig,
    /// HTP `HtpContextConfig` (backend-extension section `context`).
    HtpContextConfig,
    /// HTP `HtpGraphConfig` (backend-extension section `graphs`).
    HtpGraphConfig,
    /// HTP `HtpDeviceConfig` (backend-extension section `devices`).
    HtpDeviceConfig,
    /// HTP `HtpDeviceCoreConfig` (backend-extension section `devices[].cores`).
    HtpDeviceCoreConfig,
    /// HTP `HtpMemoryConfig` (backend-extension section `memory`).
    HtpMemoryConfig,
    /// HTP `HtpGroupContextConfig` (backend-extension section `groupContext`).
    HtpGroupContextConfig,
    /// Axelera `CompilerConfig`.
    Axelera,
    /// kiln's own option (no seed document has it).
    Kiln,
}

impl SeedDoc {
    pub fn name(self) -> &'static str {
        match self {
            SeedDoc::Qaic => "qaic",
            SeedDoc::AicCompilerConfig => "AicCompilerConfig",
            SeedDoc::AicRuntimeConfig => "AicRuntimeConfig",
            SeedDoc::CompileConfig => "CompileConfig",
            SeedDoc::HtpContextConfig => "HtpContextConfig",
            SeedDoc::HtpGraphConfig => "HtpGraphConfig",
            SeedDoc::HtpDeviceConfig => "HtpDeviceConfig",
            SeedDoc::HtpDeviceCoreConfig => "HtpDeviceCoreConfig",
            SeedDoc::HtpMemoryConfig => "HtpMemoryConfig",
            SeedDoc::HtpGroupContextConfig => "HtpGroupContextConfig",
            SeedDoc::Axelera => "Axelera",
            SeedDoc::Kiln => "kiln",
        }
    }

    /// The backend-extension section this document's fields live in, if any.
    pub fn htp_scope(self) -> Option<Scope> {
        match self {
            SeedDoc::HtpContextConfig => Some(Scope::HtpContext),
            SeedDoc::HtpGraphConfig => Some(Scope::HtpGraph),
            SeedDoc::HtpDeviceConfig => Some(Scope::HtpDevice),
            SeedDoc::HtpDeviceCoreConfig => Some(Scope::HtpCore),
            SeedDoc::HtpMemoryConfig => Some(Scope::HtpMemory),
            SeedDoc::HtpGroupContextConfig => Some(Scope::HtpGroupContext),
            _ => None,
        }
    }
}

/// One spelling of an option in one seed document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub doc: SeedDoc,
    pub key: &'static str,
}

/// Where in a file a key is read: at the top level, or inside a backend-extension section.
/// A spelling that names different options in different sections (HTP's `id`) is only
/// accepted inside its section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Top,
    HtpContext,
    HtpGraph,
    HtpDevice,
    HtpCore,
    HtpMemory,
    HtpGroupContext,
}

impl Scope {
    fn doc(self) -> Option<SeedDoc> {
        match self {
            Scope::Top => None,
            Scope::HtpContext => Some(SeedDoc::HtpContextConfig),
            Scope::HtpGraph => Some(SeedDoc::HtpGraphConfig),
            Scope::HtpDevice => Some(SeedDoc::HtpDeviceConfig),
            Scope::HtpCore => Some(SeedDoc::HtpDeviceCoreConfig),
            Scope::HtpMemory => Some(SeedDoc::HtpMemoryConfig),
            Scope::HtpGroupContext => Some(SeedDoc::HtpGroupContextConfig),
        }
    }
}

/// Whether kiln acts on an option when it is set to something other than its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// kiln does what the option says.
    Implemented,
    /// Not yet: with `fatal` the run is refused (its results would differ from what was asked),
    /// otherwise a warning (running without it is safe).
    NotYetImplemented { fatal: bool, note: &'static str },
    /// Accepted for compatibility; means nothing on this target, for the reason given.
    NoEffect { reason: &'static str },
}

impl Status {
    pub fn label(&self) -> &'static str {
        match self {
            Status::Implemented => "implemented",
            Status::NotYetImplemented { fatal: true, .. } => "not yet implemented (error)",
            Status::NotYetImplemented { fatal: false, .. } => "not yet implemented (warning)",
            Status::NoEffect { .. } => "no effect on this target",
        }
    }

    pub fn note(&self) -> &'static str {
        match self {
            Status::Implemented => "",
            Status::NotYetImplemented { note, .. } => note,
            Status::NoEffect { reason } => reason,
        }
    }
}

/// Which typed struct holds the option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    Compile,
    Runtime,
}

/// One option: its canonical name (the field of `CompileConfig` / `RuntimeConfig`), every
/// spelling the seed documents use, its type, status and meaning.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct OptionSpec {
    pub name: &'static str,
    pub section: Section,
    #[serde(skip)]
    pub kind: Kind,
    pub status: Status,
    pub origins: &'static [Origin],
    pub help: &'static str,
}

impl OptionSpec {
    /// Every spelling other than the name, in order of first appearance.
    pub fn aliases(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for o in self.origins {
            if o.key != self.name && !out.contains(&o.key) {
                out.push(o.key);
            }
        }
        out
    }

    /// The spelling a backend-extension file uses, when the option is an HTP one.
    pub fn htp_key(&self) -> Option<(Scope, &'static str)> {
        self.origins.iter().find_map(|o| o.doc.htp_scope().map(|s| (s, o.key)))
    }

    /// kiln's default value (as JSON).
    pub fn default_value(&self) -> serde_json::Value {
        match self.section {
            Section::Compile => crate::CompileConfig::default().get_json(self.name),
            Section::Runtime => crate::RuntimeConfig::default().get_json(self.name),
        }
        .unwrap_or(serde_json::Value::Null)
    }
}

/// Keys that hold other options rather than a value: the backend-extension sections, the
/// per-backend custom configs of `CompileConfig`, and kiln's own `compile:` / `runtime:` groups.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Container {
    pub name: &'static str,
    pub origins: &'static [Origin],
    /// The scope of the keys inside.
    pub scope: Scope,
    /// A list of mappings (`graphs: [{...}]`) rather than one mapping.
    pub list: bool,
    pub help: &'static str,
}

const fn o(doc: SeedDoc, key: &'static str) -> Origin {
    Origin { doc, key }
}

pub const CONTAINERS: &[Container] = &[
    Container {
        name: "graphs",
        origins: &[o(SeedDoc::CompileConfig, "graph_custom_configs")],
        scope: Scope::HtpGraph,
        list: true,
        help: "HTP graph configs (HtpGraphConfig), one mapping per graph.",
    },
    Container {
        name: "devices",
        origins: &[o(SeedDoc::CompileConfig, "device_custom_configs")],
        scope: Scope::HtpDevice,
        list: true,
        help: "HTP device configs (HtpDeviceConfig), one mapping per device.",
    },
    Container {
        name: "cores",
        origins: &[o(SeedDoc::HtpDeviceConfig, "cores")],
        scope: Scope::HtpCore,
        list: true,
        help: "HTP core configs (HtpDeviceCoreConfig) inside a device config.",
    },
    Container {
        name: "context",
        origins: &[o(SeedDoc::CompileConfig, "context_custom_configs")],
        scope: Scope::HtpContext,
        list: false,
        help: "HTP context config (HtpContextConfig); a list of them is also accepted.",
    },
    Container {
        name: "memory",
        origins: &[o(SeedDoc::CompileConfig, "memory_custom_config")],
        scope: Scope::HtpMemory,
        list: false,
        help: "HTP memory config (HtpMemoryConfig).",
    },
    Container {
        name: "groupContext",
        origins: &[o(SeedDoc::CompileConfig, "group_context_config")],
        scope: Scope::HtpGroupContext,
        list: false,
        help: "HTP group context config (HtpGroupContextConfig).",
    },
    Container {
        name: "compiler_custom_configs",
        origins: &[o(SeedDoc::CompileConfig, "compiler_custom_configs")],
        scope: Scope::Top,
        list: false,
        help: "AIC compiler options (AicCompilerConfig fields) for the backend compiler.",
    },
    Container {
        name: "compile",
        origins: &[],
        scope: Scope::Top,
        list: false,
        help: "kiln's stored form: the compile options as a group.",
    },
    Container {
        name: "runtime",
        origins: &[],
        scope: Scope::Top,
        list: false,
        help: "kiln's stored form: the runtime options as a group.",
    },
];

impl Container {
    pub fn aliases(&self) -> Vec<&'static str> {
        self.origins.iter().map(|o| o.key).filter(|k| *k != self.name).collect()
    }
}

/// Every option, compile section first, in declaration order.
pub fn options() -> &'static [OptionSpec] {
    static ALL: OnceLock<Vec<OptionSpec>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut v = crate::CompileConfig::SPECS.to_vec();
        v.extend_from_slice(crate::RuntimeConfig::SPECS);
        v
    })
}

/// The option with this canonical name.
pub fn option(name: &str) -> Option<&'static OptionSpec> {
    options().iter().find(|s| s.name == name)
}

/// What a key names.
#[derive(Debug, Clone, Copy)]
pub enum Entry {
    Option(&'static OptionSpec),
    Container(&'static Container),
}

/// Why a key could not be resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum LookupError {
    Unknown { did_you_mean: Option<String> },
    Ambiguous { candidates: String },
}

/// Resolves a key read in `scope`: the canonical name, any alias, or (inside a section) the
/// section's own spelling. A key naming different options in different sections is only
/// accepted inside one of them.
pub fn lookup(scope: Scope, key: &str) -> Result<Entry, LookupError> {
    if let Some(c) = CONTAINERS
        .iter()
        .find(|c| c.name == key || c.origins.iter().any(|o| o.key == key))
    {
        let allowed = match scope {
            Scope::Top => c.scope != Scope::HtpCore,
            Scope::HtpDevice => c.scope == Scope::HtpCore,
            _ => false,
        };
        if allowed {
            return Ok(Entry::Container(c));
        }
    }
    if let Some(s) = option(key) {
        return Ok(Entry::Option(s));
    }
    let matches: Vec<&'static OptionSpec> = options()
        .iter()
        .filter(|s| s.origins.iter().any(|o| o.key == key))
        .collect();
    if let Some(doc) = scope.doc()
        && let Some(s) = matches
            .iter()
            .find(|s| s.origins.iter().any(|o| o.key == key && o.doc == doc))
    {
        return Ok(Entry::Option(s));
    }
    match matches.as_slice() {
        [one] => Ok(Entry::Option(one)),
        [] => Err(LookupError::Unknown {
            did_you_mean: did_you_mean(key),
        }),
        many => Err(LookupError::Ambiguous {
            candidates: many
                .iter()
                .map(|s| {
                    let docs: Vec<&str> = s
                        .origins
                        .iter()
                        .filter(|o| o.key == key)
                        .map(|o| o.doc.name())
                        .collect();
                    format!("{} in {}", s.name, docs.join("/"))
                })
                .collect::<Vec<_>>()
                .join(" and "),
        }),
    }
}

/// Every accepted spelling: names, aliases and container keys.
pub fn all_spellings() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for s in options() {
        v.push(s.name);
        v.extend(s.origins.iter().map(|o| o.key));
    }
    for c in CONTAINERS {
        v.push(c.name);
        v.extend(c.origins.iter().map(|o| o.key));
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The closest known spelling, if one is close enough to be a likely typo.
pub fn did_you_mean(key: &str) -> Option<String> {
    let key_l = key.to_ascii_lowercase();
    let mut best: Option<(f64, &str)> = None;
    for cand in all_spellings() {
        let c_l = cand.to_ascii_lowercase();
        let mut score = strsim::jaro_winkler(&key_l, &c_l);
        if c_l.len().min(key_l.len()) >= 4 && (c_l.contains(&key_l) || key_l.contains(&c_l)) {
            score = score.max(0.85);
        }
        if best.is_none_or(|(b, _)| score > b) {
            best = Some((score, cand));
        }
    }
    best.filter(|(score, _)| *score >= 0.82).map(|(_, c)| c.to_string())
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_resolve_both_ways() {
        let name = |scope, key| match lookup(scope, key) {
            Ok(Entry::Option(s)) => s.name,
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(name(Scope::Top, "O"), "optimization_type");
        assert_eq!(name(Scope::Top, "vtcm_mb"), "vtcm_size_in_mb");
        assert_eq!(name(Scope::Top, "aic_num_cores"), "num_of_cores");
        assert_eq!(name(Scope::Top, "mos"), "max_out_channel_split");
        assert_eq!(name(Scope::Top, "ols"), "overlap_split_factor");
        assert_eq!(name(Scope::HtpDevice, "id"), "device_id");
        assert_eq!(name(Scope::HtpCore, "id"), "core_id");
        assert!(matches!(lookup(Scope::Top, "id"), Err(LookupError::Ambiguous { .. })));
    }

    #[test]
    fn every_spelling_names_one_option_per_document() {
        for s in options() {
            for o in s.origins {
                let others: Vec<&str> = options()
                    .iter()
                    .filter(|t| t.name != s.name && t.origins.iter().any(|p| p.key == o.key && p.doc == o.doc))
                    .map(|t| t.name)
                    .collect();
                assert!(others.is_empty(), "{}:{} also names {others:?}", o.doc.name(), o.key);
            }
        }
    }

    #[test]
    fn typos_get_a_suggestion() {
        assert_eq!(did_you_mean("aic_num_core").as_deref(), Some("aic_num_cores"));
        assert_eq!(did_you_mean("optimisation_type").as_deref(), Some("optimization_type"));
        assert_eq!(did_you_mean("zzzzqqq"), None);
    }
}
