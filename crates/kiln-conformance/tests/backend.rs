//! The whole ONNX backend suite (node, simple, pytorch-converted, pytorch-operator, light)
//! against the checked-in expected-failure list. Needs the test data written by
//! `scripts/setup.sh`; a missing cache is a failure, not a skip.

use kiln_conformance::{KINDS, Mode, default_data_dir, discover, expected_path, read_expected, run_all, summarize};

#[test]
fn onnx_backend_suite_matches_expected_failures() {
    let data = default_data_dir();
    let cases = discover(&data, &KINDS, None)
        .unwrap_or_else(|e| panic!("no ONNX test data in {} ({e}); run scripts/setup.sh", data.display()));
    assert!(
        cases.len() > 2000,
        "only {} cases found in {}",
        cases.len(),
        data.display()
    );
    let expected = read_expected(&expected_path()).unwrap_or_else(|e| panic!("{e}"));
    let results = run_all(&cases, &Mode::ALL, 2, &|_| {});
    let s = summarize(&results, &expected);
    println!("{} passed, {} failed, {} skipped", s.passed, s.failed, s.skipped);
    let keys: std::collections::BTreeSet<String> = cases.iter().map(|c| c.key()).collect();
    let stale: Vec<&String> = expected.keys().filter(|k| !keys.contains(*k)).collect();
    assert!(
        s.unexpected_failures.is_empty() && s.unexpected_passes.is_empty() && stale.is_empty(),
        "unexpected failures: {:#?}\nunexpected passes (remove from the list): {:#?}\nstale entries: {stale:#?}",
        s.unexpected_failures,
        s.unexpected_passes
    );
}
