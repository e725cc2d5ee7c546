//! docs/options.md is generated from the registry; this test fails when it is stale.
//! Regenerate with `KILN_BLESS=1 cargo test -p kiln-config --test docs`.

#![allow(clippy::panic)]

use std::path::Path;

#[test]
fn options_md_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/options.md");
    let want = kiln_config::markdown();
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/options.md is stale: run `KILN_BLESS=1 cargo test -p kiln-config --test docs`"
    );
}

#[test]
fn every_option_is_documented_with_its_status() {
    let md = kiln_config::markdown();
    for s in kiln_config::options() {
        let row = md.lines().find(|l| l.starts_with(&format!("| `{}` |", s.name)));
        let row = row.unwrap_or_else(|| panic!("{} missing", s.name));
        let label = match s.status {
            kiln_config::Status::Implemented => "implemented",
            kiln_config::Status::NotYetImplemented { fatal: true, .. } => "not yet (error)",
            kiln_config::Status::NotYetImplemented { fatal: false, .. } => "not yet (warning)",
            kiln_config::Status::NoEffect { .. } => "no effect",
        };
        assert!(row.contains(label), "{row}");
    }
}
