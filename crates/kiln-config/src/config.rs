//! `Config`, the resolved configuration: defaults, then files, then `-O KEY=VALUE` overrides,
//! each value checked against its option's kind and remembered with where it came from; the
//! cross-option rules; and the warnings and refusals that follow from each option's status.

use crate::error::{ConfigError, Location, Source, Unsupported, Warning, WarningKind};
use crate::htp::{BackendExtensions, Binding, Step};
use crate::kind::Kind;
use crate::options::{CompileConfig, CompileMode, RuntimeConfig};
use crate::registry::{self, Entry, LookupError, OptionSpec, Scope, Section, SeedDoc, Status};
use crate::tree::{self, Format, Key, Node, NodeValue, render_json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The resolved configuration. Serializes to JSON for storage in a `.kiln` program.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    pub compile: CompileConfig,
    pub runtime: RuntimeConfig,
    /// Where each option not at its default came from, by canonical name.
    pub sources: BTreeMap<String, Source>,
    /// The backend-extension file this configuration imported, kept for a lossless export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_extensions: Option<BackendExtensions>,
    /// Warnings found while loading (unknown fields kept as extras, graph conflicts, ...).
    #[serde(skip)]
    load_warnings: Vec<Warning>,
}

/// How strictly unknown keys are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// kiln, qaic, QAIRT and Axelera option files: an unknown key is an error.
    Strict,
    /// Backend-extension files: unknown fields are kept as extras with a warning (as HTP does).
    BackendExtension,
}

const HTP_SECTIONS: &[&str] = &["graphs", "devices", "context", "memory", "groupContext"];

struct Load<'a> {
    file: &'a Path,
    mode: Mode,
    bindings: Vec<Binding>,
}

