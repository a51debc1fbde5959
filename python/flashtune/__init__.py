"""flashtune: tuned FlashAttention kernels for the GPU in front of you.

`import flashtune` needs neither a GPU nor torch; flashtune.torch (imported on its own) holds the
PyTorch custom op, the FlashAttention module and explain(). The kernels live in the C++ runtime
library libflashtune_attention.so, loaded through ctypes (flashtune._lib) at first use.

flashtune.tune(shapes, ...) tunes for the GPU in front of you into the user's store, which the runtime reads
first; flashtune.tune_model(model, example_inputs) tunes the attention calls one step of a model makes; `python -m flashtune <command>` runs the CLI the package carries (tune, best, emit, report, ...).
"""
from ._lib import (  # noqa: F401
    CompileError,
    CudaError,
    FlashtuneError,
    InvalidArgumentError,
    LibraryNotFoundError,
    NoGpuError,
    UnsupportedError,
    library_path,
)
from ._lib import device_available as _device_available
from ._lib import version as _version
from ._model import tune_model  # noqa: F401
from ._tune import tune  # noqa: F401

__version__ = "0.8.0"


def device_available():
    """(True, "") when the runtime finds a usable CUDA device, else (False, "one-line reason")."""
    return _device_available()


def runtime_version():
    """The loaded runtime library's ft_version() ("0.8.0"); raises LibraryNotFoundError without it."""
    return _version()
