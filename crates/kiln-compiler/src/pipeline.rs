//! The ordered optimisation pipeline: which passes run at which level, in which order, and why
//! each sits where it does.
//!
//! Levels: 0 runs nothing (the graph as imported, for debugging); 1 cleans up (Identity
//! elimination, shape simplification, constant folding, CSE, dead code); 2 adds the fusions
//! and pattern recognition (the default); 3 is everything (today the same passes as level 2:
//! the level stays for the seeds' `optimization_type` scale and later aggressive passes). The
//! graph verifies after every pass; a failure names the pass.

use crate::CompileError;
use crate::passes::{
    attention, bn, captures, chain, conv_tail, conv_taps, conv1d, cse, dce, einsum, f16, fold, fuse_act, identity,
    inline_if, layout, matmul_add, patterns, pointwise_depthwise, qconv_residual, qdq_add, qdq_chain, qdq_conv,
    qdq_glue, qdq_matmul, qdq_weights, residual, shape, unit_transpose,
};
use kiln_ir::Graph;

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PassStat {
    pub pass: &'static str,
    /// Number of rewrites the pass made.
    pub rewrites: usize,
    /// Node count (subgraphs included) after the pass.
    pub nodes_after: usize,
}

/// What the whole pipeline did, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PipelineReport {
    pub level: u8,
    pub passes: Vec<PassStat>,
    pub nodes_before: usize,
    pub nodes_after: usize,
}

/// One position of the pipeline.
struct Pass {
    name: &'static str,
    /// Lowest level the pass runs at.
    level: u8,
    run: fn(&mut Graph) -> Result<usize, CompileError>,
    /// Whether the pipeline also runs it on every subgraph (If branches, Loop and Scan
    /// bodies, ...): false for the passes that walk subgraphs themselves, and for `f16`,
    /// whose promotion is decided for the whole model from the main graph.
    deep: bool,
}

/// Runs a pass on `g` and, when it is `deep`, on every subgraph of `g`, innermost last.
fn run_pass(pass: &Pass, g: &mut Graph) -> Result<usize, CompileError> {
    let mut n = (pass.run)(g)?;
    if pass.deep {
        for node in &mut g.nodes {
            if let kiln_ir::NodeKind::Control(c) = &mut node.kind {
                for sub in crate::passes::edit::subgraphs_mut(c) {
                    n += run_pass(pass, sub)?;
                }
            }
        }
    }
    Ok(n)
}

