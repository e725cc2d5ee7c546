//! The ONNX backend test harness.
//!
//! Test data lives in a cache outside the repo (written by `scripts/fetch_onnx_tests.py` from
//! the pinned `onnx` wheel): `<data>/<kind>/<case>/model.onnx`, `test_data_set_N/input_K.pb`,
//! `output_K.pb`, `meta.json`. Each case loads its model through a kiln `Session`, runs every
//! data set and compares every output. The checked-in `expected-failures.txt` lists cases known
//! to fail, each with a reason; a run is green only when exactly those fail.

use kiln::raw::onnx::proto::ModelProto;
use kiln::{Session, SessionOptions, Tensor, Value, ValueType};
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The kinds of backend test data, in run order.
pub const KINDS: [&str; 5] = ["node", "simple", "pytorch-converted", "pytorch-operator", "light"];

/// Least tolerance used for float comparisons, whatever a case declares.
pub const MIN_RTOL: f64 = 1e-3;
pub const MIN_ATOL: f64 = 1e-5;

#[derive(Debug, Clone)]
pub struct Case {
    pub kind: String,
    pub name: String,
    pub dir: PathBuf,
    pub rtol: f64,
    pub atol: f64,
}

impl Case {
    /// `kind/name`, the key used in the expected-failures list.
    pub fn key(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pass,
    Fail(String),
}

#[derive(Debug, Clone)]
pub struct CaseResult {
    pub case: Case,
    pub ops: Vec<String>,
    pub outcome: Outcome,
}

/// Where the test data cache is: `$KILN_ONNX_TESTS`, else `~/.cache/kiln/onnx-tests`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_ONNX_TESTS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/kiln/onnx-tests")
}

/// Lists the cases of the given kinds whose `kind/name` matches `filter`.
pub fn discover(data: &Path, kinds: &[&str], filter: Option<&regex::Regex>) -> std::io::Result<Vec<Case>> {
    let mut cases = Vec::new();
    for kind in kinds {
        let dir = data.join(kind);
        let mut names: Vec<String> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("model.onnx").exists())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            let key = format!("{kind}/{name}");
            if filter.is_some_and(|f| !f.is_match(&key)) {
                continue;
            }
            let case_dir = dir.join(&name);
            let (rtol, atol) = read_meta(&case_dir.join("meta.json"));
            cases.push(Case {
                kind: kind.to_string(),
                name,
                dir: case_dir,
                rtol,
                atol,
            });
        }
    }
    Ok(cases)
}

/// Reads `{"rtol": x, "atol": y}` (written by our fetch script) without a JSON dependency.
fn read_meta(path: &Path) -> (f64, f64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let field = |key: &str| -> Option<f64> {
        let at = text.find(&format!("\"{key}\""))?;
        let rest = text[at..].split_once(':')?.1;
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    };
    (field("rtol").unwrap_or(1e-3), field("atol").unwrap_or(1e-7))
}

/// Op types used by a case's model (main graph and subgraphs), for the per-op table.
pub fn model_ops(path: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else { return vec![] };
    let Ok(m) = ModelProto::decode(bytes.as_slice()) else {
        return vec![];
    };
    let mut ops = BTreeSet::new();
    if let Some(g) = &m.graph {
        for n in &g.node {
            ops.insert(n.op_type.clone().unwrap_or_default());
        }
    }
    ops.into_iter().collect()
}

/// The ways each case is run; a case passes only when it passes in all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Optimisation level 0: the reference interpreter on the imported graph.
    Reference,
    /// Fully optimised (level 3), compiled in memory.
    Optimized,
    /// Fully optimised, written to a `.kiln` file, loaded back and run.
    RoundTrip,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Reference, Mode::Optimized, Mode::RoundTrip];
    pub fn name(self) -> &'static str {
        match self {
            Mode::Reference => "reference",
            Mode::Optimized => "optimized",
            Mode::RoundTrip => "kiln-file",
        }
    }
}

