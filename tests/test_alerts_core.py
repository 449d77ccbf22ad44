"""The alert queue's pure logic (core/alerts.py): dedup by fingerprint and state, All Clear
counting, reminders, folding into a host's alert — values in, values out, ``now`` a parameter.
The queue is typed (issue 10, item 5) and its file format unchanged."""

from __future__ import annotations

from dataclasses import replace

from gpuheal.core import alerts
from gpuheal.core.alert import Tries
from gpuheal.rules import ALL

NOW = 1_800_000_000.437  # real time is not whole seconds
POLICY = alerts.AlertPolicy.of(ALL)  # what the rules declare about their alerts


def escalated(gpu, issue, since="S", **kw):
    a = alerts.issue_alert(gpu, issue, "escalated", since, NOW, f"{issue} on {gpu}", run_id="r", detected={},
                           tried=[], attempts=1)  # fmt: skip
    return replace(a, **kw)


def test_one_alert_per_fingerprint_and_state():
    data = alerts.AlertQueue()
    assert data.enqueue(escalated("gpu-a", "model-stuck"))
    assert not data.enqueue(escalated("gpu-a", "model-stuck")), "same state: a duplicate"
    assert data.enqueue(escalated("gpu-a", "model-stuck", since="T")), "new state replaces the queued one"
    assert [a.state_key for a in data.queue] == ["escalated:T"]
    alerts.record_sent(data, data.queue[0], NOW, 7)
    data.queue.clear()
    assert not data.enqueue(escalated("gpu-a", "model-stuck", since="T")), "already sent in this state"


def test_all_clear_on_every_nth_clean_cycle_and_any_other_cycle_starts_over():
    data = alerts.AlertQueue()
    for _ in range(2):
        alerts.count_clean_cycle(data, True, 3, NOW)
    alerts.count_clean_cycle(data, False, 3, NOW)
    assert data.clean_cycles == 0 and data.queue == []
    for _ in range(3):
        alerts.count_clean_cycle(data, True, 3, NOW)
    assert [a.kind for a in data.queue] == ["all-clear"] and data.clean_cycles == 0


def test_a_hosts_escalations_fold_into_its_host_unreachable_alert():
    data = alerts.AlertQueue()
    for a in (escalated("gpu-a", "model-stuck"), escalated("gpu-a", "host-unreachable"), escalated("gpu-b", "vram-leak")):
        data.enqueue(a)
    messages, absorbed, duplicates = alerts.fold(data, {("gpu-a", "host-unreachable"), ("gpu-a", "model-stuck")}, POLICY)
    assert [(m.alert.fingerprint, [f.fingerprint for f in m.folded]) for m in messages] == [
        ("gpu-a/host-unreachable", ["gpu-a/model-stuck"]),
        ("gpu-b/vram-leak", []),
    ]
    assert absorbed == [] and duplicates == []


def test_reminders_only_for_what_is_still_open_and_old_enough():
    data = alerts.AlertQueue()
    alerts.record_sent(data, escalated("gpu-a", "model-stuck"), NOW - 4 * 3600 - 0.5, 1)
    alerts.record_sent(data, escalated("gpu-b", "model-stuck"), NOW - 3600, 2)
    open_keys = {("gpu-a", "model-stuck"), ("gpu-b", "model-stuck")}
    due = alerts.due_reminders(data, open_keys, NOW, 4 * 3600, policy=POLICY)
    assert [(r.fingerprint, r.reminder) for r in due] == [("gpu-a/model-stuck", 1)]
    assert alerts.due_reminders(data, None, NOW, 4 * 3600, policy=POLICY) == [], "no health document: nothing known broken"


def test_damaged_times_in_the_dedup_memory_are_not_fatal():
    data = alerts.AlertQueue.from_json({"queue": [{"fingerprint": "a/b", "state_key": "k", "delivery": {"not_before": 10**400}}],
                                        "sent": {"x/y": {"kind": "escalated", "sent_at": 10**400, "alert": {"gpu": "x"}}},
                                        "clean_cycles": 10**400})  # fmt: skip
    assert data.queue[0].not_before == 0.0
    alerts.due_reminders(data, {("x", "y")}, NOW, 3600, policy=POLICY)
    alerts.prune_sent(data, set(), NOW)
    assert "x/y" not in data.sent and data.clean_cycles == 1 << 31


