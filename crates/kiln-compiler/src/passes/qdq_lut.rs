//! Functions of one 8-bit value as tables. After the chain pass, what a quantized model
//! computes in float between its integer nodes is often `DequantizeLinear -> chain`, the chain
//! a run of unary ops and arithmetic on the value and scalar constants (SiLU, HardSwish,
//! GELU, Sigmoid, LeakyRelu, a scale and shift), ending on a `QuantizeLinear` or not. Its
//! result depends on the 8-bit input alone: 256 possible values. This pass computes them, by
//! running the DequantizeLinear and the chain themselves on the 256 codes, and replaces the
//! chain with a [`Lookup8`] of X's bytes: the same values, one table read per element.
//!
//! Runs last, after the chain pass made the chains; the DequantizeLinear goes when nothing
//! else reads it.

use super::dce;
use super::edit::{Index, op};
use super::qdq_glue::dequantize;
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, Value};
use kiln_ops::elementwise::{ElementwiseOp, Lookup8, LookupTable};
use kiln_ops::value::Args;
use kiln_tensor::{DType, Tensor};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut tables = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        if let Some(t) = tabulate(g, &index, node) {
            tables.push((i, t));
        }
    }
    let count = tables.len();
    for (i, (x, lookup)) in tables {
        if let Some(node) = g.nodes.get_mut(i) {
            node.kind = NodeKind::Op(Op::Elementwise(ElementwiseOp::Lookup(lookup)));
            node.inputs = vec![Some(x)];
            node.plan = None;
        }
    }
    if count > 0 {
        dce::run(g)?;
    }
    Ok(count)
}

