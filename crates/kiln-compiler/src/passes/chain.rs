//! Elementwise chains: two or more f32 elementwise nodes in a row (unary ops that map f32 to
//! f32, Add/Sub/Mul/Div/Pow whose other operand has the chain's shape, one element or a
//! trailing block of it, and the `FakeQuantize` round trips of the `qdq_glue` pass), each
//! reading the previous one's output alone, become one `ElementwiseChain` node: one pass over
//! memory instead of one per op, and no intermediate tensors. A chain may start at a `Cast`
//! of int32 to f32 (an integer product's sums) and end at a per-tensor `QuantizeLinear` (its
//! output then 8-bit). The chain computes each op as its standalone evaluation does, so
//! results are bit-identical.
//!
//! Only static shapes: every value of the chain has the same fixed shape, which is then the
//! output's. The fused node takes the last node's place (every operand is computed by then)
//! and keeps its name and output.

use super::edit::{Index, binary, dtype_of, fixed_shape, mark, op, remove_nodes};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op, ValueId};
use kiln_ops::elementwise::{BinaryOp, Cast, ChainBinary, ChainQuantize, ChainStep, ElementwiseChain, ElementwiseOp};
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut taken = vec![false; g.nodes.len()];
    let mut chains: Vec<Chain> = Vec::new();
    for i in 0..g.nodes.len() {
        if taken.get(i).copied().unwrap_or(true) {
            continue;
        }
        let Some(head) = link(g, &index, i, None) else { continue };
        let mut chain = Chain {
            nodes: vec![i],
            inputs: vec![head.start],
            steps: Vec::new(),
            quantize: None,
        };
        chain.push(head);
        let mut cur = chain_output(g, i);
        while let Some(v) = cur {
            let [j] = index.readers(v) else { break };
            if index.is_output(v) || taken.get(*j).copied().unwrap_or(true) {
                break;
            }
            let Some(l) = link(g, &index, *j, Some(v)) else { break };
            chain.nodes.push(*j);
            let last = matches!(l.step, Step::Quantize(_));
            chain.push(l);
            if last {
                break;
            }
            cur = chain_output(g, *j);
        }
        if chain.nodes.len() < 2 {
            continue;
        }
        mark(&mut taken, chain.nodes.iter().copied());
        chains.push(chain);
    }
    let mut dead = vec![false; g.nodes.len()];
    for c in &chains {
        let Some((&last, rest)) = c.nodes.split_last() else {
            continue;
        };
        if let Some(node) = g.nodes.get_mut(last) {
            node.kind = NodeKind::Op(Op::Elementwise(ElementwiseOp::Chain(ElementwiseChain {
                steps: c.steps.clone(),
                quantize: c.quantize,
                dequantize: vec![],
            })));
            node.plan = None;
            node.inputs = c.inputs.iter().map(|&v| Some(v)).collect();
        }
        mark(&mut dead, rest.iter().copied());
    }
    remove_nodes(g, &dead);
    Ok(chains.len())
}

/// A chain being built: its nodes in order, the fused node's inputs (the value it starts
/// from, then the binary steps' operands, each once) and its steps.
struct Chain {
    nodes: Vec<usize>,
    inputs: Vec<ValueId>,
    steps: Vec<ChainStep>,
    quantize: Option<ChainQuantize>,
}

impl Chain {
    fn push(&mut self, l: Link) {
        let step = match l.step {
            Step::Start => return,
            Step::Steps(steps) => {
                self.steps.extend(steps);
                return;
            }
            Step::Quantize(q) => {
                self.quantize = Some(q);
                return;
            }
            Step::Unary(op) => ChainStep::Unary(op),
            Step::Binary { op, operand, swapped } => {
                let at = match self.inputs.iter().position(|&v| v == operand) {
                    Some(at) => at,
                    None => {
                        self.inputs.push(operand);
                        self.inputs.len() - 1
                    }
                };
                ChainStep::Binary {
                    op,
                    operand: at,
                    swapped,
                }
            }
        };
        self.steps.push(step);
    }
}

enum Step {
    /// A Cast of int32 to f32 starting the chain: the chain reads the int32 values.
    Start,
    /// The operand-free steps of a chain node already made (a `FakeQuantize`).
    Steps(Vec<ChainStep>),
    /// The final QuantizeLinear.
    Quantize(ChainQuantize),
    Unary(kiln_ops::elementwise::UnaryOp),
    Binary {
        op: ChainBinary,
        operand: ValueId,
        swapped: bool,
    },
}

