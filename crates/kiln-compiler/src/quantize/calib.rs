//! Calibration: a histogram of a tensor's values over the calibration samples in, a clipping
//! range out. Each method's algorithm is documented in `docs/options.md`
//! (`quantization_calibration`); in short:
//!
//! - `MinMax` (qaic's `None`): the observed range.
//! - `Kl`: Glow's `optimizeKL` — shrink a window over the bins, compare the window's
//!   distribution `P` (outside mass folded into its end bins) with `Q` (the window merged into
//!   255 levels and spread back over `P`'s non-empty bins), keep the window of least KL(P||Q);
//!   symmetric schemas shrink both ends together, asymmetric ones drop the lighter end.
//! - `KlV2`: TensorRT's entropy calibration (as ONNX Runtime's `Entropy`) on the histogram of
//!   `|x|`: thresholds from bin 128 up, 128 levels, the last argmin of KL.
//! - `Percentile(p)`: a one-signed tensor keeps the `p`-th percentile of its magnitude;
//!   a two-signed one clips `(100 - p) / 2` % of the mass from each end.
//! - `Mse`: both ends scaled by one factor (128 candidates), keeping the range whose grid
//!   (the schema's actual scale and zero point) gives the least squared error over the bins.
//! - `Sqnr`: AIMET's SQNR analyser: cost = squared error with clipped values weighted by 3,
//!   the two ends scaled independently for an asymmetric grid (32 x 32 candidates), together for
//!   a symmetric one (128).
//!
//! KL and KLv2 keep the observed range of a tensor with fewer values than bins (a pooled
//! vector seen on a few samples is no distribution to fit).

use super::params::{Schema, choose};

/// Counts of a tensor's values in `counts.len()` equal bins over `[min, max]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub min: f32,
    pub max: f32,
    pub counts: Vec<u64>,
}

/// A calibration method (qaic's `quantization_calibration`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    MinMax,
    Kl,
    KlV2,
    /// The percentile, in `[90, 100]`.
    Percentile(f64),
    Mse,
    Sqnr,
}

/// Levels of Glow's KL target distribution.
const KL_LEVELS: usize = 255;
/// Levels of TensorRT's entropy target distribution.
const ENTROPY_LEVELS: usize = 128;
/// Weight of clipped values in the SQNR cost (AIMET's gamma).
const SQNR_GAMMA: f64 = 3.0;

impl Histogram {
    /// An empty histogram of `bins` bins over `[min, max]` (a single point keeps its range:
    /// every value counts in bin 0, and the range stays degenerate for the schema rules).
    pub fn new(min: f32, max: f32, bins: usize) -> Histogram {
        let (min, max) = if min.is_finite() && max.is_finite() && min <= max {
            (min, max)
        } else {
            (0.0, 0.0)
        };
        Histogram {
            min,
            max,
            counts: vec![0; bins.max(1)],
        }
    }

