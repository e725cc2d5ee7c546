//! The report of profiled runs: every step's summary sorted by time, and the table
//! `kiln profile` prints. The Chrome-trace export of the same report is `trace.rs`.

use kiln_runtime::{Profile, StepSummary, ValueShape};
use std::fmt::Write as _;
use std::time::Duration;

/// The timings of profiled runs, with each step's summary sorted by time.
#[derive(Debug, Clone)]
pub struct ProfileReport {
    pub profile: Profile,
    /// One entry per step, longest total time first.
    pub steps: Vec<StepSummary>,
    /// Time to open the session (the trace's `session_initialization`).
    pub load: Duration,
}

/// The arithmetic a step computes in, for `kiln profile`'s precision column: `int8` for the
/// integer products (MatMulInteger, ConvInteger, QLinearConv, QLinearMatMul), `q/dq` for the
/// conversions into and out of 8 bits, else the element type of its first output (`f32`,
/// `f16`, `i64`, ...).
pub fn precision(s: &StepSummary) -> String {
    match s.op {
        "MatMulInteger" | "ConvInteger" | "QLinearConv" | "QLinearMatMul" => "int8".into(),
        "QuantizeLinear" | "DequantizeLinear" | "DynamicQuantizeLinear" => "q/dq".into(),
        _ => match s.outputs.first() {
            Some(ValueShape::Tensor { dtype, .. }) => dtype.to_string(),
            Some(ValueShape::Sequence { dtype: Some(d), .. }) => format!("seq<{d}>"),
            _ => "-".into(),
        },
    }
}

impl ProfileReport {
    pub fn new(profile: Profile, load: Duration) -> ProfileReport {
        let steps = profile.summarize();
        ProfileReport { profile, steps, load }
    }

    pub fn runs(&self) -> usize {
        self.profile.runs.len()
    }

    /// Sum of all step times over all runs.
    pub fn step_total(&self) -> Duration {
        self.steps.iter().map(|s| s.total).sum()
    }

    /// The table `kiln profile` prints: the `top` slowest steps (all when `None`) with mean
    /// time per run, share of all step time, cumulative share, GFLOP/s, op, name and shapes;
    /// then the same by op type.
    pub fn table(&self, top: Option<usize>) -> String {
        let runs = self.runs().max(1) as f64;
        let total = self.step_total().as_secs_f64();
        let share = |d: Duration| {
            if total > 0.0 {
                100.0 * d.as_secs_f64() / total
            } else {
                0.0
            }
        };
        let gflops = |g: Option<f64>| g.map_or_else(|| "-".to_string(), |g| format!("{g:.2}"));
        let mut out = String::new();
        let shown = top.unwrap_or(self.steps.len()).min(self.steps.len());
        let name_width = self
            .steps
            .iter()
            .take(shown)
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, 64);
        let op_width = self.steps.iter().map(|s| s.op.len()).max().unwrap_or(0).max(2);
        let _ = writeln!(
            out,
            "{:>4}  {:>11}  {:>6}  {:>6}  {:>8}  {:<op_width$}  {:<5}  {:<name_width$}  shapes (inputs -> outputs)",
            "#", "ms/run", "share", "cum", "GFLOP/s", "op", "prec", "node"
        );
        let mut cum = 0.0;
        for (rank, s) in self.steps.iter().take(shown).enumerate() {
            let sh = share(s.total);
            cum += sh;
            let ins: Vec<String> = s.inputs.iter().map(ValueShape::to_string).collect();
            let outs: Vec<String> = s.outputs.iter().map(ValueShape::to_string).collect();
            let _ = writeln!(
                out,
                "{:>4}  {:>11.4}  {:>5.1}%  {:>5.1}%  {:>8}  {:<op_width$}  {:<5}  {:<name_width$}  {} -> {}",
                rank + 1,
                s.total.as_secs_f64() * 1e3 / runs,
                sh,
                cum,
                gflops(s.gflops()),
                s.op,
                precision(s),
                s.name,
                ins.join(" "),
                outs.join(" ")
            );
        }
        if shown < self.steps.len() {
            let _ = writeln!(out, "      ... {} more steps", self.steps.len() - shown);
        }
        // By op type.
        let mut ops: Vec<(&'static str, usize, Duration, u64)> = Vec::new();
        for s in &self.steps {
            let flops_calls = s.macs.saturating_mul(s.calls as u64);
            match ops.iter_mut().find(|o| o.0 == s.op) {
                Some(o) => {
                    o.1 += 1;
                    o.2 += s.total;
                    o.3 = o.3.saturating_add(flops_calls);
                }
                None => ops.push((s.op, 1, s.total, flops_calls)),
            }
        }
        ops.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
        let _ = writeln!(
            out,
            "\n{:<op_width$}  {:>5}  {:>11}  {:>6}  {:>8}",
            "op", "nodes", "ms/run", "share", "GFLOP/s"
        );
        for (op, n, t, macs) in &ops {
            let secs = t.as_secs_f64();
            let g = (*macs > 0 && secs > 0.0).then(|| 2.0 * *macs as f64 / secs / 1e9);
            let _ = writeln!(
                out,
                "{:<op_width$}  {:>5}  {:>11.4}  {:>5.1}%  {:>8}",
                op,
                n,
                secs * 1e3 / runs,
                share(*t),
                gflops(g)
            );
        }
        // By precision: how much of the run is integer, conversion or float.
        let mut precs: Vec<(String, usize, Duration)> = Vec::new();
        for s in &self.steps {
            let p = precision(s);
            match precs.iter_mut().find(|o| o.0 == p) {
                Some(o) => {
                    o.1 += 1;
                    o.2 += s.total;
                }
                None => precs.push((p, 1, s.total)),
            }
        }
        precs.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        let _ = writeln!(
            out,
            "\n{:<9}  {:>5}  {:>11}  {:>6}",
            "precision", "nodes", "ms/run", "share"
        );
        for (p, n, t) in &precs {
            let _ = writeln!(
                out,
                "{:<9}  {:>5}  {:>11.4}  {:>5.1}%",
                p,
                n,
                t.as_secs_f64() * 1e3 / runs,
                share(*t)
            );
        }
        // The compiler's NCHW <-> NHWC transposes (a model's own Transposes are not counted).
        let layout: Vec<&StepSummary> = self
            .steps
            .iter()
            .filter(|s| s.op == "Transpose" && kiln_compiler::is_layout_transpose(&s.name))
            .collect();
        let layout_time: Duration = layout.iter().map(|s| s.total).sum();
        let _ = writeln!(
            out,
            "\nlayout transposes (NCHW <-> NHWC, inserted by the compiler): {} steps, {:.4} ms/run, {:.1}% of step time",
            layout.len(),
            layout_time.as_secs_f64() * 1e3 / runs,
            share(layout_time)
        );
        let run_total: Duration = self.profile.runs.iter().map(|r| r.duration).sum();
        let _ = writeln!(
            out,
            "\n{} runs; steps {:.4} ms/run, whole run {:.4} ms/run (steps plus input checks and freeing); \
             control-flow steps include their sub-programs",
            self.runs(),
            total * 1e3 / runs,
            run_total.as_secs_f64() * 1e3 / runs
        );
        out
    }
}
