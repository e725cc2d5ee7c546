//! `kiln compile MODEL -o OUT.kiln` and the compile flags every model-taking command shares.

use anyhow::{Context, Result, bail};
use kiln::SessionOptions;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Flags that say how a model is compiled; the same on `compile`, `run`, `bench` and `profile`.
/// For a `.kiln` program they must agree with how it was compiled (they cannot change it).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CompileFlags {
    #[command(flatten)]
    pub config: crate::config_cmd::ConfigOpts,
    /// Bind a symbolic dimension: NAME=VALUE (repeatable; qaic's onnx_define_symbol).
    #[arg(long = "define-symbol", value_name = "NAME=VALUE")]
    pub symbols: Vec<String>,
    /// Optimisation level (HTP's optimization_type): 0 = no rewrites, 1 = cleanup,
    /// 2 = fusions (default), 3 = everything.
    #[arg(long = "opt-level", visible_alias = "optimization-type", value_name = "0-3")]
    pub opt_level: Option<u8>,
    /// Expose these intermediate values as extra outputs (comma separated; qaic's
    /// set_output_tensors).
    #[arg(long = "output-tensors", value_delimiter = ',', value_name = "NAME,...")]
    pub output_tensors: Vec<String>,
    /// Expose every intermediate tensor as an output (enable_intermediate_outputs).
    #[arg(long = "all-outputs")]
    pub all_outputs: bool,
    /// Calibration samples for convert_to_quantize / dump_profile: a folder of .npz files (one
    /// sample each) or one .npz with a leading sample axis (the calibration_data option).
    #[arg(long = "calibration-data", value_name = "PATH")]
    pub calibration_data: Option<PathBuf>,
}

impl CompileFlags {
    /// The resolved configuration (defaults < `--config` files < `-O`), then these flags on top.
    pub fn session_options(&self) -> Result<SessionOptions> {
        let config = self.config.resolve()?;
        let mut o = SessionOptions::from_config(&config);
        if let Some(l) = self.opt_level {
            if l > kiln::raw::compiler::MAX_OPT_LEVEL {
                bail!("--opt-level {l}: expected 0 to {}", kiln::raw::compiler::MAX_OPT_LEVEL);
            }
            o.compile.opt_level = l;
        }
        if !self.output_tensors.is_empty() {
            o.compile.output_tensors = self.output_tensors.clone();
        }
        o.compile.all_outputs |= self.all_outputs;
        for (name, v) in crate::parse_symbols(&self.symbols)? {
            o.symbols.retain(|(n, _)| n != &name);
            o.symbols.push((name, v));
        }
        // Ctrl-C stops a compile or a run cleanly (the second one exits at once).
        o.cancel = Some(crate::interrupt_flag());
        let data = self
            .calibration_data
            .as_ref()
            .or(config.compile.calibration_data.as_ref());
        match (&mut o.quantize, data) {
            (Some(q), Some(path)) => {
                if !matches!(q.mode, kiln::QuantizeMode::LoadProfile(_)) {
                    q.samples = std::sync::Arc::new(kiln_cli::calibration::load(path)?);
                }
                q.progress = progress_bar();
            }
            (Some(q), None) => q.progress = progress_bar(),
            (None, Some(_)) => bail!(
                "--calibration-data is for quantizing: add -O convert_to_quantize=true (or dump_profile / load_profile)"
            ),
            (None, None) => {}
        }
        Ok(o)
    }

    /// Compile-section options the configuration sets (they cannot change a compiled program).
    fn configured_compile_options(&self) -> Result<Vec<String>> {
        let config = kiln_config::Config::resolve(&self.config.files, &self.config.overrides)?;
        Ok(config
            .changed()
            .into_iter()
            .filter(|(spec, _, _)| spec.section == kiln_config::Section::Compile)
            .map(|(spec, _, _)| spec.name.to_string())
            .collect())
    }

    /// Refuses the flags that only compiling uses (for commands that do not compile).
    pub fn reject_compile_only(&self, command: &str) -> Result<()> {
        if self.opt_level.is_some()
            || !self.output_tensors.is_empty()
            || self.all_outputs
            || self.calibration_data.is_some()
        {
            bail!(
                "kiln {command} describes the imported model: --opt-level, --output-tensors and --all-outputs \
                 apply to compile, run, bench and profile"
            );
        }
        Ok(())
    }

    /// Whether any flag asks for something only compiling can do.
    fn changes_compilation(&self) -> bool {
        self.opt_level.is_some()
            || !self.output_tensors.is_empty()
            || self.all_outputs
            || !self.symbols.is_empty()
            || self.calibration_data.is_some()
    }
}