    pub fn bins(&self) -> usize {
        self.counts.len()
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn width(&self) -> f64 {
        (f64::from(self.max) - f64::from(self.min)) / self.bins() as f64
    }

    /// The left edge of bin `i` (`i = bins` is the right end).
    pub fn edge(&self, i: usize) -> f64 {
        f64::from(self.min) + i as f64 * self.width()
    }

    fn center(&self, i: usize) -> f64 {
        self.edge(i) + self.width() / 2.0
    }

    /// Counts `xs`; values outside the range go to the end bins, NaN is skipped.
    pub fn add(&mut self, xs: &[f32]) {
        let n = self.bins();
        let span = f64::from(self.max) - f64::from(self.min);
        if span <= 0.0 {
            let c = xs.iter().filter(|x| !x.is_nan()).count() as u64;
            if let Some(b) = self.counts.first_mut() {
                *b += c;
            }
            return;
        }
        let inv = n as f64 / span;
        let min = f64::from(self.min);
        for &x in xs {
            if x.is_nan() {
                continue;
            }
            let b = ((f64::from(x) - min) * inv).floor();
            let b = if b <= 0.0 { 0 } else { (b as usize).min(n - 1) };
            if let Some(c) = self.counts.get_mut(b) {
                *c += 1;
            }
        }
    }

    /// The histogram of `|x|` over `[0, max(|min|, |max|)]` with as many bins, each source bin's
    /// count moved to the bin of its centre's magnitude.
    fn magnitudes(&self) -> Histogram {
        let amax = self.min.abs().max(self.max.abs());
        let mut h = Histogram::new(0.0, amax, self.bins());
        if amax <= 0.0 {
            if let Some(b) = h.counts.first_mut() {
                *b = self.total();
            }
            return h;
        }
        let n = h.bins();
        let inv = n as f64 / f64::from(h.max);
        for (i, &c) in self.counts.iter().enumerate() {
            let b = (self.center(i).abs() * inv).floor();
            let b = if b <= 0.0 { 0 } else { (b as usize).min(n - 1) };
            if let Some(t) = h.counts.get_mut(b) {
                *t += c;
            }
        }
        h
    }
}

/// The clipping range `method` picks from `h` for a tensor quantized under `schema`.
pub fn range(h: &Histogram, method: Method, schema: Schema) -> (f32, f32) {
    let full = (h.min, h.max);
    if h.total() == 0 || h.max <= h.min {
        return full;
    }
    let symmetric = !matches!(schema, Schema::Asymmetric) && h.min < 0.0;
    // Fewer values than bins are no distribution to fit: the methods that model one keep the
    // observed range.
    let method = if h.total() < h.bins() as u64 && matches!(method, Method::Kl | Method::KlV2) {
        Method::MinMax
    } else {
        method
    };
    let r = match method {
        Method::MinMax => full,
        Method::Kl => kl_window(h, symmetric),
        Method::KlV2 => entropy(h),
        Method::Percentile(p) => percentile(h, p),
        Method::Mse => mse(h, schema),
        Method::Sqnr => sqnr(h, schema),
    };
    // Never wider than observed, and never with 0 outside.
    (r.0.clamp(h.min, 0f32.max(h.min)), r.1.clamp(0f32.min(h.max), h.max))
}

/// `counts` normalised to sum 1, zeros smoothed with `eps` taken from the non-zero entries
/// (Glow's and TensorRT's smoothing).
fn smooth(counts: &[f64]) -> Vec<f64> {
    const EPS: f64 = 1e-4;
    let sum: f64 = counts.iter().sum();
    if sum <= 0.0 {
        return vec![0.0; counts.len()];
    }
    let zeros = counts.iter().filter(|&&c| c == 0.0).count();
    let nonzeros = counts.len() - zeros;
    let take = if nonzeros > 0 {
        EPS * zeros as f64 / nonzeros as f64
    } else {
        0.0
    };
    counts
        .iter()
        .map(|&c| {
            let p = c / sum;
            if c == 0.0 { EPS } else { (p - take).max(EPS * 1e-3) }
        })
        .collect()
}

fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    p.iter()
        .zip(q)
        .filter(|(p, _)| **p > 0.0)
        .map(|(p, q)| p * (p / q).ln())
        .sum()
}

/// KL(P || Q) of the bins `window` of `counts`, the mass outside folded into the end bins,
/// against the window merged into `levels` groups and spread over P's non-empty bins.
fn window_divergence(counts: &[u64], start: usize, end: usize, levels: usize) -> f64 {
    let w = end - start;
    let mut p: Vec<f64> = counts
        .get(start..end)
        .unwrap_or(&[])
        .iter()
        .map(|&c| c as f64)
        .collect();
    let below: u64 = counts.get(..start).unwrap_or(&[]).iter().sum();
    let above: u64 = counts.get(end..).unwrap_or(&[]).iter().sum();
    if let Some(f) = p.first_mut() {
        *f += below as f64;
    }
    if let Some(l) = p.last_mut() {
        *l += above as f64;
    }
    let mut q = vec![0.0; w];
    for g in 0..levels {
        let (a, b) = (g * w / levels, (g + 1) * w / levels);
        if a >= b {
            continue;
        }
        let src = counts.get(start + a..start + b).unwrap_or(&[]);
        let sum: f64 = src.iter().map(|&c| c as f64).sum();
        let nonzero = src.iter().filter(|&&c| c != 0).count();
        if nonzero == 0 {
            continue;
        }
        for (k, &c) in src.iter().enumerate() {
            if c != 0
                && let Some(t) = q.get_mut(a + k)
            {
                *t = sum / nonzero as f64;
            }
        }
    }
    kl_divergence(&smooth(&p), &smooth(&q))
}

/// Glow's `optimizeKL`.
fn kl_window(h: &Histogram, symmetric: bool) -> (f32, f32) {
    let n = h.bins();
    if n < KL_LEVELS {
        return (h.min, h.max);
    }
    let (mut start, mut end) = (0usize, n);
    let mut best = (f64::INFINITY, 0usize, n);
    while end - start >= KL_LEVELS {
        let d = window_divergence(&h.counts, start, end, KL_LEVELS);
        if d < best.0 {
            best = (d, start, end);
        }
        if symmetric {
            if end - start < KL_LEVELS + 2 {
                break;
            }
            start += 1;
            end -= 1;
        } else {
            // Drop the end whose tail (with the bin dropped) holds less mass; on a tie, the end
            // farther from zero.
            let low: u64 = h.counts.get(..=start).unwrap_or(&[]).iter().sum();
            let high: u64 = h.counts.get(end - 1..).unwrap_or(&[]).iter().sum();
            let zero = ((0.0 - f64::from(h.min)) / h.width()).floor().max(0.0) as usize;
            let farther_low = zero.saturating_sub(start) > end.saturating_sub(zero);
            if low < high || low == high && farther_low {
                start += 1;
            } else {
                end -= 1;
            }
        }
    }
    (h.edge(best.1) as f32, h.edge(best.2) as f32)
}

