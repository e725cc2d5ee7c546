//! `kiln`: run and inspect ONNX models.

mod bench;
mod compile;
mod config_cmd;
mod info;
mod profile;
mod repro;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kiln::{Session, Tensor, Value};
use kiln_cli::npy;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Keeps freed activation buffers for the next inference instead of returning them to the OS
/// (which made every run page-fault them in again).
#[global_allocator]
static ALLOC: kiln::CachingAlloc = kiln::CachingAlloc::new();

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
    /// Compile an ONNX model into a .kiln program file (optimised, weights aligned for mapping).
    Compile(compile::CompileArgs),
    /// Run a model (.onnx or .kiln) on inputs from .npy/.npz files and write every output as
    /// DIR/<name>.npy.
    Run(RunArgs),
    /// Show a model's inputs, outputs, opsets, op histogram, parameters and MACs, or a .kiln
    /// program's sections, checksums, hash, options, weights and memory plan.
    Info(InfoArgs),
    /// Benchmark a model (qaic's run_benchmark): inferences/s, load time and latency
    /// percentiles (linear interpolation, numpy's default), on given or random inputs.
    Bench(bench::BenchArgs),
    /// Time every node over N runs: a table sorted by time (op, shapes, share, GFLOP/s) and
    /// optionally a Chrome trace (--trace, ONNX Runtime's profiler layout, opens in Perfetto).
    Profile(profile::ProfileArgs),
    /// Replay an error artifact (save_error_artifact): the bundle's model, configuration and
    /// inputs; exit status 1 when the recorded error comes back, 2 for another error, 0 for none.
    Repro(repro::ReproArgs),
    /// List the options, show the resolved configuration, print its JSON Schema.
    Config(config_cmd::ConfigArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The model (.onnx or .kiln).
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
    /// `all`: also output every intermediate tensor (same as --all-outputs).
    #[arg(long, value_name = "all")]
    outputs: Option<String>,
    /// Print the CRC-32 of every input and output (sampled with crc_stride; see gen_crc in
    /// docs/options.md).
    #[arg(long)]
    crc: bool,
    #[command(flatten)]
    flags: compile::CompileFlags,
}

#[derive(clap::Args)]
struct InfoArgs {
    /// The model (.onnx) or program (.kiln).
    model: PathBuf,
    /// Symbol bindings (--define-symbol) and configuration (--config, -O) for an .onnx model.
    #[command(flatten)]
    flags: compile::CompileFlags,
    /// Also print the whole graph as text.
    #[arg(long)]
    graph: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Compile(a) => compile::compile(a),
        Command::Run(a) => run(a),
        Command::Bench(a) => bench::bench(a),
        Command::Profile(a) => profile::profile(a),
        Command::Info(a) => a
            .flags
            .reject_compile_only("info")
            .and_then(|()| compile::check_flags_for(&a.model, &a.flags))
            .and_then(|()| a.flags.session_options())
            .and_then(|o| info::info(&a.model, &o.symbols, a.graph)),
        Command::Config(a) => config_cmd::run(a),
        Command::Repro(a) => match repro::repro(a) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The flag Ctrl-C sets (a handler installed on first use): compiles and runs given it in
/// their `SessionOptions::cancel` stop with an error naming where they were, and `kiln bench`
/// reports the inferences completed so far. A second Ctrl-C exits at once (status 130).
pub(crate) fn interrupt_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, OnceLock};
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    Arc::clone(FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&flag);
        // Without a handler (another one is installed already) Ctrl-C keeps its default.
        let _ = ctrlc::set_handler(move || {
            if seen.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
            eprintln!("\ninterrupted: stopping (Ctrl-C again to exit at once)");
        });
        flag
    }))
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

/// Inputs from an optional .npz archive and `NAME=PATH.npy` specs (a spec replaces an array
/// of the same name from the archive).
pub(crate) fn read_feed(npz: Option<&Path>, inputs: &[String]) -> Result<Vec<(String, Value)>> {
    let mut feed: Vec<(String, Value)> = Vec::new();
    if let Some(npz) = npz {
        for (name, t) in npy::read_npz(npz)? {
            feed.push((name, Value::Tensor(t)));
        }
    }
    for spec in inputs {
        let (name, path) = spec
            .split_once('=')
            .with_context(|| format!("--input '{spec}': expected NAME=PATH.npy"))?;
        let t = npy::read_npy_file(Path::new(path)).with_context(|| format!("input '{name}'"))?;
        feed.retain(|(n, _)| n != name);
        feed.push((name.to_string(), Value::Tensor(t)));
    }
    Ok(feed)
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

fn run(mut a: RunArgs) -> Result<()> {
    match a.outputs.as_deref() {
        None => {}
        // Same as --all-outputs: refused on a .kiln program, whose outputs are fixed when compiling.
        Some("all") => a.flags.all_outputs = true,
        Some(other) => anyhow::bail!("--outputs {other}: expected 'all' (use --output-tensors to pick names)"),
    }
    compile::check_flags_for(&a.model, &a.flags)?;
    let options = a.flags.session_options()?;
    let t0 = std::time::Instant::now();
    let session = loading(Session::new(&a.model, &options), &a.model)?;
    let load = t0.elapsed();
    let feed = read_feed(a.npz.as_deref(), &a.inputs)?;
    let t1 = std::time::Instant::now();
    let (outputs, crc) = if a.crc {
        let (o, crc) = session.run_with_crc(feed, &kiln::RunOptions::default())?;
        (o, Some(crc))
    } else {
        (session.run(feed)?, None)
    };
    let ran = t1.elapsed();
    if let Some(crc) = &crc {
        for (name, c) in &crc.inputs {
            emit(&format!("crc input  {name}: {c:08x}\n"))?;
        }
        for (name, c) in &crc.outputs {
            emit(&format!("crc output {name}: {c:08x}\n"))?;
        }
        emit(&format!("(CRC-32 sampled with crc_stride {})\n", crc.stride))?;
    }
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
        "loaded in {:.1} ms, ran in {:.1} ms",
        load.as_secs_f64() * 1e3,
        ran.as_secs_f64() * 1e3
    );
    // enable_metrics / enable_profiling (from --config or -O) report on this run.
    if let Some(p) = session.get_profile() {
        eprint!("{}", p.table(Some(25)));
    } else if session.get_metrics().is_some() {
        session.print_metrics();
    }
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

/// `r` with "cannot load PATH" before its error, or "cannot load the model" when the error
/// already names the path (a program file's errors do), so the path is printed once.
pub(crate) fn loading<T>(r: std::result::Result<T, kiln::Error>, path: &Path) -> Result<T> {
    r.map_err(|e| {
        let shown = path.display().to_string();
        let what = if e.to_string().contains(&shown) {
            "cannot load the model".to_string()
        } else {
            format!("cannot load {shown}")
        };
        anyhow::Error::new(e).context(what)
    })
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
