//! Where a value came from (`Source`, `Location`), the typed load error (`ConfigError`) and the
//! typed warnings (`Warning`) that loading and checking a configuration produce.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// A place in a configuration file: 1-based line and column (characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub file: PathBuf,
    pub line: u32,
    pub column: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// Where an option's resolved value came from. Precedence: command line > file > default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum Source {
    /// kiln's default for this target.
    #[default]
    Default,
    /// A configuration file; `key` is the spelling used there (an alias or the name).
    File { at: Location, key: String },
    /// A `-O KEY=VALUE` argument.
    CommandLine { arg: String },
    /// Set as a consequence of another option (e.g. `mode: weight_sharing`).
    Implied { by: String },
    /// A keyword argument of an API call (Python's `kiln.Session(..., num_activations=4)`);
    /// `key` is the spelling used there.
    Keyword { key: String },
}

impl Source {
    pub fn is_default(&self) -> bool {
        matches!(self, Source::Default)
    }
}

impl Source {
    /// The source as shown next to an option: `file:line:col`, with the spelling used there
    /// when it differs from the option's name.
    pub fn describe(&self, option: &str) -> String {
        match self {
            Source::File { at, key } if key == option => at.to_string(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File { at, key } => write!(f, "{at} (as {key})"),
            Source::CommandLine { arg } => write!(f, "command line (-O {arg})"),
            Source::Implied { by } => write!(f, "implied by {by}"),
            Source::Keyword { key } => write!(f, "keyword argument {key}"),
        }
    }
}

/// Why a configuration could not be loaded or used. Every variant names the culprit: the option,
/// the value, the accepted values and where it was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{at}: malformed {format}: {message}")]
    Syntax {
        at: Location,
        format: &'static str,
        message: String,
    },
    #[error("{at}: expected {expected}, found {found}")]
    Shape {
        at: Location,
        expected: String,
        found: String,
    },
    #[error("{}: unknown option '{key}'{}", at_or_cli(.at), suggestion(.did_you_mean))]
    UnknownOption {
        key: String,
        /// `None` for a command-line override.
        at: Option<Location>,
        did_you_mean: Option<String>,
    },
    #[error("{}: invalid value {value} for {option}: expected {expected}", at_or_cli(.at))]
    InvalidValue {
        option: String,
        value: String,
        expected: String,
        at: Option<Location>,
    },
    #[error("{at}: {option} is set twice in one mapping (first as '{first}', then as '{second}')")]
    Duplicate {
        option: String,
        first: String,
        second: String,
        at: Location,
    },
    #[error("{}: '{key}' is ambiguous here: it is {candidates}", at_or_cli(.at))]
    Ambiguous {
        key: String,
        candidates: String,
        at: Option<Location>,
    },
    #[error("bad override '{arg}': {reason}")]
    BadOverride { arg: String, reason: String },
    #[error("{first} and {second} cannot be used together: {reason}")]
    Conflict {
        first: String,
        second: String,
        reason: String,
    },
    #[error("{}", not_implemented(.options))]
    NotImplemented { options: Vec<Unsupported> },
}

/// One option set to a value kiln cannot honour yet (see `Config::check`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unsupported {
    pub option: String,
    pub value: String,
    pub source: Source,
    pub reason: String,
}

fn at_or_cli(at: &Option<Location>) -> String {
    match at {
        Some(l) => l.to_string(),
        None => "command line".to_string(),
    }
}

fn suggestion(s: &Option<String>) -> String {
    match s {
        Some(s) => format!("; did you mean '{s}'?"),
        None => "; `kiln config list` shows every option".to_string(),
    }
}

fn not_implemented(options: &[Unsupported]) -> String {
    let mut s = String::from("options not yet implemented on this target:");
    for u in options {
        s.push_str(&format!(
            "\n  {} = {} ({}): {}",
            u.option,
            u.value,
            u.source.describe(&u.option),
            u.reason
        ));
    }
    s
}

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WarningKind {
    /// The option is accepted but means nothing on this target.
    NoEffect,
    /// The option is not implemented yet; running without it is safe.
    NotYetImplemented,
    /// An unknown field of a backend-extension file, kept for export but not used.
    KeptExtra,
    /// Two graph configs of one file disagree; kiln compiles one graph and used the first.
    GraphConflict,
    /// A backend-extension file loaded in passthrough mode: kept as-is, not validated, not used.
    Passthrough,
}

/// A warning for the caller to print: the option, where it was set, and why it matters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Warning {
    pub kind: WarningKind,
    pub option: String,
    pub source: Source,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            WarningKind::NoEffect => "has no effect on this target",
            WarningKind::NotYetImplemented => "is not yet implemented",
            WarningKind::KeptExtra => "is not a known option; kept for export only",
            WarningKind::GraphConflict => "differs between graph configs",
            WarningKind::Passthrough => "is passed through unvalidated",
        };
        write!(
            f,
            "{} {what} ({}): {}",
            self.option,
            self.source.describe(&self.option),
            self.message
        )
    }
}
