//! `ElementwiseChain`: a run of f32 elementwise ops applied in one pass over memory, which the
//! compiler's `chain` pass makes from unary ops and Add/Sub/Mul/Div/Pow nodes that each read
//! the previous one's output alone (GELU or Swish spelled out, normalisation arithmetic,
//! scale-and-shift). Input 0 is the chain's start; inputs 1.. are the binary steps' other
//! operands, each of the start's shape or a single element.
//!
//! The output is computed block by block (a block stays in L1 while every step runs over it),
//! in parallel over the pool for large tensors. Each step computes exactly what its standalone
//! op computes per element (unary ops through [`UnaryOp::apply_f32`], arithmetic in f32, Pow
//! through f64 as the Pow op), so results are bit-identical to the unfused graph.

use super::UnaryOp;
use crate::error::{OpError, Result};
use crate::value::{Args, InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

/// The binary ops a chain step can be.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub enum ChainBinary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
}

impl ChainBinary {
    /// `a op b` on f32, as the standalone op computes it.
    #[inline(always)]
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            ChainBinary::Add => a + b,
            ChainBinary::Sub => a - b,
            ChainBinary::Mul => a * b,
            ChainBinary::Div => a / b,
            // A square as the Pow op computes it (exact in f64, rounded once), without powf.
            ChainBinary::Pow if b == 2.0 => (f64::from(a) * f64::from(a)) as f32,
            ChainBinary::Pow => f64::from(a).powf(f64::from(b)) as f32,
        }
    }
}

/// One step on the running value `v`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum ChainStep {
    Unary(UnaryOp),
    /// `v = v op x[operand]`, or `x[operand] op v` when `swapped` (`x` the node's inputs; an
    /// operand of one element applies to every position).
    Binary {
        op: ChainBinary,
        operand: usize,
        swapped: bool,
    },
}

/// The op: its steps in order (see the module docs).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ElementwiseChain {
    pub steps: Vec<ChainStep>,
}

/// Inputs a chain gathers without allocating (GELU spelled out with tanh has six).
const INLINE_INPUTS: usize = 8;

/// Elements per block: 16 KiB of f32, which every step then reads from L1.
const BLOCK: usize = 4096;
/// Elements from which the blocks are spread over the pool.
const PAR_MIN: usize = 1 << 16;

/// A binary step's operand: the whole tensor, or its one element.
#[derive(Clone, Copy)]
enum Operand<'a> {
    Full(&'a [f32]),
    Scalar(f32),
}

