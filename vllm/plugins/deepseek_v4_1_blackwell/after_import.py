# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run a function right after a module is first imported.

The plugin is loaded in every vLLM process, but only the processes that build
a DeepSeek V4.1 model need the bindings into its modules. Deferring them to
the import of those modules keeps other processes (and other models) from
importing DeepSeek V4.1 code at all.
"""

import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_lock = threading.Lock()


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the other finders and
    makes the loader of the spec they return call the callbacks after it
    has executed the module."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        with _lock:
            callbacks = self.pending.pop(fullname, None)
        if callbacks is None:
            return None
        spec = self._spec_from_other_finders(fullname, path, target)
        if spec is None:
            return None
        # Patch this spec's own loader instance: the module keeps its real
        # loader (source, resources) and only gains the calls.
        exec_module = spec.loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_call  # type: ignore[method-assign]
        return spec

    def _spec_from_other_finders(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                return spec
        return None


_finder = _AfterImportFinder()


def after_import(module_name: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once ``module_name`` has been executed: now if it
    already has, else right after its first import finishes. An exception
    from ``callback`` fails that import."""
    with _lock:
        if module_name not in sys.modules:
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            callbacks = _finder.pending.setdefault(module_name, [])
            if callback not in callbacks:
                callbacks.append(callback)
            return
    callback()
