//! GEMM throughput on representative shapes (resnet50 convolutions as GEMM, transformer
//! projections, batch-1 GEMV), per kernel level, as GFLOP/s and % of the single-core f32
//! peak of the reference machine (Zen 4: 117 GFLOP/s = 3.65 GHz x 32 FLOP/cycle).
//!
//! `cargo bench -p kiln-kernels -- --warm-up-time 1 --measurement-time 3`; criterion reports
//! each case's throughput (elements = FLOPs, so Gelem/s = GFLOP/s); a summary table with the
//! median of our own timing loop and the % of peak is printed at the end (with the rate at
//! which B's bytes are read: the bound that matters for M = 1, where B is read once). Set
//! `KILN_BENCH_ALL_ISAS=1` to also run the AVX2 and portable kernels on an AVX-512 machine, and
//! `KILN_BENCH_SHAPES=text` to run only the shapes whose name contains `text` (and skip the
//! epilogue cases unless it matches `epilogue`). `KILN_BENCH_COLD=b` (or `a`, or `ab`) makes
//! each call use the next of several copies of B (the packed weights; of A) spanning 96 MiB,
//! as in a model whose weights outgrow the caches: every call then starts with its operands,
//! and C, evicted, where the plain run keeps them cached between calls.

mod common;

use common::{data, levels};
use criterion::{BenchmarkId, Criterion, Throughput};
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::isa::{self, Isa};
use kiln_kernels::sgemm::{AMatrix, Act, BLayout, Bias, Epilogue, PackedB, sgemm_with};
use std::hint::black_box;
use std::time::Instant;

const PEAK_GFLOPS: f64 = 117.0;

/// (name, m, n, k): C[m x n] = A[m x k] B[k x n]; a name ending in `A^T` reads A transposed,
/// one ending in `NR32` packs B in 32-column panels (what the compiler stores, for every
/// level) where the others take the level's own layout.
const SHAPES: [(&str, usize, usize, usize); 50] = [
    // A 3x3 convolution's im2col rows channels-last (PLCMOS's dilated 32 -> 64 and 64 -> 128
    // layers, one thread's rows).
    ("im2col 3x3 32->64", 3952, 64, 288),
    ("im2col 3x3 64->128", 3920, 128, 576),
    ("aspp 1x1 NHWC 33x49", 1617, 256, 960),
    ("resnet50 conv2_x 3x3", 64, 3136, 576),
    ("resnet50 conv2_x 1x1", 256, 3136, 64),
    ("resnet50 1x1 NHWC 56x56", 3136, 256, 64),
    ("resnet50 1x1 NHWC 28x28", 784, 512, 128),
    ("resnet50 1x1 NHWC 56x56 NR32", 3136, 256, 64),
    ("resnet50 1x1 NHWC 14x14 reduce NR32", 196, 256, 1024),
    ("resnet50 1x1 NHWC 14x14 expand NR32", 196, 1024, 256),
    ("resnet50 1x1 NHWC 7x7 reduce NR32", 49, 512, 2048),
    ("resnet50 1x1 NHWC 7x7 expand NR32", 49, 2048, 512),
    ("bert ffn up NR32", 128, 3072, 768),
    ("decoder ffn up m=32 NR32", 32, 3072, 768),
    ("encoder ffn up m=48 NR32", 48, 3072, 768),
    ("resnet50 conv3_x 3x3", 256, 784, 1152),
    ("resnet50 conv5_x 3x3", 512, 49, 4608),
    ("minilm qkv proj", 128, 384, 384),
    ("minilm ffn up", 128, 1536, 384),
    ("bert gemv m=1", 1, 768, 768),
    ("bert gemv m=1 NR32", 1, 768, 768),
    ("resnet50 classifier gemv NR32", 1, 1000, 2048),
    ("lstm step gemv h128 NR32", 1, 512, 128),
    ("lstm step batch 3 h256", 3, 1024, 256),
    ("stft 31 chunks NR32", 155, 258, 256),
    ("bert ffn up", 128, 3072, 768),
    ("bert ffn down", 128, 768, 3072),
    ("lda 4 KiB", 128, 1024, 1024),
    ("resnet50 conv3_x A^T", 256, 784, 1152),
    ("minilm ffn up A^T", 128, 1536, 384),
    ("mobilenet expand 1x1 56x56", 3136, 144, 24),
    ("mobilenet expand 1x1 in L2", 256, 144, 24),
    ("mobilenet expand 112x112 k16", 12544, 96, 16),
    ("mobilenet expand one row k16", 112, 96, 16),
    ("mobilenet project 1x1 56x56", 3136, 24, 144),
    ("vit qkv proj", 197, 192, 192),
    ("vit ffn up", 197, 768, 192),
    ("vit ffn down", 197, 192, 768),
    ("vit attention scores", 197, 197, 64),
    ("vit attention pv", 197, 64, 197),
    ("minilm attention scores", 128, 128, 32),
    ("minilm attention pv", 128, 32, 128),
    ("vit qkv fused", 197, 576, 192),
    ("minilm qkv fused", 128, 1152, 384),
    ("bert qkv fused", 128, 2304, 768),
    ("resnet18 7x7 3x3 NHWC NR32", 49, 512, 4608),
    ("resnet stem 7x7 s2 NHWC NR32", 12544, 64, 147),
    ("small bert ffn up m=80 NR32", 80, 2048, 512),
    ("square 480 k512 NR32", 480, 512, 512),
    ("text-line 1x1 NHWC k160 NR32", 4374, 320, 160),
];

