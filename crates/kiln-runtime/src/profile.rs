//! Per-step timings of program runs: what [`crate::run_with`] records, and its aggregation
//! into one line per step sorted by time.
//!
//! Only the steps of the top-level program are timed. A control-flow step (If, Loop, Scan,
//! SequenceMap, FlexAttention with modifier sub-programs) is one record whose time includes
//! every step of its sub-programs; they are not timed on their own.

use kiln_ops::{InferInput, Op, Value, ValueType};
use kiln_tensor::{DType, Tensor};
use std::fmt;
use std::time::{Duration, Instant};

/// Type and shape of one step input or output as it was at run time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValueShape {
    Tensor {
        dtype: DType,
        shape: Vec<usize>,
    },
    /// A sequence of `len` tensors of `dtype`.
    Sequence {
        dtype: Option<DType>,
        len: usize,
    },
    /// An empty optional.
    None,
    /// An optional input the step leaves out.
    Absent,
}

impl ValueShape {
    pub fn of(v: &Value) -> ValueShape {
        match v {
            Value::Tensor(t) => ValueShape::of_tensor(t),
            Value::Sequence(s) => ValueShape::Sequence {
                dtype: s.dtype,
                len: s.items.len(),
            },
            Value::Optional(Some(v), _) => ValueShape::of(v),
            Value::Optional(None, _) => ValueShape::None,
        }
    }

    pub fn of_tensor(t: &Tensor) -> ValueShape {
        ValueShape::Tensor {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
        }
    }

    /// Bytes of a tensor's elements in kiln's in-memory layout (0 for anything else).
    pub fn bytes(&self) -> u64 {
        match self {
            ValueShape::Tensor { dtype, shape } => shape
                .iter()
                .fold(dtype.size_of() as u64, |a, &d| a.saturating_mul(d as u64)),
            _ => 0,
        }
    }
}

impl fmt::Display for ValueShape {
    /// `f32[1,3,224,224]`, `seq<f32>(3)`, `none`, `-` (absent).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueShape::Tensor { dtype, shape } => {
                write!(f, "{dtype}[")?;
                for (i, d) in shape.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
                f.write_str("]")
            }
            ValueShape::Sequence { dtype, len } => match dtype {
                Some(d) => write!(f, "seq<{d}>({len})"),
                None => write!(f, "seq<?>({len})"),
            },
            ValueShape::None => f.write_str("none"),
            ValueShape::Absent => f.write_str("-"),
        }
    }
}

/// One timed execution of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Position of the step in the program.
    pub index: usize,
    /// The step's (node's) name.
    pub name: String,
    /// The op name (`StepKind::name`).
    pub op: &'static str,
    pub inputs: Vec<ValueShape>,
    pub outputs: Vec<ValueShape>,
    /// Bytes of the inputs held by the program (weights and other constants).
    pub param_bytes: u64,
    /// Bytes of the other inputs (activations).
    pub activation_bytes: u64,
    /// When the step started, from the profile's origin.
    pub start: Duration,
    pub duration: Duration,
    /// Multiply-accumulates of the step at these shapes (`Op::macs`); 0 when it does no
    /// MAC-like work or the count is unknown (control flow).
    pub macs: u64,
}

/// One timed run of a program: input checks, every step and output collection.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunRecord {
    /// When the run started, from the profile's origin.
    pub start: Duration,
    pub duration: Duration,
    /// The top-level steps in execution order.
    pub steps: Vec<StepRecord>,
}

/// Timings of any number of runs, measured against one origin so they share a time line.
#[derive(Debug, Clone)]
pub struct Profile {
    pub origin: Instant,
    pub runs: Vec<RunRecord>,
}

impl Default for Profile {
    fn default() -> Profile {
        Profile::new()
    }
}

impl Profile {
    /// An empty profile whose origin is now.
    pub fn new() -> Profile {
        Profile::with_origin(Instant::now())
    }

    /// An empty profile on the time line of another (so runs recorded apart can be merged).
    pub fn with_origin(origin: Instant) -> Profile {
        Profile {
            origin,
            runs: Vec::new(),
        }
    }

