"""``privcal amplify``: every bound, the chosen one, the labelled heuristic; JSON; errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from privcal.accountant.privacy.shuffle import HEURISTIC_LABEL, amplify
from privcal.cli import main


def test_human_output_lists_every_bound_and_labels_the_heuristic() -> None:
    out = CliRunner().invoke(main, ["amplify", "--epsilon0", "4", "--n", "100000",
                                    "--delta", "1e-6", "--randomizer", "krr", "--k", "10"])
    assert out.exit_code == 0, out.output
    for name in ("closed-form", "clone", "stronger-clone", "blanket"):
        assert name in out.stdout
    expected = amplify(4.0, 100000, 1e-6, "krr", 10)
    assert f"chosen: blanket: (ε = {expected.eps:.6g}, δ = 1e-06)-DP, certified" in out.stdout
    assert f"ε0/√n = {4 / 100000 ** 0.5:.4g}: {HEURISTIC_LABEL}" in out.stdout


def test_json_is_one_document_equal_to_the_library_result() -> None:
    out = CliRunner().invoke(main, ["amplify", "--epsilon0", "1", "--n", "10000",
                                    "--delta", "1e-6", "--randomizer", "binary-rr", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    expected = amplify(1.0, 10000, 1e-6, "binary-rr")
    assert doc == json.loads(expected.model_dump_json())
    assert doc["bound"] == "stronger-clone" and doc["certified"] is True
    assert doc["heuristic_label"] == HEURISTIC_LABEL


def test_no_amplification_is_reported_as_eps0() -> None:
    out = CliRunner().invoke(main, ["amplify", "--epsilon0", "60", "--n", "10",
                                    "--delta", "0.1", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["bound"] == "none (no amplification)" and doc["eps"] == 60.0


def test_bad_input_is_a_one_line_error_with_exit_code_1() -> None:
    runner = CliRunner()
    for args, word in [
        (["--epsilon0", "-1", "--n", "100", "--delta", "1e-6"], "ε0"),
        (["--epsilon0", "1", "--n", "100", "--delta", "2"], "δ"),
        (["--epsilon0", "1", "--n", "100", "--delta", "1e-6", "--randomizer", "krr"], "k"),
    ]:
        out = runner.invoke(main, ["amplify", *args])
        assert out.exit_code == 1
        assert out.stdout == ""
        assert out.stderr.startswith("error: ") and word in out.stderr
        assert out.stderr.count("\n") == 1


def test_unknown_randomizer_is_a_usage_error() -> None:
    out = CliRunner().invoke(main, ["amplify", "--epsilon0", "1", "--n", "100",
                                    "--delta", "1e-6", "--randomizer", "laplace"])
    assert out.exit_code == 2