/// The table of chain `node` when it reads a per-tensor DequantizeLinear of an 8-bit value
/// and otherwise only one-element constants: that value and the lookup.
fn tabulate(g: &Graph, index: &Index, node: &Node) -> Option<(kiln_ir::ValueId, Lookup8)> {
    let Some(Op::Elementwise(ElementwiseOp::Chain(chain))) = op(node) else {
        return None;
    };
    let start = (*node.inputs.first()?)?;
    let dq = g.nodes.get(index.producer(start)?)?;
    let (x, _, params) = dequantize(g, index, dq)?;
    let constants = node
        .inputs
        .iter()
        .skip(1)
        .map(|v| {
            index
                .constant(g, (*v)?)
                .filter(|c| c.as_tensor().is_some_and(|t| t.len() == 1))
        })
        .collect::<Option<Vec<&Value>>>()?;
    // The 256 codes in byte order (an i8 code by its two's-complement byte).
    let codes = match params.dtype {
        DType::U8 => Tensor::from_vec(vec![256], (0..=255u8).collect::<Vec<u8>>()).ok()?,
        DType::I8 => Tensor::from_vec(vec![256], (0..=255u8).map(|b| b as i8).collect::<Vec<i8>>()).ok()?,
        _ => return None,
    };
    let codes = Value::Tensor(codes);
    let Some(Op::Quant(dq_op)) = op(dq) else { return None };
    let dq_args: Vec<Option<&Value>> = std::iter::once(Some(&codes))
        .chain(dq.inputs.iter().skip(1).map(|v| v.and_then(|v| index.constant(g, v))))
        .collect();
    let floats = dq_op.eval(&Args::new(&dq_args)).ok()?.into_iter().next()?;
    let chain_args: Vec<Option<&Value>> = std::iter::once(Some(&floats))
        .chain(constants.into_iter().map(Some))
        .collect();
    let out = chain.eval(&Args::new(&chain_args)).ok()?.into_iter().next()?;
    let out = out.as_tensor()?;
    if out.len() != 256 {
        return None;
    }
    let table = match (chain.quantize.map(|q| q.dtype), out.dtype()) {
        (Some(DType::U8), DType::U8) => LookupTable::U8(out.as_slice::<u8>().ok()?.to_vec()),
        (Some(DType::I8), DType::I8) => LookupTable::I8(out.as_slice::<i8>().ok()?.to_vec()),
        (None, DType::F32) => LookupTable::F32(out.as_slice::<f32>().ok()?.to_vec()),
        _ => return None,
    };
    Some((
        x,
        Lookup8 {
            input: params.dtype,
            table,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::{Builder, dequantize, noise, op_names, quantize, run_graph};
    use kiln_ops::elementwise::{BinaryOp, UnaryOp};

    /// `DQ(x) -> x * sigmoid(x) -> Q` (SiLU, as a QDQ YOLO writes it) and `DQ(x) ->
    /// HardSigmoid-like clip(x / 6 + 0.5)` with a float output, from u8 and i8 values.
    fn graph(dtype: DType, quantized: bool) -> kiln_ir::Graph {
        let mut b = Builder::new();
        let x = b.input_typed("x", dtype, &[2, 3, 50]);
        let s = b.constant("s", Tensor::scalar(0.07f32));
        let z = match dtype {
            DType::U8 => b.constant("z", Tensor::scalar(131u8)),
            _ => b.constant("z", Tensor::scalar(-9i8)),
        };
        let d = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[&[2, 3, 50]])[0];
        let sig = b.unary(UnaryOp::Sigmoid, d, &[2, 3, 50]);
        let silu = b.binary(BinaryOp::Mul, d, sig, &[2, 3, 50]);
        let sixth = b.constant("sixth", Tensor::scalar(1.0f32 / 6.0));
        let scaled = b.binary(BinaryOp::Mul, silu, sixth, &[2, 3, 50]);
        let y = if quantized {
            let (sy, zy) = (
                b.constant("sy", Tensor::scalar(0.013f32)),
                b.constant("zy", Tensor::scalar(7u8)),
            );
            b.node_typed(
                quantize(),
                &[Some(scaled), Some(sy), Some(zy)],
                &[(DType::U8, &[2, 3, 50])],
            )[0]
        } else {
            scaled
        };
        b.finish(&[y])
    }

    fn codes(dtype: DType) -> Tensor {
        // Every byte value, then some again.
        let v: Vec<u8> = (0..300u32).map(|i| (i * 97 % 256) as u8).collect();
        match dtype {
            DType::U8 => Tensor::from_vec(vec![2, 3, 50], v).unwrap(),
            _ => Tensor::from_vec(vec![2, 3, 50], v.into_iter().map(|b| b as i8).collect::<Vec<i8>>()).unwrap(),
        }
    }

    #[test]
    fn quantized_functions_of_one_8_bit_value_become_tables_with_the_same_values() {
        for dtype in [DType::U8, DType::I8] {
            for quantized in [true, false] {
                let g = graph(dtype, quantized);
                let want = run_graph(&g, vec![codes(dtype)]);
                let mut h = g.clone();
                assert!(crate::passes::chain::run(&mut h).unwrap() >= 1);
                assert_eq!(run(&mut h).unwrap(), 1, "{dtype:?} {quantized}");
                h.verify().unwrap();
                assert_eq!(op_names(&h), ["Lookup8"]);
                let got = run_graph(&h, vec![codes(dtype)]);
                assert_eq!(got[0].dtype(), want[0].dtype());
                assert_eq!(got[0].shape(), want[0].shape());
                // Bit for bit (f32 compared by bits).
                let bits = |t: &Tensor| -> Vec<u64> {
                    match t.dtype() {
                        DType::F32 => t
                            .as_slice::<f32>()
                            .unwrap()
                            .iter()
                            .map(|v| u64::from(v.to_bits()))
                            .collect(),
                        _ => t.to_f64_vec().iter().map(|v| v.to_bits()).collect(),
                    }
                };
                assert_eq!(bits(&got[0]), bits(&want[0]), "{dtype:?} {quantized}");
                // The values vary: a table of one entry would pass a weaker check.
                let v = want[0].to_f64_vec();
                assert!(v.iter().any(|&a| a != v[0]));
            }
        }
    }

    /// A chain with a tensor operand (a bias) depends on more than the 8-bit value: no table.
    #[test]
    fn chains_reading_tensors_stay() {
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::U8, &[4, 8]);
        let s = b.constant("s", Tensor::scalar(0.05f32));
        let z = b.constant("z", Tensor::scalar(128u8));
        let d = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[&[4, 8]])[0];
        let bias = b.constant("bias", noise(&[8], 3));
        let t = b.binary(BinaryOp::Add, d, bias, &[4, 8]);
        let y = b.unary(UnaryOp::Tanh, t, &[4, 8]);
        let mut g = b.finish(&[y]);
        crate::passes::chain::run(&mut g).unwrap();
        assert_eq!(run(&mut g).unwrap(), 0);
        assert!(op_names(&g).contains(&"ElementwiseChain"));
    }
}
