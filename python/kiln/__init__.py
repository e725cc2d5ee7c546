"""kiln: compile and run ONNX models on the CPU, with qaic's Session API.

    import kiln, numpy as np
    sess = kiln.Session("model.onnx", num_of_cores=2, enable_metrics=True)
    out = sess.run({"input": np.zeros((1, 3, 224, 224), np.float32)})
    inf_completed, inf_rate, inf_time, batch_size = sess.run_benchmark()

`kiln.Session(model_path, options_path=None, **kwargs)` opens an ``.onnx`` model (compiled on
creation) or a compiled ``.kiln`` program; ``options_path`` is any configuration file kiln reads
and ``**kwargs`` any option of ``kiln config list`` (qaic, QAIRT, HTP and Axelera names and
aliases). ``kiln.compile(model, output, **kwargs)`` writes a ``.kiln`` program.
"""

from ._kiln import (
    CancelledError,
    ConfigurationError,
    InputError,
    KilnError,
    KilnWarning,
    LimitError,
    ModelError,
    ProgramFileError,
    RunOptions,
    Session,
    __version__,
    compile,
)

__all__ = [
    "Session",
    "RunOptions",
    "compile",
    "KilnError",
    "ModelError",
    "ConfigurationError",
    "InputError",
    "ProgramFileError",
    "LimitError",
    "CancelledError",
    "KilnWarning",
    "__version__",
]