    /// Number of step records over all runs.
    pub fn num_records(&self) -> usize {
        self.runs.iter().map(|r| r.steps.len()).sum()
    }

    /// One line per step (by position in the program), sorted by total time, longest first.
    /// Shapes and MACs are those of the step's first recorded run.
    pub fn summarize(&self) -> Vec<StepSummary> {
        let mut by_index: Vec<Option<StepSummary>> = Vec::new();
        for rec in self.runs.iter().flat_map(|r| &r.steps) {
            if by_index.len() <= rec.index {
                by_index.resize(rec.index + 1, None);
            }
            let Some(entry) = by_index.get_mut(rec.index) else {
                continue;
            };
            match entry {
                Some(s) => {
                    s.calls += 1;
                    s.total += rec.duration;
                    s.min = s.min.min(rec.duration);
                    s.max = s.max.max(rec.duration);
                }
                None => {
                    *entry = Some(StepSummary {
                        index: rec.index,
                        name: rec.name.clone(),
                        op: rec.op,
                        inputs: rec.inputs.clone(),
                        outputs: rec.outputs.clone(),
                        calls: 1,
                        total: rec.duration,
                        min: rec.duration,
                        max: rec.duration,
                        macs: rec.macs,
                    })
                }
            }
        }
        let mut out: Vec<StepSummary> = by_index.into_iter().flatten().collect();
        out.sort_by(|a, b| b.total.cmp(&a.total).then(a.index.cmp(&b.index)));
        out
    }
}

/// A step's timings over all recorded runs.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSummary {
    pub index: usize,
    pub name: String,
    pub op: &'static str,
    pub inputs: Vec<ValueShape>,
    pub outputs: Vec<ValueShape>,
    /// How many times the step ran.
    pub calls: usize,
    pub total: Duration,
    pub min: Duration,
    pub max: Duration,
    pub macs: u64,
}

impl StepSummary {
    /// Mean time of one call.
    pub fn mean(&self) -> Duration {
        match u32::try_from(self.calls) {
            Ok(n) if n > 0 => self.total / n,
            _ => Duration::ZERO,
        }
    }

    /// Achieved GFLOP/s (2 FLOPs per MAC) over all calls; `None` when the MAC count is
    /// unknown or zero, or no time was measured.
    pub fn gflops(&self) -> Option<f64> {
        let secs = self.total.as_secs_f64();
        (self.macs > 0 && secs > 0.0).then(|| 2.0 * self.macs as f64 * self.calls as f64 / secs / 1e9)
    }
}

/// Records the steps of one run as it executes (used by the interpreter).
pub(crate) struct Recorder {
    pub(crate) origin: Instant,
    pub(crate) steps: Vec<StepRecord>,
}

/// Where a step input came from, for splitting parameter and activation bytes.
pub(crate) struct InputSeen {
    /// The input's type and shape (`Unknown` / `Absent` for an absent input), taken before the
    /// step ran (it may consume its input).
    pub(crate) ty: ValueType,
    pub(crate) shape: ValueShape,
    pub(crate) present: bool,
    pub(crate) constant: bool,
}

impl InputSeen {
    pub(crate) fn of(value: Option<&Value>, constant: bool) -> InputSeen {
        InputSeen {
            ty: value.map_or(ValueType::Unknown, Value::value_type),
            shape: value.map_or(ValueShape::Absent, ValueShape::of),
            present: value.is_some(),
            constant,
        }
    }
}

impl Recorder {
    pub(crate) fn record(
        &mut self,
        index: usize,
        step: &crate::program::Step,
        started: Instant,
        duration: Duration,
        inputs: &[InputSeen],
        outputs: &[Value],
    ) {
        let mut param_bytes = 0u64;
        let mut activation_bytes = 0u64;
        let in_shapes: Vec<ValueShape> = inputs
            .iter()
            .map(|i| {
                let shape = i.shape.clone();
                if i.constant {
                    param_bytes = param_bytes.saturating_add(shape.bytes());
                } else {
                    activation_bytes = activation_bytes.saturating_add(shape.bytes());
                }
                shape
            })
            .collect();
        let macs = match &step.kind {
            crate::program::StepKind::Op(op) => macs_of(op, step.plan.as_ref(), inputs, outputs),
            _ => 0,
        };
        self.steps.push(StepRecord {
            index,
            name: step.name.clone(),
            op: step.kind.name(),
            inputs: in_shapes,
            // Only the outputs the node uses (an op may compute optional ones it does not).
            outputs: outputs
                .iter()
                .zip(&step.outputs)
                .filter(|(_, slot)| slot.is_some())
                .map(|(v, _)| ValueShape::of(v))
                .collect(),
            param_bytes,
            activation_bytes,
            start: started.saturating_duration_since(self.origin),
            duration,
            macs,
        });
    }
}

