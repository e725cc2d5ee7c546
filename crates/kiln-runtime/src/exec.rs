//! The step interpreter: input checking, slot management, op evaluation and control flow.

use crate::error::RuntimeError;
use crate::profile::{InputSeen, Profile, Recorder, RunRecord};
use crate::program::{IoSpec, LoopStep, Program, ScanStep, Step, StepKind};
use crate::stack::{stack, take_along};
use kiln_ops::{Args, Dim, OpError, Outputs, Sequence, Value, ValueType, util::norm_axis};
use kiln_tensor::{Data, Tensor};
use std::cell::Cell;
use std::time::Instant;

type Result<T> = std::result::Result<T, RuntimeError>;

/// A slot's content during a run: nothing, a value computed in this run, or a value owned by
/// the program or an enclosing run (constants, captures), borrowed without copying.
enum Slot<'a> {
    Empty,
    Owned(Value),
    Shared(&'a Value),
}

impl Slot<'_> {
    fn get(&self) -> Option<&Value> {
        match self {
            Slot::Empty => None,
            Slot::Owned(v) => Some(v),
            Slot::Shared(v) => Some(v),
        }
    }
    fn take(&mut self) -> Option<Value> {
        match std::mem::replace(self, Slot::Empty) {
            Slot::Empty => None,
            Slot::Owned(v) => Some(v),
            Slot::Shared(v) => Some(v.clone()),
        }
    }
}

/// A run's slots. The vector comes from the calling thread's spares (those of finished runs)
/// and goes back to them, emptied, when the run ends, so a run in steady state allocates no
/// slot table.
struct Env<'a>(Vec<Slot<'a>>);

thread_local! {
    /// Emptied slot vectors of finished runs (their capacity is what is kept).
    static SPARE_ENVS: std::cell::RefCell<Vec<Vec<Slot<'static>>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most spare slot vectors a thread keeps (one per nesting level of control flow in use).
const SPARE_ENVS_MAX: usize = 8;

impl<'a> Env<'a> {
    fn new(slots: usize) -> Env<'a> {
        let spare = SPARE_ENVS.with(|s| s.borrow_mut().pop()).unwrap_or_default();
        // The spare is empty; collecting it with the identity map only relabels the slots'
        // lifetime, and `collect` keeps the allocation (in-place iteration: same layout).
        let mut env: Vec<Slot<'a>> = spare.into_iter().collect();
        env.resize_with(slots, || Slot::Empty);
        Env(env)
    }
}

impl Drop for Env<'_> {
    fn drop(&mut self) {
        let mut env = std::mem::take(&mut self.0);
        env.clear();
        let env: Vec<Slot<'static>> = env.into_iter().map(|_| Slot::Empty).collect();
        if env.capacity() > 0 {
            SPARE_ENVS.with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARE_ENVS_MAX {
                    s.push(env);
                }
            });
        }
    }
}

/// Bounds on one run's resources (see [`run_limited`]). The run's time limit and its
/// cancellation are the calling thread's current `kiln_kernels::stop::Stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Most bytes the run's tensors may hold at once: the planned arena plus the values
    /// outside it, inputs included while the run holds them (constants and mapped weights not
    /// counted). `None`: no bound.
    pub memory_bytes: Option<u64>,
    /// Most iterations of one execution of a Loop node. `None`: no bound.
    pub loop_iterations: Option<u64>,
}

impl Limits {
    /// No bound at all.
    pub const NONE: Limits = Limits {
        memory_bytes: None,
        loop_iterations: None,
    };
}

/// Runs a program on named inputs; returns its outputs in signature order.
pub fn run(program: &Program, inputs: Vec<(String, Value)>) -> Result<Vec<(String, Value)>> {
    run_with(program, inputs, None)
}

/// [`run`], and with a profile, appends one [`RunRecord`] timing the run and each top-level
/// step (control-flow sub-programs count toward their enclosing step). Without one, the
/// interpreter does no timing at all.
pub fn run_with(
    program: &Program,
    inputs: Vec<(String, Value)>,
    profile: Option<&mut Profile>,
) -> Result<Vec<(String, Value)>> {
    run_limited(program, inputs, profile, &Limits::NONE)
}

