"""Rule 10 as the spec writes it (issue 22 item 6): role as well as weight, from spend logs, LiteLLM's
counters or gpu-monitor (each reading names its source), and heal's follow-through — one alert per
incident, 24 h to match its role, an agent alias audit past 48 h — under jittered clocks."""

from __future__ import annotations

import copy
import random

import pytest

try:
    from tests.series import FLEET_YAML, fleet_trace, polls, run
except ImportError:
    from series import FLEET_YAML, fleet_trace, polls, run

from gpuheal.config import load_config_dict
from gpuheal.config.model import Role
from gpuheal.core import routing
from gpuheal.core.issue import Issue
from gpuheal.core.routing import Deployment, Reading, counter_increase, judge, tally
from gpuheal.errors import ConfigError
from gpuheal.parse.litellm_spend import SpendRow
from gpuheal.rules.workload_misrouted.remedy import Followup, followup

ISSUE = "workload-misrouted"
LIGHT = Role("vision, light tasks", model_groups=("light",), request_tags=("vision", "web"), max_prompt_tokens=4000)


def row(model_id="gpu-light", group="light", tags=("vision",), prompt=100, api_base=None) -> SpendRow:
    return SpendRow(model_id, group, api_base, tags, prompt, 0.0)


# --------------------------------------------------------------------------- judging one request


@pytest.mark.parametrize(("r", "want"), [
    (row(), (True, None)),
    (row(group="heavy"), (False, routing.Criterion.MODEL_GROUP)),
    (row(tags=("code",)), (False, routing.Criterion.TAGS)),
    (row(prompt=90_000), (False, routing.Criterion.PROMPT)),
    (row(tags=None), (None, None)),  # tags not known, nothing broken: not judged
    (row(tags=None, prompt=90_000), (False, routing.Criterion.PROMPT)),  # one known break is enough
])
def test_a_request_is_inside_its_role_only_when_every_criterion_holds(r, want):
    assert routing.judge_request(LIGHT, r) == want


def test_rows_go_to_their_gpu_by_model_id_else_api_base_and_are_tallied():
    gpus = [Deployment("gpu-light", frozenset({"gpu-light", "light-1"}), "http://ct110:8080", LIGHT),
            Deployment("gpu-dense", frozenset({"gpu-dense"}), "http://ct8:8080", None)]
    rows = [row(), row(model_id="light-1", tags=("code",)), row(model_id=None, api_base="http://ct110:8080/v1/"),
            row(model_id="x", api_base="http://ct8:8080"), row(model_id="other", api_base="http://elsewhere"),
            row(tags=None)]
    t = tally(rows, gpus, 3600.0)
    assert (t["gpu-light"].requests, t["gpu-light"].outside, t["gpu-light"].unknown) == (4, 1, 1)
    assert t["gpu-light"].outside_by == (("request tags", 1),)
    assert (t["gpu-dense"].requests, t["gpu-dense"].outside) == (1, 0)  # no role: counted, never judged


def test_a_counter_that_went_down_is_a_proxy_restart_and_counts_from_zero():
    assert counter_increase([(0, 10), (60, 20), (120, 5), (180, 15)]) == 25
    assert counter_increase([(0, 10)]) is None


# --------------------------------------------------------------------------- the verdict

WEIGHTS = {"gpu-dense": 0.55, "gpu-light": 0.15, "strix-moe": 0.30}


def readings(light: Reading) -> dict[str, Reading]:
    return {"gpu-dense": Reading(550, light.source), "gpu-light": light, "strix-moe": Reading(300, light.source)}


def verdict(light: Reading, **kw):
    args = {"tolerance_ratio": 0.5, "role_tolerance_ratio": 0.1, "min_requests": 20} | kw
    return judge("gpu-light", readings(light), WEIGHTS, "vision, light tasks", **args)


def test_a_gpu_serving_outside_its_role_is_misrouted_even_at_its_weight():
    v = verdict(Reading(150, routing.SPEND_LOGS, outside=30, outside_by=(("request tags", 30),),
                        judged=("model group", "request tags")))
    assert isinstance(v, routing.Verdict)
    assert v.detected["outside_role_pct"] == 20 and v.detected["share_pct"] == 15 and v.detected["source"] == "spend-logs"
    assert "outside its role (request tags: 30)" in v.summary and "alias" in v.summary


