"""Issue 15: every README example runs as written, in a fresh directory.

The README's ```bash blocks run in order, each command as a separate ``bash`` process, in one
fresh directory with a throw-away ledger (``PRIVCAL_HOME`` in a temp dir; state carries over
from block to block, as for a reader following the README). Before that, every input file a
command names is generated from the option that names it (scores, probabilities, labels,
subject ids, report batches whose columns the line's comment states). Each command must exit 0,
unless its line ends with ``# exit N``. A block that must not run starts with the visible
marker ``# readme-test: skip (reason)``, or has ``<!-- readme-test: skip (reason) -->`` on the
line just above its fence (invisible when rendered: the README's first block holds exactly its
two set-up commands); the reason is required. The ```python blocks run too.

A block marked ``# readme-test: session (reason)`` (the service tour: a server started in the
background, tokens in shell variables) runs as one bash script under ``set -euo pipefail``, on
a free port instead of the one it names, with ``curl -s`` failing on an HTTP error
(``--fail-with-body``); its ``pip install`` lines are not run (the test environment has the
extras), and the files its ``-F name=@FILE`` uploads name are generated like the options'.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP = re.compile(r"^#\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*$")
SKIP_ABOVE = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->\s*$")
SESSION = re.compile(r"^#\s*readme-test:\s*session\s*\((?P<reason>[^)]+)\)\s*$")
UPLOAD = re.compile(r"-F\s+(?P<part>\w+)=@(?P<file>[\w.-]+)")
EXPECT = re.compile(r"#\s*exit\s+(?P<code>\d+)\s*$")
N, K = 2000, 10


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    text: str
    above: str = ""  # the line just above the opening fence

    @property
    def marker(self) -> str:
        """The block's readme-test marker line (its first line, or an HTML comment above it)."""
        if "readme-test" in self.above:
            return self.above.strip()
        return self.text.strip().splitlines()[0].strip() if self.text.strip() else ""

    @property
    def skip_reason(self) -> str | None:
        m = SKIP.match(self.marker) or SKIP_ABOVE.match(self.marker)
        return m.group("reason").strip() if m else None

    @property
    def is_session(self) -> bool:
        return SESSION.match(self.marker) is not None


def blocks(text: str) -> list[Block]:
    out = []
    for m in re.finditer(r"^```(\w+)\n(.*?)^```", text, re.S | re.M):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        out.append(Block(m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2), before))
    return out


def commands(block: Block) -> list[tuple[str, int]]:
    """Logical command lines (continuations joined, comment-only lines dropped) and the exit
    code each must give."""
    out, cur = [], ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if cur == "" and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        m = EXPECT.search(cur)
        out.append((cur.strip(), int(m.group("code")) if m else 0))
        cur = ""
    return out


# ------------------------------------------------------------------ the files the commands name
def _csv(path: Path, header: list[str], cols: list[np.ndarray]) -> None:
    rows = [",".join(header)]
    rows += [",".join(str(c[i]) for c in cols) for i in range(len(cols[0]))]
    path.write_text("\n".join(rows) + "\n")


