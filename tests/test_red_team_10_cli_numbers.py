"""Red team 10 (review, finding 9): the CLI's ids and planning numbers were read by click's
``int``/``float``, which take ``1_0`` as 10 and a fullwidth ``１`` as 1.

``privcal session submit 1_0`` submitted to session 10, ``session close １ --abandon``
closed session 1, ``token create --session 1_0`` bound a token to session 10, ``advise
--epsilon 0_5`` advised for ε = 5 and ``fed plan --epsilon 0_5`` planned for it. Now every
number typed on the command line follows the library's one rule
(:func:`privcal.errors.check_number_text`): such text is a usage error (exit 2) and nothing
changes; the ordinary spellings are still read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_env import CliEnv

SQLITE = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)

SESSIONS = 10


@pytest.fixture
def env(ledger_url: str, tmp_path: Path) -> CliEnv:
    e = CliEnv(ledger_url, tmp_path)
    assert e.run("db", "upgrade").exit_code == 0
    assert e.run("dataset", "create", "d", "--epsilon", "100",
                 "--subject-epsilon", "100").exit_code == 0
    for _ in range(SESSIONS):
        res = e.run("session", "open", "ldp-score", "--dataset", "d", "--alpha", "0.1",
                    "--epsilon", "2", "--rounds", "2", "--group-size", "50")
        assert res.exit_code == 0, res.stderr
    (tmp_path / "r.csv").write_text("subject,bit,round\nalice,1,0\nbob,0,0\n")
    return e


def _state(env: CliEnv) -> tuple[Any, ...]:
    """What a refused command must leave as it was: every session, the tokens, the audit
    head and the releases."""
    sessions = tuple(json.dumps(env.json("session", "status", str(i)), sort_keys=True)
                     for i in range(1, SESSIONS + 1))
    return (sessions, json.dumps(env.json("token", "list"), sort_keys=True),
            env.json("audit", "head")["head"], len(env.json("release", "list")))


def _refused(env: CliEnv, *args: str) -> None:
    before = _state(env)
    res = env.run(*args)
    assert res.exit_code == 2, (args, res.exit_code, res.stdout, res.stderr)
    assert "Invalid value" in res.stderr, res.stderr
    assert _state(env) == before


@SQLITE
@pytest.mark.parametrize("sid", ["1_0", "１", "１０", "0_1"])
def test_session_submit_refuses_a_malformed_id(env: CliEnv, sid: str) -> None:
    _refused(env, "session", "submit", sid, "--reports", env.f("r.csv"))


@SQLITE
@pytest.mark.parametrize("sid", ["１", "1_0"])
def test_session_close_refuses_a_malformed_id(env: CliEnv, sid: str) -> None:
    _refused(env, "session", "close", sid, "--abandon")


@SQLITE
def test_session_status_refuses_a_malformed_id(env: CliEnv) -> None:
    _refused(env, "session", "status", "1_0")


@SQLITE
@pytest.mark.parametrize("sid", ["1_0", "１"])
def test_token_create_refuses_a_malformed_session(env: CliEnv, sid: str) -> None:
    _refused(env, "token", "create", "--role", "device", "--session", sid,
             "--subject", "carol")


@SQLITE
@pytest.mark.parametrize("count", ["1_0", "２"])
def test_token_create_refuses_a_malformed_count(env: CliEnv, count: str) -> None:
    _refused(env, "token", "create", "--role", "device", "--session", "1",
             "--count", count, "--subject-prefix", "p")


@SQLITE
def test_token_create_refuses_a_fullwidth_expiry(env: CliEnv) -> None:
    before = _state(env)
    res = env.run("token", "create", "--role", "admin", "--expires", "１d")
    assert res.exit_code != 0 and "--expires" in res.stderr, res.stderr
    assert _state(env) == before


@SQLITE
def test_release_show_and_predict_refuse_a_malformed_id(env: CliEnv) -> None:
    for args in (("release", "show", "1_0"), ("predict", "--release", "１"),
                 ("evaluate", "--release", "1_0")):
        res = env.run(*args)
        assert res.exit_code == 2, (args, res.stdout, res.stderr)
        assert "Invalid value" in res.stderr


@SQLITE
def test_ordinary_ids_are_still_read(env: CliEnv) -> None:
    res = env.run("session", "submit", "10", "--reports", env.f("r.csv"))
    assert res.exit_code == 0, res.stderr
    assert env.json("session", "status", " 10")["id"] == 10
    assert env.json("session", "close", "1", "--abandon")["status"] != "open"
    doc = env.json("token", "create", "--role", "device", "--session", "10",
                   "--subject", "carol")
    assert doc["info"]["session"] == 10


PLANS = {
    "advise epsilon": ["advise", "--n", "1000", "--k", "10", "--epsilon", "0_5",
                       "--alpha", "0.1"],
    "advise fullwidth n": ["advise", "--n", "１000", "--k", "10", "--epsilon", "0.5",
                           "--alpha", "0.1"],
    "advise alpha": ["advise", "--n", "1000", "--k", "10", "--epsilon", "0.5",
                     "--alpha", "0.1_0"],
    "fed epsilon": ["fed", "plan", "--agents", "10", "--local-n", "200", "--alpha", "0.1",
                    "--epsilon", "0_5"],
    "fed agents": ["fed", "plan", "--agents", "1_0", "--local-n", "200", "--alpha", "0.1"],
    "fed local-n": ["fed", "plan", "--agents", "10", "--local-n", "2_00", "--alpha", "0.1"],
    "fed local-n list": ["fed", "plan", "--local-n", "200,２00", "--alpha", "0.1"],
    "fed bins": ["fed", "plan", "--agents", "10", "--local-n", "200", "--alpha", "0.1",
                 "--epsilon", "0.5", "--bins", "1_00"],
    "amplify epsilon0": ["amplify", "--epsilon0", "1_0", "--n", "10000", "--delta", "1e-6"],
    "amplify n": ["amplify", "--epsilon0", "1", "--n", "１0000", "--delta", "1e-6"],
    "serve port": ["serve", "--port", "8_321"],
    "serve window": ["serve", "--report-window", "0.00_4"],
}


@SQLITE
@pytest.mark.parametrize("case", list(PLANS))
def test_a_malformed_planning_number_is_a_usage_error(
        tmp_path: Path, ledger_url: str, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import privcal.service.app

    def no_server(*_: Any, **__: Any) -> Any:  # serve read the number: it must not listen
        raise AssertionError("serve accepted a malformed number")

    monkeypatch.setattr(privcal.service.app, "create_app", no_server)
    res = CliEnv(ledger_url, tmp_path).run(*PLANS[case], "--json")
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert "Invalid value" in res.stderr
    assert res.stdout == "" or "error" in json.loads(res.stdout)  # no plan printed


@SQLITE
@pytest.mark.parametrize("args", [
    ["advise", "--n", "1000", "--k", "10", "--epsilon", "0.5", "--alpha", "0.1"],
    ["fed", "plan", "--agents", "10", "--local-n", "200", "--alpha", "0.1", "--epsilon", "5",
     "--bins", "100", "--upper", "1.0"],
    ["fed", "plan", "--local-n", "200,300", "--alpha", "0.1"],
    ["amplify", "--epsilon0", "1", "--n", "10000", "--delta", "1e-6"],
])
def test_ordinary_planning_numbers_are_still_read(tmp_path: Path, ledger_url: str,
                                                  args: list[str]) -> None:
    res = CliEnv(ledger_url, tmp_path).run(*args, "--json")
    assert res.exit_code == 0, res.stderr
    json.loads(res.stdout)


def test_a_score_option_with_a_separator_stays_text() -> None:
    from privcal.cli.method_options import parse_score_options

    assert parse_score_options(("t=1_0", "u=１", "v=10", "w=0.5")) == {
        "t": "1_0", "u": "１", "v": 10, "w": 0.5}


def test_predict_alpha_refuses_a_malformed_level() -> None:
    from privcal.cli.group_options import one_level
    from privcal.errors import InvalidInput

    assert one_level("0.1") == 0.1
    for bad in ("0.0_5", "０.1"):
        with pytest.raises(InvalidInput):
            one_level(bad)
