"""What the kernel families share: the launch path (``launch``), registration with PyTorch
(``registry``), validation (``validate``), tensor layouts (``layout``), device properties
(``device``), row-kernel machinery (``rows``), partial and column sums (``reduce``) and device
math (``math``). A family imports from here, never another family's private names."""

from tritonkit.ops._core.device import interpreter_enabled as _interpreter_enabled

if _interpreter_enabled():
    # Before any kernel runs: the interpreter rounds to bfloat16 as the GPU does (see there).
    from tritonkit.ops._core import interpreter as _interpreter

    _interpreter.install()
