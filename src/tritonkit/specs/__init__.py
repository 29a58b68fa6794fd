"""Operator specs, one module per family; importing this package registers them all.

Every module here whose name does not start with an underscore is a family's spec module and
is imported, so a new family registers itself by adding its file.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
