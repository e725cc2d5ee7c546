//! Shape specialisation: a model with symbolic input dims runs each set of input shapes on a
//! program compiled for exactly those sizes, so every fast path that needs static shapes
//! (channels-last layout, kernel choice, fusions, the memory plan) applies as if the user had
//! bound the symbols with `onnx_define_symbol`.
//!
//! A session keeps the generic program (any shape; its signature is the model's) and the
//! model's source: the imported graph, or the ONNX model a program file embeds (imported on
//! the first miss). The first run of new shapes compiles the graph with its symbols bound to
//! that run's sizes; later runs of those shapes reuse the program, so a shape seen before never
//! compiles again. Programs compiled ahead of time for the shape sets the user listed
//! (`shape_specializations`) are always kept; run-time ones are dropped least recently used
//! beyond `shape_cache_size` (0 turns run-time specialisation off). A session compiles at most
//! [`COMPILES_PER_SLOT`] x `shape_cache_size` programs at run time: a workload of ever-new
//! shapes (every sentence another length) then runs new shapes on the generic program instead
//! of paying a compile for each. Shapes whose compile fails
//! run on the generic program, which reports the error those inputs deserve; the failure is
//! remembered (within the same bound), so it is not compiled again on every run.

use kiln_compiler::CompileOptions;
use kiln_ir::Graph;
use kiln_ops::{Dim, Value, ValueType};
use kiln_runtime::{Arena, Program};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Default of `shape_cache_size`: run-time specialisations a session keeps.
pub const DEFAULT_SHAPE_CACHE: usize = 8;