/// [`run_with`] within `limits`, answering to the calling thread's current stop (time limit
/// and cancellation: `kiln_kernels::stop`), which is checked before the first step, after
/// every step and, inside long kernels, between work chunks. A run that crosses a bound or is
/// stopped ends with an error naming the bound, the node and the figure; nothing it computed
/// is returned, and the program and its run states stay usable.
pub fn run_limited(
    program: &Program,
    inputs: Vec<(String, Value)>,
    profile: Option<&mut Profile>,
    limits: &Limits,
) -> Result<Vec<(String, Value)>> {
    let ctl = Ctl::new(limits);
    let Some(profile) = profile else {
        return run_inner(program, inputs, None, &ctl);
    };
    let started = Instant::now();
    let mut rec = Recorder {
        origin: profile.origin,
        steps: Vec::with_capacity(program.steps.len()),
    };
    let outputs = run_inner(program, inputs, Some(&mut rec), &ctl)?;
    profile.runs.push(RunRecord {
        start: started.saturating_duration_since(profile.origin),
        duration: started.elapsed(),
        steps: rec.steps,
    });
    Ok(outputs)
}

/// What a run answers to besides its inputs: its limits and the memory it holds.
struct Ctl<'l> {
    limits: &'l Limits,
    /// Bytes held by the run's tensors outside the arena (see `Limits::memory_bytes`).
    live: Cell<u64>,
    /// Bytes of the planned arena (counted once, from the start).
    arena: Cell<u64>,
    /// The program's whole peak fits the limit (checked at the start): nothing to count.
    static_peak: Cell<bool>,
}

