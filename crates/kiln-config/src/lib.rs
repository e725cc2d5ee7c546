//! kiln's configuration: every option of the option surfaces users bring (qaic, QAIRT's AIC and
//! HTP configs, Axelera's compiler config), typed, validated, and with its status on this target.
//!
//! - `options.rs` declares each option once: its typed field in [`CompileConfig`] or
//!   [`RuntimeConfig`], default, kind, status, seed-document spellings and meaning.
//! - `registry.rs` looks names up (aliases, section scopes, "did you mean").
//! - `config.rs` resolves a [`Config`]: defaults < files < `-O KEY=VALUE`, with sources.
//! - `tree.rs` parses YAML/JSON with positions; `htp.rs` imports and exports backend-extension
//!   JSON losslessly; `schema.rs` and `docs.rs` render the registry.
//!
//! ```
//! let mut c = kiln_config::Config::default();
//! c.apply_override("O=3").unwrap();
//! c.apply_override("onnx_define_symbol.batch=1").unwrap();
//! assert_eq!(c.compile.optimization_type, 3);
//! assert_eq!(c.compile.onnx_define_symbol["batch"], 1);
//! assert!(c.check().unwrap().is_empty());
//! ```

mod config;
mod custom_io;
mod docs;
mod error;
mod htp;
mod kind;
mod options;
mod registry;
mod schema;
mod tree;

pub use config::Config;
pub use custom_io::{CustomIoEntry, IoLayout, IoPrecision, custom_io_template, load_custom_io, parse_custom_io};
pub use docs::{list_json, list_text, markdown, show_json, show_text};
pub use error::{ConfigError, Location, Source, Unsupported, Warning, WarningKind};
pub use htp::BackendExtensions;
pub use kind::{Invalid, Kind};
pub use options::*;
pub use registry::{
    CONTAINERS, Container, OptionSpec, Origin, Scope, Section, SeedDoc, Status, all_spellings, did_you_mean, option,
    options,
};
pub use schema::schema;
pub use tree::Doc;
