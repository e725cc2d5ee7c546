//! Throughput of the kernel families besides the GEMM (which `sgemm.rs` covers): Winograd
//! F(4x4, 3x3) convolution, depthwise and grouped convolution, the row kernels of softmax and LayerNorm,
//! and the costly activations, on the shapes of the benchmark models.
//!
//! `cargo bench -p kiln-kernels --bench kernels -- --warm-up-time 1 --measurement-time 3`.
//! Criterion's throughput is in elements: FLOPs for the convolutions (Winograd's are those of
//! the direct method it replaces, so its rate is an effective one and may exceed the 117
//! GFLOP/s single-core peak), and values processed for the row kernels and activations. Each
//! family runs on the best kernel level of this CPU; `KILN_BENCH_ALL_ISAS=1` adds the lower
//! levels where the kernel takes one (depthwise, grouped, softmax, activations), down to the portable
//! reference.

mod common;

use common::{data, levels};
use criterion::{BenchmarkId, Criterion, Throughput};
use kiln_kernels::dwconv::{Clamp, Pixels};
use kiln_kernels::isa;
use kiln_kernels::sgemm::{Act, BLayout, act_slice_with_isa};
use kiln_kernels::vector::{layer_norm_row, softmax_row_with, softmax_unnormalized_row_with};
use kiln_kernels::winograd::{Winograd, pack_weights};
use std::hint::black_box;

fn fail(what: &str) -> ! {
    eprintln!("{what}");
    std::process::exit(1)
}

/// (name, spatial size, channels): 3x3, stride 1, pad 1, channels-last, as ResNet's stages.
const WINOGRAD: [(&str, usize, usize); 3] = [
    ("resnet conv2_x 56x56x64", 56, 64),
    ("resnet conv3_x 28x28x128", 28, 128),
    ("resnet conv4_x 14x14x256", 14, 256),
];

fn winograd(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("winograd/{}", isa::active().name()));
    let layout = BLayout::NR32;
    for (name, hw, ch) in WINOGRAD {
        let u = pack_weights(&data(ch * ch * 9, 1), ch, ch, layout).unwrap_or_else(|e| fail(&format!("pack: {e}")));
        let x = data(hw * hw * ch, 2);
        let bias = data(ch, 3);
        let mut y = vec![0.0; hw * hw * ch];
        let mut scratch = Vec::new();
        let conv = Winograd {
            c: ch,
            m: ch,
            ih: hw,
            iw: hw,
            oh: hw,
            ow: hw,
            ph: 1,
            pw: 1,
            channels_last: true,
            dilation: [1, 1],
        };
        g.throughput(Throughput::Elements((2 * hw * hw * ch * ch * 9) as u64));
        g.bench_function(BenchmarkId::new(name, "bias+relu"), |b| {
            b.iter(|| {
                let ok = conv.run(
                    &x,
                    &u,
                    layout,
                    Some(&bias),
                    None,
                    Some(Act::Relu),
                    None,
                    &mut y,
                    &mut scratch,
                );
                if !ok {
                    fail("winograd: shapes refused");
                }
                black_box(&y);
            })
        });
    }
    g.finish();
}

/// (name, output size, channels, stride): 3x3 depthwise, as MobileNet-v2's blocks.
const DEPTHWISE: [(&str, usize, usize, usize); 4] = [
    ("mobilenet 112x112x32 s1", 112, 32, 1),
    ("mobilenet 56x56x144 s1", 56, 144, 1),
    ("mobilenet 28x28x144 s2", 28, 144, 2),
    ("mobilenet 14x14x576 s1", 14, 576, 1),
];

fn depthwise(c: &mut Criterion) {
    for isa in levels() {
        let mut g = c.benchmark_group(format!("depthwise/{}", isa.name()));
        for (name, o, ch, s) in DEPTHWISE {
            // The input already padded by one pixel each side: every output pixel runs the
            // interior window, one call per output row.
            let iw = o * s + 2;
            let x = data(iw * iw * ch, 4);
            let w = data(9 * ch, 5);
            let bias = data(ch, 6);
            let window: Vec<(usize, usize)> = (0..9).map(|t| (((t / 3) * iw + t % 3) * ch, t * ch)).collect();
            let mut y = vec![0.0; o * o * ch];
            g.throughput(Throughput::Elements((2 * 9 * o * o * ch) as u64));
            g.bench_function(BenchmarkId::new(name, "bias+relu6"), |b| {
                b.iter(|| {
                    for (oy, row) in y.chunks_exact_mut(o * ch).enumerate() {
                        let px = Pixels {
                            x: &x,
                            w: &w,
                            bias: Some(&bias),
                            window: &window,
                            base: oy * s * iw * ch,
                            step: s * ch,
                            c: ch,
                            clamp: Clamp { lo: 0.0, hi: 6.0 },
                        };
                        if !px.run_with(isa, row) {
                            fail("depthwise: offsets refused");
                        }
                    }
                    black_box(&y);
                })
            });
        }
        g.finish();
    }
}

