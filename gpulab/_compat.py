"""Old module paths keep working for one release: `import gpulab.matmul_lab` imports gpulab.lessons.matmul_lab
with a DeprecationWarning (the modules moved into lessons/, app/ and display/)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "gpulab.case_study": "gpulab.lessons.case_study",
    "gpulab.compile_checks": "gpulab.lessons.compile_checks",
    "gpulab.compile_lab": "gpulab.lessons.compile_lab",
    "gpulab.course": "gpulab.app.course",
    "gpulab.data_lab": "gpulab.lessons.data_lab",
    "gpulab.html_export": "gpulab.app.html_export",
    "gpulab.matmul_lab": "gpulab.lessons.matmul_lab",
    "gpulab.measuring_claims": "gpulab.lessons.measuring_claims",
    "gpulab.measuring_lab": "gpulab.lessons.measuring_lab",
    "gpulab.measuring_lesson": "gpulab.lessons.measuring_lesson",
    "gpulab.plots": "gpulab.display.plots",
    "gpulab.precision_lab": "gpulab.lessons.precision_lab",
    "gpulab.selfcheck": "gpulab.app.selfcheck",
    "gpulab.summary": "gpulab.app.summary",
    "gpulab.sync_lab": "gpulab.lessons.sync_lab",
    "gpulab.tensor_cores_lesson": "gpulab.lessons.tensor_cores_lesson",
    "gpulab.widgets": "gpulab.display.widgets"
,}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:
        pass


class _MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; the old path is deprecated", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on sys.meta_path once."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())
