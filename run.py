"""specbench entry point: `python run.py [task=eval|train|profile] [group=choice ...] [key=value ...]`."""

import os
import sys

import hydra
from omegaconf import DictConfig

import specbench.config  # noqa: F401  (registers the resolvers the configs use)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub at run time


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    from specbench.errors import SpecbenchError
    from specbench.tasks import dispatch

    try:
        return dispatch(cfg)
    except SpecbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
