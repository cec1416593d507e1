"""The printout of this folder's A/B scripts (openmp_spin.py, static_models.py): per row, each side's median step over
the rounds, the ratio of the first side to the second and every round's step."""

from __future__ import annotations

import statistics


def report(steps: dict, rows, sides: tuple[str, str], labels: tuple[str, str]) -> None:
    """`steps[(row, side)]`: the rounds' mean steps in ms; `labels` says what each side ran."""
    for row in rows:
        new, old = (statistics.median(steps[row, side]) for side in sides)
        rounds = " / ".join(str([round(x, 2) for x in steps[row, side]]) for side in sides)
        print(f"{row}: step {new:.2f} ms {labels[0]}, {old:.2f} ms {labels[1]} ({new / old:.2f}x); rounds {rounds}")