def _write(path: Path, option: str, line: str, k: int) -> None:
    gen = np.random.default_rng(abs(hash(path.name)) % 2**32)
    probs = gen.dirichlet(np.ones(k) * 0.3, size=N)
    labels = np.array([gen.choice(k, p=p) for p in probs])
    suffix = path.suffix
    if option == "--reports":
        cols = re.search(r"columns:\s*([\w,]+)", line)
        assert cols, f"say the columns of {path.name} in a comment: `# columns: a,b`"
        names = cols.group(1).split(",")
        if names[:2] == ["subject", "bit"]:
            group = re.search(r"--group-size\s+(\d+)", README.read_text())
            n = int(group.group(1)) if group else N
            cols_ = [np.char.add("user-", np.arange(n).astype(str)), gen.integers(0, 2, n)]
            if "round" in names:  # an ldp-score batch answering round 0's query
                cols_.append(np.zeros(n, dtype=int))
            _csv(path, names, cols_)
        elif names[:2] == ["agent", "value"]:
            m = re.search(r"--agents\s+(\d+)", README.read_text())
            bins = re.search(r"--bins\s+(\d+)", README.read_text())
            m_, b = int(m.group(1)) if m else 10, int(bins.group(1)) if bins else 100
            grid = np.arange(b) / (b - 1)
            answering = m_ - max(1, m_ // 10)  # some agents do not answer (close --allow-missing)
            _csv(path, ["agent", "value"], [np.char.add("h", np.arange(answering).astype(str)),
                                            gen.choice(grid[b // 2:], answering)])
        else:  # pragma: no cover - a new kind of batch: say how to make it here
            pytest.fail(f"do not know how to generate reports with columns {names}")
        return
    if option in REGRESSION:
        # one regression sample per split: calibration files, and files named test_*
        reg = np.random.default_rng(2 if path.name.startswith("test") else 1)
        x = reg.uniform(0, 1, N)
        band = {"--preds": x, "--lower-preds": x - 0.5, "--upper-preds": x + 0.5,
                "--targets": x + reg.normal(0, 0.1 + x)}
        np.save(path, band[option])
        return
    if suffix == ".csv" and option in ("--probs", "--labels") and "--columns" in line:
        # a table as a model writes it: pandas' index, p0..p{k-1}, label
        index = np.arange(N)
        cols = [index, *(probs[:, j] for j in range(k)), labels]
        _csv(path, ["", *(f"p{j}" for j in range(k)), "label"], cols)
        return
    if option in ("--scores",):
        data: np.ndarray = gen.random(N)
    elif option == "--probs":
        data = probs
    elif option == "--labels":
        data = labels
    elif option == "--groups":  # a public group column (Mondrian calibration)
        data = np.array(["north", "south"])[gen.integers(0, 2, N)]
    elif option in ("--subjects", "--agent-of"):
        data = np.char.add("user-" if option == "--subjects" else "agent-",
                           (np.arange(N) % (N if option == "--subjects" else 20)).astype(str))
    else:  # pragma: no cover
        pytest.fail(f"do not know what file {path.name} given to {option} holds")
    if suffix == ".npy":
        np.save(path, data)
    elif suffix == ".csv":
        name = option.lstrip("-").replace("agent-of", "agent")
        if data.ndim == 2:
            _csv(path, [f"p{j}" for j in range(k)], [data[:, j] for j in range(k)])
        else:
            _csv(path, [name], [data])
    else:  # pragma: no cover
        pytest.fail(f"cannot generate {path.name}")


#: regression inputs (.npy): predictions, a quantile band, and targets y = x + noise
REGRESSION = ("--preds", "--lower-preds", "--upper-preds", "--targets")
INPUTS = ("--scores", "--probs", "--labels", "--subjects", "--agent-of", "--reports",
          "--groups", *REGRESSION)


def generate_inputs(cmds: list[str], where: Path) -> list[str]:
    made = []
    for line in cmds:
        k_opt = re.search(r"--k\s+(\d+)", line)
        k = int(k_opt.group(1)) if k_opt else K
        for m in UPLOAD.finditer(line):  # curl's multipart uploads: the part is the option
            opt, path = "--" + m.group("part").replace("_", "-"), where / m.group("file")
            assert opt in INPUTS, f"do not know what the upload {m.group(0)!r} holds"
            if not path.exists():
                _write(path, opt, line, k)
                made.append(path.name)
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a line of a multi-line quoted argument (a session block's JSON)
            continue
        for opt, val in itertools.pairwise(words):
            if opt in INPUTS:
                path = where / val.split(":", 1)[0]
                if not path.exists():
                    _write(path, opt, line, k)
                    made.append(path.name)
    return made


def session_script(block: Block, port: int) -> str:
    """A session block as the script the test runs (see the module docstring)."""
    lines = [line for line in block.text.splitlines()
             if not line.lstrip().startswith("pip install")]
    body = "\n".join(lines).replace("8321", str(port))
    body = body.replace("curl -s ", "curl -s --fail-with-body ")
    return "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + body + "\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ the test
def test_readme_skip_markers_have_reasons() -> None:
    for b in blocks(README.read_text()):
        if "readme-test" in b.marker:
            assert b.skip_reason or b.is_session, (
                f"README line {b.line}: a skip or session marker needs a (reason)")


def test_readme_opens_with_exactly_the_two_setup_commands() -> None:
    """The README's first code block: one command installs and runs the main job, one
    installs the test extras and runs the tests — nothing else."""
    first = blocks(README.read_text())[0]
    cmds = [c for c, _ in commands(first)]
    assert len(cmds) == 2, cmds
    assert "privcal quickstart" in cmds[0] and "[test]" in cmds[1] and "pytest" in cmds[1]
    assert first.skip_reason  # running them is tests/test_quickstart.py's and CI's job


def test_readme_test_command_imports_the_tests_package() -> None:
    """The README runs the tests with the bare `pytest` script, which (unlike `python -m
    pytest`) does not put the checkout on sys.path: modules importing `tests.…` must still
    be collected (pyproject's `pythonpath`)."""
    pytest_bin = Path(sys.executable).parent / "pytest"
    importing = "tests/test_cli_regression.py"  # `from tests.cli_env import CliEnv`
    assert "from tests." in (README.parent / importing).read_text()
    proc = subprocess.run([str(pytest_bin), "--collect-only", "-q", "-p", "no:cacheprovider",
                           importing], cwd=README.parent, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def run_session(block: Block, work: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(["bash", "-c", session_script(block, _free_port())], cwd=work,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (f"README line {block.line}: the session exited "
                                  f"{proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    # the auditor's verify is the script's last answer (a failed check is 200 with ok false)
    verify = proc.stdout[proc.stdout.rfind('{"ok":'):]
    assert verify.startswith('{"ok":true'), proc.stdout[-2000:]


def test_readme_service_session_is_a_script() -> None:
    """The service tour runs as one script: on a free port, curl failing on HTTP errors,
    without its install line; a session block is never skipped silently."""
    (b,) = [b for b in blocks(README.read_text()) if b.is_session]
    assert b.skip_reason is None
    script = session_script(b, 45678)
    assert "8321" not in script and ":45678" in script
    assert not [line for line in script.splitlines() if line.lstrip().startswith("pip ")]
    assert "pip install" in b.text and "--fail-with-body" in script
    assert script.startswith("set -euo pipefail")


def test_every_readme_example_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PRIVCAL_DATABASE_URL", "PYTHONPATH")}
    env.update(PRIVCAL_HOME=str(home), HOME=str(home),  # `~/keys/…` stays in the temp dir
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    all_blocks = blocks(README.read_text())
    shell = [b for b in all_blocks if b.lang in ("bash", "sh", "shell", "console")]
    assert len(shell) >= 3
    runnable = [b for b in shell if b.skip_reason is None]
    generate_inputs([c for b in runnable for c, _ in commands(b)], work)
    ran = 0
    for b in runnable:
        if b.is_session:
            run_session(b, work, env)
            ran += 1
            continue
        for cmd, code in commands(b):
            proc = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=600, check=False)
            assert proc.returncode == code, (
                f"README line {b.line}: `{cmd}` exited {proc.returncode}, expected {code}\n"
                f"{proc.stderr[-2000:]}")
            assert "Traceback" not in proc.stderr, proc.stderr
            assert "warning" not in proc.stderr.lower(), (cmd, proc.stderr)
            ran += 1
    assert ran >= 20
    for b in all_blocks:
        if b.lang == "python" and b.skip_reason is None:
            proc = subprocess.run([sys.executable, "-c", b.text], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=600, check=False)
            assert proc.returncode == 0, f"README line {b.line}:\n{proc.stderr[-2000:]}"