struct Link {
    /// The value the node reads as the running value.
    start: ValueId,
    step: Step,
}

/// The single output of a chainable node.
fn chain_output(g: &Graph, i: usize) -> Option<ValueId> {
    match g.nodes.get(i)?.outputs.as_slice() {
        [Some(o)] => Some(*o),
        _ => None,
    }
}

/// Node `i` as a chain step: reading `from` as the running value when given (else choosing
/// it), with every value f32 and of the output's fixed shape (a binary operand may be one
/// element of no higher rank, or a trailing block); the exceptions are the int32 `Cast` a
/// chain starts with and the 8-bit `QuantizeLinear` it ends with.
fn link(g: &Graph, index: &Index, i: usize, from: Option<ValueId>) -> Option<Link> {
    let node = g.nodes.get(i)?;
    let out = chain_output(g, i)?;
    let shape = fixed_shape(g, out)?;
    let f32_of = |v: ValueId| dtype_of(g, v) == Some(DType::F32);
    let same = |v: ValueId| f32_of(v) && fixed_shape(g, v).as_deref() == Some(shape.as_slice());
    if let Some((x, _, p)) = super::qdq_glue::quantize(g, index, node) {
        // Only as the last step: the running value is f32 up to here.
        if from != Some(x) || !same(x) {
            return None;
        }
        return Some(Link {
            start: x,
            step: Step::Quantize(ChainQuantize {
                scale: p.scale,
                zero_point: p.zero_point as f32,
                dtype: p.dtype,
            }),
        });
    }
    if !f32_of(out) {
        return None;
    }
    match op(node)? {
        Op::Elementwise(ElementwiseOp::Unary(u)) => {
            let [Some(x)] = node.inputs.as_slice() else { return None };
            if !u.is_f32_map() || !same(*x) || from.is_some_and(|f| f != *x) {
                return None;
            }
            return Some(Link {
                start: *x,
                step: Step::Unary(*u),
            });
        }
        Op::Elementwise(ElementwiseOp::Cast(Cast { to: DType::F32, .. })) => {
            let [Some(x)] = node.inputs.as_slice() else { return None };
            let int_start = from.is_none()
                && dtype_of(g, *x) == Some(DType::I32)
                && fixed_shape(g, *x).as_deref() == Some(shape.as_slice());
            return int_start.then_some(Link {
                start: *x,
                step: Step::Start,
            });
        }
        Op::Elementwise(ElementwiseOp::Chain(c)) => {
            let [Some(x)] = node.inputs.as_slice() else { return None };
            let free = c.steps.iter().all(|s| !matches!(s, ChainStep::Binary { .. }));
            if c.quantize.is_some() || !free || !same(*x) || from.is_some_and(|f| f != *x) {
                return None;
            }
            return Some(Link {
                start: *x,
                step: Step::Steps(c.steps.clone()),
            });
        }
        _ => {}
    }
    let (bop, a, b) = binary(node)?;
    let op = match bop {
        BinaryOp::Add => ChainBinary::Add,
        BinaryOp::Sub => ChainBinary::Sub,
        BinaryOp::Mul => ChainBinary::Mul,
        BinaryOp::Div => ChainBinary::Div,
        BinaryOp::Pow => ChainBinary::Pow,
        _ => return None,
    };
    // One element, or a block the chain's shape repeats (a bias along the last axes).
    let block = |v: ValueId| {
        f32_of(v)
            && fixed_shape(g, v).is_some_and(|s| {
                let lead = s.iter().take_while(|&&d| d == 1).count();
                let core = s.get(lead..).unwrap_or(&[]);
                s.len() <= shape.len() && shape.ends_with(core)
            })
    };
    let operand_ok = |v: ValueId| same(v) || block(v);
    // The running value on the left (a op operand) or the right (operand op a).
    let (start, operand, swapped) = match from {
        Some(f) if a == f && b != f => (a, b, false),
        Some(f) if b == f && a != f => (b, a, true),
        Some(_) => return None,
        None if same(a) => (a, b, false),
        None if same(b) => (b, a, true),
        None => return None,
    };
    if !same(start) || !operand_ok(operand) {
        return None;
    }
    Some(Link {
        start,
        step: Step::Binary { op, operand, swapped },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::passes::testutil::{Builder, f32s, noise, op_names, run_graph};
    use kiln_ops::elementwise::UnaryOp;

    /// GELU spelled out with tanh, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the way
    /// exporters write it: x^3 and the outer product read x again, so the chain runs from the
    /// Pow to the last Mul and takes x as an operand.
    fn gelu_tanh(b: &mut Builder, x: ValueId, shape: &[usize]) -> ValueId {
        let three = b.constant("three", f32s(&[], &[3.0]));
        let k = b.constant("k", f32s(&[], &[0.044715]));
        let s = b.constant("s", f32s(&[1], &[0.797_884_6]));
        let one = b.constant("one", f32s(&[], &[1.0]));
        let half = b.constant("half", f32s(&[], &[0.5]));
        let p = b.binary(BinaryOp::Pow, x, three, shape);
        let p = b.binary(BinaryOp::Mul, k, p, shape);
        let p = b.binary(BinaryOp::Add, x, p, shape);
        let p = b.binary(BinaryOp::Mul, p, s, shape);
        let p = b.unary(UnaryOp::Tanh, p, shape);
        let p = b.binary(BinaryOp::Add, p, one, shape);
        let p = b.binary(BinaryOp::Mul, x, p, shape);
        b.binary(BinaryOp::Mul, p, half, shape)
    }

    #[test]
    fn a_spelled_out_gelu_becomes_one_node_with_the_same_bits() {
        let shape = [2, 50, 40];
        let mut b = Builder::new();
        let x = b.input("x", &shape);
        let y = gelu_tanh(&mut b, x, &shape);
        let g = b.finish(&[y]);
        let input = noise(&shape, 3);
        let want = run_graph(&g, vec![input.clone()]);
        let mut fused = g.clone();
        assert_eq!(run(&mut fused).unwrap(), 1);
        fused.verify().unwrap();
        assert_eq!(op_names(&fused), ["ElementwiseChain"]);
        let node = &fused.nodes[0];
        let steps = match &node.kind {
            NodeKind::Op(Op::Elementwise(ElementwiseOp::Chain(c))) => c.steps.len(),
            _ => 0,
        };
        assert_eq!(steps, 8, "{:?}", node.kind);
        assert_eq!(node.outputs, [Some(y)]);
        let got = run_graph(&fused, vec![input]);
        let (w, v) = (want[0].as_slice::<f32>().unwrap(), got[0].as_slice::<f32>().unwrap());
        assert!(w.iter().zip(v).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn chains_stop_at_shared_values_broadcasts_and_other_types() {
        // The middle value is also a graph output: two nodes on each side, two chains.
        let shape = [4, 8];
        let mut b = Builder::new();
        let x = b.input("x", &shape);
        let e = b.unary(UnaryOp::Exp, x, &shape);
        let n = b.unary(UnaryOp::Neg, e, &shape);
        let s = b.unary(UnaryOp::Sigmoid, n, &shape);
        let t = b.unary(UnaryOp::Tanh, s, &shape);
        let mut g = b.finish(&[t, n]);
        assert_eq!(run(&mut g).unwrap(), 2);
        assert_eq!(op_names(&g), ["ElementwiseChain", "ElementwiseChain"]);
        // A column operand broadcasts along the last axis (neither the chain's shape, one
        // element nor a trailing block): the Add is left out, and the single Exp after it is
        // no chain.
        let mut b = Builder::new();
        let x = b.input("x", &shape);
        let r = b.input("r", &[4, 1]);
        let e = b.unary(UnaryOp::Exp, x, &shape);
        let a = b.binary(BinaryOp::Add, e, r, &shape);
        let t = b.unary(UnaryOp::Exp, a, &shape);
        let mut g = b.finish(&[t]);
        assert_eq!(run(&mut g).unwrap(), 0);
        // f64 values are not chained.
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::F64, &shape);
        let e = b.node_typed(
            Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Exp)),
            &[Some(x)],
            &[(DType::F64, &shape)],
        )[0];
        let n = b.node_typed(
            Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Neg)),
            &[Some(e)],
            &[(DType::F64, &shape)],
        )[0];
        let mut g = b.finish(&[n]);
        assert_eq!(run(&mut g).unwrap(), 0);
    }
}
