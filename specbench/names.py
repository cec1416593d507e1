"""The one name plain decoding goes by, and how a run folder written before it had one reads under it.

PLAIN labels plain decoding wherever it appears: the drafter that proposes nothing, its method config, its rows and
the references every speedup names. Folders written before (method `autoregressive`; summary columns fastest_ar,
fastest_ar_any, speedup_vs_baseline) are read under today's names, so old results stay readable."""

from __future__ import annotations

PLAIN = "plain"
OLD_PLAIN = "autoregressive"
OLD_COLUMNS = {"fastest_ar": "fastest_plain", "fastest_ar_any": "fastest_plain_any",
               "speedup_vs_baseline": "speedup_vs_own_plain"}
# the command line's old settings (a key, or key=value) and what replaced them
OLD_SETTINGS = {"eval.fastest_ar": "eval.fastest_plain", "eval.baseline": "eval.plain",
                f"method={OLD_PLAIN}": f"method={PLAIN}"}
# the record fields and summary columns that hold a method's label
LABEL_FIELDS = ("method", "method_name", "reference", "fastest_plain", "fastest_plain_any", "agreement_reference")


def is_plain(label: str) -> bool:
    """Whether `label` names plain decoding: the run's own (PLAIN) or one on another execution (PLAIN@<what differs>);
    a method's label that merely begins with the word does not."""
    return label == PLAIN or label.startswith(f"{PLAIN}@")


def current_label(value):
    """`value` with plain decoding's old name (alone or as `autoregressive@<execution>`) replaced by PLAIN."""
    if isinstance(value, str) and (value == OLD_PLAIN or value.startswith(OLD_PLAIN + "@")):
        return PLAIN + value[len(OLD_PLAIN):]
    return value


def current_record(record: dict) -> dict:
    """A records.jsonl record under today's labels (changed in place and returned)."""
    for field in LABEL_FIELDS:
        if field in record:
            record[field] = current_label(record[field])
    return record


def current_columns(frame):
    """A summary table (a pandas DataFrame) under today's column names and labels."""
    frame = frame.rename(columns=OLD_COLUMNS)
    for field in LABEL_FIELDS:
        if field in frame:
            frame[field] = frame[field].map(current_label)
    return frame
