"""Issue 15: the CLI's conventions on every command — ``--json``/``--db-url`` before or after
the command, one JSON error document per failure (exit codes 1–5), decimal amounts, one way
to name a dataset, a suggestion for a mistyped command, shell completion, start-up imports,
progress bars only on a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.cli import main
from privcal.storage import Ledger

EXE = str(Path(sys.executable).with_name("privcal"))


def _leaves(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> list[Any]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        if isinstance(cmd, click.Group):
            out += _leaves(cmd, click.Context(cmd, parent=ctx, info_name=name), (*path, name))
        else:
            out.append(((*path, name), cmd))
    return out


def test_every_command_takes_json_and_db_url_after_its_name() -> None:
    ctx = click.Context(main, info_name="privcal")
    leaves = _leaves(main, ctx)
    names = {" ".join(p) for p, _ in leaves}
    assert {"quickstart", "dataset create", "budget show", "calibrate pcoqs", "session submit",
            "fed plan", "audit verify", "db upgrade", "completion"} <= names
    for path, cmd in leaves:
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"--json", "--db-url"} <= opts, path


def run(*args: str, **kw: Any) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False, **kw)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/l.sqlite"


def test_options_before_or_after_the_command(url: str) -> None:
    assert run("dataset", "create", "d", "--rho", "1", "--db-url", url).exit_code == 0
    for args in (["--db-url", url, "--json", "dataset", "list"],
                 ["dataset", "list", "--db-url", url, "--json"],
                 ["--json", "dataset", "list", "--db-url", url],
                 ["--db-url", url, "dataset", "list", "--json"]):
        res = run(*args)
        assert res.exit_code == 0, (args, res.output)
        assert [d["name"] for d in json.loads(res.stdout)] == ["d"]
    # a group-level `privcal --json` reaches the command
    res = run("--json", "--db-url", url, "budget", "show", "--dataset", "d")
    assert json.loads(res.stdout)["dataset"] == "d"


def test_the_dataset_is_named_with_dataset_everywhere(url: str) -> None:
    assert run("--db-url", url, "dataset", "create", "--dataset", "d", "--rho", "1").exit_code == 0
    assert run("--db-url", url, "charge", "--dataset", "d", "--rho", "0.1").exit_code == 0
    b = json.loads(run("--db-url", url, "budget", "show", "--dataset", "d", "--json").stdout)
    assert b["spent"] == {"rho": "0.1"}
    assert json.loads(run("--db-url", url, "dataset", "show", "--dataset", "d",
                          "--json").stdout)["name"] == "d"
    # the positional form still works; two different names are a usage error
    assert run("--db-url", url, "budget", "show", "d").exit_code == 0
    res = run("--db-url", url, "budget", "show", "d", "--dataset", "e")
    assert res.exit_code == 2 and "two dataset names" in res.stderr
    assert run("--db-url", url, "budget", "show").exit_code == 2


def _error_doc(res: Any, code: int) -> dict[str, Any]:
    assert res.exit_code == code, (res.stdout, res.stderr)
    doc = json.loads(res.stdout)  # exactly one JSON document
    err = doc["error"]
    assert set(doc) == {"error"} and err["exit_code"] == code
    assert err["type"] and err["message"]
    lines = res.stderr.strip().splitlines()
    assert lines and (lines[-1].startswith("error: ") or lines[-1].startswith("Error: "))
    return err


@pytest.mark.parametrize("where", ["before", "after"])
def test_json_error_document_for_every_exit_code(url: str, where: str) -> None:
    def jrun(*args: str) -> Any:
        return run("--json", *args) if where == "before" else run(*args, "--json")

    run("--db-url", url, "dataset", "create", "d", "--rho", "1")
    err = _error_doc(jrun("--db-url", url, "budget", "show", "--dataset", "nope"), 1)
    assert err["type"] == "NotFound" and "nope" in err["message"]
    err = _error_doc(jrun("--db-url", url, "charge", "--dataset", "d", "--rho", "x"), 2)
    assert err["type"] == "BadParameter" and "not a decimal number" in err["message"]
    err = _error_doc(jrun("--db-url", url, "datset", "list"), 2)
    assert "Did you mean 'dataset'" in err["message"]
    err = _error_doc(jrun("--db-url", url, "charge", "--dataset", "d", "--rho", "2"), 3)
    assert err["type"] == "BudgetRefused" and err["scope"] and err["remaining"] == "rho=1"
    # and the amounts as the dry run's document gives them (red team 22, newcomer F4)
    assert err["cost"] == {"kind": "zcdp", "rho": "2"} and err["remaining_before"] == {
        "rho": "1"}
    with Ledger(url).engine.begin() as conn:
        conn.execute(text("UPDATE datasets SET cap_rho = '5'"))
    err = _error_doc(jrun("--db-url", url, "audit", "verify"), 4)
    assert err["type"] == "AuditFailed"
    old = f"{url[:-len('l.sqlite')]}old.sqlite"
    Ledger(old).upgrade("0001")
    err = _error_doc(jrun("--db-url", old, "dataset", "list"), 5)
    assert err["type"] == "SchemaOutOfDate" and "privcal db upgrade" in err["message"]


def test_without_json_a_failure_prints_nothing_on_stdout(url: str) -> None:
    res = run("--db-url", url, "budget", "show", "--dataset", "nope")
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr.startswith("error: ")


def test_mistyped_commands_suggest_the_nearest(url: str) -> None:
    res = run("datset", "list")
    assert res.exit_code == 2 and "Did you mean 'dataset'?" in res.stderr
    res = run("budget", "shwo")
    assert res.exit_code == 2 and "Did you mean 'show'?" in res.stderr
    res = run("calibrate", "pcoq")
    assert res.exit_code == 2 and "'pcoqs'" in res.stderr


def _complete(words: str, env: dict[str, str]) -> list[str]:
    parts = words.split(" ")
    proc = subprocess.run(
        [EXE], env={**env, "_PRIVCAL_COMPLETE": "bash_complete", "COMP_WORDS": words,
                    "COMP_CWORD": str(len(parts) - 1)},
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_shell_completion(tmp_path: Path) -> None:
    env = {**os.environ, "PRIVCAL_HOME": str(tmp_path)}
    env.pop("PRIVCAL_DATABASE_URL", None)
    for shell, marker in (("bash", "_PRIVCAL_COMPLETE=bash_complete"),
                          ("zsh", "compdef"), ("fish", "complete --no-files --command privcal")):
        res = run("completion", shell)
        assert res.exit_code == 0 and marker in res.stdout, shell
    assert run("completion", "tcsh").exit_code == 2
    subprocess.run([EXE, "dataset", "create", "hospital-a", "--rho", "1"], env=env, check=True,
                   capture_output=True, timeout=120)
    subprocess.run([EXE, "dataset", "create", "hospital-b", "--rho", "1"], env=env, check=True,
                   capture_output=True, timeout=120)
    # dataset names complete from the ledger, on every command that names a dataset
    assert _complete("privcal budget show --dataset hos", env) == [
        "plain,hospital-a", "plain,hospital-b"]
    assert "plain,hospital-a" in _complete("privcal calibrate pcoqs --dataset h", env)
    assert _complete("privcal release list --dataset hospital-b", env) == ["plain,hospital-b"]
    # file options complete paths (the shell does it: click answers "file")
    assert _complete("privcal calibrate pcoqs --scores ", env) == ["file,"]
    assert _complete("privcal session submit 1 --reports ", env) == ["file,"]
    # commands complete too
    assert "plain,dataset" in _complete("privcal da", env)


PROBE = """
import sys
from privcal.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'
               or (m.startswith('privcal.calibrators.')
                   and m.rsplit('.', 1)[1] not in ('base', 'registry', 'validation',
                                                   'bound_floats')))
