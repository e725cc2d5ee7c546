"""Type stubs of the ``kiln`` package."""

from ._kiln import (
    ConfigurationError as ConfigurationError,
    InputError as InputError,
    KilnError as KilnError,
    KilnWarning as KilnWarning,
    ModelError as ModelError,
    ProgramFileError as ProgramFileError,
    Session as Session,
    __version__ as __version__,
    compile as compile,
)
