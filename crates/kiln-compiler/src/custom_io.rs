//! Custom I/O (qaic's `custom_io_list_file`): a float model's inputs and outputs taken and
//! returned in another precision or layout. An input becomes a new graph input of the asked
//! type and layout, converted on entry into the value the model reads (`DequantizeLinear` of
//! an 8-bit one, a `Cast` of a float16 one, then a `Transpose` of an NHWC one); an output is
//! converted on exit the other way. The new values take the I/O names; the model's own ones
//! are renamed `<name>_float`. The layout pass then cancels a boundary Transpose against a
//! channels-last first or last convolution.

use crate::CompileError;
use crate::passes::edit::{add_constant, dtype_of, fresh_name, op_node as node};
use kiln_ir::{Graph, Op, ValueId, ValueType};
use kiln_ops::elementwise::{Cast, ElementwiseOp};
use kiln_ops::movement::{MovementOp, Transpose};
use kiln_ops::quant::{DequantizeLinear, QuantOp, QuantizeLinear};
use kiln_ops::{Dim, TensorType};
use kiln_tensor::{DType, Tensor};

/// One input or output to change.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IoSpec {
    pub name: String,
    /// Taken or returned as `[N, H, W, C]` instead of the model's `[N, C, H, W]`.
    pub nhwc: bool,
    pub precision: IoPrecision,
}

/// The element type at the boundary.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum IoPrecision {
    /// f32, as the model has it.
    Float,
    Float16,
    /// u8 or i8 with `(q - zero_point) * scale` the float value.
    Quantized {
        dtype: DType,
        scale: f32,
        zero_point: i32,
    },
}

fn bad(name: &str, why: impl Into<String>) -> CompileError {
    CompileError::Option(format!("custom I/O for '{name}': {}", why.into()))
}

/// Applies `specs` to `g`'s inputs and outputs (see the module docs); an entry naming no input
/// or output, a non-f32 tensor, or NHWC on a tensor not of rank 4 is an error naming it.
pub fn apply(g: &mut Graph, specs: &[IoSpec]) -> Result<(), CompileError> {
    for spec in specs {
        let input = g.inputs.iter().position(|&v| g.value_name(v) == spec.name);
        let output = g.outputs.iter().position(|&v| g.value_name(v) == spec.name);
        if spec.precision == IoPrecision::Float && !spec.nhwc {
            if input.is_none() && output.is_none() {
                return Err(unknown(g, &spec.name));
            }
            continue;
        }
        match (input, output) {
            (Some(slot), None) => change_input(g, slot, spec)?,
            (None, Some(slot)) => change_output(g, slot, spec)?,
            (Some(_), Some(_)) => return Err(bad(&spec.name, "it is both an input and an output")),
            (None, None) => return Err(unknown(g, &spec.name)),
        }
    }
    Ok(())
}