print('HEAVY=' + ','.join(heavy), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("args", [["--help"], ["dataset", "list"],
                                  ["budget", "show", "--dataset", "d"], ["release", "list"]])
def test_commands_that_do_not_compute_import_neither_scipy_nor_calibrators(
        tmp_path: Path, args: list[str]) -> None:
    """No scipy and no calibrator's mathematics: of ``privcal.calibrators`` only the contract,
    the registry, input validation and ``bound_floats`` (the exact spelling of a recorded
    threshold, which the tables print: stdlib only, < 1 ms) load."""
    env = {**os.environ, "PRIVCAL_HOME": str(tmp_path)}
    env.pop("PRIVCAL_DATABASE_URL", None)
    subprocess.run([EXE, "dataset", "create", "d", "--rho", "1"], env=env, check=True,
                   capture_output=True, timeout=120)
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    heavy = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY=")]
    assert heavy == ["HEAVY="], heavy


def test_no_warning_on_a_clean_install(tmp_path: Path) -> None:
    """No command of the README's first steps writes a warning (no plugin is installed by
    the README's test command, so no shadowing warning either)."""
    env = {**os.environ, "PRIVCAL_HOME": str(tmp_path), "PYTHONWARNINGS": "default"}
    env.pop("PRIVCAL_DATABASE_URL", None)
    env.pop("PYTHONPATH", None)
    for args in (["--help"], ["methods"], ["dataset", "create", "d", "--rho", "1"],
                 ["dataset", "list"], ["budget", "show", "--dataset", "d"],
                 ["calibrate", "--help"], ["release", "list"], ["audit", "verify"]):
        proc = subprocess.run([EXE, *args], env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "warning" not in proc.stderr.lower(), (args, proc.stderr)


# ------------------------------------------------------------------ progress bars
PTY_RUN = """
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
chunks = []
while True:
    try:
        data = os.read(fd, 65536)
    except OSError:
        break
    if not data:
        break
    chunks.append(data)
_, status = os.waitpid(pid, 0)
sys.stdout.write(b"".join(chunks).decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _tty(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run privcal with stdout and stderr on a pseudo-terminal; returns what it showed."""
    return subprocess.run([sys.executable, "-c", PTY_RUN, EXE, *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    env = {**os.environ, "PRIVCAL_HOME": str(tmp_path), "PRIVCAL_PROGRESS_MIN": "1000",
           "TERM": "xterm"}
    env.pop("PRIVCAL_DATABASE_URL", None)
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random(5000))
    subprocess.run([EXE, "dataset", "create", "d", "--rho", "10"], env=env, check=True,
                   capture_output=True, timeout=120)
    cal = ["calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
           "--scores", str(tmp_path / "s.npy")]
    shown = _tty(cal, env)
    assert shown.returncode == 0, shown.stdout
    assert "calibrating pcoqs on 5000 rows" in shown.stdout
    # --json on a terminal: no bar, one JSON document
    quiet = _tty([*cal, "--json"], env)
    assert quiet.returncode == 0 and "calibrating" not in quiet.stdout
    assert json.loads(quiet.stdout)["release"]["method"] == "pcoqs"
    # stderr not a terminal: no bar
    piped = subprocess.run([EXE, *cal], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert piped.returncode == 0 and "calibrating" not in piped.stderr + piped.stdout
    # small work: no bar even on a terminal
    small = _tty(cal, {**env, "PRIVCAL_PROGRESS_MIN": "100000"})
    assert small.returncode == 0 and "calibrating" not in small.stdout


def test_version_is_one_json_document_under_json() -> None:
    """``--version --json`` printed text (red team 14): it is a JSON document, whichever of
    the two comes first; without ``--json`` the text is click's."""
    from privcal import __version__

    for args in (("--version", "--json"), ("--json", "--version")):
        res = run(*args)
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout) == {"name": "privcal", "version": __version__}
    res = run("--version")
    assert res.exit_code == 0 and res.stdout == f"privcal, version {__version__}\n"


def test_root_usage_errors_are_json_documents_whatever_the_order(url: str) -> None:
    """``privcal --json --bogus`` printed text only: click's parser consumes the argument
    list as it goes, so ``--json`` was no longer in it when the error was caught."""
    for args in (("--json", "--bogus"), ("--bogus", "--json"), ("--json", "--db-url")):
        err = _error_doc(run(*args), 2)
        assert err["type"] in {"NoSuchOption", "BadOptionUsage"}, args
        assert "--bogus" in err["message"] or "--db-url" in err["message"], args


def test_a_group_without_its_command_is_one_line_under_json() -> None:
    """``privcal --json budget`` put the whole help page in the error's message (stderr
    still shows the page, for a person)."""
    for args, names in ((("--json", "budget"), "show"), (("dataset", "--json"), "create")):
        res = run(*args)
        assert res.exit_code == 2, res.output
        err = json.loads(res.stdout)["error"]
        assert err["type"] in {"NoArgsIsHelpError", "UsageError"} and err["exit_code"] == 2
        assert err["message"].startswith("Missing command: one of ") and names in err["message"]
        assert "\n" not in err["message"]
    assert json.loads(run("--json", "budget").stdout)["error"]["message"] == \
        "Missing command: one of show."
    res = run("budget")  # without --json: click's help page, nothing as JSON
    assert res.exit_code == 2 and "Commands:" in res.output and not res.stdout.startswith("{")


def test_json_and_db_url_between_a_group_and_its_command(url: str) -> None:
    """``privcal budget --json show d`` was a usage error (no such option)."""
    assert run("dataset", "create", "d", "--rho", "1", "--db-url", url).exit_code == 0
    res = run("dataset", "--db-url", url, "--json", "list")
    assert res.exit_code == 0, res.output
    assert [d["name"] for d in json.loads(res.stdout)] == ["d"]
    res = run("budget", "--json", "show", "d", "--db-url", url)
    assert res.exit_code == 0 and json.loads(res.stdout)["dataset"] == "d"


def test_two_different_db_urls_are_a_usage_error(tmp_path: Path) -> None:
    """``--db-url A … --db-url B`` used the last one, silently: a charge could land in a
    ledger the user did not mean. Two different ledgers are refused, nothing is created;
    the same URL twice is fine."""
    a, b = f"sqlite:///{tmp_path}/a.sqlite", f"sqlite:///{tmp_path}/b.sqlite"
    for args in (("--db-url", a, "dataset", "create", "d", "--rho", "1", "--db-url", b),
                 ("dataset", f"--db-url={a}", "create", "d", "--rho", "1", "--db-url", b),
                 ("--json", "--db-url", a, "--db-url", b, "dataset", "list")):
        res = run(*args)
        assert res.exit_code == 2, (args, res.output)
        assert "--db-url is given more than once, with different ledgers" in res.output
        if "--json" in args:
            assert json.loads(res.stdout)["error"]["type"] == "UsageError"
    assert not list(tmp_path.glob("*.sqlite"))
    res = run("--db-url", a, "dataset", "create", "d", "--rho", "1", "--db-url", a)
    assert res.exit_code == 0, res.output
    assert [p.name for p in tmp_path.glob("*.sqlite")] == ["a.sqlite"]


def test_a_usage_error_listing_choices_is_one_line_under_json() -> None:
    """click puts each choice of a missing option on a line of its own; the JSON document's
    message is one line."""
    for args, want in ((("--json", "token", "create"), "Missing option '--role'. Choose from: "
                        "admin, analyst, auditor, device, agent, ingestor"),
                       (("session", "open", "--json"), "Missing argument "
                        "'{ldp-score|fedcp2-qq|fedcp-qq}'. Choose from: ldp-score, fedcp2-qq, "
                        "fedcp-qq")):
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert json.loads(res.stdout)["error"]["message"] == want
