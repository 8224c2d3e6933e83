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
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP = re.compile(r"^#\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*$")
SKIP_ABOVE = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->\s*$")
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
            _csv(path, ["subject", "bit"],
                 [np.char.add("user-", np.arange(n).astype(str)), gen.integers(0, 2, n)])
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
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # pragma: no cover
            continue
        k_opt = re.search(r"--k\s+(\d+)", line)
        k = int(k_opt.group(1)) if k_opt else K
        for opt, val in itertools.pairwise(words):
            if opt in INPUTS:
                path = where / val.split(":", 1)[0]
                if not path.exists():
                    _write(path, opt, line, k)
                    made.append(path.name)
    return made


# ------------------------------------------------------------------ the test
def test_readme_skip_markers_have_reasons() -> None:
    for b in blocks(README.read_text()):
        if "readme-test" in b.marker:
            assert b.skip_reason, f"README line {b.line}: a skip marker needs a (reason)"


def test_readme_opens_with_exactly_the_two_setup_commands() -> None:
    """The README's first code block: one command installs and runs the main job, one
    installs the test extras and runs the tests — nothing else."""
    first = blocks(README.read_text())[0]
    cmds = [c for c, _ in commands(first)]
    assert len(cmds) == 2, cmds
    assert "privcal quickstart" in cmds[0] and "[test]" in cmds[1] and "pytest" in cmds[1]
    assert first.skip_reason  # running them is tests/test_quickstart.py's and CI's job


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
