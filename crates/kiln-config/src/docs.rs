//! Text renderings of the registry and of a resolved configuration: `kiln config list` (text and
//! JSON), `kiln config show`, and `docs/options.md`.

use crate::config::Config;
use crate::registry::{self, CONTAINERS, OptionSpec, Section, Status};
use crate::tree::render_json;
use serde_json::{Value, json};

/// Every option as JSON: name, aliases, section, type, default, allowed values, status on this
/// target and why, the seed documents and spellings it comes from, and its meaning.
pub fn list_json() -> Value {
    let mut out: Vec<Value> = registry::options()
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "aliases": s.aliases(),
                "section": s.section,
                "type": s.kind.type_name(),
                "default": s.default_value(),
                "allowed": s.kind.allowed(),
                "status": status_key(&s.status),
                "status_note": s.status.note(),
                "origins": s.origins.iter().map(|o| json!({"doc": o.doc.name(), "key": o.key})).collect::<Vec<_>>(),
                "help": s.help,
            })
        })
        .collect();
    for c in CONTAINERS {
        out.push(json!({
            "name": c.name,
            "aliases": c.aliases(),
            "section": "group",
            "type": if c.list { "list of mappings" } else { "mapping" },
            "default": Value::Null,
            "allowed": "",
            "status": "implemented",
            "status_note": "holds other options, each with its own status",
            "origins": c.origins.iter().map(|o| json!({"doc": o.doc.name(), "key": o.key})).collect::<Vec<_>>(),
            "help": c.help,
        }));
    }
    Value::Array(out)
}

fn status_key(s: &Status) -> &'static str {
    match s {
        Status::Implemented => "implemented",
        Status::NotYetImplemented { fatal: true, .. } => "not_yet_implemented_error",
        Status::NotYetImplemented { fatal: false, .. } => "not_yet_implemented_warning",
        Status::NoEffect { .. } => "no_effect",
    }
}

fn short_status(s: &Status) -> &'static str {
    match s {
        Status::Implemented => "implemented",
        Status::NotYetImplemented { fatal: true, .. } => "not yet (error)",
        Status::NotYetImplemented { fatal: false, .. } => "not yet (warning)",
        Status::NoEffect { .. } => "no effect",
    }
}

fn default_text(s: &OptionSpec) -> String {
    match s.default_value() {
        Value::Null => "none".into(),
        v => render_json(&v),
    }
}

/// `kiln config list`: one line per option.
pub fn list_text() -> String {
    let mut out = String::new();
    let w = registry::options().iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in registry::options() {
        let aliases = s.aliases();
        let aliases = if aliases.is_empty() {
            String::new()
        } else {
            format!(" (also {})", aliases.join(", "))
        };
        out.push_str(&format!(
            "{:<w$}  {:<18} {:<8} {:<10} default {}{}\n    {}",
            s.name,
            short_status(&s.status),
            format!("{:?}", s.section).to_lowercase(),
            s.kind.type_name(),
            default_text(s),
            aliases,
            s.help,
        ));
        let allowed = s.kind.allowed();
        if !allowed.is_empty() {
            out.push_str(&format!(" Allowed: {allowed}."));
        }
        if !s.status.note().is_empty() {
            out.push_str(&format!("\n    ({})", s.status.note()));
        }
        out.push('\n');
    }
    for c in CONTAINERS {
        let aliases = c.aliases();
        let aliases = if aliases.is_empty() {
            String::new()
        } else {
            format!(" (also {})", aliases.join(", "))
        };
        out.push_str(&format!("{:<w$}  group of options{aliases}\n    {}\n", c.name, c.help));
    }
    out
}

/// `kiln config show`: the resolved value of each option with where it came from. Without
/// `all`, only the implemented options and those set away from their default.
pub fn show_text(c: &Config, all: bool) -> String {
    let rows: Vec<(&OptionSpec, String, String)> = registry::options()
        .iter()
        .filter_map(|s| {
            let v = c.get(s.name)?;
            let src = c.source(s.name);
            let changed = !src.is_default() && v != s.default_value();
            if !(all || changed || s.status == Status::Implemented) {
                return None;
            }
            let value = match v {
                Value::Null => "none".into(),
                v => render_json(&v),
            };
            Some((s, value, src.describe(s.name)))
        })
        .collect();
    let wn = rows.iter().map(|r| r.0.name.len()).max().unwrap_or(0);
    let wv = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0).min(40);
    let mut out = String::new();
    for (s, value, src) in rows {
        let status = match s.status {
            Status::Implemented => String::new(),
            st => format!("  [{}]", short_status(&st)),
        };
        out.push_str(&format!("{:<wn$}  {value:<wv$}  {src}{status}\n", s.name));
    }
    out
}