/// The pipeline, in order. Each entry's comment is the reason for its position.
const PIPELINE: &[Pass] = &[
    // First: weights a subgraph captures become its own constants, so every pass below (and
    // the weight packing) treats a branch's or a loop body's weights as the main graph's.
    Pass {
        name: "captures",
        level: 1,
        deep: false,
        run: captures::run,
    },
    // float16 regions onto f32 first: every later pass (folding, fusions, kernel choice) sees
    // f32 nodes, and the identity pass removes the casts back to f32 this one makes identities.
    Pass {
        name: "f16",
        level: 2,
        deep: false,
        run: f16::run,
    },
    // Then: exporters alias weights through Identity chains; seeing through them lets every
    // later pass find constants and producers directly.
    Pass {
        name: "identity",
        level: 1,
        deep: false,
        run: identity::run,
    },
    // Before folding: Shape/Size of bound static shapes become the constants folding needs.
    Pass {
        name: "shape",
        level: 1,
        deep: false,
        run: shape::run,
    },
    // Matrix-product Einsums to MatMuls before folding, which turns a constant operand's
    // Transpose into a constant (then packed like any MatMul weight).
    Pass {
        name: "einsum",
        level: 2,
        deep: true,
        run: einsum::run,
    },
    // Fake-quantized float weights (`W -> QuantizeLinear -> DequantizeLinear`) to the 8-bit
    // constants an exporter storing them quantized writes, so the QDQ passes below find them.
    Pass {
        name: "qdq_weights",
        level: 2,
        deep: false,
        run: qdq_weights::run,
    },
    // QDQ products of constant 8-bit weights to integer ones, before folding would turn the
    // weights' DequantizeLinear into f32 constants.
    Pass {
        name: "qdq_matmul",
        level: 2,
        deep: true,
        run: qdq_matmul::run,
    },
    // QDQ convolutions to QLinearConv (8-bit in, 8-bit out, the integer GEMM), for the same
    // reason before folding.
    Pass {
        name: "qdq_conv",
        level: 2,
        deep: true,
        run: qdq_conv::run,
    },
    // QDQ additions (residuals) to QLinearAdd: one 8-bit pass, the same bits.
    Pass {
        name: "qdq_add",
        level: 2,
        deep: true,
        run: qdq_add::run,
    },
    // Collapses the shape arithmetic and constant subexpressions, with the runtime's kernels.
    Pass {
        name: "fold",
        level: 1,
        deep: false,
        run: fold::run,
    },
    // Ifs whose conditions folding made constant (exporters' guards on shapes) become their
    // taken branch's nodes, before anything below plans or fuses the graph around them.
    Pass {
        name: "inline_if",
        level: 1,
        deep: false,
        run: inline_if::run,
    },
    // After folding, equal constants (e.g. repeated Reshape targets) and the nodes reading them
    // become equal and merge.
    Pass {
        name: "cse",
        level: 1,
        deep: false,
        run: cse::run,
    },
    // Drops what the cleanup left unread, so the fusions below count real consumers.
    Pass {
        name: "dce",
        level: 1,
        deep: false,
        run: dce::run,
    },
    // Taps that only read padding off the kernel, before anything chooses a kernel from its
    // shape (layout, Winograd, packing).
    Pass {
        name: "conv_taps",
        level: 2,
        deep: true,
        run: conv_taps::run,
    },
    // BatchNorm into Conv/Gemm before activation fusion: the activation follows the BatchNorm,
    // and the Conv must write the BatchNorm's output first.
    Pass {
        name: "bn",
        level: 2,
        deep: true,
        run: bn::run,
    },
    // LayerNorm/GELU subgraphs to single ops before MatMul+Add and activation fusion, which
    // then see a Gelu after a MatMul.
    Pass {
        name: "patterns",
        level: 2,
        deep: true,
        run: patterns::run,
    },
    // Scaled dot-product attention to one Attention node before MatMul+Add, which would
    // otherwise take a constant additive mask as the Q·Kᵀ MatMul's bias and hide the pattern
    // (the Q/K/V projections lie outside it, so their own fusion is unaffected). Default since
    // Attention has its f32 kernel (no head transposes, fused scale/mask/softmax): ViT-tiny
    // and MiniLM ran 4-10% faster with it than with the MatMul/Softmax ops it replaces.
    Pass {
        name: "attention",
        level: 2,
        deep: true,
        run: attention::run,
    },
    // Bias into the MatMul before activation fusion, so the activation follows the MatMul.
    Pass {
        name: "matmul_add",
        level: 2,
        deep: true,
        run: matmul_add::run,
    },
    // A residual Add into the Conv before activation fusion: the block's Relu follows the Add,
    // and must fuse onto the Conv after the residual is in it (act(conv + bias + residual)).
    Pass {
        name: "residual",
        level: 2,
        deep: true,
        run: residual::run,
    },
    // Last rewrite: every producer is in its final form, and its epilogue applies after bias.
    Pass {
        name: "fuse_act",
        level: 2,
        deep: true,
        run: fuse_act::run,
    },
    // One-dimensional convolutions as two-dimensional ones of height 1, after the fusions (the
    // activation stays in the plan, a residual is reshaped too) and before layout.
    Pass {
        name: "conv1d",
        level: 2,
        deep: true,
        run: conv1d::run,
    },
    // After every fusion (a Conv's epilogue and residual are final), before the last dce, which
    // removes the transposes between two channels-last convolutions.
    Pass {
        name: "layout",
        level: 2,
        deep: true,
        run: layout::run,
    },
    // After layout, whose way back to channels-first after a global pooling is such a
    // transpose; after attention, whose patterns are spelled with Transposes.
    Pass {
        name: "unit_transpose",
        level: 2,
        deep: false,
        run: unit_transpose::run,
    },
    // Removes the transposes back to channels-first the layout pass left unread: the glue's
    // patterns want each 8-bit value read by its one consumer (a channels-last Concat that
    // the unread transpose still read kept SqueezeNet's fire modules in f32).
    Pass {
        name: "dce",
        level: 2,
        deep: false,
        run: dce::run,
    },
    // After every pass that matches Q/DQ patterns (the integer products, convolutions and
    // sums, and the layout's view of per-tensor Q/DQ as layout-free), before the chain pass,
    // which joins the round trips it makes with the arithmetic around them.
    Pass {
        name: "qdq_glue",
        level: 2,
        deep: true,
        run: qdq_glue::run,
    },
    // After layout (only a channels-last QLinearConv takes a sum, and the sum's operands
    // are then in its layout) and after the glue, whose requantizations may feed a sum.
    Pass {
        name: "qconv_residual",
        level: 2,
        deep: true,
        run: qconv_residual::run,
    },
    // Removes the weights the folds replaced and anything the fusions left unread.
    Pass {
        name: "dce",
        level: 2,
        deep: false,
        run: dce::run,
    },
    // Last: both convolutions must be channels-last (the `layout` pass) and the 1x1's output
    // read by the depthwise one alone, which it is only once dce has removed the transposes
    // the layout pass left unread. It leaves nothing unread itself.
    Pass {
        name: "pointwise_depthwise",
        level: 2,
        deep: true,
        run: pointwise_depthwise::run,
    },
    // After every fusion into a producer (an activation or residual a Conv or MatMul applies
    // in its epilogue costs no pass at all) and after the layout is final: what elementwise
    // runs are left go in one pass each.
    Pass {
        name: "chain",
        level: 2,
        deep: true,
        run: chain::run,
    },
    // After the chain pass: a scale and shift after a convolution's activation goes into
    // the convolution (its kernels apply it as they write the output).
    Pass {
        name: "conv_tail",
        level: 2,
        deep: true,
        run: conv_tail::run,
    },
    // After the chain pass: a chain that is a function of one 8-bit value becomes its table;
    // the others read their dequantized inputs as the 8-bit values.
    Pass {
        name: "qdq_chain",
        level: 2,
        deep: true,
        run: qdq_chain::run,
    },
];

