"""``steplog completion bash|zsh|fish``: a shell completion script, generated from the parser.

The script completes the commands and each command's options (and view names where a command
takes them); it is static text, so completing never runs steplog or opens a store.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["SHELLS", "add_commands", "completion_command", "completion_script"]

SHELLS = ("bash", "zsh", "fish")


def add_commands(commands: Any) -> None:
    """The ``completion`` subcommand."""
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description='Print a completion script: eval "$(steplog completion bash)" in ~/.bashrc, '
        "steplog completion fish > ~/.config/fish/completions/steplog.fish, or for zsh "
        'eval "$(steplog completion zsh)" in ~/.zshrc.',
    )
    completion.add_argument("shell", choices=SHELLS)


def completion_command(parser: argparse.ArgumentParser, shell: str) -> int:
    """Print the script for ``shell``."""
    sys.stdout.write(completion_script(parser, shell))
    return 0


def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, list[str]]]:
    """``{command: (help, [options])}`` of the parser's subcommands."""
    found: dict[str, tuple[str, list[str]]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                options = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
                found[name] = (helps.get(name, ""), options)
    return found


def _globals(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def _taking_values(parser: argparse.ArgumentParser) -> list[str]:
    """The global options followed by a value (``--store URL``): that word is no command."""
    return [
        o
        for a in parser._actions
        if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction)
        for o in a.option_strings
        if o.startswith("--")
    ]


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (one of ``SHELLS``)."""
    commands = _commands(parser)
    options = _globals(parser)
    valued = _taking_values(parser)
    if shell == "bash":
        return _bash(commands, options, valued)
    if shell == "zsh":
        return _zsh(commands, options, valued)
    return _fish(commands, options, valued)


def _bash(commands: dict[str, tuple[str, list[str]]], options: list[str], valued: list[str]) -> str:
    cases = "\n".join(
        f"        {name}) opts={_quote(' '.join(opts))} ;;" for name, (_, opts) in commands.items()
    )
    return f"""# bash completion for steplog (steplog completion bash)
_steplog() {{
    local cur command word opts skip
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    command=""
    skip=""
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        if [ -n "$skip" ]; then skip=""; continue; fi
        case "$word" in
            {"|".join(valued) or "--"}) skip=1 ;;
            -*) ;;
            *) command="$word"; break ;;
        esac
    done
    if [ -z "$command" ]; then
        if [[ "$cur" == -* ]]; then
            COMPREPLY=($(compgen -W {_quote(" ".join(options))} -- "$cur"))
        else
            COMPREPLY=($(compgen -W {_quote(" ".join(commands))} -- "$cur"))
        fi
        return 0
    fi
    opts=""
    case "$command" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    return 0
}}
complete -o default -F _steplog steplog
"""


def _zsh(commands: dict[str, tuple[str, list[str]]], options: list[str], valued: list[str]) -> str:
    described = "\n".join(
        f"        {_quote(name + ':' + _plain(text))}" for name, (text, _) in commands.items()
    )
    cases = "\n".join(
        f"        {name}) _values option {' '.join(_quote(o) for o in opts) or _quote('--help')} ;;"
        for name, (_, opts) in commands.items()
    )
    return f"""#compdef steplog
# zsh completion for steplog (steplog completion zsh)
_steplog() {{
    local -a commands
    commands=(
{described}
    )
    local command="" skip="" word
    for word in ${{words[2,CURRENT-1]}}; do
        if [[ -n "$skip" ]]; then skip=""; continue; fi
        case "$word" in
            {"|".join(valued) or "--"}) skip=1 ;;
            -*) ;;
            *) command="$word"; break ;;
        esac
    done
    if [[ -z "$command" ]]; then
        if [[ "$PREFIX" == -* ]]; then
            _values option {" ".join(_quote(o) for o in options)}
        else
            _describe command commands
        fi
        return
    fi
    case "$command" in
{cases}
    esac
}}
if [[ "$funcstack[1]" == "_steplog" ]]; then _steplog "$@"; else compdef _steplog steplog; fi
"""


def _fish(commands: dict[str, tuple[str, list[str]]], options: list[str], valued: list[str]) -> str:
    names = " ".join(commands)
    none_yet = f"not __fish_seen_subcommand_from {names}"
    lines = ["# fish completion for steplog (steplog completion fish)", "complete -c steplog -f"]
    for option in options:
        value = " -r" if option in valued else ""
        lines.append(f"complete -c steplog -n '{none_yet}' -l {option[2:]}{value}")
    for name, (text, opts) in commands.items():
        lines.append(f"complete -c steplog -n '{none_yet}' -a {name} -d {_quote(_plain(text))}")
        for option in opts:
            lines.append(
                f"complete -c steplog -n '__fish_seen_subcommand_from {name}' -l {option[2:]}"
            )
    return "\n".join(lines) + "\n"


def _plain(text: str) -> str:
    return text.replace("'", "").replace(":", " -").replace("%", "%%")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