def test_within_the_role_tolerance_and_weight_is_quiet():
    assert verdict(Reading(150, routing.SPEND_LOGS, outside=10, judged=("model group",))) is False


def test_counters_judge_the_model_group_and_say_what_they_cannot():
    r = routing.from_counters(150, "heavy", LIGHT)
    assert (r.outside, r.judged, r.not_judged) == (150, ("model group",), ("request tags", "prompt tokens"))
    v = verdict(r)
    assert v.detected["not_judged"] == ["request tags", "prompt tokens"] and v.detected["source"] == "litellm-counters"


def test_gpu_monitor_judges_weight_only_and_too_few_requests_is_not_known():
    r = routing.from_monitor(150, LIGHT)
    assert r.judged == () and r.not_judged == ("model group", "request tags", "prompt tokens")
    assert verdict(r) is False
    assert verdict(Reading(1, routing.MONITOR), min_requests=10_000) is None
    assert judge("gpu-light", {}, WEIGHTS, None, tolerance_ratio=0.5, role_tolerance_ratio=0.1, min_requests=1) is None


# --------------------------------------------------------------------------- through the engine


def role_config(light_role):
    data = copy.deepcopy(FLEET_YAML)
    data["gpus"][1]["role"] = light_role
    return load_config_dict(data)


def test_rule10_fires_from_litellms_counters_when_a_gpu_serves_another_model_group():
    cfg = role_config({"name": "vision, light tasks", "model_groups": ["light"]})
    counters = {"gpu-dense": "0+22x80", "gpu-light": "0+6x80", "strix-moe": "0+12x80"}
    groups = {"gpu-dense": "heavy*81", "gpu-light": "heavy*81", "strix-moe": "moe*81"}
    trace = fleet_trace(cfg, {a: {"litellm_requests_total": counters[a], "litellm_model_group": groups[a]}
                              for a in counters})
    r = run(cfg, trace)
    assert polls(r, "gpu-light", ISSUE, "pending") == [4]  # 6 requests a minute: 24 > min_requests at poll 4
    assert polls(r, "gpu-light", ISSUE) == [65]  # then hold_s 3600, "more than"
    assert polls(r, "gpu-dense", ISSUE) == []  # no role of its own, at its weight
    issue = next(i for i in r.open_at_end if i.issue == ISSUE and i.gpu == "gpu-light")
    assert issue.detected["source"] == "litellm-counters" and issue.detected["outside_role_pct"] == 100


def test_a_role_object_is_checked_by_the_schema():
    with pytest.raises(ConfigError) as err:
        role_config({"model_groups": "light"})
    assert "role" in str(err.value.key_path)
    assert role_config("plain text").gpus[1].role_kinds is None


# --------------------------------------------------------------------------- heal's follow-through

H = 3600.0


@pytest.mark.parametrize("seed", range(5))
def test_followup_alerts_once_waits_24h_then_audits_past_48h_under_a_cron_clock(seed):
    late = random.Random(seed)

    def at(hours: float) -> float:  # cron starts us 0.2-2 s late
        return 1_000_000.0 + hours * H + late.uniform(0.2, 2.0)

    since = 1_000_000.0
    step = dict(verify_within_s=24 * H, escalate_after_s=48 * H, tolerance_s=15.0)
    assert followup(since, None, at(1), **step) is Followup.ALERT
    alerted = at(1)
    assert followup(since, alerted, at(2), **step) is Followup.WAITING
    assert followup(since, alerted, at(25) - 3, **step) is Followup.NOT_VERIFIED  # 24 h after the alert, a poll early
    assert followup(since, alerted, at(47.99), **step) is Followup.NOT_VERIFIED
    assert followup(since, alerted, at(48) - 3, **step) is Followup.AUDIT  # a poll that starts a second early
    assert followup(since, None, at(49), **step) is Followup.AUDIT


# --------------------------------------------------------------------------- heal --apply, run after run


