//! The optimisation passes, one per file. Each is a function from a graph to the number of
//! rewrites it made; `pipeline.rs` orders them and verifies the graph after each.
//!
//! Every pass keeps the graph's inputs and outputs (ids, names and meaning), never deletes a
//! value a subgraph captures, and leaves a node in place when it cannot prove the rewrite exact.

pub(crate) mod attention;
pub(crate) mod bn;
pub(crate) mod captures;
pub(crate) mod chain;
pub(crate) mod conv1d;
pub(crate) mod conv_tail;
pub(crate) mod conv_taps;
pub(crate) mod cse;
pub(crate) mod dce;
pub(crate) mod edit;
pub(crate) mod einsum;
pub(crate) mod f16;
pub(crate) mod fold;
pub(crate) mod fuse_act;
pub(crate) mod identity;
pub(crate) mod inline_if;
pub mod layout;
pub(crate) mod matmul_add;
pub(crate) mod patterns;
pub(crate) mod pointwise_depthwise;
pub(crate) mod qconv_residual;
pub(crate) mod qdq_add;
pub(crate) mod qdq_chain;
pub(crate) mod qdq_conv;
pub(crate) mod qdq_glue;
pub(crate) mod qdq_matmul;
pub(crate) mod qdq_weights;
pub(crate) mod residual;
pub(crate) mod shape;
pub(crate) mod unit_transpose;

#[cfg(test)]
pub(crate) mod testutil;

use kiln_ir::Op;
use kiln_ops::misc::MiscOp;
use kiln_ops::reduce::ReduceOp;

/// Ops whose output is not a function of their inputs: never folded or merged.
pub(crate) fn is_nondeterministic(op: &Op) -> bool {
    matches!(
        op,
        Op::Misc(
            MiscOp::RandomUniform(_)
                | MiscOp::RandomNormal(_)
                | MiscOp::RandomLike(_)
                | MiscOp::Bernoulli(_)
                | MiscOp::Multinomial(_)
        ) | Op::Reduce(ReduceOp::Dropout(_))
    )
}