struct Case {
    /// Copies of A and B, used in turn (one each unless `KILN_BENCH_COLD` is set).
    a: Vec<Vec<f32>>,
    b: Vec<PackedB>,
    turn: usize,
    c: Vec<f32>,
    bias: Vec<f32>,
    m: usize,
    k: usize,
    n: usize,
    transposed: bool,
}

impl Case {
    fn new(isa: Isa, name: &str, m: usize, n: usize, k: usize) -> Case {
        let b = data(k * n, 2);
        let layout = if name.ends_with("NR32") {
            BLayout::NR32
        } else {
            BLayout::for_isa(isa)
        };
        let packed = PackedB::pack(layout, k, n, &b, MatLayout::row_major(n)).unwrap_or_else(|e| {
            eprintln!("pack: {e}");
            std::process::exit(1)
        });
        let copies = if std::env::var_os("KILN_BENCH_COLD").is_some() {
            (96 << 20) / (4 * (k * n + m * k)).max(1) + 1
        } else {
            1
        };
        Case {
            a: vec![data(m * k, 1); copies],
            b: vec![packed; copies],
            turn: 0,
            c: vec![0.0; m * n],
            bias: data(n, 3),
            m,
            k,
            n,
            transposed: name.ends_with("A^T"),
        }
    }

    fn run(&mut self, isa: Isa, epi: &Epilogue<'_>) {
        self.turn = (self.turn + 1) % self.b.len();
        let cold = std::env::var("KILN_BENCH_COLD").unwrap_or_default();
        let a = &self.a[if cold.contains('a') { self.turn } else { 0 }];
        let b = &self.b[if cold.contains('b') { self.turn } else { 0 }];
        let r = sgemm_with(
            isa,
            self.m,
            if self.transposed {
                AMatrix::transposed(a, self.m)
            } else {
                AMatrix::row_major(a, self.k)
            },
            b.view(),
            &mut self.c,
            self.n,
            epi,
        );
        if let Err(e) = r {
            eprintln!("sgemm: {e}");
            std::process::exit(1);
        }
        black_box(&self.c);
    }

    fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64
    }
}

/// Whether `KILN_BENCH_SHAPES` (unset: every shape) selects this name.
fn selected(name: &str) -> bool {
    std::env::var("KILN_BENCH_SHAPES").map_or(true, |f| name.contains(f.as_str()))
}

fn bench(c: &mut Criterion) {
    for isa in levels() {
        let mut g = c.benchmark_group(format!("sgemm/{}", isa.name()));
        for &(name, m, n, k) in SHAPES.iter().filter(|s| selected(s.0)) {
            let mut case = Case::new(isa, name, m, n, k);
            g.throughput(Throughput::Elements(case.flops() as u64));
            g.bench_function(BenchmarkId::new(name, format!("m{m}n{n}k{k}")), |bch| {
                bch.iter(|| case.run(isa, &Epilogue::NONE))
            });
        }
        // Epilogue cost on a transformer FFN: bias + Gelu (erf) fused.
        if !selected("epilogue") {
            g.finish();
            continue;
        }
        let mut case = Case::new(isa, "", 128, 1536, 384);
        let bias = case.bias.clone();
        for (label, act) in [("bias+relu", Act::Relu), ("bias+gelu", Act::Gelu { tanh: false })] {
            let epi = Epilogue {
                bias: Bias::Col(&bias),
                residual: None,
                act: Some(act),
                post: None,
                prelu: kiln_kernels::sgemm::Bias::None,
            };
            g.throughput(Throughput::Elements(case.flops() as u64));
            g.bench_function(
                BenchmarkId::new(format!("minilm ffn up {label}"), "m128n1536k384"),
                |bch| bch.iter(|| case.run(isa, &epi)),
            );
        }
        g.finish();
    }
}

