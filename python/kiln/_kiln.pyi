"""Type stubs of kiln's extension module (re-exported by ``kiln``)."""

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

_Path = Union[str, "os.PathLike[str]"]
_Shape = Optional[Tuple[Union[int, str], ...]]

__version__: str

class KilnError(Exception):
    """Base class of every error kiln raises."""

class ModelError(KilnError):
    """The model cannot be imported or compiled (names the node, op or tensor)."""

class ConfigurationError(KilnError):
    """An option is unknown, has an invalid value, conflicts with another, or cannot apply here."""

class InputError(KilnError):
    """An input is missing, unknown, or has the wrong dtype or shape (expected vs got)."""

class ProgramFileError(KilnError):
    """A .kiln program file cannot be read or written."""

class LimitError(KilnError):
    """A run or compile crossed a limit (run_time_limit_ms, run_memory_limit_mb,
    loop_iteration_limit, compile_time_limit_s); names the limit, the node and the figure."""

class CancelledError(KilnError):
    """A run was stopped by ``RunOptions.terminate``."""

class RunOptions:
    """ONNX Runtime's ``RunOptions``: pass to ``Session.run(..., run_options=ro)``; set
    ``ro.terminate = True`` from any thread to stop the runs using it (they raise
    ``CancelledError``) until it is set back to False; ``time_limit_ms`` bounds each run (raises
    ``LimitError``), replacing the session's ``run_time_limit_ms``."""

    terminate: bool
    time_limit_ms: Optional[float]
    def __init__(self, time_limit_ms: Optional[float] = None) -> None: ...

class KilnWarning(UserWarning):
    """An option accepted with no effect on this target, or a configuration-file note."""

class Session:
    """A compiled model ready to run (qaic's ``Session``).

    ``model_path``: an ``.onnx`` model (compiled now) or a ``.kiln`` program.
    ``options_path``: a configuration file (YAML or JSON; qaic/QAIRT/HTP/Axelera names).
    ``**kwargs``: any option of ``kiln config list`` by name or alias, e.g. ``num_of_cores=2``,
    ``num_activations=4``, ``enable_metrics=True``, ``onnx_define_symbol={"batch": 1}`` (or a
    list of ``(name, value)`` tuples), ``output_dir="out"`` (writes the compiled program there).
    """

    def __init__(self, model_path: _Path, options_path: Optional[_Path] = None, **kwargs: Any) -> None: ...
    def run(self, input_dict: Mapping[str, Any], run_options: Optional[RunOptions] = None) -> Dict[str, Any]:
        """Runs one inference: ``{input_name: ndarray}`` -> ``{output_name: ndarray}``; with
        ``run_options``, another thread may stop it (``run_options.terminate = True``)."""
    def run_with_crc(
        self, input_dict: Mapping[str, Any], run_options: Optional[RunOptions] = None
    ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """``run``, and the CRC-32 of every input and output (sampled with ``crc_stride``):
        ``{"stride": n, "inputs": {name: crc}, "outputs": {name: crc}}``; an input written
        during the run (through another view of its memory) raises ``InputError``."""
    def run_benchmark(
        self,
        num_inferences: Optional[int] = None,
        inf_time: Optional[float] = None,
        input_dict: Optional[Mapping[str, Any]] = None,
    ) -> Tuple[int, float, float, int]:
        """Timed inferences (40 by default, or for ``inf_time`` seconds) on ``input_dict`` or
        random inputs; returns ``(inf_completed, inf_rate, inf_time, batch_size)``."""
    def get_metrics(self) -> Dict[str, float]:
        """Latency statistics in seconds of every inference since creation or ``reset()``:
        num_of_inferences, min_latency, max_latency, P25, P50, P75, P90, P99, P999,
        total_inference_time, avg_latency. Needs ``enable_metrics`` or ``enable_profiling``."""
    def print_metrics(self) -> None:
        """Prints the metrics in qaic's wording."""
    def print_profile_data(self, n: Optional[int] = None) -> None:
        """Prints the per-node profile of the first ``n`` runs. Needs ``enable_profiling``."""
    def model_input_shape_dict(self) -> Dict[str, Tuple[_Shape, str]]:
        """``{name: (shape, dtype)}``; a symbolic dim is given by its name."""
    def model_output_shape_dict(self) -> Dict[str, Tuple[_Shape, str]]:
        """``{name: (shape, dtype)}`` of the outputs."""
    def backend_options(self) -> Dict[str, Any]:
        """The options that can change after creation, with their values."""
    def update_backend_options(self, **kwargs: Any) -> None:
        """Changes backend options (``num_of_cores``, ``num_activations``, ``enable_metrics``, ...)."""
    def setup(self) -> None:
        """Nothing to do: the model is loaded when the Session is created."""
    def reset(self) -> None:
        """Forgets metrics and profile and frees idle run memory; the session stays usable."""
    @property
    def model_path(self) -> str:
        """The model file the session was opened from."""
    @property
    def program_path(self) -> Optional[str]:
        """The program written to ``output_dir``, or None."""
    @property
    def quantization_report(self) -> Optional[Dict[str, Any]]:
        """What quantizing did (``convert_to_quantize=True, calibration_data=[{input: array}, ...]``):
        nodes quantized, SQNR of each output and of the ten worst tensors against the float model;
        None when the model was not quantized."""
    @property
    def num_of_cores(self) -> int:
        """Compute threads of each run."""

def compile(
    model: _Path,
    output: Optional[_Path] = None,
    options_path: Optional[_Path] = None,
    **kwargs: Any,
) -> str:
    """Compiles ``model`` (.onnx) into the program file ``output`` (``.kiln``); returns its path."""