/// A shape set as written on the command line and in reports: `h=640,w=640`.
pub fn format_bindings<V: std::fmt::Display>(b: &[(String, V)]) -> String {
    b.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Run-time compiles a session makes per cache slot before new shapes run shape-generic.
pub const COMPILES_PER_SLOT: u64 = 4;

/// Symbol bindings: each symbol of the model's inputs and its size, sorted by name.
pub type Bindings = Vec<(String, usize)>;

/// Where the graph to specialise comes from.
enum Source {
    /// Imported already (a session opened on an `.onnx`).
    Graph(Graph),
    /// The ONNX model embedded in a program file, with the symbols bound at compile time.
    Onnx {
        bytes: kiln_runtime::file::SourceBytes,
        symbols: Vec<(String, usize)>,
    },
    /// No source (a program file without one): only the stored shape sets specialise.
    None,
}

/// One specialisation: its bindings and program (`None`: the compile failed, see `error`).
pub(crate) struct Variant {
    pub(crate) bindings: Bindings,
    program: Option<Program>,
    error: Option<String>,
    /// Run states of this program's runs (one per concurrent run).
    pub(crate) arenas: Mutex<Vec<Arena>>,
}

impl Variant {
    fn new(bindings: Bindings, program: Result<Program, String>) -> Variant {
        let (program, error) = match program {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        Variant {
            bindings,
            program,
            error,
            arenas: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn program(&self) -> Option<&Program> {
        self.program.as_ref()
    }
}

#[derive(Default)]
struct Cache {
    /// Compiled ahead of time: kept for the session's life.
    stored: Vec<Arc<Variant>>,
    /// Compiled at run time, least recently used first.
    recent: Vec<Arc<Variant>>,
    /// Compiles done at run time (including failed ones).
    compiled: u64,
}

/// A session's specialisations (see the module doc).
pub(crate) struct Specializer {
    source: Source,
    graph: OnceLock<Result<Graph, String>>,
    options: CompileOptions,
    limit: usize,
    cache: Mutex<Cache>,
    /// Held while compiling, so two runs of new shapes do not compile the same program twice.
    compiling: Mutex<()>,
}

/// What a session's specialisations are, for reports (`kiln info`, `kiln bench`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ShapeCacheInfo {
    /// Shape sets compiled ahead of time (stored in the program file).
    pub stored: Vec<Bindings>,
    /// Shape sets compiled at run time and kept, least recently used first.
    pub cached: Vec<Bindings>,
    /// Shape sets whose compile failed (they run on the generic program), with the reason.
    pub failed: Vec<(Bindings, String)>,
    /// Compiles done at run time so far.
    pub compiled: u64,
    /// The most run-time specialisations kept (`shape_cache_size`).
    pub limit: usize,
    /// Whether new shapes can be compiled at all (the model source is at hand).
    pub can_compile: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Specializer {
    /// For a session opened on an `.onnx` model: `graph` as imported (user symbols bound).
    pub(crate) fn from_graph(graph: Graph, options: CompileOptions, limit: usize) -> Specializer {
        Specializer::new(Source::Graph(graph), options, limit)
    }

    /// For a program file: its embedded source (if any) and stored shape programs.
    pub(crate) fn from_file(
        source: Option<(kiln_runtime::file::SourceBytes, Vec<(String, usize)>)>,
        stored: Vec<(Bindings, Program)>,
        options: CompileOptions,
        limit: usize,
    ) -> Specializer {
        let source = match source {
            Some((bytes, symbols)) => Source::Onnx { bytes, symbols },
            None => Source::None,
        };
        let s = Specializer::new(source, options, limit);
        s.store(stored);
        s
    }

    /// Adds programs compiled ahead of time (kept for the session's life).
    pub(crate) fn store(&self, stored: Vec<(Bindings, Program)>) {
        lock(&self.cache)
            .stored
            .extend(stored.into_iter().map(|(b, p)| Arc::new(Variant::new(b, Ok(p)))));
    }

    fn new(source: Source, options: CompileOptions, limit: usize) -> Specializer {
        Specializer {
            source,
            graph: OnceLock::new(),
            options,
            limit,
            cache: Mutex::new(Cache::default()),
            compiling: Mutex::new(()),
        }
    }

    /// The specialised program for these inputs, compiling it on the first run of their
    /// shapes; `None` to run the generic program (static model, inputs that do not fit the
    /// signature, a failed compile, or nothing to compile from).
    pub(crate) fn variant(&self, generic: &Program, inputs: &[(String, Value)]) -> Option<Arc<Variant>> {
        // Every run: find the variant the inputs fit, allocating nothing.
        if let Some(v) = self.lookup(|b| fits(generic, inputs, b)) {
            return v.program.is_some().then_some(v);
        }
        if self.limit == 0 || matches!(self.source, Source::None) || self.exhausted() {
            return None;
        }
        let bindings = bindings(generic, inputs)?;
        let _compiling = lock(&self.compiling);
        if let Some(v) = self.lookup(|b| b == bindings.as_slice()) {
            return v.program.is_some().then_some(v);
        }
        let program = self.compile(&bindings);
        let v = Arc::new(Variant::new(bindings, program));
        let mut cache = lock(&self.cache);
        cache.compiled += 1;
        cache.recent.push(v.clone());
        let excess = cache.recent.len().saturating_sub(self.limit);
        cache.recent.drain(..excess);
        v.program.is_some().then_some(v)
    }

    /// Whether this session has made all the run-time compiles it may.
    fn exhausted(&self) -> bool {
        lock(&self.cache).compiled >= COMPILES_PER_SLOT.saturating_mul(self.limit as u64)
    }

    /// A cached variant whose bindings `hit` accepts, marked most recently used.
    fn lookup(&self, hit: impl Fn(&[(String, usize)]) -> bool) -> Option<Arc<Variant>> {
        let mut cache = lock(&self.cache);
        if let Some(v) = cache.stored.iter().find(|v| hit(&v.bindings)) {
            return Some(v.clone());
        }
        let at = cache.recent.iter().position(|v| hit(&v.bindings))?;
        let v = cache.recent.remove(at);
        cache.recent.push(v.clone());
        Some(v)
    }

    /// Compiles the source graph with `bindings` bound.
    fn compile(&self, bindings: &[(String, usize)]) -> Result<Program, String> {
        let mut graph = self.graph()?.clone();
        kiln_ir::bind_symbols(&mut graph, bindings).map_err(|e| e.to_string())?;
        kiln_compiler::compile(graph, &self.options)
            .map(|c| c.program)
            .map_err(|e| e.to_string())
    }

    /// The graph to specialise, imported from the embedded model on first use.
    fn graph(&self) -> Result<&Graph, String> {
        let g = self.graph.get_or_init(|| match &self.source {
            Source::Graph(g) => Ok(g.clone()),
            Source::Onnx { bytes, symbols } => {
                let bytes = bytes::Bytes::from_owner(bytes.clone());
                let options = kiln_onnx::ImportOptions {
                    symbols: symbols.clone(),
                };
                kiln_onnx::load_model_bytes(bytes, &options)
                    .map(|m| m.graph)
                    .map_err(|e| format!("the embedded model cannot be imported: {e}"))
            }
            Source::None => Err("the program file embeds no model source".into()),
        });
        g.as_ref().map_err(Clone::clone)
    }

    /// Frees the idle run states of every specialisation (the programs are kept).
    pub(crate) fn release_run_states(&self) {
        let cache = lock(&self.cache);
        for v in cache.stored.iter().chain(cache.recent.iter()) {
            lock(&v.arenas).clear();
        }
    }

    pub(crate) fn info(&self) -> ShapeCacheInfo {
        let cache = lock(&self.cache);
        ShapeCacheInfo {
            stored: cache.stored.iter().map(|v| v.bindings.clone()).collect(),
            cached: cache
                .recent
                .iter()
                .filter(|v| v.program.is_some())
                .map(|v| v.bindings.clone())
                .collect(),
            failed: cache
                .recent
                .iter()
                .filter_map(|v| Some((v.bindings.clone(), v.error.clone()?)))
                .collect(),
            compiled: cache.compiled,
            limit: self.limit,
            can_compile: !matches!(self.source, Source::None)
                && self.limit > 0
                && cache.compiled < COMPILES_PER_SLOT.saturating_mul(self.limit as u64),
        }
    }
}

impl std::fmt::Debug for Specializer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Specializer").field("cache", &self.info()).finish()
    }
}

/// Each input of the program's signature that has symbolic dims, with the shape the inputs
/// give it (`None` when that input is missing, not a tensor or of another rank). Allocates
/// nothing.
fn symbolic_shapes<'a>(
    program: &'a Program,
    inputs: &'a [(String, Value)],
) -> impl Iterator<Item = Option<(&'a [Dim], &'a [usize])>> {
    program.inputs.iter().filter_map(move |spec| {
        let ValueType::Tensor(tt) = &spec.ty else { return None };
        let dims = tt.shape.as_deref()?;
        if !dims.iter().any(|d| matches!(d, Dim::Sym(_))) {
            return None;
        }
        let given = match inputs.iter().find(|(n, _)| *n == spec.name) {
            Some((_, Value::Tensor(t))) if t.rank() == dims.len() => Some((dims, t.shape())),
            _ => None,
        };
        Some(given)
    })
}

/// Whether the inputs fit the program's signature with its symbols at the sizes `b` binds
/// (each symbol's every occurrence, the fixed dims too). Allocates nothing: it runs on every
/// inference of a symbolic model.
fn fits(program: &Program, inputs: &[(String, Value)], b: &[(String, usize)]) -> bool {
    symbolic_shapes(program, inputs).all(|given| {
        given.is_some_and(|(dims, shape)| {
            dims.iter().zip(shape).all(|(d, &got)| match d {
                Dim::Fixed(n) => *n == got,
                Dim::Sym(s) => b.iter().any(|(n, v)| n == s && *v == got),
            })
        })
    })
}

/// The sizes the inputs give the symbols of the program's input types, sorted by name;
/// `None` when the program's inputs have no symbols, or the inputs do not fit its signature
/// (a missing input, another rank, one symbol given two sizes): the generic program then runs
/// and reports what is wrong.
pub(crate) fn bindings(program: &Program, inputs: &[(String, Value)]) -> Option<Bindings> {
    let mut out: Bindings = Vec::new();
    for given in symbolic_shapes(program, inputs) {
        let (dims, shape) = given?;
        for (d, &got) in dims.iter().zip(shape) {
            let s = match d {
                Dim::Fixed(n) if *n != got => return None,
                Dim::Fixed(_) => continue,
                Dim::Sym(s) => s,
            };
            match out.iter().find(|(n, _)| n == s) {
                Some((_, bound)) if *bound != got => return None,
                Some(_) => {}
                None => out.push((s.clone(), got)),
            }
        }
    }
    if out.is_empty() {
        return None;
    }
    out.sort();
    Some(out)
}
