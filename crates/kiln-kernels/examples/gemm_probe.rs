//! temporary probe: GFLOP/s of small-K GEMMs called per row.
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::isa;
use kiln_kernels::sgemm::{AMatrix, Act, BLayout, Bias, Epilogue, PackedB, sgemm};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let (rows, m, k, n) = (args[0], args[1], args[2], args[3]);
    let a: Vec<f32> = (0..rows * m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let bias: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let pb = PackedB::pack(BLayout::for_isa(isa::active()), k, n, &b, MatLayout::row_major(n)).unwrap();
    let mut c = vec![0.0f32; 3 * m * n];
    let noepi = std::env::var("NOEPI").is_ok();
    let epi = if noepi {
        Epilogue::NONE
    } else {
        Epilogue {
            bias: Bias::Col(&bias),
            residual: None,
            act: Some(Act::Clip {
                min: Some(0.0),
                max: Some(6.0),
            }),
        }
    };
    let mut best = f64::MAX;
    for _ in 0..500 {
        let t = Instant::now();
        for r in 0..rows {
            let s = r % 3;
            sgemm(
                m,
                AMatrix::row_major(&a[r * m * k..(r + 1) * m * k], k),
                pb.view(),
                &mut c[s * m * n..(s + 1) * m * n],
                n,
                &epi,
            )
            .unwrap();
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let flops = 2.0 * (rows * m * k * n) as f64;
    println!(
        "rows {rows} m {m} k {k} n {n}: {:.3} ms, {:.1} GFLOP/s",
        best * 1e3,
        flops / best / 1e9
    );
}
