#!/usr/bin/env python3
"""Prints sluice's decide Lua as src/limiter/redis/script.rs assembles it, from the working tree or
from a git revision, without a build: the function library (`LIBRARY`: its declaration line, the
function's name, the Lua header of script.rs's shared constants (`local NAME = value`), then
shared.lua, models.lua, decide.lua and library.lua), or for a revision from before the library,
its script (`SCRIPT`: the declaration line if the revision has one, the header, shared.lua,
models.lua and decide.lua). For A/B runs of scripts/bench/script-cost.sh and
scripts/bench/weight-cost.sh against an earlier version.

Also the ARGV of one item for a given script (`item_argv`), each value at the offset that
script's header names, so that the benchmarks call every revision's script in its own layout,
and how to load and call either form (`prepare`, `function_name`).

Usage (run from the repository root):
  assemble-script.py [REV]
  assemble-script.py --function-name SCRIPT_FILE   # the library's function (empty: a script)
  assemble-script.py --item-argv SCRIPT_FILE limit=N window_ms=N hits=N [param=N]
                     [kind=KIND_*] [algorithm=ALGORITHM_*] [over_limit=OVER_LIMIT_*]
"""
import hashlib
import re
import subprocess
import sys

LUA = "src/limiter/redis/lua/"

# An item's arguments in the order of scripts whose header does not name their offsets (no
# ARG_*), and the codes of scripts whose header does not name them either.
POSITIONAL = ["ARG_LIMIT", "ARG_WINDOW_MS", "ARG_HITS", "ARG_KIND", "ARG_ALGORITHM", "ARG_PARAM",
              "ARG_OVER_LIMIT"]
CODES = {"KIND_CONSUME": "c", "KIND_SHADOW": "s", "KIND_REFUND": "r", "KIND_QUOTA": "q",
         "ALGORITHM_SLIDING_LOG": "l", "ALGORITHM_QUANTIZED_LOG": "q",
         "ALGORITHM_SLIDING_COUNTER": "s", "ALGORITHM_GCRA": "g", "ALGORITHM_FIXED_WINDOW": "f",
         "ALGORITHM_IN_FLIGHT": "i", "OVER_LIMIT_REFUSE": "n", "OVER_LIMIT_FILL": "f",
         "OVER_LIMIT_RECORD": "a"}


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
    files = ("shared.lua", "models.lua", "decide.lua")
    if "lua/library.lua" in rust:
        # A function library (script.rs's LIBRARY): named after its code's SHA-1, as there.
        code = header + "".join(source(LUA + f, rev) for f in files + ("library.lua",))
        digest = hashlib.sha1(code.encode()).hexdigest()[:16]
        return (f"#!lua name=sluice_{digest}\nlocal DECIDE_FUNCTION = 'sluice_decide_{digest}'\n"
                + code)
    shebang = re.search(r'macro_rules! script_shebang \{\s*\(\) => \{\s*"([^"]*)"', rust)
    first = shebang.group(1) + "\n" if shebang else ""
    return first + header + "".join(source(LUA + f, rev) for f in files)


def header(script):
    """The constants of a script's generated header: numbers as int, codes as str (none for a
    script without the header)."""
    constants = {}
    lines = script.split("-- Generated from the constants", 1)[-1].splitlines()[1:]
    for line in lines:
        found = re.fullmatch(r"local ([A-Z_]+) = (.+)", line)
        if not found:
            break
        name, value = found.groups()
        constants[name] = value.strip('"') if value.startswith('"') else int(value)
    return constants


def item_argv(script, limit, window_ms, hits, kind="KIND_CONSUME",
              algorithm="ALGORITHM_SLIDING_LOG", param=0, over_limit="OVER_LIMIT_FILL"):
    """One item's ARGV values for `script` (its text), each at the ARG_* offset its header names;
    `kind`, `algorithm` and `over_limit` name codes of the header. A script whose header names no
    offsets takes them in POSITIONAL order, cut to its ARGS_PER_ITEM (scripts from before
    `over_limit` take 6)."""
    constants = header(script)
    code = lambda name: constants.get(name, CODES[name])
    values = {"ARG_LIMIT": limit, "ARG_WINDOW_MS": window_ms, "ARG_HITS": hits,
              "ARG_KIND": code(kind), "ARG_ALGORITHM": code(algorithm), "ARG_PARAM": param,
              "ARG_OVER_LIMIT": code(over_limit)}
    per_item = constants.get("ARGS_PER_ITEM", len(POSITIONAL))
    argv = [None] * per_item
    for position, name in enumerate(POSITIONAL):
        at = constants.get(name, position + 1)
        if at <= per_item:
            argv[at - 1] = values[name]
    if None in argv:
        raise SystemExit(f"assemble-script.py: the script takes an item argument unknown here: {argv}")
    return argv


def function_name(script):
    """The name of the function a library (a script starting `#!lua name=`) decides with: sluice's
    DECIDE_FUNCTION, else the first one it registers; None for a script."""
    if not script.startswith("#!lua name="):
        return None
    found = (re.search(r"^local DECIDE_FUNCTION = '([^']*)'$", script, re.M)
             or re.search(r"register_function *[({] *'([^']*)'", script))
    if not found:
        raise SystemExit("assemble-script.py: the library registers no function found here")
    return found.group(1)


def prepare(r, script):
    """Loads `script` into the Redis of `r` (scripts/bench/resp.py): FUNCTION LOAD for a library,
    SCRIPT LOAD for a script; returns the start of a call, ["FCALL", name] or ["EVALSHA", sha]
    (the command's name is what SLOWLOG shows first)."""
    name = function_name(script)
    if name:
        r("FUNCTION", "LOAD", "REPLACE", script)
        return ["FCALL", name]
    return ["EVALSHA", r("SCRIPT", "LOAD", script)]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--function-name":
        with open(sys.argv[2]) as f:
            print(function_name(f.read()) or "")
    elif len(sys.argv) > 1 and sys.argv[1] == "--item-argv":
        with open(sys.argv[2]) as f:
            text = f.read()
        fields = dict(arg.split("=", 1) for arg in sys.argv[3:])
        print(" ".join(str(v) for v in item_argv(text, **fields)))
    else:
        sys.stdout.write(assemble(sys.argv[1] if len(sys.argv) > 1 else ""))