/// Runs one case in every [`Mode`]: every data set, every output. The first failure names its
/// mode.
pub fn run_case(case: &Case, modes: &[Mode]) -> Outcome {
    for &mode in modes {
        match run_case_in(case, mode) {
            Outcome::Pass => {}
            Outcome::Fail(e) if mode == Mode::Reference => return Outcome::Fail(e),
            Outcome::Fail(e) => return Outcome::Fail(format!("[{}] {e}", mode.name())),
        }
    }
    Outcome::Pass
}

/// Runs one case in one mode.
pub fn run_case_in(case: &Case, mode: Mode) -> Outcome {
    match std::panic::catch_unwind(|| run_case_inner(case, mode)) {
        Ok(Ok(())) => Outcome::Pass,
        Ok(Err(e)) => Outcome::Fail(e),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Outcome::Fail(format!("PANIC: {}", msg.unwrap_or_default()))
        }
    }
}

fn run_case_inner(case: &Case, mode: Mode) -> Result<(), String> {
    let session = open_session(case, mode)?;
    let inputs = session.inputs();
    let outputs = session.outputs();
    let mut sets: Vec<PathBuf> = std::fs::read_dir(&case.dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))
        })
        .collect();
    sets.sort();
    if sets.is_empty() {
        return Err("no test data sets".into());
    }
    let rtol = case.rtol.max(MIN_RTOL);
    let atol = case.atol.max(MIN_ATOL);
    for set in sets {
        let mut feed = Vec::new();
        for (k, info) in inputs.iter().enumerate() {
            let path = set.join(format!("input_{k}.pb"));
            if !path.exists() {
                // An optional graph input the data set leaves out.
                if matches!(info.ty, ValueType::Optional(_)) {
                    continue;
                }
                return Err(format!("{}: missing input_{k}.pb for '{}'", set.display(), info.name));
            }
            feed.push((info.name.clone(), read_value(&path, &info.ty)?));
        }
        let got = session.run(feed).map_err(|e| format!("run: {e}"))?;
        for (k, info) in outputs.iter().enumerate() {
            let path = set.join(format!("output_{k}.pb"));
            if !path.exists() {
                continue;
            }
            let expected = read_value(&path, &info.ty)?;
            let actual = got
                .get(k)
                .map(|(_, v)| v)
                .ok_or_else(|| format!("output {k} missing"))?;
            compare_values(&expected, actual, rtol, atol).map_err(|e| format!("output '{}': {e}", info.name))?;
            check_static_type(&info.ty, actual).map_err(|e| format!("output '{}': {e}", info.name))?;
        }
    }
    Ok(())
}

fn open_session(case: &Case, mode: Mode) -> Result<Session, String> {
    let model = case.dir.join("model.onnx");
    let mut options = SessionOptions::default();
    options.compile.opt_level = match mode {
        Mode::Reference => 0,
        Mode::Optimized | Mode::RoundTrip => kiln::raw::compiler::MAX_OPT_LEVEL,
    };
    match mode {
        Mode::Reference | Mode::Optimized => Session::new(model, &options).map_err(|e| format!("load: {e}")),
        Mode::RoundTrip => {
            let file = kiln_file_path(case);
            kiln::compile_file(&model, &file, &options).map_err(|e| format!("compile: {e}"))?;
            let s = Session::new(&file, &SessionOptions::default()).map_err(|e| format!("load .kiln: {e}"));
            let _ = std::fs::remove_file(&file);
            s
        }
    }
}

/// A scratch `.kiln` path for a case, unique per process and case.
fn kiln_file_path(case: &Case) -> PathBuf {
    std::env::temp_dir().join(format!(
        "kiln-conformance-{}-{}-{}.kiln",
        std::process::id(),
        case.kind,
        case.name
    ))
}

