#!/usr/bin/env python3
"""The options of a sluice subcommand as its `--help` prints them: each flag with its
environment variable and default. Shared by check_deploy.py (manifests) and check_readme.py
(README's flag table and synopsis), so both read `--help` the same way.

Run as a script it prints them as JSON: clihelp.py SLUICE_BINARY SUBCOMMAND
"""

import json
import re
import subprocess
import sys


def options(binary, subcommand):
    """{flag name without dashes: {"env": str | None, "default": str | None}}, in help order,
    `--help` itself left out. Raises when the help cannot be read or lists no option."""
    out = subprocess.run(
        [binary, subcommand, "--help"], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    # clap prints each option as `  [-x, ]--name [<VALUE>]`, then its help, with
    # `[env: X=]` and `[default: Y]` at the end of the option's last help line.
    for block in re.split(r"\n(?=\s+(?:-\w, )?--)", out):
        m = re.match(r"\s+(?:-\w, )?--([a-z0-9-]+)", block)
        if not m or m.group(1) == "help":
            continue
        env = re.search(r"\[env: ([A-Z0-9_]+)=", block)
        default = re.search(r"\[default: ([^\]]+)\]", block)
        found[m.group(1)] = {
            "env": env.group(1) if env else None,
            "default": default.group(1) if default else None,
        }
    if not found:
        raise RuntimeError(f"{binary} {subcommand} --help: no option found in:\n{out}")
    return found


if __name__ == "__main__":
    print(json.dumps(options(sys.argv[1], sys.argv[2]), indent=2))
