//! Reference GEMM: `C = alpha * op(A) * op(B) + beta * C`, scalar, any strides.

/// Layout of one GEMM operand: row stride and column stride in elements, so transposition is
/// a swap of strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatLayout {
    pub row_stride: usize,
    pub col_stride: usize,
}

impl MatLayout {
    /// Row-major matrix with `cols` columns.
    pub fn row_major(cols: usize) -> MatLayout {
        MatLayout {
            row_stride: cols,
            col_stride: 1,
        }
    }
    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(cols: usize) -> MatLayout {
        MatLayout {
            row_stride: 1,
            col_stride: cols,
        }
    }
}

/// Scalar element the reference GEMM runs on.
pub trait GemmScalar:
    Copy + Default + Send + Sync + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    /// A vector of `n` elements for a C that a product overwrites whole (f32: a recycled
    /// buffer with stale contents, see [`crate::recycle`]).
    fn out_buffer(n: usize) -> Vec<Self> {
        vec![Self::default(); n]
    }
    /// The running step's planned output range of `n` elements (f32 only; see
    /// [`crate::recycle::take_planned`]).
    fn planned_out(_n: usize) -> Option<crate::slab::Region<Self>> {
        None
    }
}
impl GemmScalar for f32 {
    fn out_buffer(n: usize) -> Vec<f32> {
        crate::recycle::take(n)
    }
    fn planned_out(n: usize) -> Option<crate::slab::Region<f32>> {
        crate::recycle::take_planned(n)
    }
}
impl GemmScalar for f64 {}
impl GemmScalar for i32 {}
impl GemmScalar for i64 {}
impl GemmScalar for u32 {}
impl GemmScalar for u64 {}

/// `c[m x n] = a[m x k] * b[k x n]` (c overwritten), operands addressed through their layouts.
/// Returns `false` (and leaves `c` alone) when a slice is too short for the given dims.
pub fn gemm<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    la: MatLayout,
    b: &[T],
    lb: MatLayout,
    c: &mut [T],
) -> bool {
    let need = |l: MatLayout, r: usize, cc: usize| {
        if r == 0 || cc == 0 {
            0
        } else {
            (r - 1) * l.row_stride + (cc - 1) * l.col_stride + 1
        }
    };
    if a.len() < need(la, m, k) || b.len() < need(lb, k, n) || c.len() < m * n {
        return false;
    }
    for i in 0..m {
        // Stopped (`crate::stop`): the remaining rows are left as they are.
        if crate::stop::requested() {
            break;
        }
        let crow = &mut c[i * n..(i + 1) * n];
        crow.iter_mut().for_each(|x| *x = T::default());
        for p in 0..k {
            let av = a[i * la.row_stride + p * la.col_stride];
            let brow = p * lb.row_stride;
            if lb.col_stride == 1 {
                // Contiguous rows of B: the same sums in the same order, in a form the
                // compiler vectorises.
                for (cv, &bv) in crow.iter_mut().zip(&b[brow..brow + n]) {
                    *cv = *cv + av * bv;
                }
            } else {
                for (j, cv) in crow.iter_mut().enumerate() {
                    *cv = *cv + av * b[brow + j * lb.col_stride];
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_product() {
        // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50]
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [5.0f32, 6.0, 7.0, 8.0];
        let mut c = [0.0f32; 4];
        assert!(gemm(
            2,
            2,
            2,
            &a,
            MatLayout::row_major(2),
            &b,
            MatLayout::row_major(2),
            &mut c
        ));
        assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
        // A^T * B with A stored row-major: [1 3; 2 4] * B = [26 30; 38 44]
        assert!(gemm(
            2,
            2,
            2,
            &a,
            MatLayout::transposed(2),
            &b,
            MatLayout::row_major(2),
            &mut c
        ));
        assert_eq!(c, [26.0, 30.0, 38.0, 44.0]);
    }

    #[test]
    fn short_slices_are_refused() {
        let mut c = [0.0f32; 4];
        assert!(!gemm(
            2,
            2,
            2,
            &[1.0; 3],
            MatLayout::row_major(2),
            &[1.0; 4],
            MatLayout::row_major(2),
            &mut c
        ));
    }
}
