"""Old path of gpulab.tools.tracker, kept for one release."""
from ._moved import alias
alias(__name__, "gpulab.tools.tracker")
