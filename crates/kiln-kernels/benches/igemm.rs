//! Throughput of the integer GEMM (u8 x s8 -> s32) on the shapes of ResNet-50's convolutions
//! and BERT's projections, in GOP/s (two operations per multiply-add), on the best level of
//! this CPU and the portable twin.
//!
//! `cargo bench -p kiln-kernels --bench igemm -- --warm-up-time 1 --measurement-time 3`.

use criterion::{BenchmarkId, Criterion, Throughput};
use kiln_kernels::igemm::{ConvScratch, ConvWindow, PackedB, Requantize, Scales, conv_requant_serial, igemm_with};
use kiln_kernels::isa::{self, Isa};
use std::hint::black_box;

/// The binary's allocator: its large blocks start on cache lines, as the tiles want A.
#[global_allocator]
static ALLOC: kiln_kernels::alloc::CachingAlloc = kiln_kernels::alloc::CachingAlloc::new();

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

/// (name, batch, input side, channels, kernel side, stride, output channels): channels-last
/// 8-bit convolutions requantized to u8, one block of pixels of the size the op runs.
const CONVS: [(&str, usize, usize, usize, usize, usize, usize); 7] = [
    ("resnet50 layer1 1x1 56x56x64 -> 256", 1, 56, 64, 1, 1, 256),
    ("resnet50 layer1 1x1 56x56x256 -> 64", 1, 56, 256, 1, 1, 64),
    ("resnet50 layer1 3x3 56x56x64", 2, 56, 64, 3, 1, 64),
    ("resnet50 layer2 3x3 28x28x128", 2, 28, 128, 3, 1, 128),
    ("resnet50 layer3 3x3 14x14x256", 2, 14, 256, 3, 1, 256),
    ("resnet50 layer4 3x3 7x7x512", 2, 7, 512, 3, 1, 512),
    ("resnet50 layer3.0 3x3 s2 28x28x256", 2, 28, 256, 3, 2, 256),
];

fn bench_conv(c: &mut Criterion) {
    let level = isa::active();
    let mut g = c.benchmark_group(format!("qconv/{}", level.name()));
    for (name, batch, side, ch, ks, stride, m) in CONVS {
        let pad = ks / 2;
        let out = (side + 2 * pad - ks) / stride + 1;
        let win = ConvWindow {
            batch,
            input: (side, side),
            channels: ch,
            pixel_stride: ch,
            kernel: (ks, ks),
            output: (out, out),
            stride: (stride, stride),
            dilation: (1, 1),
            pad: (pad, pad),
        };
        let k = win.depth();
        let x: Vec<u8> = (0..batch * side * side * ch).map(|i| (i * 7 % 251) as u8).collect();
        let b: Vec<i8> = (0..k * m).map(|i| (i * 13 % 255) as u8 as i8).collect();
        let Ok(packed) = PackedB::pack(&b, k, m, &[]) else {
            return;
        };
        let (bias, mult) = (vec![10.0f32; m], vec![1e-4f32; m]);
        let stage = Requantize {
            scales: Scales::F32 {
                bias: &bias,
                mult: &mult,
                zero_point: 3.0,
            },
            range: (0, 255),
            sum: None,
        };
        let pixels = win.pixels();
        let mut y = vec![0u8; pixels * m];
        let mut scratch = ConvScratch::default();
        g.throughput(Throughput::Elements((2 * pixels * m * k) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), &(), |bch, ()| {
            bch.iter(|| {
                let r = conv_requant_serial(
                    level,
                    &win,
                    black_box(&x),
                    0..pixels,
                    5,
                    &packed,
                    &mut scratch,
                    stage,
                    &mut y,
                    m,
                );
                black_box((r, &y));
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench_conv(&mut c);
    bench(&mut c);
    c.final_summary();
}