fn macs_of(op: &Op, plan: Option<&kiln_ops::fast::Plan>, inputs: &[InputSeen], outputs: &[Value]) -> u64 {
    let infer: Vec<InferInput<'_>> = inputs
        .iter()
        .map(|i| InferInput {
            ty: &i.ty,
            konst: None,
            present: i.present,
        })
        .collect();
    let out_types: Vec<ValueType> = outputs.iter().map(Value::value_type).collect();
    kiln_ops::fast::macs(op, plan, &infer, &out_types)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(index: usize, name: &str, micros: u64, macs: u64) -> StepRecord {
        StepRecord {
            index,
            name: name.into(),
            op: "Conv",
            inputs: vec![ValueShape::Tensor {
                dtype: DType::F32,
                shape: vec![1, 3, 8, 8],
            }],
            outputs: vec![],
            param_bytes: 0,
            activation_bytes: 0,
            start: Duration::ZERO,
            duration: Duration::from_micros(micros),
            macs,
        }
    }

    #[test]
    fn summary_sums_calls_and_sorts_by_total_time() {
        let mut p = Profile::new();
        p.runs.push(RunRecord {
            steps: vec![rec(0, "a", 10, 0), rec(1, "b", 30, 1000), rec(2, "c", 5, 0)],
            ..RunRecord::default()
        });
        p.runs.push(RunRecord {
            steps: vec![rec(0, "a", 50, 0), rec(1, "b", 10, 1000), rec(2, "c", 5, 0)],
            ..RunRecord::default()
        });
        let s = p.summarize();
        let names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(s[0].calls, 2);
        assert_eq!(s[0].total, Duration::from_micros(60));
        assert_eq!(s[0].mean(), Duration::from_micros(30));
        assert_eq!(s[0].min, Duration::from_micros(10));
        assert_eq!(s[0].max, Duration::from_micros(50));
        assert_eq!(s[0].gflops(), None);
        // b: 2 calls x 1000 MACs x 2 FLOPs in 40 us = 0.1 GFLOP/s.
        let g = s[1].gflops().unwrap_or(0.0);
        assert!((g - 0.1).abs() < 1e-12, "{g}");
        assert_eq!(p.num_records(), 6);
    }

    #[test]
    fn equal_times_keep_program_order() {
        let mut p = Profile::new();
        p.runs.push(RunRecord {
            steps: vec![rec(3, "d", 7, 0), rec(1, "b", 7, 0)],
            ..RunRecord::default()
        });
        let names: Vec<String> = p.summarize().into_iter().map(|x| x.name).collect();
        assert_eq!(names, ["b", "d"]);
    }

    #[test]
    fn shapes_print_compactly_and_count_bytes() {
        let s = ValueShape::Tensor {
            dtype: DType::F32,
            shape: vec![1, 3, 224, 224],
        };
        assert_eq!(s.to_string(), "f32[1,3,224,224]");
        assert_eq!(s.bytes(), 4 * 3 * 224 * 224);
        let scalar = ValueShape::Tensor {
            dtype: DType::I64,
            shape: vec![],
        };
        assert_eq!(scalar.to_string(), "i64[]");
        assert_eq!(scalar.bytes(), 8);
        assert_eq!(ValueShape::Absent.to_string(), "-");
        assert_eq!(
            ValueShape::Sequence {
                dtype: Some(DType::F32),
                len: 3
            }
            .to_string(),
            "seq<f32>(3)"
        );
    }
}
