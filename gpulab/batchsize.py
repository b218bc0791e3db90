"""Old path of gpulab.tools.batchsize, kept for one release."""
from ._moved import alias
alias(__name__, "gpulab.tools.batchsize")