def test_the_file_format_round_trips_unchanged():
    """A queue document as the previous release wrote it (heal's alert, a reminder with its
    delivery bookkeeping, a queued weekly report, a renderer's extra field) reads into records and
    writes back the same."""
    doc = {
        "queue": [
            {**escalated("gpu-a", "model-stuck").to_json(), "severity": "critical"},
            {**escalated("gpu-b", "vram-leak").to_json(), "reminder": 2,
             "delivery": {"tries": 1, "last_try_at": NOW, "last_error": "HTTP 500", "not_before": NOW + 30}},
            {"fingerprint": "fleet/weekly-report", "gpu": "fleet", "issue": None, "kind": "report",
             "state_key": "weekly:x", "created_at": NOW, "run_id": None, "title": "t", "content": "t\nbody\n",
             "detected": {}, "tried": [], "attempts": 0, "since": None, "summary": "weekly benchmark report"},
        ],
        "sent": {"gpu-c/model-stuck": {"kind": "escalated", "sent_at": NOW, "state_key": "escalated:S"}},
        "clean_cycles": 4,
    }  # fmt: skip
    data = alerts.AlertQueue.from_json(doc)
    assert [a.kind for a in data.queue] == ["escalated", "escalated", "report"]
    assert data.queue[1].delivery == Tries(1, NOW, "HTTP 500", NOW + 30) and data.queue[1].reminder == 2
    assert data.to_json() == doc
    assert alerts.normalise({"queue": ["junk", {"no": "fingerprint"}], "clean_cycles": "x"}) == alerts.AlertQueue().to_json()


def test_a_failed_try_and_a_hold_are_noted_on_the_queued_record():
    data = alerts.AlertQueue()
    data.enqueue(escalated("gpu-a", "model-stuck"))
    data.enqueue(escalated("gpu-b", "model-stuck"))
    data.note_failure([data.queue[0]], NOW, "HTTP 500")
    data.hold(NOW + 60)
    first, second = data.queue
    assert (first.delivery.tries, first.delivery.last_error, first.not_before) == (1, "HTTP 500", NOW + 60)
    assert (second.delivery.tries, second.not_before) == (0, NOW + 60)
    assert second.to_json()["delivery"] == {"not_before": NOW + 60}


def test_wrong_typed_fields_of_a_queued_alert_and_a_dedup_entry_are_read_as_not_known():
    """A damaged alerts.json (hand edits, an older writer): every field of the wrong type reads as
    "not known" and the queue still folds, reminds, prunes and writes back — never a crash."""
    junk = {"fingerprint": "gpu-a/model-stuck", "gpu": "gpu-a", "issue": "model-stuck", "kind": "escalated",
            "state_key": "k", "created_at": "yesterday", "tried": "restart", "attempts": "3", "detected": ["x"],
            "since": 5, "reminder": "junk", "unfolded": "yes", "delivery": "soon", "summary": None}  # fmt: skip
    data = alerts.AlertQueue.from_json({
        "queue": [junk, None, 7],
        "sent": {"gpu-b/model-stuck": {"kind": "escalated", "sent_at": "x", "alert": "junk", "folded_into": 3},
                 "gpu-c/x": "junk"},
        "clean_cycles": True,
    })  # fmt: skip
    (a,) = data.queue
    assert (a.created_at, a.tried, a.attempts, a.detected, a.since) == (None, (), None, {}, None)
    assert (a.reminder, a.unfolded, a.delivery, a.summary, a.not_before) == (0, False, None, "", 0.0)
    assert list(data.sent) == ["gpu-b/model-stuck"] and data.clean_cycles == 0
    open_keys = {("gpu-a", "model-stuck"), ("gpu-b", "model-stuck")}
    assert alerts.due_reminders(data, open_keys, NOW, 3600, policy=POLICY) == [], "a dedup entry without its alert is not repeated"
    messages, _, _ = alerts.fold(data, open_keys, POLICY)
    assert [m.alert.fingerprint for m in messages] == ["gpu-a/model-stuck"]
    assert alerts.unfold(data, "gpu-b", open_keys, POLICY) == []
    alerts.prune_sent(data, open_keys, NOW)
    assert data.sent == {}, "a junk time and no alert to say which issue: nothing to keep it for"
    assert alerts.AlertQueue.from_json(data.to_json()).to_json() == data.to_json()


