"""`python run.py [task=eval|train|profile|...] [group=choice ...] [key=value ...]`: the same as the installed
`specbench` command (specbench/cli.py), kept so a checkout runs without installing the console script."""

from specbench.cli import main

if __name__ == "__main__":
    main()
