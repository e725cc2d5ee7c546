//! Fuzz target: arbitrary text as `-O KEY=VALUE` overrides, one per line (what `kiln` and the
//! Python keywords pass to the configuration), applied in order, then the checks. Must return
//! Ok or a typed error, never panic.
#![no_main]

use kiln_config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut c = Config::default();
    for line in text.lines().take(64) {
        let _ = c.apply_override(line);
    }
    let _ = c.validate();
    let _ = c.check();
    let _ = c.to_backend_extension_json();
});
