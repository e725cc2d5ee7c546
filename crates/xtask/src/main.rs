//! `cargo xtask tidy`: repository checks that the compiler cannot make. The same checks run as
//! this crate's tests, so `cargo test` enforces them.

mod tidy;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cmd = std::env::args().nth(1).unwrap_or_default();
    match cmd.as_str() {
        "tidy" => match tidy::run_all(&tidy::workspace_root()) {
            Ok(()) => {
                println!("tidy: ok");
                ExitCode::SUCCESS
            }
            Err(problems) => {
                for p in problems {
                    eprintln!("tidy: {p}");
                }
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo xtask tidy");
            ExitCode::from(2)
        }
    }
}
