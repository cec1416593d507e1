"""The `specbench` command (and `python run.py`): Hydra composes the run from the config groups shipped in
specbench/conf, then specbench.tasks.dispatch runs it. Bad input ends as one `error:` line and exit code 2."""

import os
import sys
import warnings

import hydra
from omegaconf import DictConfig

import specbench.config  # noqa: F401  (registers the resolvers the configs use)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub at run time
# Every forward passes past_key_values=, which transformers 5.24 renames to cache= (the pin in pyproject.toml stops
# below its removal in 5.40). Its FutureWarning says nothing about the user's run, so it stays off their terminal.
warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    from omegaconf.errors import OmegaConfBaseException

    from specbench.errors import SpecbenchError
    from specbench.schema import config_error
    from specbench.tasks import dispatch

    try:
        return dispatch(cfg)
    except (SpecbenchError, OmegaConfBaseException) as exc:  # an OmegaConf error is a config the user can fix too
        exc = config_error(exc) if isinstance(exc, OmegaConfBaseException) else exc
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
