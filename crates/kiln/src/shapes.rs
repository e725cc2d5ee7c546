//! qaic-style session introspection and lifecycle: the input/output shape-and-dtype dicts,
//! `setup()` (make the session ready before the first run) and `reset()` (forget metrics).

use crate::Session;
use kiln_ops::{Dim, Value, ValueType};
use kiln_tensor::DType;
use std::collections::BTreeMap;

/// One entry of a shape dict: the static shape (symbolic dims by name) and the element type.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeInfo {
    /// `None` when even the rank is unknown.
    pub shape: Option<Vec<Dim>>,
    /// `None` when the element type is unknown (or the value is not a tensor).
    pub dtype: Option<DType>,
}

fn dict<'a>(specs: impl Iterator<Item = (&'a str, &'a ValueType)>) -> BTreeMap<String, ShapeInfo> {
    specs
        .map(|(name, ty)| {
            let info = match ty {
                ValueType::Tensor(t) => ShapeInfo {
                    shape: t.shape.clone(),
                    dtype: t.dtype,
                },
                _ => ShapeInfo {
                    shape: None,
                    dtype: None,
                },
            };
            (name.to_string(), info)
        })
        .collect()
}

impl Session {
    /// Every input's shape and dtype by name (qaic's `model_input_shape_dict`).
    pub fn model_input_shape_dict(&self) -> BTreeMap<String, ShapeInfo> {
        dict(self.program.inputs.iter().map(|s| (s.name.as_str(), &s.ty)))
    }

    /// Every output's shape and dtype by name (qaic's `model_output_shape_dict`).
    pub fn model_output_shape_dict(&self) -> BTreeMap<String, ShapeInfo> {
        dict(self.program.outputs.iter().map(|s| (s.name.as_str(), &s.ty)))
    }

    /// Makes the session ready to run now rather than on the first run (qaic's `setup()`):
    /// touches every page of the weights, so a memory-mapped program is read from disk here
    /// and the first inference pays no page faults, and allocates a run state's block for
    /// the memory plan. Returns the weight bytes touched.
    pub fn setup(&self) -> u64 {
        let mut touched = 0u64;
        if let Ok(bytes) = usize::try_from(self.program.arena.bytes)
            && bytes > 0
        {
            let mut arenas = self.arenas.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if arenas.is_empty() {
                arenas.push(kiln_runtime::Arena::new());
            }
            if let Some(a) = arenas.first_mut() {
                a.prepare_slab(bytes);
            }
        }
        let mut sink = 0u8;
        for (_, v) in &self.program.constants {
            if let Value::Tensor(t) = v
                && let Some(bytes) = t.data().as_bytes()
            {
                for page in bytes.chunks(4096) {
                    sink ^= page.first().copied().unwrap_or(0);
                }
                touched += bytes.len() as u64;
            }
        }
        std::hint::black_box(sink);
        touched
    }

    /// The memory plan as the runs execute it, once a run has finished: its block size, the
    /// run states holding one, the planned tensors and how many of them the latest finished
    /// run placed at their offsets (a view shares its input's range instead of taking one).
    pub fn memory_placement(&self) -> Option<MemoryPlacement> {
        if self.program.arena.bytes == 0 {
            return None;
        }
        let arenas = self.arenas.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(MemoryPlacement {
            block_bytes: self.program.arena.bytes,
            run_states: arenas.iter().filter(|a| a.slab().is_some()).count(),
            planned: self.program.arena.places.iter().flatten().count(),
            placed: arenas
                .iter()
                .map(kiln_runtime::Arena::placed_last_run)
                .max()
                .unwrap_or(0),
        })
    }
}

/// See [`Session::memory_placement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryPlacement {
    pub block_bytes: u64,
    pub run_states: usize,
    pub planned: usize,
    pub placed: usize,
}

impl std::fmt::Display for MemoryPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} planned tensors placed at their offsets, in a {:.2} MiB block per run state ({} run state{})",
            self.placed,
            self.planned,
            self.block_bytes as f64 / (1024.0 * 1024.0),
            self.run_states,
            if self.run_states == 1 { "" } else { "s" }
        )
    }
}
