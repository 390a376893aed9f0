"""fedlib: a thin, vectorized PyTorch library for federated client contribution
estimation, valuation and selection."""

from ._version import __version__  # noqa: E402

from .config import ConfigError, RunConfig, ScmConfig, load_config, make_config  # noqa: E402
from .run import RunResult, run, run_many  # noqa: E402

__all__ = ["ConfigError", "RunConfig", "RunResult", "ScmConfig", "load_config", "make_config", "run", "run_many", "__version__"]
