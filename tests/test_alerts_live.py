"""Issue 29: ``escalate``'s per-run work on ``alerts.json`` is proportional to what is live, not to the
30-day dedup memory. Its change detection (:func:`gpuheal.core.alerts.changed`) answers as the sorted JSON
of the whole document did (what it compared, twice a run, before), serialising only the queue and the entries
replaced since the load; :func:`~gpuheal.core.alerts.unfold` replaces an entry instead of changing the loaded
one in place (what that relies on); :func:`~gpuheal.core.alerts.due_reminders` parses only a due entry's
alert, and hostile entries are read as before. Performance is measured (benchmarks/README.md), not asserted."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuheal.core import alerts
from gpuheal.core.alert import Alert
from gpuheal.rules import ALL

NOW = 1_800_000_000.437
H = 3600.0
POLICY = alerts.AlertPolicy.of(ALL)
HOST = POLICY.host_issue or "host-unreachable"


def escalated(gpu: str, issue: str, kind: str = "escalated", since: str = "S") -> Alert:
    return alerts.issue_alert(gpu, issue, kind, since, NOW, f"{issue} on {gpu}", run_id="r", detected={"temp_c": 91.5},
                              tried=["restart-llama-server"], attempts=1)  # fmt: skip


def loaded(data: alerts.AlertQueue) -> alerts.AlertQueue:
    """``data`` as a run loads it from its file."""
    return alerts.AlertQueue.from_json(json.loads(json.dumps(data.to_json())))


def memory() -> alerts.AlertQueue:
    data = alerts.AlertQueue(clean_cycles=3)
    for i in range(30):
        alerts.record_sent(data, escalated(f"gpu-{i:02d}", "model-stuck"), NOW - (i + 1) * H, i)
    alerts.record_sent(data, escalated("gpu-h", HOST), NOW - H, 90)
    alerts.record_sent(data, escalated("gpu-h", "vram-leak"), NOW - H, 90, folded_into=f"gpu-h/{HOST}")
    data.enqueue(escalated("gpu-q", "thermal-critical"))
    return loaded(data)


def whole(data: alerts.AlertQueue) -> str:
    """What escalate compared before issue 29."""
    return json.dumps(data.to_json(), sort_keys=True, default=str)


def resend_same(data: alerts.AlertQueue) -> None:
    entry = data.sent["gpu-03/model-stuck"]
    data.sent["gpu-03/model-stuck"] = json.loads(json.dumps(entry))  # a new object, the same JSON


def message_id_as_float(data: alerts.AlertQueue) -> None:
    entry = data.sent["gpu-04/model-stuck"]
    data.sent["gpu-04/model-stuck"] = {**entry, "message_id": 4.0}  # == 4, but its JSON differs


def record_new(data: alerts.AlertQueue) -> None:
    alerts.record_sent(data, escalated("gpu-new", "vram-leak"), NOW, 99)


def prune(data: alerts.AlertQueue) -> None:
    alerts.prune_sent(data, set(), NOW + alerts.SENT_KEEP_S + 2 * H)


def unfold(data: alerts.AlertQueue) -> None:
    alerts.unfold(data, "gpu-h", {("gpu-h", "vram-leak")}, POLICY)


def queue_more(data: alerts.AlertQueue) -> None:
    data.queue.extend(alerts.due_reminders(data, {("gpu-07", "model-stuck")}, NOW, 4 * H, policy=POLICY))


def queue_same(data: alerts.AlertQueue) -> None:
    data.queue = [replace(a) for a in data.queue]


def held(data: alerts.AlertQueue) -> None:
    data.hold(NOW + 60)


def clean(data: alerts.AlertQueue) -> None:
    data.clean_cycles += 1


CHANGES: dict[str, tuple[Callable[[alerts.AlertQueue], None], bool]] = {
    "nothing": (lambda data: None, False),
    "an entry replaced by the same JSON": (resend_same, False),
    "an equal number whose JSON differs": (message_id_as_float, True),
    "a new entry": (record_new, True),
    "old entries pruned": (prune, True),
    "an absorbed escalation unfolded": (unfold, True),
    "a reminder queued": (queue_more, True),
    "the queue's alerts copied": (queue_same, False),
    "a 429's not-before": (held, True),
    "the clean-cycle count": (clean, True),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_changed_answers_as_the_whole_documents_sorted_json(name):
    data = memory()
    before, snapshot = whole(data), alerts.Snapshot.of(data)
    change, expected = CHANGES[name]
    change(data)
    assert alerts.changed(data, snapshot) is expected, name
    assert (whole(data) != before) is expected, f"{name}: the test's expectation is the old comparison's"


def test_changed_serialises_only_the_queue_and_the_replaced_entries(monkeypatch):
    data = memory()
    snapshot = alerts.Snapshot.of(data)
    record_new(data)
    del data.sent["gpu-new/vram-leak"]  # the same keys again; one entry replaced
    resend_same(data)
    seen: list[Any] = []
    real = alerts._sorted_json
    monkeypatch.setattr(alerts, "_sorted_json", lambda value: seen.append(value) or real(value))
    assert alerts.changed(data, snapshot) is False
    assert len(seen) == 3, "the replaced entry (now and as loaded) and the queue: never the untouched 31"


def test_unfold_replaces_the_entry_and_leaves_the_loaded_one_as_it_was():
    data = memory()
    fp = "gpu-h/vram-leak"
    was = data.sent[fp]
    out = alerts.unfold(data, "gpu-h", {("gpu-h", "vram-leak")}, POLICY)
    assert [a.fingerprint for a in out] == [fp]
    assert "folded_into" not in data.sent[fp] and was["folded_into"] == f"gpu-h/{HOST}"
    assert list(data.sent[fp]) == [k for k in was if k != "folded_into"], "the other keys in their order"


def test_due_reminders_parses_only_the_entries_that_are_due(monkeypatch):
    data = memory()
    parsed: list[Any] = []
    real = Alert.from_json.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Alert], value: Any) -> Alert | None:
        parsed.append(value)
        return real(cls, value)

    monkeypatch.setattr(Alert, "from_json", classmethod(counting))
    open_keys = {(f"gpu-{i:02d}", "model-stuck") for i in range(0, 30, 2)} | {("gpu-h", "vram-leak")}
    due = alerts.due_reminders(data, open_keys, NOW, 4 * H, policy=POLICY)
    assert sorted(a.gpu for a in due) == [f"gpu-{i:02d}" for i in range(4, 30, 2)]
    assert len(parsed) == len(due), "only a due entry's alert is parsed, not the whole 30-day memory"


HOSTILE: dict[str, Any] = {
    "gpu-a/model-stuck": {"kind": "escalated", "sent_at": "junk", "alert": {"gpu": "gpu-a", "issue": "model-stuck"}},
    "5/model-stuck": {"kind": "escalated", "sent_at": 0, "alert": {"gpu": 5, "issue": "model-stuck", "reminder": 3},
                      "reminders": "2"},
    "None/vram-leak": {"kind": "escalated", "alert": {"gpu": None, "issue": "vram-leak"}, "reminders": 1},
    "gpu-b/x": {"kind": "escalated", "sent_at": 0, "alert": ["not", "a", "dict"]},
    "gpu-c/x": {"kind": "escalated", "sent_at": 0},
    "gpu-d/model-stuck": {"kind": "resolved", "sent_at": 0, "alert": {"gpu": "gpu-d", "issue": "model-stuck"}},
    "gpu-e/model-stuck": {"kind": "escalated", "sent_at": 0, "folded_into": "gpu-e/host-unreachable",
                          "alert": {"gpu": "gpu-e", "issue": "model-stuck"}},
    "gpu-f/model-stuck": {"kind": "escalated", "sent_at": NOW, "alert": {"gpu": "gpu-f", "issue": "model-stuck"}},
    "gpu-g/model-stuck": {"kind": "escalated", "sent_at": 1e400, "alert": {"gpu": "gpu-g", "issue": "model-stuck",
                                                                          "tried": "junk", "detected": 7}},
}
for _id in POLICY.no_reminders:
    HOSTILE[f"gpu-n/{_id}"] = {"kind": "escalated", "sent_at": 0, "alert": {"gpu": "gpu-n", "issue": _id}}


def test_hostile_dedup_entries_are_read_as_before():
    data = alerts.AlertQueue.from_json({"queue": [], "sent": json.loads(json.dumps(HOSTILE, default=str))})
    open_keys = {("gpu-a", "model-stuck"), ("5", "model-stuck"), ("None", "vram-leak"), ("gpu-b", "x"),
                 ("gpu-c", "x"), ("gpu-d", "model-stuck"), ("gpu-e", "model-stuck"), ("gpu-f", "model-stuck"),
                 ("gpu-g", "model-stuck")} | {("gpu-n", i) for i in POLICY.no_reminders}  # fmt: skip
    due = alerts.due_reminders(data, open_keys, NOW, 4 * H, policy=POLICY)
    assert [(a.fingerprint, a.gpu, a.issue, a.reminder) for a in due] == [
        ("gpu-a/model-stuck", "gpu-a", "model-stuck", 1),
        ("5/model-stuck", "5", "model-stuck", 3),
        ("None/vram-leak", None, "vram-leak", 2),
    ], "a junk time is long ago; an infinite one never; a damaged alert field is not the entry's end"


def damaged(doc: dict[str, Any]) -> dict[str, Any]:
    """An old or damaged ``alerts.json``: junk a reader drops (a queued entry without a fingerprint, a dedup
    entry that is not an object, a count that is not one) and keys in another order."""
    return {"clean_cycles": "x", "sent": {**doc["sent"], "gpu-z/junk": 7}, "queue": [{"gpu": "no fingerprint"}]}


@pytest.mark.parametrize("stored", [lambda doc: doc, damaged], ids=["as written", "damaged"])
def test_escalate_leaves_an_unchanged_file_alone_and_writes_a_changed_one(tmp_path, monkeypatch, stored):
    from gpuheal.runtime import Runtime
    from gpuheal.state import files
    from gpuheal.state.store import StateDir
    from gpuheal.steps import escalate

    try:
        from tests.series import fleet_config
    except ImportError:
        from series import fleet_config
    monkeypatch.setenv("ZULIP_EMAIL", "bot@example.com")
    monkeypatch.setenv("ZULIP_API_KEY", "k" * 32)
    data = memory()
    data.queue.clear()
    state = tmp_path / "state"
    with StateDir(state, 5.0) as store:
        store.write(files.ALERTS, stored(data.to_json()))
        store.write_raw(files.GPU_HEALTH, {"schema_version": 1, "issues": []})
    path = state / files.ALERTS
    stamp = os.stat(path).st_mtime_ns, os.stat(path).st_ino
    rt = Runtime(cfg=fleet_config(), state_dir=state, now=datetime.fromtimestamp(NOW, UTC), json_out=True)
    with StateDir(state, 5.0) as store:
        escalate.command(rt, store)
    assert (os.stat(path).st_mtime_ns, os.stat(path).st_ino) == stamp, "nothing changed: not rewritten"
    later = Runtime(cfg=rt.cfg, state_dir=state, now=datetime.fromtimestamp(NOW + alerts.SENT_KEEP_S + 2 * H, UTC),
                    json_out=True)  # fmt: skip
    with StateDir(state, 5.0) as store:
        escalate.command(later, store)
        assert alerts.AlertQueue.from_json(store.read(files.ALERTS)).sent == {}, "the pruned memory is written"