/// TensorRT's entropy calibration on the magnitudes.
fn entropy(h: &Histogram) -> (f32, f32) {
    let m = h.magnitudes();
    let n = m.bins();
    if n < ENTROPY_LEVELS {
        return (h.min, h.max);
    }
    let mut best = (f64::INFINITY, n);
    for i in ENTROPY_LEVELS..=n {
        let d = window_divergence(&m.counts, 0, i, ENTROPY_LEVELS);
        // The last argmin, as TensorRT takes it.
        if d <= best.0 {
            best = (d, i);
        }
    }
    let t = m.edge(best.1) as f32;
    (h.min.max(-t), h.max.min(t))
}

/// The value below which `fraction` of the histogram's mass lies (linear within a bin).
fn quantile(h: &Histogram, fraction: f64) -> f64 {
    let total = h.total() as f64;
    let target = fraction.clamp(0.0, 1.0) * total;
    let mut acc = 0.0;
    for (i, &c) in h.counts.iter().enumerate() {
        let c = c as f64;
        if acc + c >= target && c > 0.0 {
            return h.edge(i) + (target - acc) / c * h.width();
        }
        acc += c;
    }
    f64::from(h.max)
}

fn percentile(h: &Histogram, p: f64) -> (f32, f32) {
    let p = p.clamp(0.0, 100.0) / 100.0;
    if h.min >= 0.0 || h.max <= 0.0 {
        let m = h.magnitudes();
        let t = quantile(&m, p) as f32;
        return (h.min.max(-t), h.max.min(t));
    }
    let tail = (1.0 - p) / 2.0;
    (quantile(h, tail) as f32, quantile(h, 1.0 - tail) as f32)
}

/// Sum over the bins of count x squared error of the bin centre on the grid of `[lo, hi]`,
/// clipped values weighted by `clip_weight`.
fn grid_cost(h: &Histogram, lo: f64, hi: f64, schema: Schema, clip_weight: f64) -> f64 {
    let q = choose(lo, hi, schema);
    let (rlo, rhi) = q.representable();
    let (rlo, rhi) = (f64::from(rlo), f64::from(rhi));
    h.counts
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, &c)| {
            let x = h.center(i);
            let e = x - f64::from(q.fake(x as f32));
            let w = if x < rlo || x > rhi { clip_weight } else { 1.0 };
            c as f64 * w * e * e
        })
        .sum()
}

fn mse(h: &Histogram, schema: Schema) -> (f32, f32) {
    scaled_search(h, schema, 1.0)
}

/// Both ends scaled by one factor in 128 steps; the range of least [`grid_cost`].
fn scaled_search(h: &Histogram, schema: Schema, clip_weight: f64) -> (f32, f32) {
    const STEPS: usize = 128;
    let (lo, hi) = (f64::from(h.min), f64::from(h.max));
    let mut best = (f64::INFINITY, 1.0);
    for k in 1..=STEPS {
        let f = k as f64 / STEPS as f64;
        let c = grid_cost(h, lo * f, hi * f, schema, clip_weight);
        if c < best.0 {
            best = (c, f);
        }
    }
    ((lo * best.1) as f32, (hi * best.1) as f32)
}

