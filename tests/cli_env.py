"""A CLI test environment shared by test modules: one ledger URL and a scratch directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from privcal.cli import main


@dataclass
class CliEnv:
    """Runs ``privcal --db-url URL …`` in-process; ``catch_exceptions=False`` lets a traceback
    fail the test."""

    url: str
    dir: Path

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--db-url", self.url, *args], catch_exceptions=False)

    def json(self, *args: str) -> Any:
        res = self.run(*args, "--json")
        assert res.exit_code == 0, (args, res.stderr)
        return json.loads(res.stdout)

    def f(self, name: str) -> str:
        return str(self.dir / name)