impl ElementwiseChain {
    pub fn name(&self) -> &'static str {
        "ElementwiseChain"
    }

    fn check_steps(&self, inputs: usize) -> Result<()> {
        for s in &self.steps {
            match s {
                ChainStep::Unary(op) if !op.is_f32_map() => {
                    return Err(OpError::attribute("steps", "maps of f32 to f32", op.name()));
                }
                ChainStep::Binary { operand, .. } if *operand >= inputs => {
                    return Err(OpError::attribute(
                        "steps",
                        format!("operands among the {inputs} inputs"),
                        format!("a step reading input {operand}"),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        self.check_steps(inputs.len())?;
        let x = inputs.first().ok_or(OpError::MissingInput { index: 0 })?;
        if let Some(d) = x.ty.tensor().and_then(|t| t.dtype)
            && d != DType::F32
        {
            return Err(OpError::UnsupportedDType { index: 0, got: d });
        }
        Ok(vec![x.ty.clone()])
    }

    pub fn run(&self, args: &Args<'_>) -> Result<Tensor> {
        let x = args.tensor(0)?;
        let n_inputs = args.len();
        self.check_steps(n_inputs)?;
        let f32_of = |i: usize, t: &Tensor| -> Result<()> {
            if t.dtype() == DType::F32 {
                Ok(())
            } else {
                Err(OpError::UnsupportedDType {
                    index: i,
                    got: t.dtype(),
                })
            }
        };
        f32_of(0, x)?;
        let xd = x.as_slice::<f32>()?;
        let mut operands: smallvec::SmallVec<[Operand<'_>; INLINE_INPUTS]> = smallvec::SmallVec::new();
        for i in 0..n_inputs {
            let t = args.tensor(i)?;
            f32_of(i, t)?;
            let d = t.as_slice::<f32>()?;
            operands.push(if t.shape() == x.shape() {
                Operand::Full(d)
            } else if let ([v], true) = (d, t.rank() <= x.rank()) {
                Operand::Scalar(*v)
            } else {
                return Err(OpError::input_shape(
                    i,
                    format!("X's shape {:?} or one element", x.shape()),
                    t.shape(),
                ));
            });
        }
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(xd.len());
        let run = |bi: usize, out: &mut [f32]| {
            let start = bi * BLOCK;
            if let Some(src) = xd.get(start..start + out.len()) {
                out.copy_from_slice(src);
            }
            for s in &self.steps {
                match *s {
                    ChainStep::Unary(op) => op.apply_f32(out),
                    ChainStep::Binary { op, operand, swapped } => {
                        let x = match operands.get(operand) {
                            Some(Operand::Full(d)) => Operand::Full(d.get(start..start + out.len()).unwrap_or(&[])),
                            Some(&x) => x,
                            None => continue,
                        };
                        binary_step(op, swapped, out, x);
                    }
                }
            }
        };
        if y.len() >= PAR_MIN {
            kiln_kernels::pool::for_each_chunk_mut(&mut y, BLOCK, &run);
        } else {
            y.chunks_mut(BLOCK).enumerate().for_each(|(i, c)| run(i, c));
        }
        Ok(Tensor::from_buf(x.shape(), y)?)
    }
}

/// `out[i] = out[i] op x[i]` (or `x[i] op out[i]` when `swapped`), `x` the operand or its one
/// element, compiled for the active vector level with the op inlined.
fn binary_step(op: ChainBinary, swapped: bool, out: &mut [f32], operand: Operand<'_>) {
    match op {
        ChainBinary::Add => step_with(|a, b| ChainBinary::Add.apply(a, b), swapped, out, operand),
        ChainBinary::Sub => step_with(|a, b| ChainBinary::Sub.apply(a, b), swapped, out, operand),
        ChainBinary::Mul => step_with(|a, b| ChainBinary::Mul.apply(a, b), swapped, out, operand),
        ChainBinary::Div => step_with(|a, b| ChainBinary::Div.apply(a, b), swapped, out, operand),
        ChainBinary::Pow => step_with(|a, b| ChainBinary::Pow.apply(a, b), swapped, out, operand),
    }
}

#[inline(always)]
fn step_with(f: impl Fn(f32, f32) -> f32 + Copy, swapped: bool, out: &mut [f32], operand: Operand<'_>) {
    kiln_kernels::simd::vectorize(|| match (operand, swapped) {
        (Operand::Full(d), false) => out.iter_mut().zip(d).for_each(|(v, &b)| *v = f(*v, b)),
        (Operand::Full(d), true) => out.iter_mut().zip(d).for_each(|(v, &b)| *v = f(b, *v)),
        (Operand::Scalar(c), false) => out.iter_mut().for_each(|v| *v = f(*v, c)),
        (Operand::Scalar(c), true) => out.iter_mut().for_each(|v| *v = f(c, *v)),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::elementwise::{Binary, BinaryOp, ElementwiseOp};
    use crate::value::Value;

    fn values(shape: &[usize], seed: u32, lo: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                lo + (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0
            })
            .collect();
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    fn standalone(op: ElementwiseOp, inputs: &[&Tensor]) -> Tensor {
        let vals: Vec<Value> = inputs.iter().map(|t| Value::Tensor((*t).clone())).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
        let out = op.eval(&Args::new(&refs)).unwrap();
        out[0].as_tensor().unwrap().clone()
    }

    fn chained(steps: Vec<ChainStep>, inputs: &[&Tensor]) -> Result<Tensor> {
        let vals: Vec<Value> = inputs.iter().map(|t| Value::Tensor((*t).clone())).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
        ElementwiseChain { steps }.run(&Args::new(&refs))
    }

    fn bin(op: BinaryOp) -> ElementwiseOp {
        ElementwiseOp::Binary(Binary { op, legacy_axis: None })
    }

    /// A chain computes what its ops compute one after another, bit for bit: a block edge
    /// (5000 elements), the parallel size (70000), full and one-element operands, both sides.
    #[test]
    fn a_chain_equals_its_ops_in_turn_bit_for_bit() {
        for n in [7usize, 5000, 70_000] {
            let shape = [1, n];
            let x = values(&shape, 1, 0.1);
            let y = values(&shape, 2, -1.0);
            let c = Tensor::from_vec(vec![1], vec![0.75f32]).unwrap();
            let three = Tensor::scalar(3.0f32);
            // ((x^3 * 0.75 + y) -> Tanh; 0.75 - it; / y; Erf; Sqrt of (Exp), Sigmoid, Neg
            let mut want = standalone(bin(BinaryOp::Pow), &[&x, &three]);
            want = standalone(bin(BinaryOp::Mul), &[&want, &c]);
            want = standalone(bin(BinaryOp::Add), &[&y, &want]);
            want = standalone(ElementwiseOp::Unary(UnaryOp::Tanh), &[&want]);
            want = standalone(bin(BinaryOp::Sub), &[&c, &want]);
            want = standalone(bin(BinaryOp::Div), &[&want, &y]);
            want = standalone(ElementwiseOp::Unary(UnaryOp::Erf), &[&want]);
            want = standalone(ElementwiseOp::Unary(UnaryOp::Exp), &[&want]);
            want = standalone(ElementwiseOp::Unary(UnaryOp::Sqrt), &[&want]);
            want = standalone(ElementwiseOp::Unary(UnaryOp::Sigmoid), &[&want]);
            want = standalone(ElementwiseOp::Unary(UnaryOp::Neg), &[&want]);
            let b = |op, operand, swapped| ChainStep::Binary { op, operand, swapped };
            let got = chained(
                vec![
                    b(ChainBinary::Pow, 3, false),
                    b(ChainBinary::Mul, 2, false),
                    b(ChainBinary::Add, 1, true),
                    ChainStep::Unary(UnaryOp::Tanh),
                    b(ChainBinary::Sub, 2, true),
                    b(ChainBinary::Div, 1, false),
                    ChainStep::Unary(UnaryOp::Erf),
                    ChainStep::Unary(UnaryOp::Exp),
                    ChainStep::Unary(UnaryOp::Sqrt),
                    ChainStep::Unary(UnaryOp::Sigmoid),
                    ChainStep::Unary(UnaryOp::Neg),
                ],
                &[&x, &y, &c, &three],
            )
            .unwrap();
            assert_eq!(got.shape(), want.shape());
            let (g, w) = (got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
            assert!(w.iter().any(|v| *v != 0.0 && v.is_finite()));
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(a.to_bits() == b.to_bits(), "n={n} element {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn bad_operands_and_steps_are_refused() {
        let x = values(&[2, 3], 1, 0.0);
        let wrong = values(&[3, 2], 2, 0.0);
        let step = ChainStep::Binary {
            op: ChainBinary::Add,
            operand: 1,
            swapped: false,
        };
        let e = chained(vec![step], &[&x, &wrong]).unwrap_err();
        assert_eq!(e, OpError::input_shape(1, "X's shape [2, 3] or one element", &[3, 2]));
        let e = chained(vec![step], &[&x]).unwrap_err();
        assert_eq!(
            e,
            OpError::attribute("steps", "operands among the 1 inputs", "a step reading input 1")
        );
        let e = chained(vec![ChainStep::Unary(UnaryOp::IsNaN)], &[&x]).unwrap_err();
        assert_eq!(e, OpError::attribute("steps", "maps of f32 to f32", "IsNaN"));
        let ints = Tensor::from_vec(vec![2], vec![1i64, 2]).unwrap();
        assert!(chained(vec![ChainStep::Unary(UnaryOp::Neg)], &[&ints]).is_err());
    }
}