def heal_run(tmp_path, cfg, now_s: float, issues: list[dict]):
    """One ``heal --apply`` run on a real state directory, its poll's issues given (the engine's part is
    tested above): what it queued and audited."""
    import json
    from datetime import UTC, datetime
    from types import SimpleNamespace
    from unittest import mock

    from gpuheal.core.memory import Memory
    from gpuheal.model import Observation
    from gpuheal.state.store import StateDir
    from gpuheal.steps.heal import Heal

    now = datetime.fromtimestamp(now_s, UTC)
    obs = Observation(at=now, gpus={}, monitor_ok=True)
    result = SimpleNamespace(issues=issues, obs=obs, health={"status": "healthy", "issues": issues, "gpus": {}},
                             evaluation=SimpleNamespace(inhibited=[], tolerance_s=15.0, memory=Memory()))
    with StateDir(tmp_path, 10) as store, mock.patch.object(Heal, "_check", lambda self, gpu: result):
        Heal(cfg, store, now, apply=True).run(None, None)
        queue = store.read("alerts.json", {})["queue"]
    log = tmp_path / "gpu-self-heal-log.jsonl"
    audit = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return queue, audit


def test_heal_alerts_once_then_asks_for_an_alias_audit_past_48h_then_says_resolved(tmp_path):
    cfg = role_config({"name": "vision, light tasks", "model_groups": ["light"]})
    since_s = 1_784_361_600.0
    since = "2026-07-18T08:00:00Z"
    misrouted = [Issue.from_json({"gpu": "gpu-light", "issue": ISSUE, "severity": "info", "state": "firing", "since": since,
                  "summary": "gpu-light (vision, light tasks) 100 % of its requests are outside its role",
                  "detected": {"source": "litellm-counters", "outside_role_pct": 100.0}})]
    late = random.Random(7)
    runs = {}
    for hours in (0, 0.02, 2, 25, 47.99, 48, 49):
        runs[hours] = heal_run(tmp_path, cfg, since_s + hours * H + late.uniform(0.2, 2.0), misrouted)
    first_queue, first_audit = runs[0]
    assert [(a["gpu"], a["kind"], a["state_key"]) for a in first_queue] == [("gpu-light", "escalated", f"escalated:{since}")]
    assert len([r for r in first_audit if r["escalated"]]) == 1
    assert runs[47.99][0] == first_queue and len(runs[47.99][1]) == len(first_audit)  # nothing new for 48 h
    queue, audit = runs[49]
    audits = [a for a in queue if a["state_key"] == f"audit:{since}"]
    assert len(audits) == 1 and "agent alias audit needed" in audits[0]["summary"]
    assert len([r for r in audit if r["escalated"]]) == 2  # the alert, then the audit: once each
    queue, _ = heal_run(tmp_path, cfg, since_s + 50 * H, [])  # its pattern matches its role again
    assert ("gpu-light", "resolved") in {(a["gpu"], a["kind"]) for a in queue}


def test_rule10_from_spend_tallies_judges_tags_and_names_its_source():
    from dataclasses import replace

    from gpuheal.model import RoleTally

    cfg = role_config({"name": "vision, light tasks", "request_tags": ["vision"]})
    tallies = {"gpu-dense": RoleTally(550, 0, 0, 3600.0), "strix-moe": RoleTally(300, 0, 0, 3600.0),
               "gpu-light": RoleTally(150, 60, 10, 3600.0, (("request tags", 60),))}
    trace = [replace(o, gpus={a: replace(s, routing=tallies[a]) for a, s in o.gpus.items()})
             for o in fleet_trace(cfg, n=70)]
    r = run(cfg, trace)
    assert polls(r, "gpu-light", ISSUE, "pending") == [0] and polls(r, "gpu-light", ISSUE) == [61]
    d = next(i for i in r.open_at_end if i.gpu == "gpu-light").detected
    assert (d["source"], d["outside_role_pct"], d["outside_by"], d["role_unknown"]) == (
        "spend-logs", 42.9, {"request tags": 60}, 10)  # 60 of the 140 judgeable
    assert "not_judged" not in d and polls(r, "gpu-dense", ISSUE, "pending") == []


def test_litellms_request_counts_keep_rule10_on_without_gpu_monitor():
    from datetime import UTC, datetime

    from gpuheal.core.coverage import from_litellm, rules_off
    from gpuheal.model import Observation
    from gpuheal.rules import ALL

    obs = Observation(datetime(2026, 7, 18, tzinfo=UTC), {}, True, source="smi")
    assert ISSUE in {o["rule"] for o in rules_off("smi", obs, ALL)}
    assert ISSUE not in {o["rule"] for o in rules_off("smi", obs, ALL, from_litellm("http://127.0.0.1:4000", True, False))}
    assert from_litellm(None, True, True) == frozenset() and from_litellm("http://x", False, False) == frozenset()


