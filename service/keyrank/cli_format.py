"""The help format every ``keyrank`` subcommand shares: each option's help line ends with its default."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: ...)`` suffix on every option; required ones end in ``(required)`` instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required:
            return action.help if action.help is None or action.help.endswith("(required)") else f"{action.help} (required)"
        return super()._get_help_string(action)