/// Seconds per call of one timed batch of `reps` calls.
fn batch(case: &mut Case, isa: Isa, epi: &Epilogue<'_>, reps: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        case.run(isa, epi);
    }
    t.elapsed().as_secs_f64() / reps as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds per call over `samples` timed batches of about 20 ms.
fn median_time(case: &mut Case, isa: Isa, samples: usize) -> f64 {
    let reps = ((0.02 / batch(case, isa, &Epilogue::NONE, 1).max(1e-7)) as usize).clamp(1, 10_000);
    median((0..samples).map(|_| batch(case, isa, &Epilogue::NONE, reps)).collect())
}

/// The fused epilogue's cost: plain, bias+relu, bias+gelu, bias+silu batches interleaved
/// (A B C D A B C D ..) so that load from other processes hits all alike; on a transformer
/// projection and on an inverted-residual expansion (K = 16, as EfficientNet's first one).
fn epilogue_cost(isa: Isa) {
    for (m, n, k) in [(128, 1536, 384), (12544, 96, 16)] {
        let mut case = Case::new(isa, "", m, n, k);
        let bias = case.bias.clone();
        let with = |act| Epilogue {
            bias: Bias::Col(&bias),
            residual: None,
            act: Some(act),
            post: None,
            prelu: kiln_kernels::sgemm::Bias::None,
        };
        let epis = [
            ("none", Epilogue::NONE),
            ("bias+relu", with(Act::Relu)),
            ("bias+gelu", with(Act::Gelu { tanh: false })),
            ("bias+silu", with(Act::Silu)),
        ];
        let reps = ((0.02 / batch(&mut case, isa, &Epilogue::NONE, 1).max(1e-7)) as usize).clamp(1, 10_000);
        let mut times = vec![Vec::new(); epis.len()];
        for _ in 0..15 {
            for (t, (_, e)) in times.iter_mut().zip(&epis) {
                t.push(batch(&mut case, isa, e, reps));
            }
        }
        let base = median(times[0].clone());
        for (t, (name, _)) in times.into_iter().zip(&epis) {
            let md = median(t);
            println!(
                "{:<8} epilogue {:<10} on {m}x{n}x{k}: {:>8.1} us (+{:.1}%, {:.1} GFLOP/s)",
                isa.name(),
                name,
                md * 1e6,
                100.0 * (md / base - 1.0),
                2.0 * (m * n * k) as f64 / md / 1e9
            );
        }
    }
}

fn summary() {
    println!();
    println!("kernels: {}", isa::dispatch().describe());
    println!(
        "{:<8} {:<22} {:>5} {:>5} {:>5} {:>10} {:>8} {:>7} {:>8}",
        "isa", "shape", "M", "N", "K", "median us", "GFLOP/s", "% peak", "B GB/s"
    );
    for isa in levels() {
        for &(name, m, n, k) in SHAPES.iter().filter(|s| selected(s.0)) {
            let mut case = Case::new(isa, name, m, n, k);
            let t = median_time(&mut case, isa, 15);
            let gf = case.flops() / t / 1e9;
            println!(
                "{:<8} {:<22} {:>5} {:>5} {:>5} {:>10.1} {:>8.1} {:>6.1}% {:>8.1}",
                isa.name(),
                name,
                m,
                n,
                k,
                t * 1e6,
                gf,
                100.0 * gf / PEAK_GFLOPS,
                (4 * k * n) as f64 / t / 1e9
            );
        }
        if selected("epilogue") {
            epilogue_cost(isa);
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    let listing = std::env::args().any(|a| a == "--list" || a == "--test");
    if !listing {
        summary();
    }
}
