//! `kiln config list|show|schema`: the option registry, the resolved configuration with where
//! each value came from, and the JSON Schema of configuration files. `ConfigOpts` is the
//! `--config F` / `-O KEY=VALUE` pair every command can flatten into its arguments.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use kiln_config::{Config, ConfigError};
use std::path::PathBuf;

/// Configuration sources shared by the commands: files, then overrides (command line wins).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct ConfigOpts {
    /// A configuration file: qaic options YAML, JSON, HTP backend-extension JSON or Axelera
    /// compiler config (repeatable; later files win).
    #[arg(long = "config", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Set an option: KEY=VALUE, KEY any name or alias (repeatable; wins over files).
    #[arg(short = 'O', value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

impl ConfigOpts {
    /// The resolved configuration (defaults < files < overrides), its warnings printed.
    pub(crate) fn resolve(&self) -> Result<Config> {
        let c = Config::resolve(&self.files, &self.overrides)?;
        let warnings = c.check()?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        Ok(c)
    }
}

#[derive(Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// List every option: name, aliases, type, default, allowed values, status on this target, meaning.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Print the resolved configuration and where each value came from.
    Show {
        #[command(flatten)]
        opts: ConfigOpts,
        /// Every option, not only the implemented ones and those set.
        #[arg(long)]
        all: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Print the configuration as an HTP backend-extension JSON instead.
        #[arg(long)]
        backend_extensions: bool,
    },
    /// Print the JSON Schema (draft 2020-12) of a configuration file.
    Schema,
}

pub(crate) fn run(a: ConfigArgs) -> Result<()> {
    match a.command {
        ConfigCommand::List { json } => {
            if json {
                crate::emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&kiln_config::list_json())?
                ))
            } else {
                crate::emit(&kiln_config::list_text())
            }
        }
        ConfigCommand::Schema => crate::emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&kiln_config::schema()).context("cannot render the schema")?
        )),
        ConfigCommand::Show {
            opts,
            all,
            json,
            backend_extensions,
        } => {
            let c = Config::resolve(&opts.files, &opts.overrides)?;
            for w in c.warnings() {
                eprintln!("warning: {w}");
            }
            if let Err(e @ ConfigError::NotImplemented { .. }) = c.check() {
                eprintln!("note: compile and run would refuse this configuration: {e}");
            }
            if backend_extensions {
                crate::emit(&c.to_backend_extension_json())
            } else if json {
                crate::emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&kiln_config::show_json(&c))?
                ))
            } else {
                crate::emit(&kiln_config::show_text(&c, all))
            }
        }
    }
}
