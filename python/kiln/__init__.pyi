"""Type stubs of the ``kiln`` package."""

from ._kiln import (
    CancelledError as CancelledError,
    ConfigurationError as ConfigurationError,
    InputError as InputError,
    KilnError as KilnError,
    KilnWarning as KilnWarning,
    LimitError as LimitError,
    ModelError as ModelError,
    ProgramFileError as ProgramFileError,
    RunOptions as RunOptions,
    Session as Session,
    __version__ as __version__,
    compile as compile,
)
