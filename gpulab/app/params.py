"""The notebooks' parameter schemas live in the core, `gpulab.verdicts.params`; these are the names the runner uses."""
from ..verdicts.params import SCHEMAS, Param, check_params, parse_value

__all__ = ["SCHEMAS", "Param", "check_params", "parse_value"]
