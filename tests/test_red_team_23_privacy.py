"""Red team 23, privacy: findings on the privacy guarantees (see each test's docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.errors import InvalidInput, NotFound


@pytest.mark.parametrize("orders", ["2_0", "1.5,1_5", "１.5", ["2", "1_5"], ["２"]])
def test_a_renyi_order_spelled_with_a_separator_or_fullwidth_digit_is_refused(
        tmp_path: Path, orders: object) -> None:
    """F3: the grid of an (ε, δ) cap is fixed for good; ``Decimal("2_0")`` is 20 and
    ``Decimal("１.5")`` 1.5, so ``--renyi-orders 2_0`` created a dataset whose grid was the
    order 20, which nobody typed. Refused in one line, nothing written, as every amount is."""
    acct = Accountant(Ledger(f"sqlite:///{tmp_path / 'l.db'}"))
    acct.ledger.upgrade()
    with pytest.raises(InvalidInput,
                       match=r"^a Rényi order must be a number \(plain, no '_'\), got "):
        acct.create_dataset("d", approx_epsilon=1, approx_delta=1e-6, renyi_orders=orders)
    with pytest.raises(NotFound):
        acct.dataset("d")
    # the spellings that are numbers keep working
    info = acct.create_dataset("e", approx_epsilon=1, approx_delta=1e-6,
                               renyi_orders=" 2, 1.5 ,20")
    assert [str(a) for a in acct.budget(info.name).renyi_orders or []] == ["1.5", "2", "20"]


def test_the_cli_refuses_renyi_orders_2_0(tmp_path: Path) -> None:
    """F3 through ``privcal dataset create``: exit 1, one line, no dataset."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Ledger(url).upgrade()
    res = CliRunner().invoke(main, ["--db-url", url, "dataset", "create", "--dataset", "d",
                                    "--approx-epsilon", "1", "--approx-delta", "1e-6",
                                    "--renyi-orders", "2_0"])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "a Rényi order must be a number (plain, no '_'), got '2_0'" in res.output
    res = CliRunner().invoke(main, ["--db-url", url, "budget", "show", "d"])
    assert res.exit_code == 1 and "unknown dataset 'd'" in res.output
