"""Old module paths that import for one more release as the module they moved to, with a DeprecationWarning."""
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {f"gpulab.{m}": f"gpulab.tools.{m}" for m in ("batchsize", "dataloading", "tracker")}
MOVED["gpulab.workloads.feeds"] = "gpulab.tools.feeds"


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def exec_module(self, module):
        warnings.warn(f"{module.__name__} moved to {MOVED[module.__name__]}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


sys.meta_path.append(OldPaths())
