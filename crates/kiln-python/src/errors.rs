//! kiln's Python exceptions and the mapping of every Rust error onto them, with the CLI's
//! messages. A panic inside kiln becomes a `KilnError` too ([`guarded`]): it never unwinds
//! into Python.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyUserWarning};
use pyo3::prelude::*;

create_exception!(kiln, KilnError, PyException, "Base class of every error kiln raises.");
create_exception!(
    kiln,
    ModelError,
    KilnError,
    "The model cannot be imported or compiled (names the node, op or tensor)."
);
create_exception!(
    kiln,
    ConfigurationError,
    KilnError,
    "An option is unknown, has an invalid value, conflicts with another, or cannot apply here."
);
create_exception!(
    kiln,
    InputError,
    KilnError,
    "An input is missing, unknown, or has the wrong dtype or shape (names it: expected vs got)."
);
create_exception!(
    kiln,
    ProgramFileError,
    KilnError,
    "A .kiln program file cannot be read or written (names the file and the section)."
);
create_exception!(
    kiln,
    LimitError,
    KilnError,
    "A run or compile crossed a limit (run_time_limit_ms, run_memory_limit_mb, loop_iteration_limit, compile_time_limit_s); names the limit, the node and the figure."
);
create_exception!(
    kiln,
    CancelledError,
    KilnError,
    "A run was stopped by RunOptions.terminate (or a compile by its cancel flag)."
);
create_exception!(
    kiln,
    KilnWarning,
    PyUserWarning,
    "An option that is accepted but has no effect on this target, or a configuration file note."
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KilnError", py.get_type::<KilnError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("ConfigurationError", py.get_type::<ConfigurationError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("ProgramFileError", py.get_type::<ProgramFileError>())?;
    m.add("LimitError", py.get_type::<LimitError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    m.add("KilnWarning", py.get_type::<KilnWarning>())?;
    Ok(())
}

// The message of an error with its causes, as the CLI prints them (`a: b: c`).
use kiln::artifact::chain;

/// A session error as the Python exception of its class.
pub(crate) fn from_kiln(e: kiln::Error) -> PyErr {
    use kiln::RuntimeError as R;
    let msg = chain(&e);
    match e.root() {
        kiln::Error::Run(R::Cancelled { .. }) => CancelledError::new_err(msg),
        kiln::Error::Compile(kiln::raw::compiler::CompileError::Stopped { reason, .. }) => match reason {
            kiln::StopReason::Cancelled => CancelledError::new_err(msg),
            _ => LimitError::new_err(msg),
        },
        kiln::Error::Run(R::TimeLimit { .. } | R::MemoryLimit { .. } | R::LoopLimit { .. }) => LimitError::new_err(msg),
        kiln::Error::Import(_) | kiln::Error::Compile(_) | kiln::Error::Unsupported { .. } => ModelError::new_err(msg),
        kiln::Error::Program { .. } | kiln::Error::Write(_) => ProgramFileError::new_err(msg),
        kiln::Error::ShapeSet { .. } => ConfigurationError::new_err(msg),
        kiln::Error::Run(R::Input { .. } | R::UnknownInput { .. } | R::MissingInput { .. }) | kiln::Error::Crc(_) => {
            InputError::new_err(msg)
        }
        _ => KilnError::new_err(msg),
    }
}

pub(crate) fn from_config(e: kiln_config::ConfigError) -> PyErr {
    ConfigurationError::new_err(chain(&e))
}

/// An error setting the keyword argument `key`, worded for a keyword argument (the
/// configuration's own wording names a command line or file position).
pub(crate) fn from_keyword(key: &str, e: kiln_config::ConfigError) -> PyErr {
    use kiln_config::ConfigError as C;
    let msg = match &e {
        C::UnknownOption { did_you_mean, .. } => format!(
            "unknown option '{key}' (keyword argument){}",
            did_you_mean.as_ref().map_or_else(
                || "; `kiln config list` shows every option".to_string(),
                |s| format!("; did you mean '{s}'?")
            )
        ),
        C::InvalidValue {
            option,
            value,
            expected,
            ..
        } => format!("{key}={value}: invalid value for {option}: expected {expected}"),
        C::Ambiguous { candidates, .. } => format!("keyword argument '{key}' is ambiguous: it is {candidates}"),
        _ => format!("keyword argument '{key}': {}", chain(&e)),
    };
    ConfigurationError::new_err(msg)
}

pub(crate) fn config(msg: impl Into<String>) -> PyErr {
    ConfigurationError::new_err(msg.into())
}

pub(crate) fn input(msg: impl Into<String>) -> PyErr {
    InputError::new_err(msg.into())
}

/// Runs `f` (usually without the GIL: building a `PyErr` does not need it), turning a panic
/// into a `KilnError` naming what was being done.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(KilnError::new_err(format!(
                "internal error while {what} (a bug in kiln; please report it with the model): {detail}"
            )))
        }
    }
}
