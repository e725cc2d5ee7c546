//! The Program: steps over numbered slots, constants, the I/O signature, sub-programs.

use kiln_ops::{Op, Value, ValueType};

/// One graph input or output: its name, slot and declared type.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct IoSpec {
    pub name: String,
    pub slot: usize,
    pub ty: ValueType,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Program {
    pub name: String,
    /// Name of each slot (for errors, intermediate outputs and profiles).
    pub slot_names: Vec<String>,
    pub inputs: Vec<IoSpec>,
    pub outputs: Vec<IoSpec>,
    /// In a program file, tensor constants live in the weights section (see `file`).
    #[serde(
        serialize_with = "crate::file::serialize_constants",
        deserialize_with = "crate::file::deserialize_constants"
    )]
    pub constants: Vec<(usize, Value)>,
    /// For a sub-program: `(outer slot, inner slot)` pairs copied in from the enclosing
    /// program's state when it starts.
    pub captures: Vec<(usize, usize)>,
    pub steps: Vec<Step>,
    /// The memory plan of a main program (empty for sub-programs and unplanned programs).
    pub arena: ArenaPlan,
}

/// Where a program's planned tensors live in the run arena: its size and, per slot, the byte
/// offset and size of the slot's tensor. A step whose op asks for an output buffer of exactly
/// the planned size gets that range ([`kiln_kernels::recycle::take_planned`]); the slab's claim
/// check keeps ranges from aliasing whatever the plan says, so a wrong or hostile plan only
/// costs fallbacks to ordinary vectors.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ArenaPlan {
    pub bytes: u64,
    pub places: Vec<Option<(u64, u64)>>,
    /// Bytes of the op outputs outside the arena (the graph's outputs) when every value of
    /// the program has a static size and it has no control flow, so a run never holds more
    /// than `bytes + outside`; `None` when some size is only known at run time.
    pub outside: Option<u64>,
}

