//! Throughput of the integer GEMM (u8 x s8 -> s32) on the shapes of ResNet-50's convolutions
//! and BERT's projections, in GOP/s (two operations per multiply-add), on the best level of
//! this CPU and the portable twin.
//!
//! `cargo bench -p kiln-kernels --bench igemm -- --warm-up-time 1 --measurement-time 3`.

use criterion::{BenchmarkId, Criterion, Throughput};
use kiln_kernels::igemm::{PackedB, igemm_with};
use kiln_kernels::isa::{self, Isa};
use std::hint::black_box;

/// (name, M, N, K).
const SHAPES: [(&str, usize, usize, usize); 10] = [
    ("resnet50 stem 7x7x3 (147 deep) -> 64", 3136, 64, 147),
    ("mobilenet 1x1 112x112 16->64", 12544, 64, 16),
    ("mobilenet 1x1 56x56 24->72", 3136, 72, 24),
    ("resnet50 layer4 1x1 7x7 512->2048", 98, 2048, 512),
    ("resnet50 conv 1x1 56x56 64->256", 3136, 256, 64),
    ("resnet50 conv3 3x3 28x28x128", 784, 128, 1152),
    ("resnet50 conv4 1x1 14x14 1024->256", 196, 256, 1024),
    ("resnet50 conv5 3x3 7x7x512", 49, 512, 4608),
    ("bert qkv 128x768->768", 128, 768, 768),
    ("bert ffn 128x768->3072", 128, 3072, 768),
];

fn bench(c: &mut Criterion) {
    let best = isa::active();
    let mut levels = vec![best];
    if std::env::var_os("KILN_BENCH_ALL_ISAS").is_some() {
        levels.push(Isa::Portable);
    }
    for level in levels {
        let mut g = c.benchmark_group(format!("igemm/{}", level.name()));
        for (name, m, n, k) in SHAPES {
            let a: Vec<u8> = (0..m * k).map(|i| (i * 7 % 251) as u8).collect();
            let b: Vec<i8> = (0..k * n).map(|i| (i * 13 % 255) as u8 as i8).collect();
            let Ok(packed) = PackedB::pack(&b, k, n, &[]) else {
                return;
            };
            let mut out = vec![0i32; m * n];
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            g.bench_with_input(BenchmarkId::from_parameter(name), &(), |bch, ()| {
                bch.iter(|| {
                    let r = igemm_with(level, m, k, black_box(&a), k, 3, &packed, &mut out, n);
                    black_box((r, &out));
                })
            });
        }
        g.finish();
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
