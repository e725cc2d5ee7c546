//! Scalar functions std does not provide.

/// The error function (defined once, in the kernels crate, so the GEMM epilogue's portable
/// Gelu and the standalone operators agree bit for bit).
pub(crate) use kiln_kernels::sgemm::erf;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_tabulated_values() {
        // Abramowitz & Stegun table 7.1 / high-precision references.
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.9, 0.999_958_902_121_900_5),
            (3.0, 0.999_977_909_503_001_4),
            (4.0, 0.999_999_984_582_742_1),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {} want {want}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-13);
        }
        assert_eq!(erf(40.0), 1.0);
    }
}
