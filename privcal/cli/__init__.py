"""The ``privcal`` command line: a thin skin over the library.

Each module in this package defines commands and attaches them to :data:`main`
when imported; the list below is the whole CLI.
"""

from importlib import import_module

from privcal.cli.app import main

_COMMAND_MODULES = (
    "ledger_cmds",  # dataset, budget, charge, release, audit, db
    "calibrate_cmds",  # methods, calibrate, predict, evaluate
    "amplify_cmds",  # amplify
    "fed_cmds",  # fed plan
    "local_cmds",  # advise
    "session_cmds",  # session open/submit/status/close
    "quickstart_cmds",  # quickstart
)

for _name in _COMMAND_MODULES:
    try:
        import_module(f"privcal.cli.{_name}")
    except ModuleNotFoundError as _exc:  # a command module not written yet
        if _exc.name != f"privcal.cli.{_name}":
            raise

__all__ = ["main"]
