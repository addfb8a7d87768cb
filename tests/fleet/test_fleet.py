"""The fleet file and the router command line (fast tier)."""

from __future__ import annotations

import pytest

from kimidflash.errors import FleetError
from kimidflash.fleet.router import router_argv, router_url
from kimidflash.fleet.spec import load_fleet

from ..support.helpers import CONFIGS

TINY = CONFIGS / "cpu-tiny.env"


def fleet_file(tmp_path, body: str):
    path = tmp_path / "fleet.toml"
    path.write_text(body)
    return path


def two(router="", a="", b="", a_port=8101, b_port=8102, policy="round_robin"):
    return f"""
[router]
policy = "{policy}"
port = 8100
{router}

[[replica]]
name = "a"
config = "{TINY}"
port = {a_port}
{a}

[[replica]]
name = "b"
config = "{TINY}"
port = {b_port}
{b}
"""


def test_a_valid_fleet_renders_the_router_over_every_replica(tmp_path):
    body = two() + '\n[[replica]]\nname = "far"\nurl = "http://10.0.0.2:8000/v1"\n'
    fleet = load_fleet(fleet_file(tmp_path, body), environ={})
    assert [r.name for r in fleet.local] == ["a", "b"]
    assert fleet.replicas[2].base_url == "http://10.0.0.2:8000"
    argv = router_argv(fleet)
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == [
        "http://127.0.0.1:8101",
        "http://127.0.0.1:8102",
        "http://10.0.0.2:8000",
    ]
    assert argv[argv.index("--policy") + 1] == "round_robin"
    assert argv[argv.index("--port") + 1] == "8100" and argv[argv.index("--prometheus-port") + 1] == "29000"
    assert router_url(fleet) == "http://127.0.0.1:8100"


@pytest.mark.parametrize(
    "body, words",
    [
        (two(b_port=8101), ["replica 'b' port 8101 is already taken by replica 'a' port"]),
        (two(a_port=8100), ["replica 'a' port 8100 is already taken by [router] port"]),
        (two(router="prometheus_port = 8100"), ["port and prometheus_port are both 8100"]),
        (two(b='set = ["SERVED_MODEL_NAME=other"]'), ["replica 'b' SERVED_MODEL_NAME=other", "replica 'a' has"]),
        (two(b='set = ["VLLM_VERSION=0.33.0"]'), ["replica 'b' VLLM_VERSION=0.33.0"]),
        (two(b='set = ["NUM_SPECULATIVE_TOKENS=2"]'), ["NUM_SPECULATIVE_TOKENS=2"]),
        (two(b='set = ["DRAFT_MODEL_DIR=/elsewhere/draft"]'), ["DRAFT_MODEL_DIR=/elsewhere/draft"]),
        (two(router='host = "0.0.0.0"'), ["[router] host 0.0.0.0 exposes the fleet", "checks no key", "a, b"]),
        (two(policy="fastest"), ["policy 'fastest' is not one of"]),
        (two(router="colour = 1"), ["[router]: unknown key(s) colour"]),
        (two(a='url = "http://x:1"'), ["exactly one of config", "and url"]),
        (two(b='set = ["MAX_NUM_SEQS=zero"]'), ["replica 'b'", "MAX_NUM_SEQS"]),
        ("[router]\nport = 8000\n", ["no [[replica]]"]),
        ('[[replica]]\nname = "a"\nurl = "10.0.0.2:8000"\n', ["url '10.0.0.2:8000' is not an http(s) URL"]),
        ('[[replica]]\nname = "a"\nconfig = "x.env"\n', ["port must be a port number"]),
        ("[[replica]]\nconfig = 'x.env'\n", ["#1: name is required"]),
        (two().replace('name = "b"', 'name = "a"'), ["replica name 'a' is used twice"]),
        ("[router\n", ["not TOML"]),
    ],
)
def test_refusals_name_the_file_and_the_field(tmp_path, body, words):
    path = fleet_file(tmp_path, body)
    with pytest.raises(FleetError) as exc:
        load_fleet(path, environ={})
    msg = str(exc.value)
    assert str(path) in msg and "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_an_exposed_router_is_accepted_when_every_replica_takes_the_key(tmp_path):
    fleet = load_fleet(fleet_file(tmp_path, two(router='host = "0.0.0.0"')), environ={"API_KEY": "k"})
    assert all(r.config.api_key == "k" for r in fleet.local)
    assert router_url(fleet) == "http://127.0.0.1:8100"


def test_a_missing_fleet_file_is_named(tmp_path):
    with pytest.raises(FleetError, match="does not exist"):
        load_fleet(tmp_path / "nope.toml")


def test_check_prints_each_replica_and_the_router_command(tmp_path, capsys):
    from kimidflash.fleet.cli import curl_line, main

    path = fleet_file(tmp_path, two())
    assert main([str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "replica a: http://127.0.0.1:8101" in out and "router: vllm-router --host 127.0.0.1 --port 8100" in out
    line = curl_line(load_fleet(path, environ={}))
    assert "http://127.0.0.1:8100/v1/chat/completions" in line and "X-Session-ID: my-session" in line
    assert "Authorization" not in line
    assert "Authorization: Bearer $API_KEY" in curl_line(load_fleet(path, environ={"API_KEY": "k"}))


def test_router_overhead_is_the_per_round_latency_difference(tmp_path):
    import json

    from kimidflash.fleet.bench import FleetBenchOptions, write_overhead

    files = []
    # (file stem, mean e2e ms, median e2e ms, output tok/s) per round
    runs = {
        1: [
            ("direct-1-c1", 100.0, 90.0, 10.0),
            ("router-1-c1", 103.0, 92.0, 9.9),
            ("direct-1-c8", 0, 0, 50.0),
            ("router-1-c8", 0, 0, 49.0),
            ("router-2-c8", 0, 0, 80.0),
        ],
        2: [
            ("direct-1-c1", 110.0, 95.0, 10.0),
            ("router-1-c1", 111.0, 96.0, 9.9),
            ("direct-1-c8", 0, 0, 45.0),
            ("router-1-c8", 0, 0, 45.0),
            ("router-2-c8", 0, 0, 70.0),
        ],
    }
    for r, rows in runs.items():
        for stem, mean, median, tps in rows:
            f = tmp_path / f"{stem}-r{r}.json"
            # three requests whose service times (e2e minus slot wait) have this mean and median; one failed
            reqs = [
                {"e2el_ms": median + 50.0, "slot_wait_ms": 50.0},
                {"e2el_ms": median, "slot_wait_ms": None},
                {"e2el_ms": 3 * mean - 2 * median + 7.0, "slot_wait_ms": 7.0},
                {"e2el_ms": None},
            ]
            f.write_text(json.dumps({"requests": reqs, "output_throughput": tps}))
            files.append(f)
    opts = FleetBenchOptions(
        "configs/cpu-tiny.env", tmp_path, rounds=2, sessions=4, max_tokens=16, router_version="0.1.17"
    )
    write_overhead(files, tmp_path, opts, ["configs/cpu-tiny.env"])
    doc = json.loads((tmp_path / "router-overhead.json").read_text())
    assert [x["router_added_ms_mean"] for x in doc["rounds"]] == [3.0, 1.0]
    assert [x["router_added_ms_median"] for x in doc["rounds"]] == [2.0, 1.0]
    assert doc["rounds"][0]["router_2_vs_direct_tok_s_c8"] == 1.6
    assert doc["median"]["router_added_ms_mean"] == 2.0
    assert doc["provenance"]["command"].startswith("kimidflash fleet-bench")
