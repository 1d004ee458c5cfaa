"""The JSONL metrics `mcpp train --metrics-path OUT/NAME.jsonl` writes, as the device scripts read them
(bench/gpu/*.sh tables, tests/device/loss_check.py): one reader for all of them."""
import json


def records(out, name, event=None):
    """NAME's metric records ([] when the file is missing), only those of `event` when given."""
    try:
        with open(f"{out}/{name}.jsonl") as f:
            recs = [json.loads(line) for line in f]
    except OSError:
        return []
    return recs if event is None else [r for r in recs if r.get("event") == event]


def last_iteration(out, name):
    """NAME's last logged training iteration (a record with tokens_per_sec), or None."""
    it = [r for r in records(out, name) if "tokens_per_sec" in r]
    return it[-1] if it else None