impl Config {
    /// Defaults, then the file (qaic options YAML, JSON, HTP backend-extension JSON, Axelera
    /// compiler config JSON; the format is told by the extension or the content).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        c.load_file(path)?;
        Ok(c)
    }

    /// The full resolution: defaults < each file in order < each `-O KEY=VALUE` in order, then
    /// the cross-option rules. Warnings are in `warnings()`; unimplemented options are refused
    /// by `check()`, which the compiler and runtime call.
    pub fn resolve<P: AsRef<Path>>(files: &[P], overrides: &[String]) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for f in files {
            c.load_file(f)?;
        }
        for o in overrides {
            c.apply_override(o)?;
        }
        c.validate()?;
        Ok(c)
    }

    /// Loads a file on top of the current values.
    pub fn load_file(&mut self, path: impl AsRef<Path>) -> Result<(), ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_str(&text, path)
    }

    /// Loads configuration text; `path` names it in messages and tells its format.
    pub fn load_str(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let root = tree::parse(text, path, Format::detect(path, text))?;
        let entries = match &root.value {
            NodeValue::Map(entries) => entries,
            NodeValue::Scalar(Value::Null) => return Ok(()), // an empty file
            _ => {
                return Err(ConfigError::Shape {
                    at: root.at(path),
                    expected: "a mapping of option names to values".into(),
                    found: root.kind_name().into(),
                });
            }
        };
        if is_backend_extension(entries) {
            return self.import_backend_extension(&root, path);
        }
        let mut load = Load {
            file: path,
            mode: Mode::Strict,
            bindings: Vec::new(),
        };
        self.apply_map(entries, Scope::Top, &mut load, &mut Vec::new(), None)?;
        self.apply_implied();
        Ok(())
    }

    /// Imports a backend-extension JSON file (context / graphs / devices / memory /
    /// groupContext). With `passthrough` the document is kept as-is for export, neither
    /// validated nor applied.
    pub fn load_backend_extensions(&mut self, path: impl AsRef<Path>, passthrough: bool) -> Result<(), ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let root = tree::parse(&text, path, Format::Json)?;
        if !matches!(root.value, NodeValue::Map(_)) {
            return Err(ConfigError::Shape {
                at: root.at(path),
                expected: "a JSON object with context / graphs / devices / memory / groupContext sections".into(),
                found: root.kind_name().into(),
            });
        }
        if passthrough {
            self.backend_extensions = Some(BackendExtensions {
                path: path.to_path_buf(),
                passthrough: true,
                doc: root.to_doc(),
                bindings: Vec::new(),
            });
            self.load_warnings.push(Warning {
                kind: WarningKind::Passthrough,
                option: "backend extensions".into(),
                source: Source::File {
                    at: root.at(path),
                    key: "(passthrough)".into(),
                },
                message: "the file is kept as-is for export; its options are not validated and not applied".into(),
            });
            return Ok(());
        }
        self.import_backend_extension(&root, path)
    }

    fn import_backend_extension(&mut self, root: &Node, path: &Path) -> Result<(), ConfigError> {
        let NodeValue::Map(entries) = &root.value else {
            return Ok(());
        };
        let mut load = Load {
            file: path,
            mode: Mode::BackendExtension,
            bindings: Vec::new(),
        };
        self.apply_map(entries, Scope::Top, &mut load, &mut Vec::new(), None)?;
        self.backend_extensions = Some(BackendExtensions {
            path: path.to_path_buf(),
            passthrough: false,
            doc: root.to_doc(),
            bindings: load.bindings,
        });
        self.apply_implied();
        Ok(())
    }

    /// Applies one `KEY=VALUE` override (precedence over files). VALUE is read as YAML
    /// (`true`, `3`, `[a, b]`, `{batch: 1}`); for text-valued options it is taken literally.
    /// `onnx_define_symbol.NAME=VALUE` binds one symbol.
    pub fn apply_override(&mut self, arg: &str) -> Result<(), ConfigError> {
        let bad = |reason: String| ConfigError::BadOverride {
            arg: arg.to_string(),
            reason,
        };
        let (key, raw) = arg.split_once('=').ok_or_else(|| bad("expected KEY=VALUE".into()))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(bad("the key is empty".into()));
        }
        let (key, sub) = match key.split_once('.') {
            Some((k, s)) if registry::lookup(Scope::Top, key).is_err() => (k, Some(s)),
            _ => (key, None),
        };
        let spec = match registry::lookup(Scope::Top, key) {
            Ok(Entry::Option(s)) => s,
            Ok(Entry::Container(c)) => {
                return Err(bad(format!("{} is a group of options; set them one by one", c.name)));
            }
            Err(LookupError::Unknown { did_you_mean }) => {
                return Err(ConfigError::UnknownOption {
                    key: key.to_string(),
                    at: None,
                    did_you_mean,
                });
            }
            Err(LookupError::Ambiguous { candidates }) => {
                return Err(ConfigError::Ambiguous {
                    key: key.to_string(),
                    candidates,
                    at: None,
                });
            }
        };
        let value = match sub {
            Some(symbol) if spec.kind == Kind::Symbols => {
                let mut m = serde_json::Map::new();
                m.insert(symbol.to_string(), override_value(raw, &Kind::Json, arg)?);
                let mut merged = self.get(spec.name).unwrap_or(Value::Null);
                let new = spec
                    .kind
                    .normalize(&Value::Object(m))
                    .map_err(|_| ConfigError::InvalidValue {
                        option: spec.name.to_string(),
                        value: raw.to_string(),
                        expected: "a non-negative integer".into(),
                        at: None,
                    })?;
                if let (Value::Object(all), Value::Object(one)) = (&mut merged, new) {
                    all.extend(one);
                }
                merged
            }
            Some(_) => return Err(bad(format!("{} takes no .FIELD suffix", spec.name))),
            None => override_value(raw, &spec.kind, arg)?,
        };
        self.set_value(spec, &value, Source::CommandLine { arg: arg.to_string() }, None)?;
        self.apply_implied();
        Ok(())
    }

    /// Sets an option by any of its spellings (for APIs such as Python keyword arguments).
    pub fn set(&mut self, key: &str, value: &Value, source: Source) -> Result<(), ConfigError> {
        match registry::lookup(Scope::Top, key) {
            Ok(Entry::Option(spec)) => {
                self.set_value(spec, value, source, None)?;
                self.apply_implied();
                Ok(())
            }
            Ok(Entry::Container(c)) => Err(ConfigError::InvalidValue {
                option: c.name.to_string(),
                value: render_json(value),
                expected: "its options set one by one".into(),
                at: None,
            }),
            Err(LookupError::Unknown { did_you_mean }) => Err(ConfigError::UnknownOption {
                key: key.to_string(),
                at: None,
                did_you_mean,
            }),
            Err(LookupError::Ambiguous { candidates }) => Err(ConfigError::Ambiguous {
                key: key.to_string(),
                candidates,
                at: None,
            }),
        }
    }

    /// An option's current value as JSON, by any spelling.
    pub fn get(&self, key: &str) -> Option<Value> {
        let spec = match registry::lookup(Scope::Top, key) {
            Ok(Entry::Option(s)) => s,
            _ => return None,
        };
        match spec.section {
            Section::Compile => self.compile.get_json(spec.name),
            Section::Runtime => self.runtime.get_json(spec.name),
        }
    }

    /// Where an option's value came from, by any spelling.
    pub fn source(&self, key: &str) -> Source {
        let name = match registry::lookup(Scope::Top, key) {
            Ok(Entry::Option(s)) => s.name,
            _ => key,
        };
        self.sources.get(name).cloned().unwrap_or_default()
    }

    /// The cross-option rules of the seed documents.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let conflict = |a: &str, b: &str, reason: &str| ConfigError::Conflict {
            first: format!("{a} ({})", self.source(a).describe(a)),
            second: format!("{b} ({})", self.source(b).describe(b)),
            reason: reason.into(),
        };
        let c = &self.compile;
        let r = &self.runtime;
        if c.enable_intermediate_outputs && !c.output_tensors.is_empty() {
            return Err(conflict(
                "enable_intermediate_outputs",
                "output_tensors",
                "one outputs every intermediate tensor, the other a chosen few",
            ));
        }
        if r.enable_metrics && r.enable_profiling {
            return Err(conflict(
                "enable_metrics",
                "enable_profiling",
                "profiling already reports the metrics (qaic allows one of them)",
            ));
        }
        if r.inf_time.is_some() && !self.source("num_inferences").is_default() {
            return Err(conflict(
                "num_inferences",
                "inf_time",
                "a benchmark runs either a number of inferences or for a time",
            ));
        }
        if c.convert_to_quantize {
            for other in ["dump_profile", "load_profile"] {
                if self.get(other).is_some_and(|v| !v.is_null()) {
                    return Err(conflict(
                        "convert_to_quantize",
                        other,
                        "convert_to_quantize profiles the inputs itself",
                    ));
                }
            }
        }
        for (a, b) in [
            ("dump_profile", "load_profile"),
            ("dump_profile", "external_quantization_file"),
            ("load_profile", "external_quantization_file"),
        ] {
            if self.get(a).is_some_and(|v| !v.is_null()) && self.get(b).is_some_and(|v| !v.is_null()) {
                return Err(conflict(
                    a,
                    b,
                    "the ranges come from one place: calibration data, a profile or an external file",
                ));
            }
        }
        let axelera_quantizes = c.compiler_mode == crate::AxeleraCompilerMode::QuantizeAndLower;
        let changed = |k: &str| self.changed().iter().any(|(spec, _, _)| spec.name == k);
        if changed("quantization_scheme") && !axelera_quantizes {
            return Err(conflict(
                "quantization_scheme",
                "compiler_mode",
                "Axelera's quantization_scheme applies when compiler_mode is quantize_and_lower",
            ));
        }
        if axelera_quantizes
            && c.quantization_scheme == crate::QuantizationScheme::PerTensorMinMax
            && changed("quantization_calibration")
        {
            return Err(conflict(
                "quantization_scheme",
                "quantization_calibration",
                "per_tensor_min_max is MinMax calibration (quantization_calibration None)",
            ));
        }
        if c.dump_profile.is_some() && c.load_profile.is_some() {
            return Err(conflict(
                "dump_profile",
                "load_profile",
                "a compile either writes a profile from calibration data or quantizes from one",
            ));
        }
        let quantizing = c.convert_to_quantize
            || c.dump_profile.is_some()
            || c.load_profile.is_some()
            || c.external_quantization_file.is_some()
            || axelera_quantizes;
        if !quantizing {
            // A quantization setting without anything that quantizes would be silently ignored.
            let set = [
                "quantization_schema_activations",
                "quantization_schema_constants",
                "quantization_calibration",
                "percentile_calibration_value",
                "num_histogram_bins",
                "quantization_precision_bias",
                "enable_rowwise",
                "enable_channelwise",
                "quantize_dw_channel_wise",
                "keep_original_precision_for_nodes",
                "profiling_threads",
                "calibration_data",
                "quantization_debug",
                "remove_io_quantization",
                "quantized_graph_export",
                "model_debug_save_dir",
            ]
            .into_iter()
            .find(|k| self.changed().iter().any(|(spec, _, _)| spec.name == *k));
            if let Some(k) = set {
                return Err(conflict(
                    k,
                    "convert_to_quantize",
                    "this quantization option only applies when quantizing: set convert_to_quantize (or dump_profile / load_profile)",
                ));
            }
        }
        if c.max_spill_fill_buffer_for_group > 0 && c.group_id != 0 {
            return Err(conflict(
                "max_spill_fill_buffer_for_group",
                "group_id",
                "max_spill_fill_buffer_for_group needs group_id 0",
            ));
        }
        Ok(())
    }

    /// Options set away from their default, with their value and source, in registry order.
    pub fn changed(&self) -> Vec<(&'static OptionSpec, Value, Source)> {
        registry::options()
            .iter()
            .filter_map(|s| {
                let src = self.sources.get(s.name)?;
                let v = self.get(s.name)?;
                (v != s.default_value()).then(|| (s, v, src.clone()))
            })
            .collect()
    }

    /// Warnings to print: options with no effect or not yet implemented (non-fatal) that are
    /// set away from their default, and what loading found.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = self.load_warnings.clone();
        for (spec, _, source) in self.changed() {
            let kind = match spec.status {
                Status::NoEffect { .. } => WarningKind::NoEffect,
                Status::NotYetImplemented { fatal: false, .. } => WarningKind::NotYetImplemented,
                _ => continue,
            };
            out.push(Warning {
                kind,
                option: spec.name.to_string(),
                source,
                message: spec.status.note().to_string(),
            });
        }
        out
    }

    /// Options set to something kiln cannot honour yet (their results would differ).
    pub fn unsupported(&self) -> Vec<Unsupported> {
        let mut out: Vec<Unsupported> = self
            .changed()
            .into_iter()
            .filter(|(s, _, _)| matches!(s.status, Status::NotYetImplemented { fatal: true, .. }))
            .map(|(s, v, source)| Unsupported {
                option: s.name.to_string(),
                value: render_json(&v),
                source,
                reason: s.status.note().to_string(),
            })
            .collect();
        if self.compile.compiler_mode == crate::AxeleraCompilerMode::QuantizeOnly {
            out.push(Unsupported {
                option: "compiler_mode".into(),
                value: "quantize_only".into(),
                source: self.source("compiler_mode"),
                reason: "writing the quantized model as an ONNX file is not yet implemented; quantize_and_lower \
                         quantizes and compiles it"
                    .into(),
            });
        }
        out
    }

    /// What the compiler and runtime call before acting: the warnings, or one error listing
    /// every option that is set but not yet implemented.
    pub fn check(&self) -> Result<Vec<Warning>, ConfigError> {
        self.validate()?;
        let options = self.unsupported();
        if options.is_empty() {
            Ok(self.warnings())
        } else {
            Err(ConfigError::NotImplemented { options })
        }
    }

    /// The HTP backend-extension JSON of this configuration: the imported file with any
    /// overridden values replaced (a lossless round trip when nothing was overridden), or one
    /// built from the HTP options set away from their defaults.
    pub fn to_backend_extension_json(&self) -> String {
        crate::htp::export(self).to_json_pretty()
    }

    fn apply_implied(&mut self) {
        if self.compile.mode == Some(CompileMode::WeightSharing)
            && self
                .sources
                .get("weight_sharing_enabled")
                .is_none_or(|s| matches!(s, Source::Implied { .. }))
        {
            self.compile.weight_sharing_enabled = true;
            self.sources.insert(
                "weight_sharing_enabled".into(),
                Source::Implied {
                    by: "mode weight_sharing".into(),
                },
            );
        }
    }

    fn set_value(
        &mut self,
        spec: &'static OptionSpec,
        value: &Value,
        source: Source,
        at: Option<Location>,
    ) -> Result<(), ConfigError> {
        let invalid = || ConfigError::InvalidValue {
            option: spec.name.to_string(),
            value: render_json(value),
            expected: spec.kind.expected(),
            at: at.clone(),
        };
        let v = spec.kind.normalize(value).map_err(|_| invalid())?;
        let r = match spec.section {
            Section::Compile => self.compile.set_json(spec.name, v),
            Section::Runtime => self.runtime.set_json(spec.name, v),
        };
        r.map_err(|_| invalid())?;
        self.sources.insert(spec.name.to_string(), source);
        Ok(())
    }

    /// Applies one mapping read in `scope`. `container` collects, for a list of graph or
    /// device configs, the values the first entry set (later entries only warn if they differ).
    fn apply_map(
        &mut self,
        entries: &[(Key, Node)],
        scope: Scope,
        load: &mut Load<'_>,
        path: &mut Vec<Step>,
        mut container: Option<&mut HashMap<&'static str, Value>>,
    ) -> Result<(), ConfigError> {
        let mut seen: HashMap<&'static str, &str> = HashMap::new();
        for (key, node) in entries {
            let key_at = Location {
                file: load.file.to_path_buf(),
                line: key.line,
                column: key.column,
            };
            let entry = match lookup_key(scope, &key.name) {
                Ok(e) => e,
                Err(LookupError::Unknown { did_you_mean }) => {
                    if load.mode == Mode::BackendExtension {
                        let hint = did_you_mean
                            .map(|d| format!("; did you mean '{d}'?"))
                            .unwrap_or_default();
                        self.load_warnings.push(Warning {
                            kind: WarningKind::KeptExtra,
                            option: key.name.clone(),
                            source: Source::File {
                                at: key_at,
                                key: key.name.clone(),
                            },
                            message: format!("kept as an extra of the backend-extension file{hint}"),
                        });
                        continue;
                    }
                    return Err(ConfigError::UnknownOption {
                        key: key.name.clone(),
                        at: Some(key_at),
                        did_you_mean,
                    });
                }
                Err(LookupError::Ambiguous { candidates }) => {
                    return Err(ConfigError::Ambiguous {
                        key: key.name.clone(),
                        candidates,
                        at: Some(key_at),
                    });
                }
            };
            match entry {
                Entry::Container(c) => {
                    path.push(Step::Key(key.name.clone()));
                    let items: Vec<(usize, &Node)> = match (&node.value, c.list) {
                        (NodeValue::Seq(items), _) => items.iter().enumerate().collect(),
                        (NodeValue::Map(_), false) => vec![(usize::MAX, node)],
                        (NodeValue::Scalar(Value::Null), _) => Vec::new(),
                        _ => {
                            return Err(ConfigError::Shape {
                                at: node.at(load.file),
                                expected: format!(
                                    "{} for '{}'",
                                    if c.list { "a list of mappings" } else { "a mapping" },
                                    key.name
                                ),
                                found: node.kind_name().into(),
                            });
                        }
                    };
                    let mut first: HashMap<&'static str, Value> = HashMap::new();
                    for (i, item) in items {
                        let NodeValue::Map(inner) = &item.value else {
                            return Err(ConfigError::Shape {
                                at: item.at(load.file),
                                expected: format!("a mapping in '{}'", key.name),
                                found: item.kind_name().into(),
                            });
                        };
                        if i != usize::MAX {
                            path.push(Step::Index(i));
                        }
                        let share = c.list && c.scope != Scope::Top;
                        self.apply_map(inner, c.scope, load, path, share.then_some(&mut first))?;
                        if i != usize::MAX {
                            path.pop();
                        }
                    }
                    path.pop();
                }
                Entry::Option(spec) => {
                    if let Some(prev) = seen.insert(spec.name, &key.name) {
                        return Err(ConfigError::Duplicate {
                            option: spec.name.to_string(),
                            first: prev.to_string(),
                            second: key.name.clone(),
                            at: key_at,
                        });
                    }
                    let value = node.to_json();
                    if load.mode == Mode::BackendExtension {
                        let mut p = path.clone();
                        p.push(Step::Key(key.name.clone()));
                        load.bindings.push(Binding {
                            path: p,
                            option: spec.name.to_string(),
                        });
                    }
                    let normalized = spec.kind.normalize(&value).map_err(|_| ConfigError::InvalidValue {
                        option: spec.name.to_string(),
                        value: render_json(&value),
                        expected: spec.kind.expected(),
                        at: Some(node.at(load.file)),
                    })?;
                    if let Some(first) = container.as_deref_mut() {
                        if let Some(prev) = first.get(spec.name) {
                            if prev != &normalized {
                                self.load_warnings.push(Warning {
                                    kind: WarningKind::GraphConflict,
                                    option: spec.name.to_string(),
                                    source: Source::File {
                                        at: key_at,
                                        key: key.name.clone(),
                                    },
                                    message: format!(
                                        "{} here, {} in an earlier entry; kiln compiles one graph and keeps the first",
                                        render_json(&value),
                                        render_json(prev)
                                    ),
                                });
                            }
                            continue;
                        }
                        first.insert(spec.name, normalized);
                    }
                    let source = Source::File {
                        at: key_at,
                        key: key.name.clone(),
                    };
                    self.set_value(spec, &value, source, Some(node.at(load.file)))?;
                }
            }
        }
        Ok(())
    }
}