def test_a_rule10_alert_gets_no_reminders_once_sent():
    from gpuheal.core import alerts

    data = alerts.AlertQueue()
    now = 1_800_000_000.0
    for gpu, issue in (("gpu-light", ISSUE), ("gpu-a", "model-stuck")):
        alert = alerts.issue_alert(gpu, issue, "escalated", "2026-07-18T08:00:00Z", now - 5 * H, "x",
                                   run_id=None, detected={}, tried=[], attempts=0)
        alerts.record_sent(data, alert, now - 5 * H, 1)
    from gpuheal.rules import ALL

    due = alerts.due_reminders(data, {("gpu-light", ISSUE), ("gpu-a", "model-stuck")}, now, 4 * H,
                               policy=alerts.AlertPolicy.of(ALL))
    assert [r.fingerprint for r in due] == ["gpu-a/model-stuck"]  # once per incident; its 48 h audit is its own


# --------------------------------------------------------------------------- naming the traffic (issue 27 item 11)

ROLES = {"gpu-dense": Role("heavy reasoning", model_groups=("heavy",), request_tags=("code",)),
         "gpu-light": LIGHT,
         "strix-moe": Role("long docs", model_groups=("moe",), min_prompt_tokens=2000)}


def test_a_tally_keeps_which_group_tag_or_prompt_size_fell_outside():
    gpus = [Deployment("gpu-light", frozenset({"gpu-light"}), "http://ct110:8080", LIGHT)]
    rows = [row(group="heavy")] * 3 + [row(tags=("code", "code", "x"))] * 2 + [row(prompt=9000), row(tags=())]
    t = tally(rows, gpus, 3600.0)["gpu-light"]
    assert t.traffic == (("model group", "heavy", 3), ("request tags", "code", 2), ("request tags", "x", 2),
                         ("prompt tokens", "above 4000", 1), ("request tags", "(no tag)", 1))
    assert type(t).from_dict(t.to_dict()) == t


def test_the_recommendation_names_each_kind_of_traffic_and_where_it_belongs():
    light = Reading(150, routing.SPEND_LOGS, outside=60, outside_by=(("model group", 40), ("request tags", 20)),
                    judged=("model group", "request tags", "prompt tokens"),
                    traffic=(("model group", "heavy", 40), ("request tags", "code", 12), ("request tags", "x", 8),
                             ("prompt tokens", "above 4000", 5)))
    v = verdict(light, roles=ROLES)
    assert v.detected["route"] == [
        {"traffic": "model group", "value": "heavy", "requests": 40, "to": ["gpu-dense"]},
        {"traffic": "request tags", "value": "code", "requests": 12, "to": ["gpu-dense"]},
        {"traffic": "request tags", "value": "x", "requests": 8, "to": []},
    ]
    assert v.summary.endswith("[spend-logs]: recommend agent alias updates: model group 'heavy' (40 requests) -> "
                              "gpu-dense; tag 'code' (12 requests) -> gpu-dense; tag 'x' (8 requests) -> no GPU's "
                              "role names it (give one a role that does)")


def test_from_counters_the_deployments_group_is_named_with_its_destination():
    v = verdict(routing.from_counters(150, "heavy", LIGHT), roles=ROLES)
    assert "model group 'heavy' (150 requests) -> gpu-dense" in v.summary
    assert "[litellm-counters]" in v.summary


def test_a_share_off_its_weight_names_the_gpus_to_move_requests_to_or_from():
    over = {"gpu-dense": Reading(800, routing.COUNTERS), "gpu-light": Reading(150, routing.COUNTERS),
            "strix-moe": Reading(50, routing.COUNTERS)}
    args = {"tolerance_ratio": 0.2, "role_tolerance_ratio": 0.1, "min_requests": 20, "roles": ROLES}
    v = judge("gpu-dense", over, WEIGHTS, "heavy reasoning", **args)
    assert v.detected["move_to"] == ["strix-moe"] and "move requests to strix-moe (under their weight)" in v.summary
    u = judge("strix-moe", over, WEIGHTS, "long docs", **args)
    assert u.detected["move_from"] == ["gpu-dense"] and "move requests here from gpu-dense (over their weight)" in u.summary


def test_prompt_sizes_go_to_a_role_whose_bounds_take_them():
    assert routing.accepts(ROLES["strix-moe"], "prompt tokens", "above 4000")
    assert not routing.accepts(LIGHT, "prompt tokens", "above 4000")
    assert routing.accepts(LIGHT, "prompt tokens", "below 2000") and not routing.accepts(ROLES["strix-moe"],
                                                                                        "prompt tokens", "below 2000")


