#!/usr/bin/env python3
"""Prints sluice's decide script (`SCRIPT` of src/limiter/redis/script.rs) as that file assembles
it, from the working tree or from a git revision, without a build: the declaration line if the
revision has one, the Lua header of script.rs's shared constants (`local NAME = value`), then
shared.lua, models.lua and decide.lua. For A/B runs of scripts/bench/script-cost.sh and
scripts/bench/weight-cost.sh against an earlier version.

Usage: assemble-script.py [REV]    (run from the repository root)
"""
import re
import subprocess
import sys

LUA = "src/limiter/redis/lua/"


def source(path, rev):
    if not rev:
        with open(path) as f:
            return f.read()
    return subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def assemble(rev=""):
    rust = source("src/limiter/redis/script.rs", rev)
    block = rust.split("shared_with_lua! {", 1)[1].split("\n}", 1)[0]
    header = "-- Generated from the constants of src/limiter/redis/script.rs.\n"
    for name, value in re.findall(r"^\s*([A-Z_]+): [^=]+= (.+);$", block, re.M):
        header += f"local {name} = {value}\n"
    shebang = re.search(r'macro_rules! script_shebang \{\s*\(\) => \{\s*"([^"]*)"', rust)
    first = shebang.group(1) + "\n" if shebang else ""
    return first + header + "".join(
        source(LUA + f, rev) for f in ("shared.lua", "models.lua", "decide.lua"))


if __name__ == "__main__":
    sys.stdout.write(assemble(sys.argv[1] if len(sys.argv) > 1 else ""))
