"""Triton's CPU interpreter, made to convert float32 to bfloat16 as the GPU does.

The GPU rounds float32 to bfloat16 to nearest, ties to even (``cvt.rn.bf16.f32``: what
``x.to(tl.bfloat16)`` and a store into a bfloat16 tensor compile to). Triton 3.6's interpreter
truncates instead: its ``_convert_float`` drops the low 16 bits when no rounding mode is given;
its round-to-nearest mode rounds ties up and lets a mantissa carry spill into the exponent's
bits; both modes mangle float32 subnormals. Truncation doubles the rounding error and biases
it toward zero: a bfloat16 gradient checked on the CPU came out up to a few times PyTorch's
own error, as a float64 model of the same arithmetic with truncation predicts (see
docs/performance.md), so the CPU checks of bfloat16 outputs measured the interpreter, not the
kernel.

:func:`install` replaces the interpreter's float32 -> bfloat16 conversion with the GPU's
(rounding to nearest even; truncation, subnormals included, where a kernel asks for
round-toward-zero). tritonkit installs it on import when TRITON_INTERPRET is set, after
checking it on a few values: where Triton's interpreter has changed shape it is left alone
and :data:`ROUNDS_BF16` stays False, which the check engine reads to allow the truncation's
error again.

:func:`install` also runs every interpreted kernel under ``np.errstate(all="ignore")``: NumPy
warns (``RuntimeWarning: overflow encountered in exp2``, ``invalid value encountered in
subtract``) where the GPU's IEEE arithmetic quietly gives the inf or NaN the kernel means
(``exp2(-inf)`` of a masked score, ``inf - inf`` of a row holding inf); those warnings describe
the interpreter, not the user's program, and would reach the user from every such call (NumPy's
own ``RuntimeWarning``s inside a kernel, such as ``All-NaN slice encountered``, are ignored too).
"""

from __future__ import annotations

import warnings

import numpy as np

ROUNDS_BF16 = False  # True once the interpreter rounds float32 to bfloat16 to nearest even


def round_to_bfloat16(data: np.ndarray, toward_zero: bool = False) -> np.ndarray:
    """float32 values to bfloat16 bit patterns (uint16) as the GPU converts them: rounded to
    nearest, ties to even (a carry out of the mantissa moves into the exponent, up to
    infinity), or with ``toward_zero`` truncated; subnormals kept; NaN stays a quiet NaN of the
    same sign."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32).astype(np.uint64)
    if toward_zero:
        rounded = (bits >> 16).astype(np.uint16)
    else:
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(data, dtype=np.float32))
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded.reshape(np.shape(data))


def _quiet_numpy(interpreter) -> None:
    """Interpreted kernels run with NumPy's floating-point warnings off (see the module doc)."""
    executor = getattr(interpreter, "GridExecutor", None)
    call = vars(executor).get("__call__") if isinstance(executor, type) else None
    if call is None or getattr(call, "_tritonkit_quiet", False):
        return

    def quiet_call(self, *args, **kwargs):
        # errstate for the ufuncs' floating-point flags; the filter for the warnings NumPy
        # raises itself (np.nanmax's "All-NaN slice encountered").
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return call(self, *args, **kwargs)

    quiet_call._tritonkit_quiet = True
    executor.__call__ = quiet_call


def install() -> bool:
    """Make Triton's interpreter round float32 to bfloat16 to nearest even, with NumPy's
    floating-point warnings off inside kernels; True when it rounds (idempotent)."""
    global ROUNDS_BF16
    if ROUNDS_BF16:
        return True
    try:
        import triton.language as tl
        from triton._C.libtriton import ir
        from triton.runtime import interpreter
    except ImportError:
        return False
    _quiet_numpy(interpreter)
    original = getattr(interpreter, "_convert_float", None)
    rtz = getattr(getattr(ir, "ROUNDING_MODE", None), "RTZ", None)
    if original is None or rtz is None:
        return False

    def convert_float(data, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            return round_to_bfloat16(data, toward_zero=rounding_mode == rtz)
        return original(data, input_dtype, output_dtype, rounding_mode)

    # Checked before it is kept: a tie rounds to even, a carry reaches the exponent.
    probe = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.99999, -2.5], dtype=np.float32)
    expected = np.array([0x3F80, 0x3F82, 0x4000, 0xC020], dtype=np.uint16)
    interpreter._convert_float = convert_float
    try:
        as_cast = interpreter.InterpreterBuilder().cast_impl(
            interpreter.TensorHandle(probe, tl.float32), tl.bfloat16
        )
        ok = np.array_equal(np.asarray(as_cast.data).view(np.uint16), expected)
    except Exception:  # the interpreter's internals moved: leave it as it was
        ok = False
    if not ok:
        interpreter._convert_float = original
        return False
    ROUNDS_BF16 = True
    return True
