"""Old path of gpulab.tools.dataloading, kept for one release."""
from ._moved import alias
alias(__name__, "gpulab.tools.dataloading")
