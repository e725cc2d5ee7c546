//! `ElementwiseChain`: a run of f32 elementwise ops applied in one pass over memory, which the
//! compiler's `chain` pass makes from unary ops and Add/Sub/Mul/Div/Pow nodes that each read
//! the previous one's output alone (GELU or Swish spelled out, normalisation arithmetic,
//! scale-and-shift), and from the quantize-dequantize round trips of QDQ graphs. Input 0 is
//! the chain's start (f32, or int32 converted as `Cast` converts it: an integer product's
//! sums); inputs 1.. are the binary steps' other operands, each of the start's shape, a single
//! element, or a trailing block of it (a bias along the last axes, repeated). Any input may be
//! 8-bit with its [`ChainDequantize`]: dequantized as it is read, as `DequantizeLinear`
//! computes it (a quantized model's float arithmetic reads its 8-bit tensors, a quarter of the
//! bytes, with no f32 tensor in between). The output is f32, or 8-bit when the chain ends on a
//! `QuantizeLinear` ([`ChainQuantize`]).
//!
//! The output is computed block by block (a block stays in L1 while every step runs over it),
//! in parallel over the pool for large tensors. Each step computes exactly what its standalone
//! op computes per element (unary ops through [`UnaryOp::apply_f32`], arithmetic in f32, Pow
//! through f64 as the Pow op, the round trip and the final quantization through the
//! `QuantizeLinear` / `DequantizeLinear` rows), so results are bit-identical to the unfused
//! graph.

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
    /// `QuantizeLinear` to the 8-bit type of range `[lo, hi]` (one scale and zero point) and
    /// `DequantizeLinear` back: the value rounded onto the quantization grid.
    FakeQuantize {
        scale: f32,
        zero_point: f32,
        lo: f32,
        hi: f32,
    },
}

/// A chain's final `QuantizeLinear` (one scale and zero point): the output is 8-bit.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChainQuantize {
    pub scale: f32,
    pub zero_point: f32,
    /// U8 or I8.
    pub dtype: DType,
}

/// A chain input's `DequantizeLinear` (one scale and zero point): the input is 8-bit.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChainDequantize {
    pub scale: f32,
    pub zero_point: i32,
    /// U8 or I8.
    pub dtype: DType,
}

/// The op: its steps in order (see the module docs).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ElementwiseChain {
    pub steps: Vec<ChainStep>,
    /// The output's quantization, when the chain ends on a `QuantizeLinear`.
    #[serde(default)]
    pub quantize: Option<ChainQuantize>,
    /// Per input, its dequantization when it is 8-bit (none past the end).
    #[serde(default)]
    pub dequantize: Vec<Option<ChainDequantize>>,
}

/// Inputs a chain gathers without allocating (GELU spelled out with tanh has six).
const INLINE_INPUTS: usize = 8;

/// Elements per block: 16 KiB of f32, which every step then reads from L1.
const BLOCK: usize = 4096;
/// Elements from which the blocks are spread over the pool.
const PAR_MIN: usize = 1 << 14;

