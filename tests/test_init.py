"""``gpuheal init --from-litellm URL`` and the doctor's drift check (issue 27 item 16).

LiteLLM here is a loopback fake answering ``/v1/model/info`` as 1.108.7 does (the real proxy is in
``tests/reallitellm/test_init_real.py``), so that every bad answer can be made: down, slow, garbage,
HTML, 401, a body that is not LiteLLM's, hostile strings. gpu-monitor is the simulator's look-alike
(it answers as the real one does) or a fake for its failures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from servers import Garbage, Hang, LoopbackServer, Oversized, Reply, closed_url, json_reply, run_gpuheal

from gpuheal.config import load_config_dict
from gpuheal.core import topology
from gpuheal.parse.gpu_data import parse_gpu_data

KEY = "sk-init-master-4d1e0c"


def deployment(group: str, model_id: str | None, api_base: str | None, **params) -> dict:
    """One ``/v1/model/info`` entry as 1.108.7 lists a config.yaml deployment (the key masked)."""
    lp = {"model": f"openai/{model_id}", "api_key": "not-n**********", **params}
    if api_base is not None:
        lp["api_base"] = api_base
    info = {"db_model": False, "max_tokens": None, "input_cost_per_token": 0, "mode": None}
    if model_id is not None:
        info["id"] = model_id
    return {"model_name": group, "litellm_params": lp, "model_info": info}


FLEET = {"data": [
    deployment("qwen", "gpu-dense", "http://ct8:8080/v1", weight=0.55),
    deployment("qwen", "gpu-light", "http://ct110:8080/v1", weight=0.15),
    deployment("qwen", "strix-moe", "http://ct15:8080/v1/", weight=0.30),
    deployment("solo", "7d3c" * 16, "http://127.0.0.1:18090/v1", rpm=30),  # an id LiteLLM made: 64 hex
]}  # fmt: skip


def litellm(answer=None) -> LoopbackServer:
    return LoopbackServer({"/v1/model/info": answer or json_reply(FLEET)})


def init(tmp_path: Path, url: str, *args: str, key: str | None = KEY, env: dict | None = None):
    full = {**({"LITELLM_MASTER_KEY": key} if key else {}), **(env or {})}
    return run_gpuheal("-c", str(tmp_path / "gpuheal.yaml"), "init", "--from-litellm", url, *args, env=full,
                       cwd=tmp_path)  # fmt: skip


def written(tmp_path: Path) -> dict:
    return yaml.safe_load((tmp_path / "gpuheal.yaml").read_text())


def test_one_entry_per_deployment_with_what_litellm_knows_and_a_comment_for_the_rest(tmp_path):
    with litellm() as srv:
        proc = init(tmp_path, srv.url)
        asked = srv.requests
    assert proc.returncode == 0, proc.stderr
    assert [r.headers.get("authorization") for r in asked] == [f"Bearer {KEY}"]  # the key: one header, nowhere else
    raw = written(tmp_path)
    gpus = raw["gpus"]
    assert [g["alias"] for g in gpus] == ["gpu-dense", "gpu-light", "strix-moe", "solo-127.0.0.1-18090"]
    assert gpus[0] == {"alias": "gpu-dense", "host": "ct8", "endpoint": "http://ct8:8080",
                       "litellm_model_id": "gpu-dense", "labels": {"model_group": "qwen"}}  # fmt: skip
    assert gpus[2]["endpoint"] == "http://ct15:8080" and gpus[3]["litellm_model_id"] == "7d3c" * 16
    assert raw["litellm"] == {"url": srv.url, "admin_key_env": "LITELLM_MASTER_KEY"}
    text = (tmp_path / "gpuheal.yaml").read_text()
    for key in ("vendor", "vram_total_mb", "baseline_tok_s", "restart_command"):
        assert text.count(f"# {key}:") == 4 and "not known" in text
    assert KEY not in text and KEY not in proc.stdout + proc.stderr and "not-n***" not in text
    check = run_gpuheal("config", "validate", str(tmp_path / "gpuheal.yaml"))
    assert check.returncode == 0 and "valid (4 GPUs" in check.stdout, check.stdout + check.stderr
    assert oct((tmp_path / "gpuheal.yaml").stat().st_mode & 0o777) == "0o640"


def test_gpu_monitor_fills_in_what_it_reports(tmp_path):
    doc = {"generated_at": "2026-07-18T08:00:00Z",
           "gpus": [{"hostname": "ct8", "name": "NVIDIA GeForce RTX 3090", "vram_total_mb": 24576, "temp_c": 60},
                    {"hostname": "ct110", "index": 0, "name": "NVIDIA GeForce RTX 5070", "vram_total_mb": 12288},
                    {"hostname": "ct110", "index": 1, "name": "NVIDIA GeForce RTX 5070", "vram_total_mb": 12288},
                    {"hostname": "ct99", "name": "AMD Radeon", "vram_total_mb": 1}],
           "strix": {"hostname": "ct15", "running": True, "name": "AMD Strix Halo", "vram_total_mb": 65536},
           "benchmarks": {"ct8": {"current_tok_s": 74.9, "baseline_tok_s": 74.8}}}  # fmt: skip
    with litellm() as lite, LoopbackServer({"/gpu-data": json_reply(doc)}) as mon:
        proc = init(tmp_path, lite.url, "--monitor", mon.url + "/gpu-data")
    assert proc.returncode == 0, proc.stderr
    raw = written(tmp_path)
    dense, light, strix, solo = raw["gpus"]
    assert (dense["vendor"], dense["name"], dense["vram_total_mb"], dense["baseline_tok_s"]) == (
        "nvidia", "NVIDIA GeForce RTX 3090", 24576, 74.8)
    assert (strix["vendor"], strix["vram_total_mb"]) == ("amd", 65536)
    assert "vendor" not in light and "gpu_index" not in light and "vendor" not in solo
    text = (tmp_path / "gpuheal.yaml").read_text()
    assert "gpu-monitor reports 2 GPUs on host ct110: set gpu_index" in text
    assert "gpu-monitor reports no GPU on host 127.0.0.1" in text
    assert raw["monitor"] == {"url": mon.url + "/gpu-data"}
    assert load_config_dict(raw).gpus[0].vram_total_mb == 24576


@pytest.mark.parametrize("answer", [Hang(), Garbage(), Reply(500, b"<html>oops</html>")], ids=["slow", "garbage", "html"])
def test_a_gpu_monitor_that_fails_is_a_warning_and_a_comment(tmp_path, answer):
    with litellm() as lite, LoopbackServer(default=answer) as mon:
        proc = init(tmp_path, lite.url, "--monitor", mon.url + "/gpu-data", "--timeout-s", "1")
    assert proc.returncode == 0, proc.stderr
    assert "gpu-monitor" in proc.stderr and "Traceback" not in proc.stderr
    assert [g["alias"] for g in written(tmp_path)["gpus"]][0] == "gpu-dense"
    assert "vendor" not in written(tmp_path)["gpus"][0]


@pytest.mark.parametrize(
    "answer,said",
    [
        (None, "refused"),
        (Hang(), "did not answer /v1/model/info within 1 s"),
        (Garbage(), "LiteLLM"),
        (Reply(200, b"<!doctype html><html>login</html>"), "HTML"),
        (json_reply({"error": {"message": "Authentication Error, Invalid proxy server token passed.",
                               "type": "auth_error", "code": "401"}}, 401), "rejected the admin key"),  # fmt: skip
        (json_reply({"models": []}), "no 'data' list"),
        (json_reply([1, 2]), "no 'data' list"),
        (Oversized(20 * 1024 * 1024), "larger than 8 MiB"),
        (json_reply({"data": [deployment("hosted", "gpt", None)]}), "none a llama-server gpuheal can watch"),
        (json_reply({"data": []}), "lists 0 deployments"),
    ],
    ids=["down", "slow", "garbage", "html", "401", "not-litellm", "a-list", "huge", "only-hosted", "empty"],
)
def test_a_litellm_that_cannot_be_read_is_one_line_exit_3_and_nothing_written(tmp_path, answer, said):
    if answer is None:
        proc = init(tmp_path, closed_url(), "--timeout-s", "1")
    else:
        with LoopbackServer(default=answer) as srv:
            proc = init(tmp_path, srv.url, "--timeout-s", "1")
    assert proc.returncode == 3 and said in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "gpuheal.yaml").exists() and list(tmp_path.iterdir()) == []
    assert KEY not in proc.stderr


def test_it_never_overwrites_without_force(tmp_path):
    (tmp_path / "gpuheal.yaml").write_text("# mine\n")
    with litellm() as srv:
        proc = init(tmp_path, srv.url)
        assert not srv.requests  # refused before asking anything
        assert proc.returncode == 3 and "exists" in proc.stderr and "--force" in proc.stderr
        assert (tmp_path / "gpuheal.yaml").read_text() == "# mine\n"
        forced = init(tmp_path, srv.url, "--force")
    assert forced.returncode == 0 and len(written(tmp_path)["gpus"]) == 4


def test_the_admin_key_comes_from_the_named_variable_or_dotenv_never_a_flag(tmp_path):
    with litellm() as srv:
        none = init(tmp_path, srv.url, key=None)
        assert none.returncode == 3 and "$LITELLM_MASTER_KEY" in none.stderr and not srv.requests
        (tmp_path / ".env").write_text(f"PROXY_ADMIN={KEY}\n")
        os.chmod(tmp_path / ".env", 0o600)
        proc = init(tmp_path, srv.url, "--admin-key-env", "PROXY_ADMIN", key=None)
        assert proc.returncode == 0, proc.stderr
        assert srv.requests[-1].headers.get("authorization") == f"Bearer {KEY}"
    assert written(tmp_path)["litellm"]["admin_key_env"] == "PROXY_ADMIN"
    assert KEY not in (tmp_path / "gpuheal.yaml").read_text()


@pytest.mark.parametrize(
    "url", ["http://admin:sk-x@127.0.0.1:4000", "http://127.0.0.1:4000/?key=sk-x", "ftp://127.0.0.1", "127.0.0.1:4000",
            "http://127.0.0.1:4000\n"],
)  # fmt: skip
def test_a_url_with_a_secret_or_not_a_url_is_refused_before_anything(tmp_path, url):
    proc = init(tmp_path, url)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1 and "sk-x" not in proc.stderr


def test_hostile_strings_stay_in_quotes_and_comments(tmp_path):
    evil = {"data": [
        deployment("qwen", "gpu-dense", "http://ct8:8080/v1"),
        deployment("g\n  - alias: pwned\n    host: x\n    endpoint: http://x", "id\n  - alias: pwned2",
                   "http://ct9:8080/v1\n  - alias: pwned3"),
        deployment("g2\x1b[2J\u202e", "ok-id", "http://[::1]:8080/v1"),
        deployment("g3 \"quoted\" #not-a-comment", "has space", "http://ct10:8080/v1"),
        deployment("g4" + "x" * 300, "gpu-long", "http://ct11:8080/v1"),
        deployment("qwen", "gpu-dense", "http://ct12:8080/v1"),  # the same id again: a unique alias
        {"model_name": 7, "litellm_params": "no", "model_info": []}, "not an object",
    ]}  # fmt: skip
    with litellm(json_reply(evil)) as srv:
        proc = init(tmp_path, srv.url)
    assert proc.returncode == 0, proc.stderr
    raw = written(tmp_path)
    assert [g["alias"] for g in raw["gpus"]] == ["gpu-dense", "gpu-long", "qwen-ct12-8080"]
    assert all(set(g) <= {"alias", "host", "endpoint", "litellm_model_id", "labels"} for g in raw["gpus"])
    text = (tmp_path / "gpuheal.yaml").read_text()
    assert "pwned" not in json.dumps(raw) and "\x1b" not in text and "\u202e" not in text
    assert "# LiteLLM's model group: " in text  # too long for a label: a comment
    assert text.count("# not watched:") == 3  # the newline api_base, the IPv6 host, the id with a space
    assert run_gpuheal("config", "validate", str(tmp_path / "gpuheal.yaml")).returncode == 0


def test_servers_sharing_a_host_get_an_index_each_marked_not_known(tmp_path):
    """The config matches GPUs by (host, index): two llama-servers on one host need a gpu_index each.
    Which GPU each one uses is not known, so the numbers are written with a comment saying so."""
    doc = {"data": [deployment("a", "m-a", "http://127.0.0.1:18081/v1"), deployment("b", "m-b", "http://127.0.0.1:18082/v1"),
                    deployment("c", "m-c", "http://ct9:8080/v1")]}  # fmt: skip
    mon = {"gpus": [{"hostname": "127.0.0.1", "index": i, "name": f"NVIDIA RTX {i}", "vram_total_mb": 8192 * (i + 1)}
                    for i in (1, 0)]}  # fmt: skip
    with litellm(json_reply(doc)) as lite, LoopbackServer({"/gpu-data": json_reply(mon)}) as m:
        proc = init(tmp_path, lite.url, "--monitor", m.url + "/gpu-data")
    assert proc.returncode == 0, proc.stderr
    gpus = written(tmp_path)["gpus"]
    assert [(g["alias"], g.get("gpu_index"), g.get("vram_total_mb")) for g in gpus] == [
        ("m-a", 0, 8192), ("m-b", 1, 16384), ("m-c", None, None)]
    assert "which of host \"127.0.0.1\"'s GPUs this server uses" in (tmp_path / "gpuheal.yaml").read_text()


def test_json_output(tmp_path):
    with litellm() as srv:
        proc = init(tmp_path, srv.url, "--json")
    doc = json.loads(proc.stdout)
    assert doc["gpus"][0] == "gpu-dense" and doc["not_watched"] == [] and doc["monitor"] is None


# --------------------------------------------------------------------------- the pure half


def test_monitor_gpus_reads_hosts_indexes_and_baselines():
    doc = parse_gpu_data({"gpus": [{"hostname": "a", "index": 1, "name": "NVIDIA H100", "vram_total_mb": 81559},
                                   {"hostname": "a", "index": 0, "name": "NVIDIA H100", "vram_total_mb": 81559},
                                   {"hostname": "b", "name": "AMD Instinct MI300X"}],
                          "benchmarks": {"b": {"baseline_tok_s": 40}}})  # fmt: skip
    gpus = topology.monitor_gpus(doc, {"benchmarks": {"b": {"current_tok_s": 39, "baseline_tok_s": 40}}})
    assert [(m.hostname, m.index, m.gpus_on_host) for m in gpus] == [("a", 0, 2), ("a", 1, 2), ("b", None, 1)]
    assert gpus[2].baseline_tok_s == 40 and topology.vendor_of(gpus[2].name) == "amd"
    assert topology.vendor_of("Some GPU") is None


def test_rendered_config_round_trips_through_the_loader():
    routes = topology.read_routes(FLEET)
    assert not isinstance(routes, str)
    entries = topology.plan_entries(routes, "no --monitor given")
    text = topology.render_config("http://127.0.0.1:4000", "LITELLM_MASTER_KEY", entries, None, "", "2026-07-18T08:00:00Z")
    cfg = load_config_dict(yaml.safe_load(text))
    assert [g.litellm_model_id for g in cfg.gpus][:3] == ["gpu-dense", "gpu-light", "strix-moe"]


# --------------------------------------------------------------------------- drift


GPUS = (("gpu-dense", "http://ct8:8080", "gpu-dense"), ("gpu-light", "http://ct110:8080", None),
        ("gone", "http://ct7:8080", None), ("moved", "http://ct20:8080", "strix-moe"))  # fmt: skip


def test_drift_names_unwatched_unrouted_and_moved():
    routes = topology.read_routes({"data": [*FLEET["data"], deployment("hosted", "gpt", None)]})
    assert not isinstance(routes, str)
    found = topology.drift(routes, GPUS)
    assert [r.model_id for r in found.unwatched] == ["7d3c" * 16]
    assert found.unrouted == ("gone",) and [(a, r.model_id) for a, r in found.moved] == [("moved", "strix-moe")]
    assert found.hosted == 1


def doctor_rows(tmp_path, litellm_url: str, environ: dict, gpus=GPUS):
    from gpuheal import doctor
    from gpuheal.doctor.drift import drift_checks

    raw = {"litellm": {"url": litellm_url, "timeout_s": 1},
           "gpus": [{"alias": a, "host": f"h{i}", "endpoint": e, **({"litellm_model_id": m} if m else {})}
                    for i, (a, e, m) in enumerate(gpus)]}  # fmt: skip
    ctx = doctor.Context(load_config_dict(raw), str(tmp_path), environ)
    return drift_checks(ctx, 1.0)


def test_doctor_warns_on_drift_with_a_fix_line(tmp_path):
    with litellm() as srv:
        rows = doctor_rows(tmp_path, srv.url, {"LITELLM_MASTER_KEY": KEY})
    by = {(r.target, r.status) for r in rows}
    assert by == {("litellm", "warn"), ("gone", "warn"), ("moved", "warn")}
    assert all(r.fix for r in rows) and all(KEY not in r.detail + r.fix for r in rows)
    unwatched = [r for r in rows if r.target == "litellm"][0]
    assert "127.0.0.1:18090" in unwatched.detail and "gpuheal init --from-litellm" in unwatched.fix


def test_doctor_says_ok_when_they_match(tmp_path):
    gpus = [(d["model_info"]["id"][:20], d["litellm_params"]["api_base"].removesuffix("/").removesuffix("/v1"), None)
            for d in FLEET["data"]]  # fmt: skip
    with litellm() as srv:
        (row,) = doctor_rows(tmp_path, srv.url, {"LITELLM_MASTER_KEY": KEY}, gpus)
    assert row.status == "ok" and "4 deployments match" in row.detail


@pytest.mark.parametrize("answer", [Hang(), Garbage(), json_reply({"error": "no"}, 401)], ids=["slow", "garbage", "401"])
def test_doctor_drift_on_a_bad_litellm_is_one_warning(tmp_path, answer):
    with LoopbackServer(default=answer) as srv:
        (row,) = doctor_rows(tmp_path, srv.url, {"LITELLM_MASTER_KEY": KEY})
    assert row.status == "warn" and row.detail.startswith("cannot compare with gpus[]")


def test_doctor_drift_without_a_key_is_a_skip(tmp_path):
    (row,) = doctor_rows(tmp_path, closed_url(), {})
    assert row.status == "skip" and "$LITELLM_MASTER_KEY is not set" in row.detail