/// The produced value must agree with the graph output's static type (declared in the file and
/// refined by kiln's inference): same dtype, same rank, same size on every fixed dim.
fn check_static_type(ty: &ValueType, v: &Value) -> Result<(), String> {
    let (ValueType::Tensor(t), Value::Tensor(x)) = (ty, v) else {
        return Ok(());
    };
    let dtype_ok = t.dtype.is_none_or(|d| d == x.dtype());
    let shape_ok = t.shape.as_ref().is_none_or(|s| {
        s.len() == x.rank()
            && s.iter()
                .zip(x.shape())
                .all(|(d, &n)| !matches!(d, kiln::Dim::Fixed(f) if *f != n))
    });
    if dtype_ok && shape_ok {
        Ok(())
    } else {
        Err(format!(
            "static type {ty} disagrees with the produced {}{:?}",
            x.dtype(),
            x.shape()
        ))
    }
}

fn read_value(path: &Path, ty: &ValueType) -> Result<Value, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    kiln::raw::onnx::load_value_proto(&bytes, ty, path.parent()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Compares a produced value with the expected one.
pub fn compare_values(expected: &Value, got: &Value, rtol: f64, atol: f64) -> Result<(), String> {
    match (expected, got) {
        (Value::Tensor(e), Value::Tensor(g)) => compare_tensor(e, g, rtol, atol),
        (Value::Sequence(e), Value::Sequence(g)) => {
            if e.items.len() != g.items.len() {
                return Err(format!(
                    "sequence length: expected {}, got {}",
                    e.items.len(),
                    g.items.len()
                ));
            }
            for (i, (a, b)) in e.items.iter().zip(&g.items).enumerate() {
                compare_tensor(a, b, rtol, atol).map_err(|m| format!("item {i}: {m}"))?;
            }
            Ok(())
        }
        (Value::Optional(e, _), Value::Optional(g, _)) => match (e, g) {
            (None, None) => Ok(()),
            (Some(e), Some(g)) => compare_values(e, g, rtol, atol),
            (e, _) => Err(format!(
                "optional: expected {}, got the other",
                if e.is_some() { "a value" } else { "none" }
            )),
        },
        (Value::Optional(Some(e), _), g) => compare_values(e, g, rtol, atol),
        (e, Value::Optional(Some(g), _)) => compare_values(e, g, rtol, atol),
        (e, g) => Err(format!("expected a {}, got a {}", e.kind(), g.kind())),
    }
}

fn compare_tensor(e: &Tensor, g: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    kiln::compare(e, g, rtol, atol).map_err(|m| m.to_string())
}

/// The expected-failure list: `kind/case | reason` per line, `#` comments.
pub fn read_expected(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, reason) = line
            .split_once('|')
            .ok_or_else(|| format!("{}:{}: expected 'kind/case | reason'", path.display(), i + 1))?;
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(format!("{}:{}: '{}' has no reason", path.display(), i + 1, key.trim()));
        }
        out.insert(key.trim().to_string(), reason.to_string());
    }
    Ok(out)
}

/// The checked-in list's path.
pub fn expected_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("expected-failures.txt")
}

/// Longest a single case may take before it is reported as a failure (a hang is a bug).
pub const CASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs a case on its own thread; a case still running after `limit` is a failure (its thread
/// is left to finish in the background).
pub fn run_case_with_timeout(case: &Case, modes: &[Mode], limit: std::time::Duration) -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel();
    let c = case.clone();
    let modes = modes.to_vec();
    let spawned = std::thread::Builder::new().stack_size(64 << 20).spawn(move || {
        let _ = tx.send(run_case(&c, &modes));
    });
    if let Err(e) = spawned {
        return Outcome::Fail(format!("cannot start a thread: {e}"));
    }
    match rx.recv_timeout(limit) {
        Ok(o) => o,
        Err(_) => Outcome::Fail(format!("TIMEOUT: still running after {}s", limit.as_secs())),
    }
}

/// Runs cases on `jobs` threads, calling `progress` after each.
pub fn run_all(
    cases: &[Case],
    modes: &[Mode],
    jobs: usize,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(cases.len()));
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { break };
                    let r = CaseResult {
                        case: case.clone(),
                        ops: model_ops(&case.dir.join("model.onnx")),
                        outcome: run_case_with_timeout(case, modes, CASE_TIMEOUT),
                    };
                    progress(&r);
                    if let Ok(mut v) = results.lock() {
                        v.push(r);
                    }
                }
            });
        }
    });
    let mut v = results.into_inner().unwrap_or_default();
    v.sort_by(|a, b| (&a.case.kind, &a.case.name).cmp(&(&b.case.kind, &b.case.name)));
    v
}

