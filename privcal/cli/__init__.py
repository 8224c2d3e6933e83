"""The ``privcal`` command line: a thin skin over the library.

Each module in this package defines commands and attaches them to :data:`main`
when imported; the imports below are the whole CLI.
"""

from privcal.cli import (  # noqa: F401  (imported for their commands)
    amplify_cmds,  # amplify
    audit_cmds,  # audit verify/report/head/keygen
    calibrate_cmds,  # methods, calibrate
    completion_cmds,  # completion
    db_cmds,  # db upgrade/current/check
    fed_cmds,  # fed plan
    ledger_cmds,  # dataset, budget, charge, release
    local_cmds,  # advise
    predict_cmds,  # predict, evaluate
    quickstart_cmds,  # quickstart
    service_cmds,  # serve, token create/list/revoke
    session_cmds,  # session open/submit/status/close
)
from privcal.cli.app import main

__all__ = ["main"]
