//! `kiln-conformance`: run the ONNX backend tests against kiln and check the expected-failure
//! list. Exit status 0 only when exactly the listed cases fail.

use clap::Parser;
use kiln_conformance::{
    KINDS, Mode, Outcome, default_data_dir, discover, expected_path, per_op, read_expected, run_all, summarize,
};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Run the ONNX backend test cases through kiln")]
struct Args {
    /// Test data cache (default: $KILN_ONNX_TESTS or ~/.cache/kiln/onnx-tests).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Kinds to run (comma separated): node, simple, pytorch-converted, pytorch-operator, light.
    #[arg(long, value_delimiter = ',')]
    kinds: Option<Vec<String>>,
    /// Only cases whose `kind/name` matches this regex.
    #[arg(long)]
    filter: Option<String>,
    /// Print every case's outcome and failure reason.
    #[arg(long, short)]
    verbose: bool,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Modes to run each case in (comma separated): reference (level 0), optimized (level 3),
    /// kiln-file (level 3 through a written and reloaded .kiln). Default: all three.
    #[arg(long, value_delimiter = ',', value_parser = parse_mode)]
    mode: Option<Vec<Mode>>,
    /// Do not print the per-op table.
    #[arg(long)]
    no_table: bool,
    /// Write the current failures as an expected-failure list to this file (reasons from the
    /// old list where present, else the failure message).
    #[arg(long)]
    write_expected: Option<PathBuf>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::ALL
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| format!("unknown mode '{s}' (reference, optimized, kiln-file)"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let data = args.data.unwrap_or_else(default_data_dir);
    let kinds: Vec<String> = args
        .kinds
        .unwrap_or_else(|| KINDS.iter().map(|s| s.to_string()).collect());
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    let filter = match args.filter.as_deref().map(regex::Regex::new).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: --filter: {e}");
            return ExitCode::from(2);
        }
    };
    let cases = match discover(&data, &kinds, filter.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "error: cannot read test data in {}: {e}\nrun: python scripts/fetch_onnx_tests.py {}",
                data.display(),
                data.display()
            );
            return ExitCode::from(2);
        }
    };
    let expected = match read_expected(&expected_path()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let verbose = args.verbose;
    let modes = args.mode.clone().unwrap_or_else(|| Mode::ALL.to_vec());
    let results = run_all(&cases, &modes, args.jobs, &|r| {
        if verbose {
            match &r.outcome {
                Outcome::Pass => println!("PASS {}", r.case.key()),
                Outcome::Fail(m) => println!("FAIL {}: {}", r.case.key(), m.replace("\n  ", " ").replace('\n', "; ")),
            }
            let _ = std::io::stdout().flush();
        }
    });
    if !args.no_table {
        println!("\n{:<34} {:>6} {:>6}", "op", "pass", "fail");
        for (op, (p, f)) in per_op(&results) {
            println!("{op:<34} {p:>6} {f:>6}");
        }
    }
    let summary = summarize(&results, &expected);
    if let Some(path) = &args.write_expected {
        let mut text = String::from(
            "# ONNX backend test cases kiln is known to fail: `kind/case | reason`.\n# The conformance run fails on any other failure and on any listed case that passes.\n",
        );
        for r in &results {
            if let Outcome::Fail(m) = &r.outcome {
                let key = r.case.key();
                let reason = expected
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| m.lines().next().unwrap_or("").replace('|', "/"));
                text.push_str(&format!("{key} | {reason}\n"));
            }
        }
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: {}: {e}", path.display());
        }
    }
    let in_run: std::collections::BTreeSet<String> = results.iter().map(|r| r.case.key()).collect();
    println!();
    for (key, msg) in &summary.unexpected_failures {
        println!("UNEXPECTED FAIL {key}: {}", msg.lines().next().unwrap_or(""));
    }
    for key in &summary.unexpected_passes {
        println!("UNEXPECTED PASS {key} (remove it from expected-failures.txt)");
    }
    let missing: Vec<&String> = expected
        .keys()
        .filter(|k| filter.is_none() && !in_run.contains(*k) && kinds.iter().any(|kd| k.starts_with(&format!("{kd}/"))))
        .collect();
    for key in &missing {
        println!("STALE ENTRY {key}: no such case in the test data");
    }
    println!(
        "{} passed, {} failed, {} skipped",
        summary.passed, summary.failed, summary.skipped
    );
    let ok = summary.unexpected_failures.is_empty() && summary.unexpected_passes.is_empty() && missing.is_empty();
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
