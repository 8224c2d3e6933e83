"""``privcal completion``: the shell completion script."""

from __future__ import annotations

import click

from privcal.cli.app import Settings, emit, main, pass_settings


@main.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@pass_settings
def completion(settings: Settings, shell: str) -> None:
    """Print the shell completion script for SHELL (``--json``: ``{"shell", "script"}``).

    \b
    bash:  eval "$(privcal completion bash)"   (e.g. in ~/.bashrc)
    zsh:   eval "$(privcal completion zsh)"    (e.g. in ~/.zshrc)
    fish:  privcal completion fish > ~/.config/fish/completions/privcal.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # the Choice admits only shells click supports
    script = cls(main, {}, "privcal", "_PRIVCAL_COMPLETE").source()
    emit({"shell": shell, "script": script}, as_json=settings.as_json, human=script)
