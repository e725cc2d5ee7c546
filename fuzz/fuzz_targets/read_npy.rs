//! Fuzz target: arbitrary bytes as an `.npy` array (even first byte) or an `.npz` archive (odd),
//! read as `kiln run` and `kiln repro` read inputs, with the archive's decompressed bytes bounded
//! to 64 MiB. Must return the arrays or an error, never panic or allocate without bound (no
//! zip bombs). Seed it with .npy/.npz files numpy wrote (examples/, the corpus' feeds).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    if pick % 2 == 0 {
        if let Ok(t) = kiln_cli::npy::parse_npy(rest) {
            let (bytes, _) = kiln_cli::npy::to_npy(&t);
            let _ = kiln_cli::npy::parse_npy(&bytes);
        }
    } else {
        let _ = kiln_cli::npy::read_npz_from(std::io::Cursor::new(rest), "fuzz.npz", 64 << 20);
    }
});
