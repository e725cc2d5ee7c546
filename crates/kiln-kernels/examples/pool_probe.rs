//! temporary probe: fork-join cost of the pool.
use kiln_kernels::pool::{self, ThreadPool};
use std::time::Instant;
fn main() {
    let p = ThreadPool::new(2).unwrap();
    let _a = p.activate();
    p.install(|| {
        let work = |n: usize| {
            let mut s = 0.0f64;
            for i in 0..n {
                s += (i as f64).sqrt();
            }
            std::hint::black_box(s);
        };
        for &n in &[0usize, 2000, 20000] {
            let mut best = f64::MAX;
            let mut tot = 0.0;
            for _ in 0..20 {
                let t = Instant::now();
                for _ in 0..1000 {
                    pool::parallel_for(2, &|_| work(n));
                }
                let e = t.elapsed().as_secs_f64() / 1000.0;
                best = best.min(e);
                tot += e;
            }
            let t = Instant::now();
            for _ in 0..1000 {
                work(n);
            }
            let single = t.elapsed().as_secs_f64() / 1000.0;
            println!(
                "n {n}: fork-join of 2 tasks best {:.2} us avg {:.2} us; one task alone {:.2} us",
                best * 1e6,
                tot / 20.0 * 1e6,
                single * 1e6
            );
        }
    });
}
