"""The Core statements of the hot path (a charge and its audit append), built once per ledger.

A statement object that is reused keeps its cache key, so SQLAlchemy compiles it once
(issue 11); :meth:`HotStatements._stmt` builds each on first use and keeps it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, insert, select, update

from privcal.storage.models import AuditEntry, AuditHead, Charge, Dataset

__all__ = ["SPENT_COLUMNS", "HotStatements"]

#: the dataset columns holding its running totals, in :class:`privcal.accountant` order
SPENT_COLUMNS = ("spent_pure_eps", "spent_pure_rho", "spent_zcdp_rho", "spent_approx_eps",
                 "spent_approx_delta")


class HotStatements:
    """The statement cache of a :class:`~privcal.storage.ledger.Ledger`."""

    # set by Ledger.__init__; ``backend`` is the Ledger's
    _stmts: dict[str, Any]

    def _stmt(self, name: str) -> Any:
        """The Core statements of the hot path, built once per ledger (a statement object
        reused keeps its cache key: SQLAlchemy compiles it once)."""
        st = self._stmts.get(name)
        if st is not None:
            return st
        pg = self.backend == "postgresql"
        dt, ct = Dataset.__table__, Charge.__table__
        ht, et = AuditHead.__table__, AuditEntry.__table__
        if name == "dataset":
            st = select(dt).where(dt.c.name == bindparam("name"))
            st = st.with_for_update() if pg else st
        elif name == "by_key":
            st = select(ct).where(ct.c.dataset_id == bindparam("d"),
                                  ct.c.idempotency_key == bindparam("k"))
        elif name == "count":
            st = update(dt).where(dt.c.id == bindparam("d")).values(
                charge_count=dt.c.charge_count + 1)
        elif name == "count_spent":
            st = update(dt).where(dt.c.id == bindparam("d")).values(
                charge_count=dt.c.charge_count + 1,
                **{c: bindparam(f"s_{c}", type_=dt.c[c].type) for c in SPENT_COLUMNS})
        elif name.startswith("charge"):  # charge / charge+count / charge+count_spent
            # bind names differ from every column name: parameters named like a column would
            # otherwise be added to the statement's SET / VALUES clause
            st = insert(ct).values(
                {c.name: bindparam(f"c_{c.name}", type_=c.type) for c in ct.c if c.name != "id"}
            ).returning(ct.c.id)
            if "+" in name:
                st = st.add_cte(self._stmt(name.split("+")[1]).cte("upd"))
        elif name == "head":
            st = select(ht.c.seq, ht.c.entry_hash).where(ht.c.id == 1)
        elif name == "entry":
            st = insert(et)
        elif name == "move_head":
            st = update(ht).where(ht.c.id == 1).values(seq=bindparam("s"),
                                                       entry_hash=bindparam("h"))
        else:  # pragma: no cover
            raise KeyError(name)
        self._stmts[name] = st
        return st