/// A binary step's operand: the whole tensor, its one element, or a block repeated along the
/// leading axes (element `i` of the chain reads `d[i % d.len()]`), or a whole 8-bit tensor
/// dequantized block by block.
#[derive(Clone, Copy)]
enum Operand<'a> {
    Full(&'a [f32]),
    Scalar(f32),
    Periodic(&'a [f32]),
    Bytes(Bytes<'a>, ChainDequantize),
}

/// An 8-bit input's values.
#[derive(Clone, Copy)]
enum Bytes<'a> {
    U8(&'a [u8]),
    I8(&'a [i8]),
}

impl<'a> Bytes<'a> {
    /// Input `i` as 8-bit values of `d`'s type.
    fn of(t: &'a Tensor, d: ChainDequantize, i: usize) -> Result<Bytes<'a>> {
        match (t.dtype(), d.dtype) {
            (DType::U8, DType::U8) => Ok(Bytes::U8(t.as_slice::<u8>()?)),
            (DType::I8, DType::I8) => Ok(Bytes::I8(t.as_slice::<i8>()?)),
            (got, _) => Err(OpError::UnsupportedDType { index: i, got }),
        }
    }

    /// Elements `start..start + out.len()` dequantized into `out` (as many as there are).
    fn dequantize(self, d: ChainDequantize, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Bytes::U8(v) => {
                let z = d.zero_point.clamp(0, 255) as u8;
                kiln_kernels::quant::dequantize_row(v.get(start..end).unwrap_or(&[]), out, d.scale, z);
            }
            Bytes::I8(v) => {
                let z = d.zero_point.clamp(-128, 127) as i8;
                kiln_kernels::quant::dequantize_row(v.get(start..end).unwrap_or(&[]), out, d.scale, z);
            }
        }
    }

    fn len(self) -> usize {
        match self {
            Bytes::U8(v) => v.len(),
            Bytes::I8(v) => v.len(),
        }
    }
}

/// Whether an operand of shape `o` repeats along `x`'s leading axes: `o` without its leading
/// ones is a suffix of `x`'s shape.
fn is_trailing_block(o: &[usize], x: &[usize]) -> bool {
    let lead = o.iter().take_while(|&&d| d == 1).count();
    let core = o.get(lead..).unwrap_or(&[]);
    o.len() <= x.len() && x.ends_with(core)
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
        self.check_quantize()?;
        let x = inputs.first().ok_or(OpError::MissingInput { index: 0 })?;
        let dq = self.dequantize.first().copied().flatten();
        if let Some(d) = x.ty.tensor().and_then(|t| t.dtype)
            && !matches!((d, dq), (DType::F32 | DType::I32, None))
            && dq.is_none_or(|q| q.dtype != d)
        {
            return Err(OpError::UnsupportedDType { index: 0, got: d });
        }
        let shape = x.ty.tensor().and_then(|t| t.shape.clone());
        Ok(vec![ValueType::Tensor(crate::TensorType {
            dtype: Some(self.quantize.map_or(DType::F32, |q| q.dtype)),
            shape,
        })])
    }

    fn check_quantize(&self) -> Result<()> {
        match self.quantize {
            Some(q) if !matches!(q.dtype, DType::U8 | DType::I8) => Err(OpError::attribute(
                "quantize",
                "a u8 or i8 output",
                format!("{:?}", q.dtype),
            )),
            _ => Ok(()),
        }
    }

    pub fn run(&self, args: &Args<'_>) -> Result<Tensor> {
        let x = args.tensor(0)?;
        let n_inputs = args.len();
        self.check_steps(n_inputs)?;
        self.check_quantize()?;
        let dq = |i: usize| self.dequantize.get(i).copied().flatten();
        let start_values = match (x.dtype(), dq(0)) {
            (DType::F32, None) => Start::F32(x.as_slice::<f32>()?),
            (DType::I32, None) => Start::I32(x.as_slice::<i32>()?),
            (_, Some(d)) => Start::Bytes(Bytes::of(x, d, 0)?, d),
            (got, None) => return Err(OpError::UnsupportedDType { index: 0, got }),
        };
        // 8-bit operands that are not of X's shape, dequantized once (they are small).
        let mut small: smallvec::SmallVec<[(usize, Vec<f32>); 2]> = smallvec::SmallVec::new();
        for i in 0..n_inputs {
            let t = args.tensor(i)?;
            if let Some(d) = dq(i)
                && t.shape() != x.shape()
            {
                let b = Bytes::of(t, d, i)?;
                let mut v = vec![0.0f32; b.len()];
                b.dequantize(d, 0, &mut v);
                small.push((i, v));
            }
        }
        let mut operands: smallvec::SmallVec<[Operand<'_>; INLINE_INPUTS]> = smallvec::SmallVec::new();
        for i in 0..n_inputs {
            let t = args.tensor(i)?;
            if let (0, Start::I32(_)) = (i, start_values) {
                // An int32 start is no operand (the chain pass only takes f32 ones); its slot
                // keeps the operands' indices.
                operands.push(Operand::Scalar(f32::NAN));
                continue;
            }
            let d: &[f32] = match (dq(i), small.iter().find(|(j, _)| *j == i)) {
                (Some(q), None) => {
                    operands.push(Operand::Bytes(Bytes::of(t, q, i)?, q));
                    continue;
                }
                (Some(_), Some((_, v))) => v,
                (None, _) if t.dtype() == DType::F32 => t.as_slice::<f32>()?,
                (None, _) => {
                    return Err(OpError::UnsupportedDType {
                        index: i,
                        got: t.dtype(),
                    });
                }
            };
            operands.push(if t.shape() == x.shape() {
                Operand::Full(d)
            } else if let ([v], true) = (d, t.rank() <= x.rank()) {
                Operand::Scalar(*v)
            } else if !d.is_empty() && is_trailing_block(t.shape(), x.shape()) {
                Operand::Periodic(d)
            } else {
                return Err(OpError::input_shape(
                    i,
                    format!("X's shape {:?}, one element or a trailing block of it", x.shape()),
                    t.shape(),
                ));
            });
        }
        let run = |bi: usize, out: &mut [f32]| {
            let start = bi * BLOCK;
            match start_values {
                Start::F32(xd) => {
                    if let Some(src) = xd.get(start..start + out.len()) {
                        out.copy_from_slice(src);
                    }
                }
                Start::I32(xd) => {
                    if let Some(src) = xd.get(start..start + out.len()) {
                        // As the Cast op converts int32 to f32 (one rounding).
                        kiln_kernels::simd::vectorize(|| out.iter_mut().zip(src).for_each(|(o, &a)| *o = a as f32));
                    }
                }
                Start::Bytes(b, d) => b.dequantize(d, start, out),
            }
            for s in &self.steps {
                match *s {
                    ChainStep::Unary(op) => op.apply_f32(out),
                    ChainStep::Binary { op, operand, swapped } => match operands.get(operand) {
                        Some(Operand::Full(d)) => {
                            let d = d.get(start..start + out.len()).unwrap_or(&[]);
                            binary_step(op, swapped, out, Operand::Full(d));
                        }
                        Some(&Operand::Periodic(d)) => {
                            // Run by run of the repeated block, each an aligned full operand.
                            let mut at = start % d.len();
                            for seg in split_runs(out, d.len(), at) {
                                let len = seg.len();
                                binary_step(op, swapped, seg, Operand::Full(d.get(at..at + len).unwrap_or(&[])));
                                at = 0;
                            }
                        }
                        // The block's 8-bit operand dequantized into this thread's scratch.
                        Some(&Operand::Bytes(b, d)) => with_block(&OPERAND_BLOCK, out.len(), |v| {
                            b.dequantize(d, start, v);
                            binary_step(op, swapped, out, Operand::Full(v));
                        }),
                        Some(&x) => binary_step(op, swapped, out, x),
                        None => {}
                    },
                    ChainStep::FakeQuantize {
                        scale,
                        zero_point,
                        lo,
                        hi,
                    } => kiln_kernels::quant::fake_quantize_row(out, scale, zero_point, (lo, hi)),
                }
            }
        };
        let n = x.len();
        let parallel = n >= PAR_MIN;
        match self.quantize {
            None => {
                // Every element is written below: a recycled buffer needs no clearing.
                let mut y = crate::util::out_f32(n);
                if parallel {
                    kiln_kernels::pool::for_each_chunk_mut(&mut y, BLOCK, &run);
                } else {
                    y.chunks_mut(BLOCK).enumerate().for_each(|(i, c)| run(i, c));
                }
                Ok(Tensor::from_buf(x.shape(), y)?)
            }
            Some(q) => {
                fn quantized<T: kiln_kernels::quant::Q8 + kiln_tensor::Element + kiln_kernels::recycle::Recycled>(
                    x: &Tensor,
                    q: ChainQuantize,
                    parallel: bool,
                    run: &(dyn Fn(usize, &mut [f32]) + Sync),
                ) -> Result<Tensor> {
                    let mut y = crate::util::out_buf::<T>(x.len());
                    let one = |bi: usize, out: &mut [T]| {
                        // The f32 block in this thread's scratch (`run` writes all of it
                        // first): no 16 KiB zeroing per block.
                        with_block(&QUANTIZE_BLOCK, out.len(), |b| {
                            run(bi, b);
                            kiln_kernels::quant::quantize_row(b, out, q.scale, q.zero_point);
                        })
                    };
                    if parallel {
                        kiln_kernels::pool::for_each_chunk_mut(&mut y, BLOCK, &one);
                    } else {
                        y.chunks_mut(BLOCK).enumerate().for_each(|(i, c)| one(i, c));
                    }
                    Ok(Tensor::from_buf(x.shape(), y)?)
                }
                match q.dtype {
                    DType::U8 => quantized::<u8>(x, q, parallel, &run),
                    _ => quantized::<i8>(x, q, parallel, &run),
                }
            }
        }
    }
}

thread_local! {
    /// Each thread's f32 block of a chain that ends quantized.
    static QUANTIZE_BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each thread's f32 block of an 8-bit operand.
    static OPERAND_BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` f32 values of this thread's block `key` (stale contents: `f` writes
/// every value before it reads it), or of a fresh vector when the block is in use.
fn with_block<R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    key.with(|cell| {
        let mut fresh = Vec::new();
        let mut kept = cell.try_borrow_mut();
        let scratch = match kept.as_deref_mut() {
            Ok(v) => v,
            Err(_) => &mut fresh,
        };
        f(kiln_kernels::recycle::scratch(scratch, len))
    })
}

/// The chain's start: f32 values, or int32 or 8-bit ones converted as they are read.
#[derive(Clone, Copy)]
enum Start<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    Bytes(Bytes<'a>, ChainDequantize),
}

/// `out` cut where a block of `period` elements repeats, the first run starting `at` into it.
fn split_runs(out: &mut [f32], period: usize, at: usize) -> impl Iterator<Item = &mut [f32]> {
    let first = period.saturating_sub(at).min(out.len());
    let (head, rest) = out.split_at_mut(first);
    std::iter::once(head).chain(rest.chunks_mut(period.max(1)))
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
        // A periodic operand arrives cut to the block's runs, as full ones.
        (Operand::Full(d) | Operand::Periodic(d), false) => out.iter_mut().zip(d).for_each(|(v, &b)| *v = f(*v, b)),
        (Operand::Full(d) | Operand::Periodic(d), true) => out.iter_mut().zip(d).for_each(|(v, &b)| *v = f(b, *v)),
        (Operand::Scalar(c), false) => out.iter_mut().for_each(|v| *v = f(*v, c)),
        (Operand::Scalar(c), true) => out.iter_mut().for_each(|v| *v = f(c, *v)),
        // Dequantized into a block first by the caller.
        (Operand::Bytes(..), _) => {}
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::elementwise::{Binary, BinaryOp, ElementwiseOp};
    use crate::quant::QuantOp;
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
        ElementwiseChain {
            steps,
            quantize: None,
            dequantize: vec![],
        }
        .run(&Args::new(&refs))
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

    fn quant(op: QuantOp, inputs: &[&Tensor]) -> Tensor {
        let vals: Vec<Value> = inputs.iter().map(|t| Value::Tensor((*t).clone())).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
        let out = op.eval(&Args::new(&refs)).unwrap();
        out[0].as_tensor().unwrap().clone()
    }

    /// The QDQ glue a chain takes: int32 sums cast to f32, a per-column scale and a bias
    /// along the last axis (a trailing block, across block edges: 3 x 1700 elements), the
    /// quantize-dequantize round trip, an operand that is the chain's start itself, and a
    /// final QuantizeLinear to u8 and to i8: bit for bit the ops in turn.
    #[test]
    fn int_starts_trailing_blocks_round_trips_and_quantized_ends_match_the_ops() {
        use crate::elementwise::Cast;
        use crate::quant::{DequantizeLinear, QuantizeLinear};
        let shape = [3, 1700];
        let sums: Vec<i32> = (0..5100).map(|i| (i * 7919 % 20011) - 10000).collect();
        let acc = Tensor::from_vec(shape.to_vec(), sums).unwrap();
        let scale = values(&[1700], 3, 0.0001);
        let bias = values(&[1, 1700], 4, -1.0);
        let (s1, z1) = (Tensor::scalar(0.0123f32), Tensor::scalar(131u8));
        let q = |zp: &Tensor| {
            QuantOp::QuantizeLinear(QuantizeLinear {
                axis: 1,
                saturate: true,
                block_size: 0,
                output_dtype: Some(zp.dtype()),
                precision: None,
            })
        };
        let dq = QuantOp::DequantizeLinear(DequantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: None,
        });
        let cast = ElementwiseOp::Cast(Cast {
            to: DType::F32,
            saturate: true,
            round: kiln_tensor::formats::RoundMode::Up,
        });
        let mut want = standalone(cast, &[&acc]);
        want = standalone(bin(BinaryOp::Mul), &[&want, &scale]);
        want = quant(q(&z1), &[&want, &s1, &z1]);
        want = quant(dq.clone(), &[&want, &s1, &z1]);
        want = standalone(bin(BinaryOp::Add), &[&bias, &want]);
        let fq = ChainStep::FakeQuantize {
            scale: 0.0123,
            zero_point: 131.0,
            lo: 0.0,
            hi: 255.0,
        };
        let b = |op, operand, swapped| ChainStep::Binary { op, operand, swapped };
        let steps = vec![b(ChainBinary::Mul, 1, false), fq, b(ChainBinary::Add, 2, true)];
        let got = chained(steps.clone(), &[&acc, &scale, &bias]).unwrap();
        let bits = |t: &Tensor| {
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got), bits(&want));
        // An f32 start the chain also reads as an operand: x * FQ(x).
        let x = values(&shape, 5, -2.0);
        let mut w2 = quant(q(&z1), &[&x, &s1, &z1]);
        w2 = quant(dq, &[&w2, &s1, &z1]);
        w2 = standalone(bin(BinaryOp::Mul), &[&x, &w2]);
        let got = chained(vec![fq, b(ChainBinary::Mul, 0, true)], &[&x]).unwrap();
        assert_eq!(bits(&got), bits(&w2));
        assert!(bits(&w2).iter().any(|&v| f32::from_bits(v) != 0.0));
        // Ending on a QuantizeLinear, u8 and i8.
        for (s2, z2) in [
            (Tensor::scalar(0.05f32), Tensor::scalar(7u8)),
            (Tensor::scalar(0.02f32), Tensor::scalar(-3i8)),
        ] {
            let want_q = quant(q(&z2), &[&want, &s2, &z2]);
            let chain = ElementwiseChain {
                steps: steps.clone(),
                quantize: Some(ChainQuantize {
                    scale: *s2.as_slice::<f32>().unwrap().first().unwrap(),
                    zero_point: z2.to_f64_vec()[0] as f32,
                    dtype: z2.dtype(),
                }),
                dequantize: vec![],
            };
            let vals: Vec<Value> = [&acc, &scale, &bias]
                .iter()
                .map(|t| Value::Tensor((*t).clone()))
                .collect();
            let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
            let got_q = chain.run(&Args::new(&refs)).unwrap();
            assert_eq!(got_q.dtype(), z2.dtype());
            assert_eq!(got_q.to_f64_vec(), want_q.to_f64_vec());
            let distinct: std::collections::BTreeSet<i64> = got_q.to_f64_vec().iter().map(|&v| v as i64).collect();
            assert!(distinct.len() > 20, "{distinct:?}");
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
        assert_eq!(
            e,
            OpError::input_shape(1, "X's shape [2, 3], one element or a trailing block of it", &[3, 2])
        );
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
