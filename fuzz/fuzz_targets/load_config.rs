//! Fuzz target: arbitrary text as a configuration file of every format kiln reads (qaic YAML,
//! JSON, HTP backend extensions, Axelera), the format picked by the first byte as the file's
//! extension; then the checks, the backend-extension export and the JSON round trip. Every
//! step must return Ok or a typed error, never panic or allocate without bound. Seed it with
//! the files of `crates/kiln-config/tests/` and `examples/`.
#![no_main]

use kiln_config::Config;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const NAMES: [&str; 5] = ["c.yaml", "c.yml", "c.json", "c.conf", "c"];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let name = NAMES[usize::from(pick) % NAMES.len()];
    let mut c = Config::default();
    if c.load_str(&text, Path::new(name)).is_err() {
        return;
    }
    let _ = c.validate();
    let _ = c.check();
    let _ = c.warnings();
    let _ = c.unsupported();
    let json = c.to_backend_extension_json();
    let mut again = Config::default();
    let _ = again.load_str(&json, Path::new("again.json"));
    if let Ok(v) = serde_json::to_string(&c) {
        let _ = serde_json::from_str::<Config>(&v);
    }
});