/// `lookup`, plus the `compiler_` / `runtime_` prefixes of the AIC backend-extension dict
/// (`compiler_num_of_cores`, `runtime_device_ids`, case as QNN writes it: `compiler_convert_to_FP16`).
fn lookup_key(scope: Scope, key: &str) -> Result<Entry, LookupError> {
    let err = match registry::lookup(scope, key) {
        Ok(e) => return Ok(e),
        Err(e) => e,
    };
    if scope == Scope::Top {
        for (prefix, doc) in [
            ("compiler_", SeedDoc::AicCompilerConfig),
            ("runtime_", SeedDoc::AicRuntimeConfig),
        ] {
            if let Some(field) = key.strip_prefix(prefix)
                && let Some(spec) = registry::options().iter().find(|s| {
                    s.origins
                        .iter()
                        .any(|o| o.doc == doc && o.key.eq_ignore_ascii_case(field))
                })
            {
                return Ok(Entry::Option(spec));
            }
        }
    }
    Err(err)
}

/// A mapping with HTP sections and no option of its own is a backend-extension file.
fn is_backend_extension(entries: &[(Key, Node)]) -> bool {
    let has_section = entries.iter().any(|(k, _)| HTP_SECTIONS.contains(&k.name.as_str()));
    let has_option = entries
        .iter()
        .any(|(k, _)| matches!(lookup_key(Scope::Top, &k.name), Ok(Entry::Option(_))));
    has_section && !has_option
}

/// Reads an override's VALUE for an option of this kind.
fn override_value(raw: &str, kind: &Kind, arg: &str) -> Result<Value, ConfigError> {
    let text = raw.trim();
    let literal = match kind {
        Kind::Str | Kind::Path | Kind::Choice(_) => true,
        Kind::Nullable(inner) => {
            matches!(inner, Kind::Str | Kind::Path | Kind::Choice(_)) && !matches!(text, "null" | "~" | "")
        }
        Kind::StrList | Kind::ChoiceList(_) => !text.starts_with('['),
        _ => false,
    };
    if literal {
        return Ok(Value::String(text.to_string()));
    }
    if text.is_empty() {
        return Ok(Value::Null);
    }
    let node: Node = serde_saphyr::from_str(text).map_err(|e| ConfigError::BadOverride {
        arg: arg.to_string(),
        reason: format!("VALUE is not valid YAML: {}", e.without_snippet()),
    })?;
    Ok(node.to_json())
}
