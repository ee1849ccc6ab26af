"""The command-line reference page, rendered from shoal's own argument parser.

Every command and sub-command gets a heading, its usage line as argparse prints it,
and a table of its arguments with their help; the parser is the only source, so a
new option appears here when it appears in `shoal --help`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from config_reference import escape


def render(parser: argparse.ArgumentParser) -> str:
    """The whole reference page (Markdown) for the `shoal` parser."""
    lines = [
        "# Command line",
        "",
        "Every command of `shoal` and its options, generated from its argument parser",
        "(the same text as `shoal COMMAND --help`). User errors print one line and exit",
        "with code 2; a failed job exits 1; a run stopped by SIGTERM or SIGINT exits",
        "128 + the signal after its final checkpoint.",
    ]
    for name, command, help_text in _commands(parser, parser.prog, ""):
        anchor = name.replace(" ", "-")
        lines += ["", f"## `{name}` {{#{anchor}}}", ""]
        if help_text:
            sentence = help_text[0].upper() + help_text[1:]
            lines += [escape(sentence if sentence.endswith(".") else sentence + "."), ""]
        lines += ["```text", command.format_usage().strip(), "```", ""]
        rows = [_row(action) for action in command._actions if _documented(action)]
        if rows:
            lines += ["| argument | description |", "|---|---|", *rows]
    return "\n".join(lines).rstrip() + "\n"


def _commands(
    parser: argparse.ArgumentParser, name: str, help_text: str
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(full command name, its parser, its help) for the parser and every sub-command."""
    yield name, parser, help_text or (parser.description or "")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for sub_name, sub_parser in action.choices.items():
                yield from _commands(sub_parser, f"{name} {sub_name}", helps.get(sub_name, ""))


def _documented(action: argparse.Action) -> bool:
    if isinstance(action, argparse._SubParsersAction):
        return False  # each sub-command has a section of its own
    return action.help is not argparse.SUPPRESS


def _row(action: argparse.Action) -> str:
    if action.option_strings:
        shown = ", ".join(action.option_strings)
        if action.nargs != 0:
            shown += f" {action.metavar or action.dest.upper()}"
    else:
        shown = str(action.metavar or action.dest)
        if action.nargs == "+":
            shown += " ..."
        elif action.nargs == "?":
            shown = f"[{shown}]"
    text = escape(action.help or "")
    if action.required and action.option_strings:
        text += " (required)"
    if action.nargs == argparse.REMAINDER or isinstance(action, argparse._AppendAction):
        text += " (repeatable)" if "repeatable" not in text else ""
    return f"| `{shown}` | {text} |"
