"""Storage: SQLAlchemy models, engines per backend, the ledger and its hash-chained audit log."""

from privcal.storage import tokens as _tokens  # noqa: F401  (registers the service tables)
from privcal.storage.ledger import Ledger
from privcal.storage.records import AuditHeadInfo, ReleaseRecord, VerifyReport

__all__ = ["AuditHeadInfo", "Ledger", "ReleaseRecord", "VerifyReport"]
