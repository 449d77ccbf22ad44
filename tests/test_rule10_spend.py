"""Rule 10's spend logs (issue 22 item 6): the page parser and ``GET /spend/logs/v2`` on a loopback server
that answers as the real 1.108.7 proxy's route does (``{"data", "total", "page", "page_size",
"total_pages"}``; 401 "Prisma Client is not initialized" without a database, pinned against the real
proxy by tests/reallitellm/test_spend_logs_real.py). Bad input: paginated, huge, missing fields,
garbage, wrong types, slow → one fault or "not known", never a crash."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

try:
    from tests.servers import Garbage, LoopbackServer, Oversized, Reply, Slow, json_reply
except ImportError:
    from servers import Garbage, LoopbackServer, Oversized, Reply, Slow, json_reply

from gpuheal.model import DataFault
from gpuheal.parse.litellm_spend import InvalidSpendLogs, parse_spend_page
from gpuheal.sources.litellm_spend import NO_DATABASE, PAGE_SIZE, SpendLogs, fetch_spend, stamp

KEY = "sk-admin-secret"
ROW = {"request_id": "chatcmpl-1", "model_id": "gpu-light", "model_group": "light", "api_base": "http://ct110:8080/v1",
       "request_tags": ["vision"], "prompt_tokens": 120, "startTime": "2026-07-18T08:00:00Z"}


def test_a_v2_page_is_read_row_by_row():
    page = parse_spend_page({"data": [ROW], "total": 1, "page": 1, "page_size": 1000, "total_pages": 1})
    (row,) = page.rows
    assert (row.model_id, row.model_group, row.request_tags, row.prompt_tokens) == ("gpu-light", "light", ("vision",), 120)
    assert row.start_s == 1784361600.0 and page.total_pages == 1 and page.problems == ()


def test_missing_and_wrong_fields_are_not_known_and_counted_once():
    rows = [{"model_id": 7, "request_tags": "not json", "prompt_tokens": "120", "startTime": "yesterday"}, {}, "junk",
            {**ROW, "request_tags": '["vision", "web"]'}, {**ROW, "request_tags": ["ok", 3], "prompt_tokens": -1}]
    page = parse_spend_page(rows)
    assert len(page.rows) == 4
    first = page.rows[0]
    assert (first.model_id, first.request_tags, first.prompt_tokens, first.start_s) == (None, None, None, None)
    assert page.rows[1].model_group is None and page.rows[1].request_tags is None  # absent: not known, no problem
    assert page.rows[2].request_tags == ("vision", "web")  # the database's Json column as text
    assert page.rows[3].request_tags == ("ok",) and page.rows[3].prompt_tokens is None
    text = " | ".join(page.problems)
    assert "a row that is not an object: 1 row" in text and "prompt_tokens" in text and "model_id" in text


@pytest.mark.parametrize("doc", [{"error": "x"}, "text", None, 3, {"data": "rows"}])
def test_a_page_that_is_not_one_is_invalid(doc):
    with pytest.raises(InvalidSpendLogs):
        parse_spend_page(doc)


def test_the_window_is_asked_to_the_second_in_utc():
    assert stamp(1784361600.4, up=False) == "2026-07-18 08:00:00"
    assert stamp(1784361600.4, up=True) == "2026-07-18 08:00:01"


def pager(rows: list[dict], seen: list[dict]):
    """``/spend/logs/v2`` as the proxy pages: ``page_size`` rows per page, ``total_pages`` said."""

    def answer(req):
        q = {k: v[0] for k, v in parse_qs(req.query).items()}
        seen.append({**q, "auth": req.headers.get("authorization")})
        page, size = int(q["page"]), int(q["page_size"])
        chunk = rows[(page - 1) * size: page * size]
        return json_reply({"data": chunk, "total": len(rows), "page": page, "page_size": size,
                           "total_pages": (len(rows) + size - 1) // size})
    return answer


def test_every_page_is_read_sorted_ascending_with_the_admin_key():
    rows, seen = [ROW] * (PAGE_SIZE + 5), []
    with LoopbackServer({"/spend/logs/v2": pager(rows, seen)}) as srv:
        got = fetch_spend(srv.url, KEY, 1784358000.0, 1784361600.0, deadline_s=10, max_rows=5000)
    assert isinstance(got, SpendLogs) and len(got.rows) == PAGE_SIZE + 5 and got.pages == 2
    assert [s["page"] for s in seen] == ["1", "2"]
    assert seen[0]["auth"] == f"Bearer {KEY}" and seen[0]["sort_order"] == "asc"
    assert (seen[0]["start_date"], seen[0]["end_date"]) == ("2026-07-18 07:00:00", "2026-07-18 08:00:00")


def test_more_rows_than_the_cap_is_not_known_never_a_partial_share():
    with LoopbackServer({"/spend/logs/v2": pager([ROW] * (PAGE_SIZE + 5), [])}) as srv:
        got = fetch_spend(srv.url, KEY, 0.0, 1.0, deadline_s=10, max_rows=1000)
    assert isinstance(got, DataFault) and got.fault == "oversized" and "not known" in got.detail


NO_DB = Reply(401, {"error": {"message": "Prisma Client is not initialized", "type": "internal_error",
                              "param": "None", "code": "401"}})


@pytest.mark.parametrize(("behaviour", "kind"), [
    (NO_DB, NO_DATABASE),
    (Reply(500, {"error": {"message": "/spend/logs ErrorDatabase not connected. Connect a database"}}), NO_DATABASE),
    (Reply(403, {"error": {"message": "not allowed"}}), "http-403"),
    (Reply(200, b"<html>proxy login</html>"), "invalid"),
    (json_reply({"detail": "wrong shape"}), "invalid"),
    (Garbage(), "invalid"),
    (Oversized(size=20 << 20), "oversized"),
    (Slow(5.0), "timeout"),
])
def test_bad_answers_are_one_fault_never_a_crash(behaviour, kind):
    with LoopbackServer({"/spend/logs/v2": behaviour}) as srv:
        got = fetch_spend(srv.url, KEY, 0.0, 1.0, deadline_s=1.0, max_rows=100)
    assert isinstance(got, DataFault), got
    assert got.fault == kind, got
    assert KEY not in got.detail and "\n" not in got.detail


def test_without_an_admin_key_nothing_is_sent():
    got = fetch_spend("http://127.0.0.1:9", None, 0.0, 1.0, deadline_s=1.0, max_rows=100)
    assert isinstance(got, DataFault) and got.fault == "http-401" and "admin key" in got.detail


# --------------------------------------------------------------------------- through sense


def test_sense_tallies_the_spend_logs_per_gpu_against_its_role(monkeypatch):
    import copy
    from datetime import UTC, datetime

    try:
        from tests.series import FLEET_YAML
    except ImportError:
        from series import FLEET_YAML
    from gpuheal.config import load_config_dict
    from gpuheal.sources.sense import sense

    rows = [{**ROW, "model_id": "gpu-light"}] * 6 + [{**ROW, "model_id": "gpu-light", "request_tags": ["code"]}] * 4
    rows += [{**ROW, "model_id": "gpu-dense", "model_group": "heavy"}] * 5 + [{"model_id": "gpu-dense"}]
    seen: list[dict] = []
    with LoopbackServer({"/spend/logs/v2": pager(rows, seen), "/health/liveliness": Reply(200, '"alive"')}) as srv:
        data = copy.deepcopy(FLEET_YAML)
        data["litellm"] = {"url": srv.url, "read_spend_logs": True, "timeout_s": 2}
        data["gpus"][1]["role"] = {"name": "vision", "request_tags": ["vision"]}
        monkeypatch.setenv("LITELLM_MASTER_KEY", KEY)
        obs = sense(load_config_dict(data), datetime(2026, 7, 18, 9, 0, tzinfo=UTC))
    light, dense, strix = (obs.gpus[a].routing for a in ("gpu-light", "gpu-dense", "strix-moe"))
    assert (light.requests, light.outside, light.outside_by) == (10, 4, (("request tags", 4),))
    assert (dense.requests, dense.outside, dense.unknown) == (6, 0, 0) and strix.requests == 0
    assert (seen[0]["start_date"], seen[0]["end_date"]) == ("2026-07-18 08:00:00", "2026-07-18 09:00:00")
    assert not [f for f in obs.faults if f.source == "litellm"]


def test_sense_without_a_database_adds_no_fault_and_no_tally(monkeypatch):
    import copy
    from datetime import UTC, datetime

    try:
        from tests.series import FLEET_YAML
    except ImportError:
        from series import FLEET_YAML
    from gpuheal.config import load_config_dict
    from gpuheal.sources.sense import sense

    with LoopbackServer({"/spend/logs/v2": NO_DB, "/health/liveliness": Reply(200, '"alive"')}) as srv:
        data = copy.deepcopy(FLEET_YAML)
        data["litellm"] = {"url": srv.url, "read_spend_logs": True, "timeout_s": 2}
        monkeypatch.setenv("LITELLM_MASTER_KEY", KEY)
        obs = sense(load_config_dict(data), datetime(2026, 7, 18, 9, 0, tzinfo=UTC))
    assert all(s.routing is None for s in obs.gpus.values())
    assert not [f for f in obs.faults if f.source == "litellm"]  # doctor says it once; not every poll's fault


# --------------------------------------------------------------------------- doctor


def doctor_rows(url: str, role, **litellm):
    import copy

    try:
        from tests.series import FLEET_YAML
    except ImportError:
        from series import FLEET_YAML
    from gpuheal.config import load_config_dict
    from gpuheal.doctor.checks import spend_logs_checks

    data = copy.deepcopy(FLEET_YAML)
    data["litellm"] = {"url": url, "timeout_s": 2, **litellm}
    data["gpus"][1]["role"] = role
    return [(c.target, c.check, c.status, c.detail) for c in spend_logs_checks(load_config_dict(data), KEY, 2.0)]


def test_doctor_says_in_one_line_that_spend_logs_need_a_database_and_what_is_used_instead():
    role = {"name": "vision", "model_groups": ["light"], "request_tags": ["vision"]}
    with LoopbackServer({"/spend/logs/v2": NO_DB}) as srv:
        rows = doctor_rows(srv.url, role, read_spend_logs=True, read_metrics=True)
        assert rows[0] == ("litellm", "spend logs", "warn", "spend logs need LiteLLM's database; using LiteLLM's counters")
        assert rows[1][:3] == ("gpu-light", "role", "warn") and "request tags are not known" in rows[1][3]
        rows = doctor_rows(srv.url, role, read_spend_logs=True)  # gpu-monitor only: weight alone
        assert rows[0][3] == "spend logs need LiteLLM's database; using gpu-monitor"
        assert "model group and request tags are not known" in rows[1][3] and rows[1][3].endswith("weight only")
    with LoopbackServer({"/spend/logs/v2": pager([ROW] * 3, [])}) as srv:
        assert doctor_rows(srv.url, role, read_spend_logs=True) == [
            ("litellm", "spend logs", "ok", "GET /spend/logs/v2: 3 requests in the last minute")]
    assert doctor_rows("http://127.0.0.1:9", "plain text") == []  # nothing to judge, nothing asked