/// (name, output size, channels, channels per group): 3x3, stride 1, as ResNeXt-50's and
/// RegNet-Y's grouped layers (the permuted 4- and 8-wide groups, the broadcast 16- and
/// 32-wide ones).
const GROUPED: [(&str, usize, usize, usize); 4] = [
    ("resnext layer1 56x56x128 g4", 56, 128, 4),
    ("resnext layer2 28x28x256 g8", 28, 256, 8),
    ("regnet block2 28x28x144 g16", 28, 144, 16),
    ("resnext layer4 7x7x1024 g32", 7, 1024, 32),
];

fn grouped(c: &mut Criterion) {
    for isa in levels() {
        let mut g = c.benchmark_group(format!("grouped/{}", isa.name()));
        for (name, o, ch, cg) in GROUPED {
            // The input already padded by one pixel each side, every pixel in one call, as
            // the op passes them.
            let iw = o + 2;
            let x = data(iw * iw * ch, 4);
            let w = data(9 * cg * ch, 5);
            let bias = data(ch, 6);
            let window: Vec<(usize, usize)> = (0..9).map(|t| (((t / 3) * iw + t % 3) * ch, t * cg * ch)).collect();
            let bases: Vec<usize> = (0..o * o).map(|p| ((p / o) * iw + p % o) * ch).collect();
            let mut y = vec![0.0; o * o * ch];
            g.throughput(Throughput::Elements((2 * 9 * cg * o * o * ch) as u64));
            g.bench_function(BenchmarkId::new(name, "bias+relu"), |b| {
                b.iter(|| {
                    let px = kiln_kernels::grouped::Pixels {
                        x: &x,
                        w: &w,
                        bias: Some(&bias),
                        window: &window,
                        bases: &bases,
                        dsts: None,
                        cg,
                        mg: cg,
                        m: ch,
                        outs: [0, ch],
                        clamp: Clamp {
                            lo: 0.0,
                            hi: f32::INFINITY,
                        },
                    };
                    if !px.run_with(isa, &mut y) {
                        fail("grouped: offsets refused");
                    }
                    black_box(&y);
                })
            });
        }
        g.finish();
    }
}

/// (name, rows, row length): attention score rows (softmax) and hidden states (LayerNorm,
/// activations).
const ROWS: [(&str, usize, usize); 2] = [("vit-tiny 197x197", 197, 197), ("bert 128x128", 128, 128)];
const HIDDEN: [(&str, usize, usize); 2] = [("vit-tiny 197x192", 197, 192), ("bert 128x768", 128, 768)];
const ACTIVATIONS: [(&str, usize); 2] = [("vit-tiny mlp 197x768", 197 * 768), ("bert mlp 128x3072", 128 * 3072)];

fn rows(c: &mut Criterion) {
    for isa in levels() {
        let mut g = c.benchmark_group(format!("softmax/{}", isa.name()));
        for (name, n, len) in ROWS {
            let src = data(n * len, 7);
            let mut buf = src.clone();
            g.throughput(Throughput::Elements((n * len) as u64));
            g.bench_function(BenchmarkId::new(name, "rows"), |b| {
                b.iter(|| {
                    buf.copy_from_slice(&src);
                    buf.chunks_exact_mut(len).for_each(|r| softmax_row_with(isa, r));
                    black_box(&buf);
                })
            });
            // Attention's rows: scaled, masked (an additive mask row), left unnormalised.
            let mask = data(len, 12);
            g.bench_function(BenchmarkId::new(name, "attention rows"), |b| {
                b.iter(|| {
                    buf.copy_from_slice(&src);
                    for r in buf.chunks_exact_mut(len) {
                        black_box(softmax_unnormalized_row_with(isa, r, 0.125, Some(&mask)));
                    }
                    black_box(&buf);
                })
            });
        }
        g.finish();
        let mut g = c.benchmark_group(format!("activation/{}", isa.name()));
        for (name, len) in ACTIVATIONS {
            let src = data(len, 8);
            let mut buf = src.clone();
            for (label, act) in [
                ("gelu", Act::Gelu { tanh: false }),
                ("sigmoid", Act::Sigmoid),
                ("silu", Act::Silu),
            ] {
                g.throughput(Throughput::Elements(len as u64));
                g.bench_function(BenchmarkId::new(name, label), |b| {
                    b.iter(|| {
                        buf.copy_from_slice(&src);
                        act_slice_with_isa(isa, act, &mut buf);
                        black_box(&buf);
                    })
                });
            }
        }
        g.finish();
    }
    let mut g = c.benchmark_group(format!("layernorm/{}", isa::active().name()));
    for (name, n, len) in HIDDEN {
        let x = data(n * len, 9);
        let (scale, bias) = (data(len, 10), data(len, 11));
        let mut y = vec![0.0; n * len];
        g.throughput(Throughput::Elements((n * len) as u64));
        g.bench_function(BenchmarkId::new(name, "rows"), |b| {
            b.iter(|| {
                for (xr, yr) in x.chunks_exact(len).zip(y.chunks_exact_mut(len)) {
                    layer_norm_row(xr, yr, &scale, Some(&bias), 1e-5);
                }
                black_box(&y);
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    winograd(&mut c);
    depthwise(&mut c);
    grouped(&mut c);
    rows(&mut c);
    c.final_summary();
}