impl<'l> Ctl<'l> {
    fn new(limits: &'l Limits) -> Ctl<'l> {
        Ctl {
            limits,
            live: Cell::new(0),
            arena: Cell::new(0),
            static_peak: Cell::new(false),
        }
    }

    /// The error for a stop seen at `step` (`None`: before the first step), when there is one.
    fn stopped(&self, step: Option<&Step>) -> Result<()> {
        if !kiln_kernels::stop::requested() {
            return Ok(());
        }
        let Some((reason, limit, elapsed)) = kiln_kernels::stop::current_state() else {
            return Ok(());
        };
        let (node, op) = step.map_or_else(
            || ("(before the first node)".to_string(), "-".to_string()),
            |s| (s.name.clone(), s.kind.name().to_string()),
        );
        let elapsed_ms = elapsed.as_secs_f64() * 1e3;
        Err(match reason {
            kiln_kernels::stop::StopReason::Cancelled => RuntimeError::Cancelled { node, op, elapsed_ms },
            kiln_kernels::stop::StopReason::TimeLimit => RuntimeError::TimeLimit {
                node,
                op,
                limit_ms: limit.map_or(0.0, |l| l.as_secs_f64() * 1e3),
                elapsed_ms,
            },
        })
    }

    /// Checks that `more` bytes fit beside those held now (a step's outputs, before it runs).
    fn fits(&self, step: &Step, more: u64) -> Result<()> {
        let Some(limit) = self.limits.memory_bytes else {
            return Ok(());
        };
        let held = self.live.get().saturating_add(self.arena.get());
        if held.saturating_add(more) > limit {
            return Err(RuntimeError::MemoryLimit {
                node: step.name.clone(),
                op: step.kind.name().to_string(),
                limit_bytes: limit,
                needed_bytes: more,
                held_bytes: held,
            });
        }
        Ok(())
    }

    /// Whether `outputs` tensors of the largest size an op may produce (`MAX_ELEMENTS` of 8
    /// bytes each) fit beside what is held: then no output needs sizing before it is made.
    fn surely_fits(&self, outputs: usize) -> bool {
        let Some(limit) = self.limits.memory_bytes else {
            return true;
        };
        let largest = (kiln_tensor::MAX_ELEMENTS as u64).saturating_mul(8);
        let held = self.live.get().saturating_add(self.arena.get());
        held.saturating_add(largest.saturating_mul(outputs as u64)) <= limit
    }

    fn counting(&self) -> bool {
        self.limits.memory_bytes.is_some() && !self.static_peak.get()
    }

    fn hold(&self, v: &Value) {
        if self.counting() {
            self.live.set(self.live.get().saturating_add(dynamic_bytes(v)));
        }
    }

    fn release(&self, v: &Value) {
        if self.counting() {
            self.release_bytes(dynamic_bytes(v));
        }
    }

    fn release_bytes(&self, bytes: u64) {
        self.live.set(self.live.get().saturating_sub(bytes));
    }
}

/// Bytes a value holds outside the arena and outside shared storage (a mapped file or a
/// constant): what a step allocated for it.
fn dynamic_bytes(v: &Value) -> u64 {
    match v {
        Value::Tensor(t) => tensor_bytes(t),
        Value::Sequence(s) => s.items.iter().map(tensor_bytes).fold(0, u64::saturating_add),
        Value::Optional(Some(v), _) => dynamic_bytes(v),
        Value::Optional(None, _) => 0,
    }
}

/// [`dynamic_bytes`] of a tensor.
fn tensor_bytes(t: &Tensor) -> u64 {
    if t.data().is_region() {
        0
    } else {
        (t.len() as u64).saturating_mul(t.dtype().size_of().max(1) as u64)
    }
}

/// Bytes of a step's outputs as the op's inference gives them for these inputs (outputs of
/// unknown size count 0: they are counted once computed).
fn expected_bytes(op: &kiln_ops::Op, args: &[Option<&Value>]) -> u64 {
    let types: smallvec::SmallVec<[ValueType; INLINE_ARGS]> = args
        .iter()
        .map(|a| a.map_or(ValueType::Unknown, Value::value_type))
        .collect();
    let ins: smallvec::SmallVec<[kiln_ops::InferInput<'_>; INLINE_ARGS]> = args
        .iter()
        .zip(&types)
        .map(|(a, ty)| kiln_ops::InferInput {
            ty,
            konst: *a,
            present: a.is_some(),
        })
        .collect();
    let Ok(outs) = op.infer(&ins) else { return 0 };
    outs.iter()
        .filter_map(|t| {
            let tt = t.tensor()?;
            let dtype = tt.dtype?;
            let mut n: u64 = 1;
            for d in tt.shape.as_ref()? {
                match d {
                    Dim::Fixed(k) => n = n.saturating_mul(*k as u64),
                    Dim::Sym(_) => return None,
                }
            }
            Some(n.saturating_mul(dtype.size_of().max(1) as u64))
        })
        .fold(0, u64::saturating_add)
}

fn run_inner(
    program: &Program,
    inputs: Vec<(String, Value)>,
    rec: Option<&mut Recorder>,
    ctl: &Ctl<'_>,
) -> Result<Vec<(String, Value)>> {
    let mut bound: smallvec::SmallVec<[Option<Value>; 4]> = smallvec::smallvec![None; program.inputs.len()];
    for (name, value) in inputs {
        let Some(pos) = program.inputs.iter().position(|s| s.name == name) else {
            let known: Vec<&str> = program.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(RuntimeError::UnknownInput {
                name,
                known: known.join(", "),
            });
        };
        bound[pos] = Some(value);
    }
    let mut symbols: Vec<(String, usize)> = Vec::new();
    let mut formal: smallvec::SmallVec<[Value; 4]> = smallvec::SmallVec::with_capacity(bound.len());
    for (spec, v) in program.inputs.iter().zip(bound) {
        let v = v.ok_or_else(|| RuntimeError::MissingInput {
            name: spec.name.clone(),
            expected: spec.ty.to_string(),
        })?;
        let v = check_input(spec, v, &mut symbols)?;
        formal.push(v);
    }
    // The plan's block is checked against the memory limit before it is allocated (a
    // program file may ask for any size).
    if let Some(limit) = ctl.limits.memory_bytes
        && program.arena.bytes > limit
    {
        return Err(RuntimeError::MemoryLimit {
            node: "(the memory plan)".into(),
            op: "-".into(),
            limit_bytes: limit,
            needed_bytes: program.arena.bytes,
            held_bytes: 0,
        });
    }
    // The planned tensors take their ranges of the run state's arena (one block per arena,
    // allocated by the first run).
    let planned =
        program.arena.bytes > 0 && usize::try_from(program.arena.bytes).is_ok_and(kiln_kernels::recycle::use_slab);
    if planned {
        ctl.arena.set(program.arena.bytes);
    }
    // A fully static program's peak is known: checked once, then no step needs counting.
    if let (Some(limit), Some(outside)) = (ctl.limits.memory_bytes, program.arena.outside) {
        let peak = program.arena.bytes.saturating_add(outside);
        if peak > limit {
            return Err(RuntimeError::MemoryLimit {
                node: "(the memory plan and the outputs)".into(),
                op: "-".into(),
                limit_bytes: limit,
                needed_bytes: peak,
                held_bytes: 0,
            });
        }
        ctl.static_peak.set(true);
    }
    ctl.stopped(None)?;
    let outputs = run_program(program, &[], formal, rec, planned, ctl);
    // The run's buffers stay with its arena for the next run; the rest are let go.
    kiln_kernels::recycle::finish_run();
    let mut outputs = outputs?;
    // An output that is a view of a planned tensor leaves the arena (the next run reuses it).
    outputs.iter_mut().for_each(Value::detach);
    Ok(program.outputs.iter().map(|o| o.name.clone()).zip(outputs).collect())
}

fn input_err(spec: &IoSpec, reason: String) -> RuntimeError {
    RuntimeError::Input {
        name: spec.name.clone(),
        reason,
    }
}

/// Checks a value against the declared type (kind, dtype, rank, fixed dims, consistent
/// symbol bindings across inputs).
fn check_input(spec: &IoSpec, v: Value, symbols: &mut Vec<(String, usize)>) -> Result<Value> {
    match (&spec.ty, v) {
        (ValueType::Tensor(tt), Value::Tensor(t)) => {
            if let Some(d) = tt.dtype
                && d != t.dtype()
            {
                return Err(input_err(spec, format!("expected dtype {d}, got {}", t.dtype())));
            }
            if let Some(shape) = &tt.shape {
                if shape.len() != t.rank() {
                    return Err(input_err(
                        spec,
                        format!(
                            "expected rank {} (shape {}), got rank {} (shape {:?})",
                            shape.len(),
                            spec.ty,
                            t.rank(),
                            t.shape()
                        ),
                    ));
                }
                for (i, (d, &got)) in shape.iter().zip(t.shape()).enumerate() {
                    match d {
                        Dim::Fixed(n) if *n != got => {
                            return Err(input_err(
                                spec,
                                format!(
                                    "dim {i}: expected {n}, got {got} (expected shape {}, got {:?})",
                                    spec.ty,
                                    t.shape()
                                ),
                            ));
                        }
                        Dim::Sym(s) if !s.starts_with("unk__") => match symbols.iter().find(|(n, _)| n == s) {
                            Some((_, bound)) if *bound != got => {
                                return Err(input_err(
                                    spec,
                                    format!(
                                        "dim {i} is symbol '{s}', already bound to {bound} by another input, got {got}"
                                    ),
                                ));
                            }
                            Some(_) => {}
                            None => symbols.push((s.clone(), got)),
                        },
                        _ => {}
                    }
                }
            }
            Ok(Value::Tensor(t))
        }
        (ValueType::Optional(inner), v @ Value::Optional(..)) => {
            let _ = inner;
            Ok(v)
        }
        (ValueType::Optional(inner), v) => Ok(Value::Optional(Some(Box::new(v)), (**inner).clone())),
        (ValueType::Sequence(_), v @ Value::Sequence(_)) => Ok(v),
        (ValueType::Unknown, v) => Ok(v),
        (ty, v) => Err(input_err(spec, format!("expected a {ty}, got a {}", v.kind()))),
    }
}

/// Runs `p` with its formal inputs and its captures read from `outer`; with a recorder, times
/// each of its steps.
fn run_program(
    p: &Program,
    outer: &[Slot<'_>],
    formal: impl IntoIterator<Item = Value, IntoIter: ExactSizeIterator>,
    mut rec: Option<&mut Recorder>,
    planned: bool,
    ctl: &Ctl<'_>,
) -> Result<Outputs> {
    let formal = formal.into_iter();
    let mut slots = Env::new(p.num_slots());
    let env = &mut slots.0;
    let bad = |what: String| RuntimeError::Program(format!("'{}': {what}", p.name));
    for (slot, v) in &p.constants {
        *env.get_mut(*slot)
            .ok_or_else(|| bad(format!("constant slot {slot} out of range")))? = Slot::Shared(v);
    }
    for &(o, i) in &p.captures {
        let v = outer.get(o).and_then(Slot::get).ok_or_else(|| {
            bad(format!(
                "captured value '{}' is not available",
                p.slot_names.get(i).map_or("?", |s| s)
            ))
        })?;
        *env.get_mut(i)
            .ok_or_else(|| bad(format!("capture slot {i} out of range")))? = Slot::Shared(v);
    }
    if formal.len() != p.inputs.len() {
        return Err(bad(format!("expects {} inputs, got {}", p.inputs.len(), formal.len())));
    }
    for (spec, v) in p.inputs.iter().zip(formal) {
        // Held like a step's output: freeing it gives its bytes back.
        ctl.hold(&v);
        *env.get_mut(spec.slot)
            .ok_or_else(|| bad(format!("input slot {} out of range", spec.slot)))? = Slot::Owned(v);
    }
    for (index, step) in p.steps.iter().enumerate() {
        // The op's output buffer (when it asks for one of the planned size) is the step's
        // planned range; control-flow steps and sub-programs have none.
        let place = match (&step.kind, step.outputs.first()) {
            (StepKind::Op(_), Some(Some(slot))) if planned => p.arena.place(*slot),
            _ => None,
        };
        kiln_kernels::recycle::plan_output(place);
        let results = match rec.as_deref_mut() {
            None => run_step_moving(step, env, ctl, place.is_some())?,
            Some(rec) => {
                let seen: Vec<InputSeen> = step
                    .inputs
                    .iter()
                    .map(|s| {
                        let slot = s.and_then(|s| env.get(s));
                        InputSeen::of(slot.and_then(Slot::get), matches!(slot, Some(Slot::Shared(_))))
                    })
                    .collect();
                let started = Instant::now();
                let results = run_step_moving(step, env, ctl, place.is_some())?;
                let duration = started.elapsed();
                rec.record(index, step, started, duration, &seen, &results);
                results
            }
        };
        // A stop seen during the step may have cut its kernels short: its results are dropped.
        ctl.stopped(Some(step))?;
        let mut results = results.into_iter();
        for out in &step.outputs {
            let v = results.next();
            if let Some(slot) = out {
                if v.is_none() && step.frees.contains(slot) {
                    // An output nobody reads, which the op was told it may skip.
                    continue;
                }
                let v = v.ok_or_else(|| RuntimeError::Control {
                    node: step.name.clone(),
                    op: step.kind.name().to_string(),
                    reason: "produced fewer outputs than the node declares".into(),
                })?;
                ctl.hold(&v);
                let s = env
                    .get_mut(*slot)
                    .ok_or_else(|| bad(format!("output slot {slot} out of range")))?;
                if let Slot::Owned(old) = std::mem::replace(s, Slot::Owned(v)) {
                    ctl.release(&old);
                }
            }
        }
        for &f in &step.frees {
            if let Some(s) = env.get_mut(f) {
                let freed = std::mem::replace(s, Slot::Empty);
                if let Slot::Owned(v) = &freed {
                    ctl.release(v);
                }
                // A freed f32, int64 or bool tensor's vector goes to the kernels' recycled
                // buffers, for a later output of about its size.
                if let Slot::Owned(Value::Tensor(t)) = freed {
                    use kiln_kernels::recycle::give_of;
                    match t.into_data() {
                        Data::F32(b) => b.into_owned().map(give_of),
                        Data::I64(b) => b.into_owned().map(give_of),
                        Data::Bool(b) => b.into_owned().map(give_of),
                        Data::U8(b) => b.into_owned().map(give_of),
                        Data::I8(b) => b.into_owned().map(give_of),
                        _ => None,
                    };
                }
            }
        }
    }
    kiln_kernels::recycle::plan_output(None);
    let mut outs = Outputs::with_capacity(p.outputs.len());
    for (k, o) in p.outputs.iter().enumerate() {
        let used_later = p.outputs[k + 1..].iter().any(|x| x.slot == o.slot);
        let slot = env
            .get_mut(o.slot)
            .ok_or_else(|| bad(format!("output slot {} out of range", o.slot)))?;
        let owned = matches!(slot, Slot::Owned(_));
        let v = if used_later { slot.get().cloned() } else { slot.take() };
        let v = v.ok_or_else(|| bad(format!("output '{}' was not computed", o.name)))?;
        // A value this program held leaves it: whoever stores it (an enclosing step) holds
        // it again.
        if owned && !used_later {
            ctl.release(&v);
        }
        outs.push(v);
    }
    Ok(outs)
}

/// [`run_step`], except that a view op (`Op::view_shape`: Reshape, Flatten, Squeeze,
/// Unsqueeze) whose input 0 is owned and dies at this step takes that value and relabels its
/// shape instead of copying it.
fn run_step_moving(step: &Step, env: &mut [Slot<'_>], ctl: &Ctl<'_>, planned: bool) -> Result<Outputs> {
    if let (StepKind::Op(op), Some(Some(x))) = (&step.kind, step.inputs.first())
        && op.is_view()
        && step.frees.contains(x)
        && step.inputs.iter().skip(1).all(|s| s.as_ref() != Some(x))
        && matches!(env.get(*x), Some(Slot::Owned(Value::Tensor(_))))
    {
        let shape = {
            let args: smallvec::SmallVec<[Option<&Value>; INLINE_ARGS]> =
                step.inputs.iter().map(|s| s.and_then(|s| env.get(s)?.get())).collect();
            op.view_shape(&Args::new(&args))
        };
        if let Some(Ok(shape)) = shape
            && let Some(slot) = env.get_mut(*x)
            && let Slot::Owned(Value::Tensor(t)) = std::mem::replace(slot, Slot::Empty)
        {
            let node_err = |source: OpError| RuntimeError::Node {
                node: step.name.clone(),
                op: step.kind.name().to_string(),
                source,
            };
            // The input's bytes move to the output (held again when it is stored).
            ctl.release_bytes(tensor_bytes(&t));
            let t = t.reshape(shape).map_err(|e| node_err(OpError::from(e)))?;
            return Ok(smallvec::smallvec![Value::Tensor(t)]);
        }
    }
    run_step(step, env, ctl, planned)
}

/// Inputs a step gathers without allocating (more go to a vector).
const INLINE_ARGS: usize = 8;

fn run_step(step: &Step, env: &[Slot<'_>], ctl: &Ctl<'_>, planned: bool) -> Result<Outputs> {
    let node_err = |source: OpError| RuntimeError::Node {
        node: step.name.clone(),
        op: step.kind.name().to_string(),
        source,
    };
    let ctl_err = |reason: String| RuntimeError::Control {
        node: step.name.clone(),
        op: step.kind.name().to_string(),
        reason,
    };
    let input = |s: &Option<usize>| -> Result<Option<&Value>> {
        match s {
            None => Ok(None),
            Some(s) => env
                .get(*s)
                .and_then(Slot::get)
                .map(Some)
                .ok_or_else(|| ctl_err(format!("input slot {s} holds no value (program error)"))),
        }
    };
    // The usual few inputs are gathered on the stack: no allocation per step.
    let mut inline: [Option<&Value>; INLINE_ARGS] = [None; INLINE_ARGS];
    let heap: Vec<Option<&Value>>;
    let args: &[Option<&Value>] = if step.inputs.len() <= INLINE_ARGS {
        for (d, s) in inline.iter_mut().zip(&step.inputs) {
            *d = input(s)?;
        }
        inline.get(..step.inputs.len()).unwrap_or(&[])
    } else {
        heap = step.inputs.iter().map(input).collect::<Result<_>>()?;
        &heap
    };
    match &step.kind {
        StepKind::Op(op) => {
            // Outputs whose slot is freed by this very step are read by no one.
            let wanted = step
                .outputs
                .iter()
                .enumerate()
                .take(64)
                .fold(0u64, |m, (i, o)| match o {
                    Some(s) if !step.frees.contains(s) => m | (1u64 << i),
                    _ => m,
                })
                | 1;
            // Under a memory limit, an output outside the arena is counted before it exists
            // (unless even the largest outputs an op may make would fit).
            if ctl.counting() && !planned && !ctl.surely_fits(step.outputs.len()) {
                ctl.fits(step, expected_bytes(op, args))?;
            }
            kiln_ops::fast::eval(op, step.plan.as_ref(), &Args::new(&args).with_wanted(wanted)).map_err(node_err)
        }
        StepKind::If {
            then_branch,
            else_branch,
        } => {
            let cond = Args::new(&args).tensor(0).map_err(node_err)?;
            let c = cond
                .to_f64_vec()
                .first()
                .copied()
                .ok_or_else(|| ctl_err(format!("condition is empty (shape {:?})", cond.shape())))?;
            let branch = if c != 0.0 { then_branch } else { else_branch };
            run_program(branch, env, [], None, false, ctl)
        }
        StepKind::Loop(l) => run_loop(l, &args, env, ctl, step)
            .map(Outputs::from)
            .map_err(|e| wrap(e, step)),
        StepKind::Scan(s) => run_scan(s, &args, env, ctl)
            .map(Outputs::from)
            .map_err(|e| wrap(e, step)),
        StepKind::FlexAttention {
            op,
            score_mod,
            prob_mod,
        } => {
            let call = |p: &Option<Box<Program>>, t: Tensor| -> std::result::Result<Tensor, OpError> {
                let Some(p) = p else { return Ok(t) };
                let outs = run_program(p, env, [Value::Tensor(t)], None, false, ctl)
                    .map_err(|e| OpError::subgraph("modifier", "one tensor", format!("an error: {e}")))?;
                match outs.into_iter().next() {
                    Some(Value::Tensor(t)) => Ok(t),
                    _ => Err(OpError::subgraph("modifier", "one tensor", "another value or none")),
                }
            };
            let mut smod = |t: Tensor| call(score_mod, t);
            let mut pmod = |t: Tensor| call(prob_mod, t);
            op.eval_with(&Args::new(&args), &mut smod, &mut pmod).map_err(node_err)
        }
        StepKind::SequenceMap { body } => run_sequence_map(body, &args, env, step.outputs.len(), ctl)
            .map(Outputs::from)
            .map_err(|e| wrap(e, step)),
    }
}

/// Adds the node's name to an op error raised by control-flow bookkeeping.
fn wrap(e: RuntimeError, step: &Step) -> RuntimeError {
    match e {
        RuntimeError::Program(reason) => RuntimeError::Control {
            node: step.name.clone(),
            op: step.kind.name().to_string(),
            reason,
        },
        other => other,
    }
}

fn op_err(e: OpError) -> RuntimeError {
    RuntimeError::Program(e.to_string())
}

fn run_loop(l: &LoopStep, args: &[Option<&Value>], env: &[Slot<'_>], ctl: &Ctl<'_>, step: &Step) -> Result<Vec<Value>> {
    let a = Args::new(args);
    let max_trip = match a.opt_tensor(0).map_err(op_err)? {
        Some(t) => Some(
            t.to_i64_vec()
                .and_then(|v| v.first().copied())
                .ok_or_else(|| RuntimeError::Program("M must be an integer scalar".into()))?,
        ),
        None => None,
    };
    let mut cond = match a.opt_tensor(1).map_err(op_err)? {
        Some(t) => t.to_f64_vec().first().is_some_and(|&c| c != 0.0),
        None => true,
    };
    let mut carried: Vec<Value> = (2..args.len())
        .map(|i| a.value(i).cloned().unwrap_or(Value::Optional(None, ValueType::Unknown)))
        .collect();
    let n_carried = carried.len();
    let n_scan = l.body.outputs.len().saturating_sub(1 + n_carried);
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); n_scan];
    let mut iter: i64 = 0;
    while cond && max_trip.is_none_or(|m| iter < m) {
        if let Some(limit) = ctl.limits.loop_iterations
            && iter as u64 >= limit
        {
            return Err(RuntimeError::LoopLimit {
                node: step.name.clone(),
                limit,
                trip_count: max_trip,
            });
        }
        let mut formal = Vec::with_capacity(2 + n_carried);
        formal.push(Value::Tensor(Tensor::scalar(iter)));
        formal.push(Value::Tensor(Tensor::scalar(cond)));
        formal.append(&mut carried);
        let outs = run_program(&l.body, env, formal, None, false, ctl)?;
        let mut outs = outs.into_iter();
        let c = outs
            .next()
            .ok_or_else(|| RuntimeError::Program("loop body returned no condition".into()))?;
        cond = match &c {
            Value::Tensor(t) => t.to_f64_vec().first().is_some_and(|&x| x != 0.0),
            _ => return Err(RuntimeError::Program("loop condition must be a tensor".into())),
        };
        carried = outs.by_ref().take(n_carried).collect();
        for (k, v) in outs.enumerate() {
            match (v, scans.get_mut(k)) {
                (Value::Tensor(t), Some(acc)) => acc.push(t),
                _ => return Err(RuntimeError::Program(format!("scan output {k} must be a tensor"))),
            }
        }
        iter += 1;
    }
    let mut result = carried;
    for acc in scans {
        result.push(Value::Tensor(if acc.is_empty() {
            Tensor::zeros(kiln_tensor::DType::F32, vec![0]).map_err(|e| op_err(e.into()))?
        } else {
            stack(&acc, 0).map_err(op_err)?
        }));
    }
    Ok(result)
}

fn run_scan(s: &ScanStep, args: &[Option<&Value>], env: &[Slot<'_>], ctl: &Ctl<'_>) -> Result<Vec<Value>> {
    if !s.batched {
        return run_scan_once(s, args, env, ctl);
    }
    // Scan-8: input 0 is sequence_lens; every other input and every output has a leading batch
    // axis. Each batch entry is scanned on its own and the results are stacked again.
    let a = Args::new(args);
    let rest = args.get(1..).unwrap_or(&[]);
    let first = Args::new(rest).tensor(0).map_err(op_err)?;
    let batch = *first
        .shape()
        .first()
        .ok_or_else(|| RuntimeError::Program("Scan-8 inputs need a batch axis".into()))?;
    let mut per_batch: Vec<Vec<Value>> = Vec::with_capacity(batch);
    for b in 0..batch {
        let mut sliced = Vec::with_capacity(rest.len());
        for i in 0..rest.len() {
            let t = Args::new(rest).tensor(i).map_err(op_err)?;
            sliced.push(Value::Tensor(take_along(t, 0, b).map_err(op_err)?));
        }
        if let Some(lens) = a.opt_tensor(0).map_err(op_err)? {
            let len = lens.to_i64_vec().and_then(|v| v.get(b).copied());
            // The sequence length: the leading dim of the first scan input, batch removed.
            let first_scan = rest.len().saturating_sub(s.num_scan_inputs);
            let full = sliced
                .get(first_scan)
                .and_then(Value::as_tensor)
                .and_then(|t| t.shape().first().copied());
            if let (Some(l), Some(f)) = (len, full)
                && l != f as i64
            {
                return Err(RuntimeError::Program(format!(
                    "sequence_lens[{b}] = {l} is shorter than the sequence ({f}); variable lengths are not supported"
                )));
            }
        }
        let refs: Vec<Option<&Value>> = sliced.iter().map(Some).collect();
        per_batch.push(run_scan_once(s, &refs, env, ctl)?);
    }
    let n_out = per_batch.first().map_or(0, Vec::len);
    let mut result = Vec::with_capacity(n_out);
    for k in 0..n_out {
        let items: Vec<Tensor> = per_batch
            .iter()
            .map(|o| match o.get(k) {
                Some(Value::Tensor(t)) => Ok(t.clone()),
                _ => Err(RuntimeError::Program(format!("scan output {k} must be a tensor"))),
            })
            .collect::<Result<_>>()?;
        result.push(Value::Tensor(stack(&items, 0).map_err(op_err)?));
    }
    Ok(result)
}

fn run_scan_once(s: &ScanStep, args: &[Option<&Value>], env: &[Slot<'_>], ctl: &Ctl<'_>) -> Result<Vec<Value>> {
    let a = Args::new(args);
    let n_state = args.len().saturating_sub(s.num_scan_inputs);
    let mut state: Vec<Value> = (0..n_state)
        .map(|i| {
            a.value(i)
                .cloned()
                .ok_or_else(|| RuntimeError::Program(format!("state input {i} is absent")))
        })
        .collect::<Result<_>>()?;
    let mut scan_in: Vec<(&Tensor, usize, bool)> = Vec::new();
    for k in 0..s.num_scan_inputs {
        let t = a.tensor(n_state + k).map_err(op_err)?;
        let axis = norm_axis(s.input_axes.get(k).copied().unwrap_or(0), t.rank()).map_err(op_err)?;
        scan_in.push((t, axis, s.input_reverse.get(k).copied().unwrap_or(false)));
    }
    let len = match scan_in.first() {
        Some((t, axis, _)) => t.shape()[*axis],
        None => 0,
    };
    for (t, axis, _) in &scan_in {
        if t.shape()[*axis] != len {
            return Err(RuntimeError::Program(format!(
                "scan inputs have different lengths ({} vs {len})",
                t.shape()[*axis]
            )));
        }
    }
    let n_scan_out = s.body.outputs.len().saturating_sub(n_state);
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); n_scan_out];
    for it in 0..len {
        let mut formal = std::mem::take(&mut state);
        for (t, axis, rev) in &scan_in {
            let idx = if *rev { len - 1 - it } else { it };
            formal.push(Value::Tensor(take_along(t, *axis, idx).map_err(op_err)?));
        }
        let outs = run_program(&s.body, env, formal, None, false, ctl)?;
        let mut outs = outs.into_iter();
        state = outs.by_ref().take(n_state).collect();
        for (k, v) in outs.enumerate() {
            match (v, scans.get_mut(k)) {
                (Value::Tensor(t), Some(acc)) => acc.push(t),
                _ => return Err(RuntimeError::Program(format!("scan output {k} must be a tensor"))),
            }
        }
    }
    let mut result = state;
    for (k, mut acc) in scans.into_iter().enumerate() {
        if s.output_reverse.get(k).copied().unwrap_or(false) {
            acc.reverse();
        }
        if acc.is_empty() {
            return Err(RuntimeError::Program(
                "scan over zero iterations has no output shape".into(),
            ));
        }
        let rank = acc[0].rank() + 1;
        let axis = norm_axis(s.output_axes.get(k).copied().unwrap_or(0), rank).map_err(op_err)?;
        result.push(Value::Tensor(stack(&acc, axis).map_err(op_err)?));
    }
    Ok(result)
}

fn run_sequence_map(
    body: &Program,
    args: &[Option<&Value>],
    env: &[Slot<'_>],
    n_out: usize,
    ctl: &Ctl<'_>,
) -> Result<Vec<Value>> {
    let a = Args::new(args);
    let seq = a.sequence(0).map_err(op_err)?;
    let len = seq.items.len();
    let mut outs: Vec<Vec<Tensor>> = vec![Vec::new(); n_out];
    for i in 0..len {
        let mut formal = Vec::with_capacity(args.len());
        for k in 0..args.len() {
            match a.value(k) {
                Some(Value::Sequence(s)) => {
                    let item = s.items.get(i).ok_or_else(|| {
                        RuntimeError::Program(format!(
                            "sequence input {k} has {} items, expected {len}",
                            s.items.len()
                        ))
                    })?;
                    formal.push(Value::Tensor(item.clone()));
                }
                Some(v) => formal.push(v.clone()),
                None => return Err(RuntimeError::Program(format!("input {k} is absent"))),
            }
        }
        for (k, v) in run_program(body, env, formal, None, false, ctl)?
            .into_iter()
            .enumerate()
        {
            match (v, outs.get_mut(k)) {
                (Value::Tensor(t), Some(acc)) => acc.push(t),
                _ => return Err(RuntimeError::Program(format!("body output {k} must be a tensor"))),
            }
        }
    }
    let types: Vec<Option<kiln_tensor::DType>> = body
        .outputs
        .iter()
        .map(|o| o.ty.tensor().and_then(|t| t.dtype))
        .collect();
    Ok(outs
        .into_iter()
        .enumerate()
        .map(|(k, items)| {
            let dtype = items.first().map(Tensor::dtype).or(types.get(k).copied().flatten());
            Value::Sequence(Sequence { dtype, items })
        })
        .collect())
}
