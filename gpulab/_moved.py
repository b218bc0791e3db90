"""Old module paths that import for one more release, each as the module it moved to, with a DeprecationWarning."""
import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make `import old` give the module `new`, warning that the path moved."""
    # stacklevel 3: the importing line (warnings skips the import machinery's own frames)
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
