"""hq: the hybrid quantization runtime (libhqcore) from Python.

A thin layer over the C library (cffi, API mode, built against the installed hq/hq.h): the C
library stays the one implementation. `hq.torch` adds PyTorch modules. docs/python.md has the
guide.
"""
from ._core import (BOTH, COLWISE, HOST, ROWWISE, Buffer, Checkpoint, CheckpointWriter, Context,
                    Error, GemmInfo, InvalidArgument, NotFound, NotSupported, ParseError, Plugins,
                    QTensor, Quantizer, Recipe, State, StateError, adam_step, as_tensor,
                    default_recipe, device_count, gemm, info, last_error, linear_dgrad,
                    linear_fprop, linear_wgrad, quantize, version)

__all__ = ["BOTH", "COLWISE", "HOST", "ROWWISE", "Buffer", "Checkpoint", "CheckpointWriter",
           "Context", "Error", "GemmInfo", "InvalidArgument", "NotFound", "NotSupported",
           "ParseError", "Plugins", "QTensor", "Quantizer", "Recipe", "State", "StateError",
           "adam_step", "as_tensor", "default_recipe", "device_count", "gemm", "info",
           "last_error", "linear_dgrad", "linear_fprop", "linear_wgrad", "quantize", "version"]
__version__ = version()