/// Runs the passes of `level` over `graph` in pipeline order; the graph verifies after each.
pub fn optimize(graph: &mut Graph, level: u8) -> Result<PipelineReport, CompileError> {
    let nodes_before = graph.node_count_deep();
    let mut passes = Vec::new();
    for pass in PIPELINE.iter().filter(|p| p.level <= level) {
        let rewrites = run_checked(pass, graph, "during or after pass")?;
        passes.push(PassStat {
            pass: pass.name,
            rewrites,
            nodes_after: graph.node_count_deep(),
        });
    }
    Ok(PipelineReport {
        level,
        passes,
        nodes_before,
        nodes_after: graph.node_count_deep(),
    })
}

/// The passes run before quantizing (`quantize::prepare`): the level-1 cleanup and BatchNorm
/// folding, so the weights quantized are those the program runs, and no fusion has yet hidden a
/// value a quantized node reads.
const PREPARE: &[&str] = &[
    "captures",
    "identity",
    "shape",
    "fold",
    "inline_if",
    "cse",
    "dce",
    "bn",
    "dce",
];

pub(crate) fn prepare_for_quantization(graph: &mut Graph) -> Result<(), CompileError> {
    for name in PREPARE {
        let Some(pass) = PIPELINE.iter().find(|p| p.name == *name) else {
            continue;
        };
        run_checked(pass, graph, "while preparing to quantize, after pass")?;
    }
    Ok(())
}