fn sqnr(h: &Histogram, schema: Schema) -> (f32, f32) {
    const STEPS: usize = 32;
    let (lo, hi) = (f64::from(h.min), f64::from(h.max));
    if !matches!(schema, Schema::Asymmetric) && lo < 0.0 {
        // A symmetric grid has one degree of freedom: scale both ends together.
        return scaled_search(h, schema, SQNR_GAMMA);
    }
    let lo_steps = if lo < 0.0 { STEPS } else { 1 };
    let hi_steps = if hi > 0.0 { STEPS } else { 1 };
    let mut best = (f64::INFINITY, 1.0, 1.0);
    for a in 1..=lo_steps {
        let fa = if lo_steps == 1 { 1.0 } else { a as f64 / STEPS as f64 };
        for b in 1..=hi_steps {
            let fb = if hi_steps == 1 { 1.0 } else { b as f64 / STEPS as f64 };
            let c = grid_cost(h, lo * fa, hi * fb, schema, SQNR_GAMMA);
            if c < best.0 {
                best = (c, fa, fb);
            }
        }
    }
    ((lo * best.1) as f32, (hi * best.2) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A histogram of a Laplace-like sample with rare large outliers.
    fn heavy_tailed(bins: usize) -> Histogram {
        let mut xs = Vec::new();
        let mut s = 1u64;
        for _ in 0..20_000 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 11) as f64 / (1u64 << 53) as f64).clamp(1e-9, 1.0 - 1e-9);
            let v = if u < 0.5 {
                (2.0 * u).ln()
            } else {
                -(2.0 * (1.0 - u)).ln()
            };
            xs.push(v as f32);
        }
        let mut h = Histogram::new(-38.0, 40.0, bins);
        h.add(&xs);
        // The bulk weighs 100 times these samples; one outlier at each end.
        for c in &mut h.counts {
            *c *= 100;
        }
        h.add(&[40.0, -38.0]);
        h
    }

    #[test]
    fn histogram_counts_every_value_once() {
        let mut h = Histogram::new(-1.0, 1.0, 4);
        h.add(&[-1.0, -0.6, -0.1, 0.0, 0.4, 0.99, 1.0, 7.0, f32::NAN]);
        assert_eq!(h.counts, vec![2, 1, 2, 3]);
        assert_eq!(h.total(), 8);
        // A constant tensor keeps its single-point range (a ReLU that never fired: the
        // schema rules then give their degenerate scale, not one of 1e-7 / 255).
        let mut z = Histogram::new(0.0, 0.0, 8);
        z.add(&[0.0, 0.0, 0.0]);
        assert_eq!((z.min, z.max, z.counts[0], z.total()), (0.0, 0.0, 3, 3));
        for m in [
            Method::MinMax,
            Method::Kl,
            Method::KlV2,
            Method::Percentile(99.0),
            Method::Mse,
            Method::Sqnr,
        ] {
            assert_eq!(range(&z, m, Schema::SymmetricWithUint8), (0.0, 0.0), "{m:?}");
        }
    }

    #[test]
    fn minmax_keeps_the_range() {
        let h = heavy_tailed(512);
        assert_eq!(range(&h, Method::MinMax, Schema::Symmetric), (-38.0, 40.0));
    }

    #[test]
    fn every_other_method_clips_the_outliers() {
        let h = heavy_tailed(512);
        for m in [
            Method::Kl,
            Method::KlV2,
            Method::Percentile(99.9),
            Method::Mse,
            Method::Sqnr,
        ] {
            for s in [Schema::Symmetric, Schema::Asymmetric] {
                let (lo, hi) = range(&h, m, s);
                assert!(lo < -3.0 && hi > 3.0, "{m:?} {s:?}: ({lo}, {hi}) clips the bulk");
                assert!(hi < 30.0 && lo > -30.0, "{m:?} {s:?}: ({lo}, {hi}) kept the outliers");
            }
        }
    }

    #[test]
    fn percentile_of_a_uniform_one_signed_tensor() {
        let xs: Vec<f32> = (0..10_000).map(|i| i as f32 / 1000.0).collect();
        let mut h = Histogram::new(0.0, 10.0, 1000);
        h.add(&xs);
        let (lo, hi) = range(&h, Method::Percentile(99.0), Schema::SymmetricWithUint8);
        assert_eq!(lo, 0.0);
        assert!((hi - 9.9).abs() < 0.02, "{hi}");
        let (_, hi) = range(&h, Method::Percentile(100.0), Schema::SymmetricWithUint8);
        assert!((hi - 10.0).abs() < 0.02, "{hi}");
    }

    #[test]
    fn mse_picks_a_lower_error_than_minmax() {
        let h = heavy_tailed(512);
        let (lo, hi) = range(&h, Method::Mse, Schema::Symmetric);
        let chosen = grid_cost(&h, f64::from(lo), f64::from(hi), Schema::Symmetric, 1.0);
        let full = grid_cost(&h, -38.0, 40.0, Schema::Symmetric, 1.0);
        assert!(chosen < full / 2.0, "{chosen} vs {full}");
    }

    #[test]
    fn a_range_stays_inside_the_observed_one() {
        let mut h = Histogram::new(2.0, 3.0, 300);
        h.add(&[2.0, 2.5, 3.0]);
        for m in [
            Method::MinMax,
            Method::Kl,
            Method::KlV2,
            Method::Percentile(95.0),
            Method::Mse,
            Method::Sqnr,
        ] {
            let (lo, hi) = range(&h, m, Schema::Asymmetric);
            assert!(lo <= hi && lo >= 2.0 && hi <= 3.0, "{m:?}: ({lo}, {hi})");
        }
        let empty = Histogram::new(-1.0, 1.0, 8);
        assert_eq!(range(&empty, Method::Kl, Schema::Symmetric), (-1.0, 1.0));
    }
}