/// A progress bar on stderr for the calibration runs (none when stderr is not a terminal).
fn progress_bar() -> Option<kiln::ProgressFn> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} samples")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(kiln::ProgressFn(std::sync::Arc::new(
        move |p: kiln::QuantizeProgress| {
            bar.set_length(p.total as u64);
            bar.set_message(format!("calibration: {}", p.stage));
            bar.set_position(p.done as u64);
            if p.done == p.total {
                bar.finish_and_clear();
                bar.reset();
            }
        },
    )))
}

/// Refuses compile flags on an already compiled `.kiln` program, whose compilation is fixed.
pub fn check_flags_for(model: &Path, flags: &CompileFlags) -> Result<()> {
    if !kiln::is_program_file(model) {
        return Ok(());
    }
    if flags.changes_compilation() {
        bail!(
            "{} is a compiled .kiln program: --define-symbol, --opt-level, --output-tensors and --all-outputs \
             (--outputs all) apply when compiling, and its outputs were fixed then; pass them to `kiln compile` \
             (or run the .onnx)",
            model.display()
        );
    }
    let set = flags.configured_compile_options()?;
    if !set.is_empty() {
        bail!(
            "{} is a compiled .kiln program: the compile options {} in the configuration apply when compiling; \
             pass them to `kiln compile` (or run the .onnx)",
            model.display(),
            set.join(", ")
        );
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct CompileArgs {
    /// The model (.onnx).
    pub model: PathBuf,
    /// The program file to write (default: OUTPUT_DIR/<model>.kiln with the output_dir option).
    #[arg(long, short = 'o', value_name = "OUT.kiln")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub flags: CompileFlags,
    /// No progress or summary on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Write the quantization report (nodes quantized, SQNR of each output and of the ten
    /// worst tensors against the float model) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
}

pub fn compile(a: CompileArgs) -> Result<()> {
    let options = a.flags.session_options()?;
    if a.report.is_some() && options.quantize.is_none() {
        bail!(
            "--report writes the quantization report: add -O convert_to_quantize=true (or dump_profile / load_profile)"
        );
    }
    let output = match (&a.output, &options.config.compile.output_dir) {
        (Some(o), _) => o.clone(),
        (None, Some(dir)) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create output_dir {}", dir.display()))?;
            let stem = a
                .model
                .file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
            dir.join(format!("{stem}.kiln"))
        }
        (None, None) => bail!("no output file: pass -o OUT.kiln (or set output_dir in the configuration)"),
    };
    let progress = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let p = indicatif::ProgressBar::new_spinner();
        p.set_message(format!("compiling {}", a.model.display()));
        p.enable_steady_tick(std::time::Duration::from_millis(100));
        p
    });
    let t0 = Instant::now();
    let r = kiln::compile_file(&a.model, &output, &options);
    if let Some(p) = &progress {
        p.finish_and_clear();
    }
    let s = r.with_context(|| format!("cannot compile {}", a.model.display()))?;
    let took = t0.elapsed();
    if let Some(path) = &a.report {
        let Some(q) = &s.quantization else {
            bail!("no quantization report: the compile did not quantize");
        };
        let json = serde_json::to_string_pretty(q).context("the quantization report")?;
        std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    if a.quiet {
        return Ok(());
    }
    let mut out = String::new();
    out.push_str(&format!(
        "compiled {} -> {} in {:.2} s\n",
        a.model.display(),
        output.display(),
        took.as_secs_f64()
    ));
    out.push_str(&format!(
        "  optimisation level {}: {} nodes -> {}\n",
        s.report.level, s.report.nodes_before, s.report.nodes_after
    ));
    for p in s.report.passes.iter().filter(|p| p.rewrites > 0) {
        out.push_str(&format!("    {:<28} {:>6} rewrites\n", p.pass, p.rewrites));
    }
    if let Some(q) = &s.quantization {
        for line in q.render().lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out.push_str(&format!(
        "  memory plan: {}\n    (recorded in the program; each run places its planned tensors at these offsets in one\n    block per run state, so later runs allocate only their outputs)\n",
        s.memory.summary()
    ));
    out.push_str(&format!(
        "  weights: {} tensors, {} ({}), 64-byte aligned\n",
        s.meta.weights.count,
        human_bytes(s.meta.weights.bytes),
        s.meta.weights.packing
    ));
    if !s.meta.shape_sets.is_empty() {
        let sets: Vec<String> = s.meta.shape_sets.iter().map(|b| kiln::format_bindings(b)).collect();
        out.push_str(&format!(
            "  shape specializations: {} ({})\n",
            sets.len(),
            sets.join("; ")
        ));
    }
    if let Some(src) = &s.meta.specialize {
        out.push_str(&format!(
            "  symbolic input dims: the model ({}) is embedded; a session compiles each new input shape on its first run\n",
            human_bytes(src.bytes)
        ));
    }
    out.push_str(&format!(
        "  file: {} bytes, content hash {}\n",
        s.file_bytes,
        &s.meta.content_hash[..16.min(s.meta.content_hash.len())]
    ));
    eprint!("{out}");
    Ok(())
}

pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b} B")
    }
}