/// Runs `pass`, then checks the stop (a pass cut short by a stop may leave its work half
/// done: nothing after it runs) and that the graph still verifies.
fn run_checked(pass: &Pass, graph: &mut Graph, when: &str) -> Result<usize, CompileError> {
    let rewrites = run_pass(pass, graph)?;
    crate::error::check_stop(|| format!("{when} {}", pass.name))?;
    graph.verify().map_err(|e| CompileError::Pass {
        pass: pass.name,
        node: String::new(),
        message: format!("the graph no longer verifies: {e}"),
    })?;
    Ok(rewrites)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ir::{NodeKind, Op};
    use kiln_ops::elementwise::UnaryOp;
    use kiln_ops::movement::{Identity, MovementOp};
    use kiln_ops::nn::{Activation, Conv, NnOp};
    use kiln_ops::reduce::{BatchNorm, ReduceOp};

    /// x -> Identity -> Conv -> BatchNorm -> Relu -> y, the BatchNorm's parameters behind a
    /// foldable Mul.
    fn cnn() -> kiln_ir::Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 2, 4, 4]);
        let xi = b.node(
            Op::Movement(MovementOp::Identity(Identity)),
            &[Some(x)],
            &[&[1, 2, 4, 4]],
        )[0];
        let w = b.constant("w", noise(&[3, 2, 3, 3], 1));
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            pads: vec![1, 1, 1, 1],
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(xi), Some(w)], &[&[1, 3, 4, 4]])[0];
        let s0 = b.constant("s0", f32s(&[3], &[1.0, 2.0, 3.0]));
        let two = b.constant("two", f32s(&[3], &[0.5, 0.5, 0.5]));
        let scale = b.binary(kiln_ops::elementwise::BinaryOp::Mul, s0, two, &[3]);
        let shift = b.constant("shift", f32s(&[3], &[0.1, -0.2, 0.3]));
        let mean = b.constant("mean", f32s(&[3], &[0.0, 0.1, -0.1]));
        let var = b.constant("var", f32s(&[3], &[1.0, 0.5, 2.0]));
        let bn = Op::Reduce(ReduceOp::BatchNormalization(BatchNorm {
            epsilon: 1e-5,
            momentum: 0.9,
            training_mode: false,
            saved_outputs: false,
        }));
        let n = b.node(
            bn,
            &[Some(c), Some(scale), Some(shift), Some(mean), Some(var)],
            &[&[1, 3, 4, 4]],
        )[0];
        let y = b.unary(UnaryOp::Relu, n, &[1, 3, 4, 4]);
        b.finish(&[y])
    }

    #[test]
    fn levels_run_their_passes_and_keep_results() {
        let xin = noise(&[1, 2, 4, 4], 9);
        let reference = run_graph(&cnn(), vec![xin.clone()]);
        let mut g = cnn();
        let r = optimize(&mut g, 0).unwrap();
        assert!(r.passes.is_empty());
        assert_eq!((r.nodes_before, r.nodes_after), (5, 5));

        let mut g = cnn();
        let r = optimize(&mut g, 1).unwrap();
        let names: Vec<_> = r.passes.iter().map(|p| p.pass).collect();
        assert_eq!(
            names,
            ["captures", "identity", "shape", "fold", "inline_if", "cse", "dce"]
        );
        assert_eq!(op_names(&g), ["Conv", "BatchNormalization", "Relu"]);
        assert_eq!(run_graph(&g, vec![xin.clone()]), reference);

        for level in [2, 3] {
            let mut g = cnn();
            let r = optimize(&mut g, level).unwrap();
            // One Conv with the Relu fused, run channels-last on its 2-channel input as it is
            // (no transpose in), then one transpose back.
            assert_eq!((r.nodes_before, r.nodes_after), (5, 2));
            assert_eq!(op_names(&g), ["Conv", "Transpose"]);
            let NodeKind::Op(Op::Nn(NnOp::Conv(_))) = &g.nodes[0].kind else {
                panic!("not a Conv");
            };
            let plan = g.nodes[0].conv_plan();
            assert_eq!(plan.activation, Some(Activation::Relu));
            assert!(plan.channels_last && plan.x_channels_first);
            // BatchNorm folding rounds the new weights once: equal to float precision.
            assert_close(&run_graph(&g, vec![xin.clone()])[0], &reference[0], 1e-6);
        }
    }
}
