"""The notebooks' parameter schemas now live in the core, `gpulab.params` (the lesson helper checks them)."""
from ..params import *  # noqa: F401,F403
from ..params import SCHEMAS, Param, check_params, parse_value  # noqa: F401
