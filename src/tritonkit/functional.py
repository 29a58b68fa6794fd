"""The public functions of tritonkit, one import away: ``from tritonkit.functional import gelu``.

Derived from the families (``tritonkit.ops.FAMILIES``, each family's ``__all__``): importing
this module imports every family.
"""

import importlib

from tritonkit.ops import FAMILIES


def _export() -> list[str]:
    names: dict[str, str] = {}
    for family in FAMILIES:
        module = importlib.import_module(f"tritonkit.ops.{family}")
        for name in module.__all__:
            if name in names:
                raise ImportError(
                    f"tritonkit: {name!r} is exported by families {names[name]!r} and {family!r}"
                )
            names[name] = family
            globals()[name] = getattr(module, name)
    return sorted(names)


__all__ = _export()