impl ArenaPlan {
    /// The planned `(offset, bytes)` of `slot`'s tensor, when it fits the address space.
    pub fn place(&self, slot: usize) -> Option<(usize, usize)> {
        let (o, b) = (*self.places.get(slot)?)?;
        Some((usize::try_from(o).ok()?, usize::try_from(b).ok()?))
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Step {
    pub name: String,
    pub kind: StepKind,
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<Option<usize>>,
    /// Slots whose last reader is this step: freed right after it runs.
    pub frees: Vec<usize>,
    /// The compiler's plan for an op step (`kiln_ops::fast::Plan`); `None` runs it as imported.
    pub plan: Option<kiln_ops::fast::Plan>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum StepKind {
    Op(Op),
    If {
        #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
        then_branch: Box<Program>,
        #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
        else_branch: Box<Program>,
    },
    Loop(LoopStep),
    Scan(ScanStep),
    SequenceMap {
        #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
        body: Box<Program>,
    },
    /// FlexAttention whose score/probability modifiers are sub-programs.
    FlexAttention {
        op: kiln_ops::recurrent::FlexAttention,
        #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
        score_mod: Option<Box<Program>>,
        #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
        prob_mod: Option<Box<Program>>,
    },
}

impl StepKind {
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Op(op) => op.name(),
            StepKind::If { .. } => "If",
            StepKind::Loop(_) => "Loop",
            StepKind::Scan(_) => "Scan",
            StepKind::SequenceMap { .. } => "SequenceMap",
            StepKind::FlexAttention { .. } => "FlexAttention",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LoopStep {
    #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
    pub body: Box<Program>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ScanStep {
    #[serde(deserialize_with = "kiln_ops::serde_depth::nested")]
    pub body: Box<Program>,
    /// Scan-8 form: input 0 is `sequence_lens` and every value has a leading batch axis.
    pub batched: bool,
    pub num_scan_inputs: usize,
    pub input_reverse: Vec<bool>,
    pub input_axes: Vec<i64>,
    pub output_reverse: Vec<bool>,
    pub output_axes: Vec<i64>,
}

impl Program {
    pub fn num_slots(&self) -> usize {
        self.slot_names.len()
    }

    /// Fills every step's `frees` list from slot liveness: a slot is freed after the last
    /// step reading it (or, when nothing reads it, after the step producing it), unless it is
    /// a program output or a constant.
    pub fn compute_frees(&mut self) {
        let n = self.num_slots();
        let mut last: Vec<Option<usize>> = vec![None; n];
        for (i, step) in self.steps.iter().enumerate() {
            // A value no step reads dies where it is produced (reads below move this on).
            for s in step.outputs.iter().flatten() {
                if let Some(l) = last.get_mut(*s) {
                    *l = Some(i);
                }
            }
            for s in step.inputs.iter().flatten() {
                if let Some(l) = last.get_mut(*s) {
                    *l = Some(i);
                }
            }
            for s in step.captured_slots() {
                if let Some(l) = last.get_mut(s) {
                    *l = Some(i);
                }
            }
        }
        let keep: Vec<usize> = self
            .outputs
            .iter()
            .map(|o| o.slot)
            .chain(self.constants.iter().map(|(s, _)| *s))
            .collect();
        for step in &mut self.steps {
            step.frees.clear();
        }
        for (slot, l) in last.iter().enumerate() {
            if let Some(i) = l
                && !keep.contains(&slot)
                && let Some(step) = self.steps.get_mut(*i)
            {
                step.frees.push(slot);
            }
        }
        for step in &mut self.steps {
            for p in step.subprograms_mut() {
                p.compute_frees();
            }
        }
    }
}

impl Program {
    /// Checks every op step's attributes (`Op::validate`, the importer's check) and its plan
    /// against its op (`kiln_ops::fast::validate`), in this program and its sub-programs: the
    /// first misfit, with its step's name. The decoder of a program file calls this.
    pub fn validate(&self) -> Result<(), (String, kiln_ops::OpError)> {
        for step in &self.steps {
            if let StepKind::Op(op) = &step.kind {
                let checked = op
                    .validate()
                    .and_then(|()| kiln_ops::fast::validate(op, step.plan.as_ref()));
                checked.map_err(|e| (step.name.clone(), e))?;
            } else if step.plan.is_some() {
                let e = kiln_ops::OpError::Plan {
                    op: step.kind.name(),
                    plan: step.plan.as_ref().map(|p| p.summary()).unwrap_or_default(),
                    reason: "control flow takes no op plan",
                };
                return Err((step.name.clone(), e));
            }
            for p in step.subprograms() {
                p.validate()?;
            }
        }
        Ok(())
    }
}

impl Step {
    pub fn subprograms(&self) -> Vec<&Program> {
        match &self.kind {
            StepKind::Op(_) => vec![],
            StepKind::If {
                then_branch,
                else_branch,
            } => vec![then_branch, else_branch],
            StepKind::Loop(l) => vec![&l.body],
            StepKind::Scan(s) => vec![&s.body],
            StepKind::SequenceMap { body } => vec![body],
            StepKind::FlexAttention {
                score_mod, prob_mod, ..
            } => score_mod.iter().chain(prob_mod.iter()).map(|p| &**p).collect(),
        }
    }
    fn subprograms_mut(&mut self) -> Vec<&mut Program> {
        match &mut self.kind {
            StepKind::Op(_) => vec![],
            StepKind::If {
                then_branch,
                else_branch,
            } => vec![then_branch, else_branch],
            StepKind::Loop(l) => vec![&mut l.body],
            StepKind::Scan(s) => vec![&mut s.body],
            StepKind::SequenceMap { body } => vec![body],
            StepKind::FlexAttention {
                score_mod, prob_mod, ..
            } => score_mod
                .iter_mut()
                .chain(prob_mod.iter_mut())
                .map(|p| &mut **p)
                .collect(),
        }
    }
    /// Outer slots read by this step's sub-programs.
    pub fn captured_slots(&self) -> Vec<usize> {
        self.subprograms()
            .iter()
            .flat_map(|p| p.captures.iter().map(|(o, _)| *o))
            .collect()
    }
}
