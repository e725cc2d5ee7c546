//! What a Session's runs take from the system allocator: the first run, and the third (steady
//! state, where only the outputs and small bookkeeping should remain).
//!
//!     cargo run --release -p kiln --example alloc_probe -- MODEL.onnx|MODEL.kiln [THREADS]

use kiln::{CountingAlloc, Session, SessionOptions};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: alloc_probe MODEL [THREADS]")?;
    let mut options = SessionOptions::default();
    options.threads = args.next().map(|t| t.parse()).transpose()?.unwrap_or(1);
    let s = Session::new(&path, &options)?;
    let feeds = s.with_random_inputs(Vec::new(), 7)?;
    let (r, first) = ALLOC.measure(|| s.run(feeds.clone()));
    r?;
    s.run(feeds.clone())?;
    let again = feeds.clone();
    let (out, third) = ALLOC.measure(|| s.run(again));
    let out_bytes: usize = out?
        .iter()
        .map(|(_, v)| v.as_tensor().map_or(0, |t| t.len() * t.dtype().size_of().max(1)))
        .sum();
    println!("{path}: first run {first:?}; third run {third:?}; outputs {out_bytes} bytes");
    Ok(())
}
