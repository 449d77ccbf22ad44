"""The recorded history in the state directory: two files, so that a cron run rewrites only what changed.

``history.json`` holds the raw tier (every poll appends to it); ``history-coarse.json`` the coarse tier
(:mod:`gpuheal.state.history`), which changes once every ``coarse_bucket_s`` — a 100-GPU week holds ~5 MB
of coarse buckets, which each cron run read and wrote back unchanged while they shared one file (issue 29).
A state directory of the earlier layout (the coarse tier inside ``history.json``) is read as it is and
moved to this one by its first save.
"""

from __future__ import annotations

from gpuheal.state import files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir


def load_history(store: StateDir) -> History:
    """The recorded history (either layout); a corrupt file is set aside and its tier starts empty."""
    data = store.read(files.HISTORY, {})
    coarse = store.read(files.HISTORY_COARSE, None)
    return History.from_files(data, coarse)


def save_history(store: StateDir, history: History) -> None:
    """Both tiers: the coarse file first, only when it changed (removed when the tier is empty), then
    ``history.json``. A run stopped between the two leaves buckets in both files, or the earlier layout's
    in ``history.json``: read back, the samples folded twice are folded once (``History.compact`` never
    folds a bucket again), and an earlier layout's coarse tier wins over its coarse file."""
    data, coarse = history.encoded_files()  # the text of History.to_files' documents
    if coarse is not None:
        if history.coarse_gpus():
            store.write_encoded(files.HISTORY_COARSE, coarse)
        else:
            store.remove(files.HISTORY_COARSE)
    store.write_encoded(files.HISTORY, data)  # a few large packed strings