# --------------------------------------------------------------------------- one cause, one message


def _msgs(*pairs, kind="escalated"):
    return [alerts.Message(replace(escalated(g, i), kind=kind)) for g, i in pairs]


def no_label(_gpu):
    return ""


def test_a_gpus_thermal_tiers_are_one_incident_whatever_the_queue_order():
    out = alerts.group(_msgs(("a", "thermal-warning"), ("a", "thermal-critical"), ("a", "thermal-rising")),
                       no_label, 10, POLICY)
    assert len(out) == 1 and out[0].alert.issue == "thermal-critical"
    assert sorted(t.issue for t in out[0].tiers) == ["thermal-rising", "thermal-warning"]
    assert len(out[0].members) == 3


def test_tier_two_inhibits_tier_one_only_on_the_same_gpu():
    out = alerts.group(_msgs(("a", "thermal-rising"), ("a", "thermal-warning"), ("b", "thermal-warning")),
                       no_label, 10, POLICY)
    assert [(m.alert.gpu, m.alert.issue, [t.issue for t in m.tiers]) for m in out] == [
        ("a", "thermal-rising", ["thermal-warning"]), ("b", "thermal-warning", [])]


def test_one_kind_across_gpus_is_one_message_and_a_label_splits_it():
    pairs = [(f"n{i}", "thermal-critical") for i in range(6)]
    assert len(alerts.group(_msgs(*pairs), no_label, 10, POLICY)) == 1
    out = alerts.group(_msgs(*pairs), lambda g: "r1" if g < "n3" else "r2", 10, POLICY)
    assert [sorted(str(m.alert.gpu) for m in msg.incidents) for msg in out] == [["n0", "n1", "n2"], ["n3", "n4", "n5"]]


def test_fleet_alerts_and_kinds_never_merge():
    out = alerts.group(_msgs(("fleet", "cooling-infrastructure"), ("fleet", "data-source-unreachable"))
                       + _msgs(("a", "thermal-critical"), kind="resolved") + _msgs(("b", "thermal-critical")),
                       no_label, 10, POLICY)
    assert len(out) == 4


def test_the_budget_keeps_every_member_in_one_summary():
    pairs = [(f"n{i}", issue) for i, issue in enumerate(["vram-leak", "model-stuck", "host-unreachable",
                                                           "benchmark-regression", "api-key-mismatch"])]
    msgs = _msgs(*pairs)
    out = alerts.group(msgs, no_label, 3, POLICY)
    assert len(out) == 3 and out[-1].summary and not out[0].summary
    assert sorted(a.gpu for m in out for a in m.members) == sorted(g for g, _ in pairs)


def test_a_group_of_ten_thousand_fits_one_message_and_names_what_it_can():
    from gpuheal.render.incident import group_content
    from gpuheal.zulip import MAX_CONTENT  # the sink's limit

    incidents = [{"gpu": f"gpu-{i:05d}", "issue": "thermal-critical", "detected": {"temp_c": 90}, "tried": []}
                 for i in range(10_000)]
    text = group_content(incidents, kind="escalated", issue="thermal-critical", summary=False, labels={},
                         limit=MAX_CONTENT)
    assert len(text) <= MAX_CONTENT
    assert "gpu-00000" in text and "more." in text and "10000 GPUs" in text


def test_hostile_gpu_text_is_escaped_in_the_table():
    from gpuheal.render.incident import group_content

    incidents = [{"gpu": "a|b", "issue": "x", "detected": {"temp_c": "@**all**"}, "summary": "`boom`"}]
    text = group_content(incidents, kind="escalated", issue="x", summary=False, labels={}, limit=10_000)
    assert "a\\|b" in text and "@**all**" not in text and "\\`boom\\`" in text
