"""The help format every ``keyrank`` subcommand shares: each option's help line ends with its default."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: ...)`` suffix on every option, except on required ones (which have none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required:
            return action.help
        return super()._get_help_string(action)
