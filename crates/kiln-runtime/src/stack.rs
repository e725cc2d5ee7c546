//! Stacking and slicing tensors along an axis: what Loop, Scan and SequenceMap need to
//! assemble per-iteration values.

use kiln_ops::OpError;
use kiln_tensor::{Tensor, strides_of};

/// Stacks equally shaped tensors along a new axis `axis` (0..=rank).
pub fn stack(items: &[Tensor], axis: usize) -> Result<Tensor, OpError> {
    let Some(first) = items.first() else {
        return Err(OpError::subgraph(
            "body",
            "at least one iteration's value to stack",
            "none",
        ));
    };
    let shape = first.shape().to_vec();
    if axis > shape.len() {
        return Err(OpError::Axis {
            axis: axis as i64,
            rank: shape.len() + 1,
        });
    }
    for t in items {
        if t.shape() != shape.as_slice() || t.dtype() != first.dtype() {
            let k = items.iter().position(|u| std::ptr::eq(u, t)).unwrap_or(0);
            return Err(OpError::subgraph(
                "body",
                format!("{}{:?} in every iteration, as in the first", first.dtype(), shape),
                format!("{}{:?} in iteration {k}", t.dtype(), t.shape()),
            ));
        }
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis..].iter().product();
    let mut out_shape = shape.clone();
    out_shape.insert(axis, items.len());
    // Concatenate item after item, then pick the stacked order.
    let refs: Vec<&Tensor> = items.iter().collect();
    let flat = Tensor::concat_flat(&refs)?;
    let per = outer * inner;
    let mut order = Vec::with_capacity(per * items.len());
    for o in 0..outer {
        for k in 0..items.len() {
            let base = k * per + o * inner;
            order.extend(base..base + inner);
        }
    }
    Ok(flat.gather_flat(out_shape, &order)?)
}

/// Slice `index` of `t` along `axis` (the axis removed).
pub fn take_along(t: &Tensor, axis: usize, index: usize) -> Result<Tensor, OpError> {
    let shape = t.shape();
    if axis >= shape.len() {
        return Err(OpError::Axis {
            axis: axis as i64,
            rank: shape.len(),
        });
    }
    if index >= shape[axis] {
        return Err(OpError::IndexOutOfRange {
            index: index as i64,
            size: shape[axis],
        });
    }
    let strides = strides_of(shape);
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut idx = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * strides[axis] * shape[axis] + index * strides[axis];
        idx.extend(base..base + inner);
    }
    let mut out_shape = shape.to_vec();
    out_shape.remove(axis);
    Ok(t.gather_flat(out_shape, &idx)?)
}