fn unknown(g: &Graph, name: &str) -> CompileError {
    let names = |vs: &[ValueId]| {
        vs.iter()
            .map(|&v| g.value_name(v).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    bad(
        name,
        format!(
            "no input or output has that name (inputs: {}; outputs: {})",
            names(&g.inputs),
            names(&g.outputs)
        ),
    )
}

/// The f32 tensor type of `v` (its shape, rank 4 when `nhwc`).
fn float_type(g: &Graph, v: ValueId, spec: &IoSpec) -> Result<Option<Vec<Dim>>, CompileError> {
    if dtype_of(g, v) != Some(DType::F32) {
        return Err(bad(
            &spec.name,
            format!(
                "a precision or layout applies to f32 tensors; it is {}",
                dtype_of(g, v).map_or_else(|| "of unknown type".to_string(), |d| d.to_string())
            ),
        ));
    }
    let shape = match g.value(v).map(|x| &x.ty) {
        Some(ValueType::Tensor(t)) => t.shape.clone(),
        _ => None,
    };
    if spec.nhwc && shape.as_ref().is_none_or(|s| s.len() != 4) {
        return Err(bad(&spec.name, "Layout NHWC needs a tensor of rank 4"));
    }
    Ok(shape)
}

fn boundary_dtype(p: IoPrecision) -> DType {
    match p {
        IoPrecision::Float => DType::F32,
        IoPrecision::Float16 => DType::F16,
        IoPrecision::Quantized { dtype, .. } => dtype,
    }
}

/// The boundary shape of the model's value `v` (NHWC when asked) and the I/O name, `v`
/// renamed `<name>_float` for the new boundary value to take the name.
fn boundary(g: &mut Graph, v: ValueId, spec: &IoSpec) -> Result<(Option<Vec<Dim>>, String), CompileError> {
    let shape = float_type(g, v, spec)?;
    let outer = if spec.nhwc {
        permute(&shape, [0, 2, 3, 1])
    } else {
        shape
    };
    let name = spec.name.clone();
    let float_name = fresh_name(g, &format!("{name}_float"));
    if let Some(x) = g.values.get_mut(v.index()) {
        x.name = float_name;
    }
    Ok((outer, name))
}

/// A new value of `dtype` and `shape`.
fn value(g: &mut Graph, name: String, dtype: DType, shape: &Option<Vec<Dim>>) -> ValueId {
    g.add_value(
        name,
        ValueType::Tensor(TensorType {
            dtype: Some(dtype),
            shape: shape.clone(),
        }),
    )
}

fn permute(shape: &Option<Vec<Dim>>, perm: [usize; 4]) -> Option<Vec<Dim>> {
    let s = shape.as_ref()?;
    perm.iter().map(|&p| s.get(p).cloned()).collect()
}

/// The 8-bit grid's scale and zero point as constants.
fn grid(
    g: &mut Graph,
    name: &str,
    dtype: DType,
    scale: f32,
    zero_point: i32,
) -> Result<(ValueId, ValueId), CompileError> {
    let zp = match dtype {
        DType::U8 => Tensor::scalar(u8::try_from(zero_point).map_err(|_| bad(name, "Offset outside uint8"))?),
        DType::I8 => Tensor::scalar(i8::try_from(zero_point).map_err(|_| bad(name, "Offset outside int8"))?),
        other => return Err(bad(name, format!("an 8-bit precision, not {other}"))),
    };
    let s = add_constant(g, &format!("{name}_io_scale"), Tensor::scalar(scale));
    let z = add_constant(g, &format!("{name}_io_zero_point"), zp);
    Ok((s, z))
}

fn change_input(g: &mut Graph, slot: usize, spec: &IoSpec) -> Result<(), CompileError> {
    let Some(&x) = g.inputs.get(slot) else { return Ok(()) };
    let (outer_shape, name) = boundary(g, x, spec)?;
    let outer = value(g, name.clone(), boundary_dtype(spec.precision), &outer_shape);
    let mut nodes = Vec::new();
    let mut cur = outer;
    // Each conversion's output: `x` itself for the last one.
    let mut steps: Vec<Op> = Vec::new();
    let mut extra: Vec<Vec<Option<ValueId>>> = Vec::new();
    match spec.precision {
        IoPrecision::Float => {}
        IoPrecision::Float16 => {
            steps.push(Op::Elementwise(ElementwiseOp::Cast(Cast {
                to: DType::F32,
                saturate: true,
                round: kiln_tensor::formats::RoundMode::Up,
            })));
            extra.push(Vec::new());
        }
        IoPrecision::Quantized {
            dtype,
            scale,
            zero_point,
        } => {
            let (s, z) = grid(g, &name, dtype, scale, zero_point)?;
            steps.push(Op::Quant(QuantOp::DequantizeLinear(DequantizeLinear {
                axis: 1,
                block_size: 0,
                output_dtype: None,
            })));
            extra.push(vec![Some(s), Some(z)]);
        }
    }
    if spec.nhwc {
        steps.push(Op::Movement(MovementOp::Transpose(Transpose {
            perm: Some(vec![0, 3, 1, 2]),
        })));
        extra.push(Vec::new());
    }
    let count = steps.len();
    for (i, (op, more)) in steps.into_iter().zip(extra).enumerate() {
        let out = if i + 1 == count {
            x
        } else {
            let n = fresh_name(g, &format!("{name}_io{i}"));
            value(g, n, DType::F32, &outer_shape)
        };
        let mut inputs = vec![Some(cur)];
        inputs.extend(more);
        nodes.push(node(format!("{name}_custom_io{i}"), op, inputs, out));
        cur = out;
    }
    g.nodes.splice(0..0, nodes);
    if let Some(s) = g.inputs.get_mut(slot) {
        *s = outer;
    }
    Ok(())
}

fn change_output(g: &mut Graph, slot: usize, spec: &IoSpec) -> Result<(), CompileError> {
    let Some(&y) = g.outputs.get(slot) else { return Ok(()) };
    if g.inputs.contains(&y) {
        return Err(bad(&spec.name, "it is both an input and an output"));
    }
    let (outer_shape, name) = boundary(g, y, spec)?;
    let mut cur = y;
    if spec.nhwc {
        let n = if spec.precision == IoPrecision::Float {
            name.clone()
        } else {
            fresh_name(g, &format!("{name}_nhwc"))
        };
        let t = value(g, n, DType::F32, &outer_shape);
        let op = Op::Movement(MovementOp::Transpose(Transpose {
            perm: Some(vec![0, 2, 3, 1]),
        }));
        g.nodes
            .push(node(format!("{name}_custom_io_layout"), op, vec![Some(cur)], t));
        cur = t;
    }
    let boundary = boundary_dtype(spec.precision);
    if boundary != DType::F32 {
        let out = value(g, name.clone(), boundary, &outer_shape);
        let (op, inputs) = match spec.precision {
            IoPrecision::Quantized {
                dtype,
                scale,
                zero_point,
            } => {
                let (s, z) = grid(g, &name, dtype, scale, zero_point)?;
                (
                    Op::Quant(QuantOp::QuantizeLinear(QuantizeLinear {
                        axis: 1,
                        saturate: true,
                        block_size: 0,
                        output_dtype: None,
                        precision: None,
                    })),
                    vec![Some(cur), Some(s), Some(z)],
                )
            }
            _ => (
                Op::Elementwise(ElementwiseOp::Cast(Cast {
                    to: DType::F16,
                    saturate: true,
                    round: kiln_tensor::formats::RoundMode::Up,
                })),
                vec![Some(cur)],
            ),
        };
        g.nodes
            .push(node(format!("{name}_custom_io_precision"), op, inputs, out));
        cur = out;
    }
    if let Some(s) = g.outputs.get_mut(slot) {
        *s = cur;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::passes::testutil::{Builder, run_graph};
    use kiln_ops::elementwise::UnaryOp;

    /// A Relu model taking an NHWC uint8 image and returning NHWC int8 and float16: every
    /// element is the float model's on the dequantized, transposed input, converted back.
    #[test]
    fn inputs_and_outputs_change_precision_and_layout() {
        let shape = [1, 2, 3, 4];
        let mut b = Builder::new();
        let x = b.input("x", &shape);
        let y = b.unary(UnaryOp::Relu, x, &shape);
        let z = b.unary(UnaryOp::Neg, x, &shape);
        let mut g = b.finish(&[y, z]);
        let specs = [
            IoSpec {
                name: "x".into(),
                nhwc: true,
                precision: IoPrecision::Quantized {
                    dtype: DType::U8,
                    scale: 0.5,
                    zero_point: 10,
                },
            },
            IoSpec {
                name: g.value_name(y).to_string(),
                nhwc: true,
                precision: IoPrecision::Quantized {
                    dtype: DType::I8,
                    scale: 0.25,
                    zero_point: -3,
                },
            },
            IoSpec {
                name: g.value_name(z).to_string(),
                nhwc: false,
                precision: IoPrecision::Float16,
            },
        ];
        apply(&mut g, &specs).unwrap();
        g.verify().unwrap();
        assert_eq!(g.value_name(g.inputs[0]), "x");
        let q: Vec<u8> = (0..24).map(|i| (i * 7 % 23) as u8).collect();
        let out = run_graph(&g, vec![Tensor::from_vec(vec![1, 3, 4, 2], q.clone()).unwrap()]);
        // The float value of NCHW element (c, h, w) is NHWC element (h, w, c) dequantized.
        let xf = |c: usize, h: usize, w: usize| (f32::from(q[(h * 4 + w) * 2 + c]) - 10.0) * 0.5;
        assert_eq!(out[0].shape(), &[1, 3, 4, 2]);
        assert_eq!(out[0].dtype(), DType::I8);
        assert_eq!(out[1].shape(), &[1, 2, 3, 4]);
        assert_eq!(out[1].dtype(), DType::F16);
        let yq = out[0].as_slice::<i8>().unwrap();
        let zh = out[1].to_f64_vec();
        for c in 0..2 {
            for h in 0..3 {
                for w in 0..4 {
                    let v = xf(c, h, w);
                    let want_y = ((v.max(0.0) / 0.25).round_ties_even() - 3.0).clamp(-128.0, 127.0) as i8;
                    assert_eq!(yq[(h * 4 + w) * 2 + c], want_y, "y at {c},{h},{w}");
                    assert_eq!(zh[(c * 3 + h) * 4 + w], f64::from(-v), "z at {c},{h},{w}");
                }
            }
        }
        assert!(yq.iter().any(|&v| v != -3));
    }

    #[test]
    fn unknown_names_and_bad_layouts_are_refused_by_name() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3]);
        let y = b.unary(UnaryOp::Relu, x, &[2, 3]);
        let g = b.finish(&[y]);
        let spec = |name: &str, nhwc| IoSpec {
            name: name.into(),
            nhwc,
            precision: IoPrecision::Float,
        };
        let e = apply(&mut g.clone(), &[spec("nope", false)]).unwrap_err().to_string();
        assert!(e.contains("'nope'") && e.contains("inputs: x"), "{e}");
        let e = apply(&mut g.clone(), &[spec("x", true)]).unwrap_err().to_string();
        assert!(e.contains("rank 4"), "{e}");
    }
}