/// A summary of a run against the expected-failure list.
#[derive(Debug, Default)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Failures not in the list.
    pub unexpected_failures: Vec<(String, String)>,
    /// Listed cases that passed.
    pub unexpected_passes: Vec<String>,
}

pub fn summarize(results: &[CaseResult], expected: &BTreeMap<String, String>) -> Summary {
    let mut s = Summary::default();
    for r in results {
        let key = r.case.key();
        match &r.outcome {
            Outcome::Pass => {
                s.passed += 1;
                if expected.contains_key(&key) {
                    s.unexpected_passes.push(key);
                }
            }
            Outcome::Fail(msg) => {
                s.failed += 1;
                if !expected.contains_key(&key) {
                    s.unexpected_failures.push((key, msg.clone()));
                }
            }
        }
    }
    s
}

/// Per-op table: op type → (cases passed, cases failed), over the cases using the op.
pub fn per_op(results: &[CaseResult]) -> BTreeMap<String, (usize, usize)> {
    let mut t: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in results {
        for op in &r.ops {
            let e = t.entry(op.clone()).or_default();
            match r.outcome {
                Outcome::Pass => e.0 += 1,
                Outcome::Fail(_) => e.1 += 1,
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, outcome: Outcome) -> CaseResult {
        CaseResult {
            case: Case {
                kind: "node".into(),
                name: name.into(),
                dir: PathBuf::new(),
                rtol: 1e-3,
                atol: 1e-7,
            },
            ops: vec!["Add".into()],
            outcome,
        }
    }

    #[test]
    fn summary_flags_unlisted_failures_and_listed_passes() {
        let expected: BTreeMap<String, String> = [
            ("node/test_b".to_string(), "known".to_string()),
            ("node/test_c".to_string(), "known".to_string()),
        ]
        .into();
        let results = vec![
            result("test_a", Outcome::Fail("boom".into())),
            result("test_b", Outcome::Fail("known".into())),
            result("test_c", Outcome::Pass),
            result("test_d", Outcome::Pass),
        ];
        let s = summarize(&results, &expected);
        assert_eq!((s.passed, s.failed), (2, 2));
        assert_eq!(
            s.unexpected_failures,
            vec![("node/test_a".to_string(), "boom".to_string())]
        );
        assert_eq!(s.unexpected_passes, vec!["node/test_c".to_string()]);
        assert_eq!(per_op(&results).get("Add"), Some(&(2, 2)));
    }

    #[test]
    fn expected_list_needs_a_reason_per_line() {
        let dir = std::env::temp_dir().join(format!("kiln-exp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("list.txt");
        std::fs::write(&p, "# comment\nnode/test_x | a reason\n").unwrap();
        assert_eq!(
            read_expected(&p).unwrap().get("node/test_x").map(String::as_str),
            Some("a reason")
        );
        std::fs::write(&p, "node/test_x |  \n").unwrap();
        assert!(read_expected(&p).unwrap_err().contains("no reason"));
        std::fs::write(&p, "node/test_x\n").unwrap();
        assert!(read_expected(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn float_comparison_uses_the_floor_tolerances() {
        let e = Value::Tensor(Tensor::from_vec(vec![2], vec![1.0f32, 0.0]).unwrap());
        let g = Value::Tensor(Tensor::from_vec(vec![2], vec![1.0009f32, 0.000009]).unwrap());
        assert!(compare_values(&e, &g, MIN_RTOL, MIN_ATOL).is_ok());
        let g = Value::Tensor(Tensor::from_vec(vec![2], vec![1.0f32, 0.0001]).unwrap());
        assert!(compare_values(&e, &g, MIN_RTOL, MIN_ATOL).is_err());
    }
}
