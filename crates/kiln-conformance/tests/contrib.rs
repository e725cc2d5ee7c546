//! ONNX Runtime's com.microsoft ops (the ones its transformer optimiser and its quantiser's
//! QOperator format write), each case a
//! small model with ONNX Runtime's outputs as the reference (written by
//! `scripts/make_contrib_tests.py` from `scripts/setup.sh`). Every case must pass in every mode;
//! a missing cache is a failure, not a skip.

use kiln_conformance::{Mode, Outcome, default_data_dir, discover, run_all};

#[test]
fn com_microsoft_ops_match_onnxruntime() {
    let data = default_data_dir();
    let cases = discover(&data, &["contrib"], None)
        .unwrap_or_else(|e| panic!("no contrib cases in {} ({e}); run scripts/setup.sh", data.display()));
    assert!(
        cases.len() >= 56,
        "only {} contrib cases in {}",
        cases.len(),
        data.display()
    );
    let results = run_all(&cases, &Mode::ALL, 2, &|_| {});
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Pass => None,
            Outcome::Fail(why) => Some(format!("{}: {why}", r.case.key())),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}
