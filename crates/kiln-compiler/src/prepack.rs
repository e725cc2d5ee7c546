//! Weight prepacking for the GEMM kernels, done once at compile time: a MatMul or Gemm whose B
//! is a constant f32 matrix (`[k, n]`, or `[n, k]` for a Gemm with transB) read by nothing else
//! gets that constant replaced by the kernels' packed panels (layout `f32/nr32/v1`, which every kernel level reads), and records
//! the packing in its op. The packed weights go to the program file's aligned weights section
//! and are used in place from the memory map; no run packs them again.

use kiln_ir::Graph;
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::sgemm::{BLayout, PackedB};
use kiln_ops::nn::NnOp;
use kiln_ops::nn::matmul::PackedWeight;
use kiln_ops::{Op, Value, ValueType};
use kiln_runtime::{Program, StepKind};
use kiln_tensor::{DType, Tensor};

/// The packing used: fixed, so a program runs on every kernel level and machine.
pub const LAYOUT: BLayout = BLayout::NR32;

/// Prepacks the main program's eligible MatMul and Gemm weights; returns how many it packed.
pub fn run(graph: &Graph, program: &mut Program) -> usize {
    let mut reads = vec![0usize; program.num_slots()];
    for step in &program.steps {
        for s in step.inputs.iter().flatten().copied().chain(step.captured_slots()) {
            if let Some(r) = reads.get_mut(s) {
                *r += 1;
            }
        }
    }
    let outputs: Vec<usize> = program.outputs.iter().map(|o| o.slot).collect();
    let is_f32 = |slot: usize| {
        graph.values.get(slot).is_some_and(|v| match &v.ty {
            ValueType::Tensor(t) => t.dtype == Some(DType::F32),
            _ => false,
        })
    };
    let mut packed = 0;
    for i in 0..program.steps.len() {
        let Some(step) = program.steps.get(i) else { break };
        // Which op, and whether its B is stored transposed (`n x k`).
        let trans_b = match &step.kind {
            StepKind::Op(Op::Nn(NnOp::MatMul(mm))) if mm.packed_b.is_none() => false,
            StepKind::Op(Op::Nn(NnOp::Gemm(g))) if g.packed_b.is_none() => g.trans_b,
            _ => continue,
        };
        let (Some(Some(a)), Some(Some(b))) = (step.inputs.first(), step.inputs.get(1)) else {
            continue;
        };
        let (a, b) = (*a, *b);
        if !is_f32(a) || reads.get(b) != Some(&1) || outputs.contains(&b) {
            continue;
        }
        let Some(ci) = program.constants.iter().position(|(s, _)| *s == b) else {
            continue;
        };
        let Some((_, Value::Tensor(w))) = program.constants.get(ci) else {
            continue;
        };
        let (Ok(data), [r, c]) = (w.as_slice::<f32>(), w.shape()) else {
            continue;
        };
        let ((k, n), layout) = if trans_b {
            ((*c, *r), MatLayout::transposed(*c))
        } else {
            ((*r, *c), MatLayout::row_major(*c))
        };
        let Ok(p) = PackedB::pack(LAYOUT, k, n, data, layout) else {
            continue;
        };
        let floats: Vec<f32> = p.view().data().to_vec();
        let Ok(t) = Tensor::from_vec(vec![floats.len()], floats) else {
            continue;
        };
        let record = Some(PackedWeight {
            k,
            n,
            layout: LAYOUT.tag().to_string(),
        });
        let Some(step) = program.steps.get_mut(i) else { break };
        match &mut step.kind {
            StepKind::Op(Op::Nn(NnOp::MatMul(mm))) => mm.packed_b = record,
            StepKind::Op(Op::Nn(NnOp::Gemm(g))) => g.packed_b = record,
            _ => continue,
        }
        if let Some(c) = program.constants.get_mut(ci) {
            c.1 = Value::Tensor(t);
        }
        packed += 1;
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use crate::{CompileOptions, compile};
    use kiln_ops::nn::MatMul;

    fn matmul() -> Op {
        Op::Nn(NnOp::MatMul(MatMul::default()))
    }

    fn run_program(p: &Program, x: Tensor) -> Tensor {
        let out = kiln_runtime::run(p, vec![("x".into(), Value::Tensor(x))]).unwrap();
        out[0].1.as_tensor().unwrap().clone()
    }

    #[test]
    fn constant_weights_are_packed_once_and_give_the_same_product() {
        // y = (x · W1) · W2 with x [2, 5, 7]; W1 [7, 40], W2 [40, 3]; both weights packed.
        let mut b = Builder::new();
        let x = b.input("x", &[2, 5, 7]);
        let w1 = b.constant("w1", noise(&[7, 40], 1));
        let w2 = b.constant("w2", noise(&[40, 3], 2));
        let h = b.node(matmul(), &[Some(x), Some(w1)], &[&[2, 5, 40]])[0];
        let y = b.node(matmul(), &[Some(h), Some(w2)], &[&[2, 5, 3]])[0];
        let g = b.finish(&[y]);
        let level = |opt_level| CompileOptions {
            opt_level,
            ..CompileOptions::default()
        };
        let packed = compile(g.clone(), &level(2)).unwrap();
        let plain = compile(g, &level(0)).unwrap();
        assert_eq!((packed.prepacked, plain.prepacked), (2, 0));
        let layouts: Vec<Option<PackedWeight>> = packed
            .program
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Op(Op::Nn(NnOp::MatMul(m))) => Some(m.packed_b.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            layouts,
            vec![
                Some(PackedWeight {
                    k: 7,
                    n: 40,
                    layout: "f32/nr32/v1".into()
                }),
                Some(PackedWeight {
                    k: 40,
                    n: 3,
                    layout: "f32/nr32/v1".into()
                }),
            ]
        );
        let x = noise(&[2, 5, 7], 3);
        assert_close(
            &run_program(&packed.program, x.clone()),
            &run_program(&plain.program, x),
            1e-5,
        );
    }

    #[test]
    fn gemm_weights_with_trans_b_alpha_beta_and_c_give_the_same_result() {
        use kiln_ops::nn::Gemm;
        let mut b = Builder::new();
        let x = b.input("x", &[3, 20]);
        let w = b.constant("w", noise(&[37, 20], 4));
        let c = b.constant("c", noise(&[37], 5));
        let gemm = Op::Nn(NnOp::Gemm(Gemm {
            alpha: 0.5,
            beta: 2.0,
            trans_b: true,
            ..Gemm::default()
        }));
        let y = b.node(gemm, &[Some(x), Some(w), Some(c)], &[&[3, 37]])[0];
        let g = b.finish(&[y]);
        let level = |opt_level| CompileOptions {
            opt_level,
            ..CompileOptions::default()
        };
        let packed = compile(g.clone(), &level(1)).unwrap();
        let plain = compile(g, &level(0)).unwrap();
        assert_eq!(packed.prepacked, 1);
        let x = noise(&[3, 20], 6);
        assert_close(
            &run_program(&packed.program, x.clone()),
            &run_program(&plain.program, x),
            1e-5,
        );
    }

    #[test]
    fn shared_weights_stay_as_they_are() {
        // One weight read by two MatMuls is left unpacked (the other reader needs the matrix).
        let mut b = Builder::new();
        let x = b.input("x", &[4, 6]);
        let w = b.constant("w", noise(&[6, 6], 1));
        let h = b.node(matmul(), &[Some(x), Some(w)], &[&[4, 6]])[0];
        let y = b.node(matmul(), &[Some(h), Some(w)], &[&[4, 6]])[0];
        let g = b.finish(&[y]);
        let c = compile(g, &CompileOptions::default()).unwrap();
        assert_eq!(c.prepacked, 0);
    }
}