/// `kiln config show --json`: every option with its value and source.
pub fn show_json(c: &Config) -> Value {
    let mut m = serde_json::Map::new();
    for s in registry::options() {
        m.insert(
            s.name.to_string(),
            json!({
                "value": c.get(s.name),
                "source": c.source(s.name),
                "status": status_key(&s.status),
            }),
        );
    }
    json!({"options": m, "warnings": c.warnings()})
}

fn md(s: &str) -> String {
    s.replace('|', "\\|")
}

/// `docs/options.md`, generated from the registry (a test fails when the file is stale).
pub fn markdown() -> String {
    let opts = registry::options();
    let count = |f: &dyn Fn(&Status) -> bool| opts.iter().filter(|s| f(&s.status)).count();
    let mut out = String::new();
    out.push_str("# kiln options\n\n");
    out.push_str("<!-- Generated from crates/kiln-config/src/options.rs; do not edit. Regenerate with\n");
    out.push_str("     `KILN_BLESS=1 cargo test -p kiln-config --test docs`. -->\n\n");
    out.push_str(
        "kiln accepts the option files and names of qaic (Session keywords and options YAML), QAIRT \
(`AicCompilerConfig`, `AicRuntimeConfig`, `CompileConfig`, the HTP context / graph / device / core / \
memory / group-context configs and their backend-extension JSON) and Axelera (`CompilerConfig`), and \
says what each option does on this target: the host CPU.\n\n",
    );
    out.push_str(&format!(
        "{} options: {} implemented, {} not yet implemented (error), {} not yet implemented (warning), {} with no effect on this target.\n\n",
        opts.len(),
        count(&|s| *s == Status::Implemented),
        count(&|s| matches!(s, Status::NotYetImplemented { fatal: true, .. })),
        count(&|s| matches!(s, Status::NotYetImplemented { fatal: false, .. })),
        count(&|s| matches!(s, Status::NoEffect { .. })),
    ));
    out.push_str(
        "- **implemented**: kiln does what the option says.\n\
- **not yet (error)**: setting it away from its default refuses the compile or run, because the results \
would differ from what was asked.\n\
- **not yet (warning)**: setting it prints a warning; running without it is safe.\n\
- **no effect**: accepted for compatibility; setting it prints a warning with the reason.\n\n\
Precedence: command line (`-O KEY=VALUE`, on every command) > configuration file (`--config F`) > \
defaults. `kiln config show` prints the resolved values and where each came from; `kiln config list` \
lists the options; `kiln config schema` prints the JSON Schema.\n\n\
Files: a mapping of option names (or aliases) to values, in YAML or JSON; the groups below nest options \
(`graphs: [{O: 3}]`). A file whose top level holds only `context`, `graphs`, `devices`, `memory` and \
`groupContext` is an HTP backend-extension file: unknown fields are kept as extras (with a warning) and \
exported unchanged. AicConfigHelper keys with the prefixes `compiler_` and `runtime_` are accepted.\n\n",
    );
    for (section, title) in [
        (Section::Compile, "Compile options"),
        (Section::Runtime, "Runtime options"),
    ] {
        out.push_str(&format!("## {title}\n\n"));
        out.push_str("| option | seed spellings | type | default | allowed | status | meaning |\n");
        out.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
        for s in opts.iter().filter(|s| s.section == section) {
            let origins: Vec<String> = s
                .origins
                .iter()
                .map(|o| format!("{}: `{}`", o.doc.name(), o.key))
                .collect();
            let note = s.status.note();
            let status = if note.is_empty() {
                short_status(&s.status).to_string()
            } else {
                format!("{}: {}", short_status(&s.status), note)
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | `{}` | {} | {} | {} |\n",
                s.name,
                md(&origins.join(", ")),
                md(&s.kind.type_name()),
                md(&default_text(s)),
                md(&s.kind.allowed()),
                md(&status),
                md(s.help),
            ));
        }
        out.push('\n');
    }
    out.push_str("## Groups\n\n| key | seed spellings | holds |\n| --- | --- | --- |\n");
    for c in CONTAINERS {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            c.name,
            md(&c.aliases().join(", ")),
            md(c.help)
        ));
    }
    out
}