@pytest.mark.parametrize(("criterion", "value"), [("prompt tokens", "above lots"), ("prompt tokens", ""),
                                                  ("prompt tokens", "above -5"), ("nonsense", "heavy"),
                                                  ("model group", "")])
def test_garbage_traffic_has_no_destination(criterion, value):
    assert not any(routing.accepts(r, criterion, value) for r in (*ROLES.values(), None))


def test_hostile_group_names_are_shown_printable_and_bounded():
    gpus = [Deployment("gpu-light", frozenset({"gpu-light"}), "http://ct110:8080", LIGHT)]
    t = tally([row(group="\x1b[31mred[/]\n" + "g" * 5000)], gpus, 3600.0)["gpu-light"]
    [(criterion, value, n)] = t.traffic
    assert "\x1b" not in value and "\n" not in value and len(value) <= routing.VALUE_CHARS and n == 1


@pytest.mark.parametrize("traffic", ["x", [["a", "b"]], [["a", "b", "many"]], [[1, 2, float("nan")]], 5])
def test_a_damaged_traffic_list_in_a_trace_is_no_tally(traffic):
    from gpuheal.model import RoleTally

    good = RoleTally(10, 2, 0, 3600.0, (("model group", 2),), (("model group", "heavy", 2),)).to_dict()
    assert RoleTally.from_dict({**good, "traffic": traffic}) is None
    assert RoleTally.from_dict({k: v for k, v in good.items() if k != "traffic"}).traffic == ()


def test_rule10_through_the_engine_names_the_group_and_its_gpu():
    data = copy.deepcopy(FLEET_YAML)
    data["gpus"][0]["role"] = {"name": "heavy reasoning", "model_groups": ["heavy"]}
    data["gpus"][1]["role"] = {"name": "vision, light tasks", "model_groups": ["light"]}
    cfg = load_config_dict(data)
    counters = {"gpu-dense": "0+22x80", "gpu-light": "0+6x80", "strix-moe": "0+12x80"}
    groups = {"gpu-dense": "heavy*81", "gpu-light": "heavy*81", "strix-moe": "moe*81"}
    trace = fleet_trace(cfg, {a: {"litellm_requests_total": counters[a], "litellm_model_group": groups[a]}
                              for a in counters})
    issue = next(i for i in run(cfg, trace).open_at_end if i.issue == ISSUE and i.gpu == "gpu-light")
    assert "model group 'heavy' (" in issue.summary and "requests) -> gpu-dense" in issue.summary
    assert issue.detected["route"][0]["to"] == ["gpu-dense"]


def test_the_fleet_is_summed_once_a_poll_not_once_a_gpu(monkeypatch):
    """Issue 29: each GPU's share was measured by summing the whole fleet again (a 1,000-GPU poll summed it
    a thousand times); the sums are now made once per poll and shared by every GPU's judgement."""
    cfg = load_config_dict(copy.deepcopy(FLEET_YAML))  # three weighted GPUs
    trace = fleet_trace(cfg, {a: {"litellm_requests_total": "0+12x30"}
                              for a in ("gpu-dense", "gpu-light", "strix-moe")})
    sums = []
    counted = routing.totals
    monkeypatch.setattr(routing, "totals",
                        lambda readings, weights: sums.append(len(weights)) or counted(readings, weights))
    run(cfg, trace, jitter=False)
    judged = sum(1 for n in sums if n)
    assert 0 < judged <= len(trace)  # once per poll at most, however many GPUs are judged


def test_shares_judged_with_the_fleet_s_sums_given_or_counted_are_the_same():
    over = {"gpu-dense": Reading(800, routing.COUNTERS), "gpu-light": Reading(150, routing.COUNTERS),
            "strix-moe": Reading(50, routing.COUNTERS)}
    args = {"tolerance_ratio": 0.2, "role_tolerance_ratio": 0.1, "min_requests": 20, "roles": ROLES}
    for alias in over:
        given = judge(alias, over, WEIGHTS, None, fleet=routing.totals(over, WEIGHTS), **args)
        assert given == judge(alias, over, WEIGHTS, None, **args)
    assert routing.totals({"gpu-dense": over["gpu-dense"]}, WEIGHTS) is None  # a weighted GPU without a reading
