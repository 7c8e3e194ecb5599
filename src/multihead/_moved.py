"""Old module names that still import, for one release: ``import multihead.<package>.<old>`` gives the module at its
new place, with a DeprecationWarning naming it (:func:`keep_old_names`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings


class OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import PACKAGE.<old>``: the module ``PACKAGE.<moved[old]>`` (already executed), with a warning."""

    def __init__(self, package: str, moved: dict[str, str]) -> None:
        self.package, self.moved = package, moved

    def find_spec(self, fullname, path, target=None):
        package, _, leaf = fullname.rpartition(".")
        if package != self.package or leaf not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = f"{self.package}.{self.moved[spec.name.rpartition('.')[2]]}"
        warnings.warn(
            f"{spec.name} moved to {new}; the old name goes in the next release", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # the module at its new place is already executed
        pass


def keep_old_names(package: str, moved: dict[str, str]) -> None:
    """Let ``package``'s old module names (``moved``: old leaf -> new dotted path inside ``package``) import, once
    per package however often this is called."""
    if not any(isinstance(f, OldNames) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(OldNames(package, moved))
