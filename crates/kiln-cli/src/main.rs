//! `kiln`: run and inspect ONNX models.

mod info;
mod npy;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kiln::{Session, SessionOptions, Tensor, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "kiln: an ahead-of-time compiler and runtime for ONNX models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a model on inputs from .npy/.npz files and write every output as DIR/<name>.npy.
    Run(RunArgs),
    /// Show a model's inputs, outputs, opsets, op histogram, parameters and MACs.
    Info(InfoArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The model (.onnx).
    model: PathBuf,
    /// An input as NAME=PATH.npy (repeatable).
    #[arg(long = "input", short = 'i', value_name = "NAME=PATH")]
    inputs: Vec<String>,
    /// Inputs from an .npz archive (array names are input names).
    #[arg(long = "inputs", value_name = "PATH.npz")]
    npz: Option<PathBuf>,
    /// Where to write the outputs (default: no files, only the summary).
    #[arg(long, short = 'o', value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Bind a symbolic dimension: NAME=VALUE (repeatable; qaic's onnx_define_symbol).
    #[arg(long = "define-symbol", value_name = "NAME=VALUE")]
    symbols: Vec<String>,
}

#[derive(clap::Args)]
struct InfoArgs {
    /// The model (.onnx).
    model: PathBuf,
    /// Bind a symbolic dimension: NAME=VALUE (repeatable).
    #[arg(long = "define-symbol", value_name = "NAME=VALUE")]
    symbols: Vec<String>,
    /// Also print the whole graph as text.
    #[arg(long)]
    graph: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Run(a) => run(a),
        Command::Info(a) => parse_symbols(&a.symbols).and_then(|s| info::info(&a.model, &s, a.graph)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes text to stdout; a closed pipe (`kiln info m.onnx | head`) is not an error.
pub(crate) fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

pub(crate) fn parse_symbols(items: &[String]) -> Result<Vec<(String, usize)>> {
    items
        .iter()
        .map(|s| {
            let (name, value) = s
                .split_once('=')
                .with_context(|| format!("--define-symbol '{s}': expected NAME=VALUE"))?;
            let v: usize = value
                .trim()
                .parse()
                .with_context(|| format!("--define-symbol '{s}': '{value}' is not a non-negative integer"))?;
            Ok((name.trim().to_string(), v))
        })
        .collect()
}

/// Output file name for a tensor name: anything but letters, digits, `.`, `_`, `-` becomes `_`.
fn file_name_for(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        format!("_{s}")
    } else {
        s
    }
}

fn run(a: RunArgs) -> Result<()> {
    let options = SessionOptions {
        symbols: parse_symbols(&a.symbols)?,
        ..SessionOptions::default()
    };
    let t0 = std::time::Instant::now();
    let session = Session::new(&a.model, &options).with_context(|| format!("cannot load {}", a.model.display()))?;
    let load = t0.elapsed();
    let mut feed: Vec<(String, Value)> = Vec::new();
    if let Some(npz) = &a.npz {
        for (name, t) in npy::read_npz(npz)? {
            feed.push((name, Value::Tensor(t)));
        }
    }
    for spec in &a.inputs {
        let (name, path) = spec
            .split_once('=')
            .with_context(|| format!("--input '{spec}': expected NAME=PATH.npy"))?;
        let t = npy::read_npy_file(Path::new(path)).with_context(|| format!("input '{name}'"))?;
        feed.retain(|(n, _)| n != name);
        feed.push((name.to_string(), Value::Tensor(t)));
    }
    let t1 = std::time::Instant::now();
    let outputs = session.run(feed)?;
    let ran = t1.elapsed();
    if let Some(dir) = &a.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for (name, value) in &outputs {
        let t = match value {
            Value::Tensor(t) => t,
            other => {
                emit(&format!(
                    "{name}: {} (not written: only tensors are saved as .npy)\n",
                    other.kind()
                ))?;
                continue;
            }
        };
        let mut note = String::new();
        if let Some(dir) = &a.output_dir {
            let path = dir.join(format!("{}.npy", file_name_for(name)));
            let w = npy::write_npy(&path, t)?;
            if let Some(from) = w.converted_from {
                note = format!(
                    " (written as {} from {from}: numpy has no {from})",
                    if from.is_int() { "int8/uint8" } else { "float32" }
                );
            }
        }
        emit(&format!("{name}: {}{note}\n", summary(t)))?;
    }
    eprintln!(
        "loaded in {:.1} ms, ran in {:.1} ms (reference interpreter)",
        load.as_secs_f64() * 1e3,
        ran.as_secs_f64() * 1e3
    );
    Ok(())
}

/// One line describing a tensor: dtype, shape and a few statistics.
fn summary(t: &Tensor) -> String {
    let shape = format!("{}{:?}", t.dtype(), t.shape());
    if t.dtype() == kiln::DType::String {
        let first: Vec<String> = t
            .as_slice::<String>()
            .unwrap_or(&[])
            .iter()
            .take(3)
            .map(|s| format!("{s:?}"))
            .collect();
        return format!(
            "{shape} [{}{}]",
            first.join(", "),
            if t.len() > 3 { ", ..." } else { "" }
        );
    }
    let v = t.to_f64_vec();
    if v.is_empty() {
        return format!("{shape} (empty)");
    }
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let (min, max) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let mean = finite.iter().sum::<f64>() / finite.len().max(1) as f64;
    let nonfinite = v.len() - finite.len();
    let first: Vec<String> = v.iter().take(4).map(|x| format!("{x:.6}")).collect();
    let argmax = v
        .iter()
        .enumerate()
        .fold(
            (0, f64::NEG_INFINITY),
            |acc, (i, &x)| if x > acc.1 { (i, x) } else { acc },
        )
        .0;
    let mut s = format!(
        "{shape} min={min:.6} max={max:.6} mean={mean:.6} argmax={argmax} first=[{}]",
        first.join(", ")
    );
    if nonfinite > 0 {
        s.push_str(&format!(" non-finite={nonfinite}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_become_safe_file_names() {
        assert_eq!(file_name_for("logits"), "logits");
        assert_eq!(file_name_for("out/0:1 x"), "out_0_1_x");
        assert_eq!(file_name_for("a.b-c_d"), "a.b-c_d");
        assert_eq!(file_name_for(".."), "_..");
    }

    #[test]
    fn symbols_parse_or_fail_clearly() {
        assert_eq!(
            parse_symbols(&["batch=4".into()]).unwrap(),
            vec![("batch".to_string(), 4)]
        );
        assert!(parse_symbols(&["batch".into()]).is_err());
        assert!(parse_symbols(&["batch=-1".into()]).is_err());
    }
}
