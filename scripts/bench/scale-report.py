#!/usr/bin/env python3
"""The table, target checks and chart data of scripts/bench/scale.sh, from its JSON files.

Usage: scale-report.py OUT "SIZES" "FLOODS" "BUILDS" QUICK
Prints markdown; writes OUT/scale.gp (gnuplot: OUT/scale.png) and one data file per line of
the chart. Rounds of one phase are summarised by their median.
"""
import json
import os
import statistics
import sys

out, sizes, floods, builds, quick = sys.argv[1:6]
sizes = [int(x) for x in sizes.split()]
floods = [int(x) for x in floods.split()]
builds = builds.split()
quick = quick == "1"


def load(name):
    return json.load(open(os.path.join(out, name + ".json")))["phases"][0]


def phases(prefix):
    """Every round of one measurement."""
    found = []
    r = 1
    while os.path.exists(os.path.join(out, f"{prefix}-r{r}.json")):
        found.append(load(f"{prefix}-r{r}"))
        r += 1
    return found


def summary(prefix):
    rounds = phases(prefix)
    if not rounds:
        return None
    def med(f):
        return statistics.median(f(p) for p in rounds)
    def per(p, name):
        return p["cpu_secs"].get(name, 0.0) * 1e6 / max(p["requests"], 1)
    return {
        "rate": med(lambda p: p["decisions_per_sec"]),
        "rates": [p["decisions_per_sec"] for p in rounds],
        "sluice_us": med(lambda p: per(p, "sluice")),
        "redis_us": med(lambda p: per(p, "redis-server")),
        "p99": med(lambda p: p["p99_ms"]),
        "errors": sum(p["errors"] for p in rounds),
        "over": med(lambda p: p["over_limit"] / max(p["requests"], 1)),
        "rounds": len(rounds),
        "has_redis": "redis-server" in rounds[0]["cpu_secs"],
    }


def number(path, field):
    for line in open(os.path.join(out, path)):
        name, value = line.split()
        if name == field:
            return int(value)
    raise KeyError(field)


def fmt_scale(n):
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k" if n >= 1000 else str(n)


print("## One key, N entries in its window (requests that find it full)")
print()
print("| entries | backend | build | decisions/s | sluice CPU µs/decision | Redis CPU µs/decision | p99 ms | errors |")
print("|---:|---|---|---:|---:|---:|---:|---:|")
window = {}
for n in sizes:
    for backend in ["memory-none", "redis-off"]:
        for b in builds:
            s = summary(f"window-{backend}-{b}-{n}")
            if s is None:
                continue
            name = "memory" if backend == "memory-none" else "redis"
            fill = f"fill-window-{name}-{n}" if name == "redis" else f"fill-window-memory-{b}-{n}"
            filled = load(fill)
            entries = filled["ok"]
            window[(backend, b, n)] = (entries, s)
            held = fmt_scale(n)
            if filled["errors"]:
                held = f"{entries:,} or more ({filled['errors']} fill errors)"
            elif entries < n:
                held = f"{entries:,} (the fill's time ran out)"
            redis = f"{s['redis_us']:.1f}" if s["has_redis"] else "-"
            print(f"| {held} | {name} | {b} | {s['rate']:.0f} | {s['sluice_us']:.1f} | {redis} | {s['p99']:.2f} | {s['errors']} |")
print()
print("## Floods of K distinct keys, all over their limit")
print()
print("| keys | backend | local cache | build | decisions/s | sluice CPU µs/decision | Redis CPU µs/decision | p99 ms | errors | over limit |")
print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
flood = {}
for k in floods:
    for backend in ["redis-off", "redis-on", "memory-none"]:
        for b in builds:
            s = summary(f"flood-{backend}-{b}-{k}")
            if s is None:
                continue
            flood[(backend, b, k)] = s
            name, cache = {"redis-off": ("redis", "off"), "redis-on": ("redis", "on"),
                           "memory-none": ("memory", "-")}[backend]
            redis = f"{s['redis_us']:.1f}" if s["has_redis"] else "-"
            print(f"| {fmt_scale(k)} | {name} | {cache} | {b} | {s['rate']:.0f} | {s['sluice_us']:.1f} | {redis} "
                  f"| {s['p99']:.2f} | {s['errors']} | {100 * s['over']:.1f} % |")
print()
print("## Memory")
print()
print("| backend | build | bytes per entry (one key) | bytes per key (flood) |")
print("|---|---|---:|---:|")
big = sizes[-1]
kmax = floods[-1]
redis_entry = (number(f"memory-redis-window-{big}.txt", "used_memory")
               - number(f"memory-redis-window-{sizes[-2]}.txt", "used_memory")) / (big - sizes[-2])
redis_key = (number("memory-redis-flood-end.txt", "used_memory")
             - number("memory-redis-flood-start.txt", "used_memory")) / kmax
print(f"| redis (used_memory) | both | {redis_entry:.1f} | {redis_key:.1f} |")
for b in builds:
    entries = load(f"fill-window-memory-{b}-{big}")["ok"]
    before = number(f"memory-memory-{b}-window-{sizes[-2]}.txt", "rss_kb")
    after = number(f"memory-memory-{b}-window-{big}.txt", "rss_kb")
    per_entry = (after - before) * 1024 / max(entries, 1)
    keys = load(f"fill-flood-memory-{b}")["ok"]
    per_key = (number(f"memory-memory-{b}-flood-end.txt", "rss_kb")
               - number(f"memory-memory-{b}-flood-start.txt", "rss_kb")) * 1024 / max(keys, 1)
    print(f"| memory (RSS) | {b} | {per_entry:.1f} (over {entries:,} entries) | {per_key:.1f} (over {keys:,} keys) |")
print()

checks = []
for b in builds:
    lo, hi = window.get(("memory-none", b, sizes[0])), window.get(("memory-none", b, big))
    if lo and hi:
        ratio = hi[1]["rate"] / lo[1]["rate"]
        checks.append((f"{b}: memory, one key at {hi[0]:,} entries >= 0.85x the same at {lo[0]}",
                       ratio >= 0.85, f"{ratio:.2f}x"))
    for k in floods[-2:]:
        on, off = flood.get(("redis-on", b, k)), flood.get(("redis-off", b, k))
        if on and off:
            ratio = on["rate"] / off["rate"]
            # Each round's on and off phases run back to back: their ratios show how much of
            # the medians' difference is the machine's drift between phases.
            paired = ", ".join(f"{a / o:.2f}" for a, o in zip(on["rates"], off["rates"]))
            checks.append((f"{b}: Redis, {fmt_scale(k)} over-limit keys, cache on >= cache off, no extra errors",
                           ratio >= 1.0 and on["errors"] <= off["errors"],
                           f"{ratio:.3f}x, errors {on['errors']} on, {off['errors']} off; "
                           f"on/off by round {paired}"))
if quick:
    print("quick run (debug build, small sizes, short phases): the figures mean nothing")
for label, met, value in checks:
    print(f"- target {label}: {'met' if met else 'MISSED'} ({value})")
print()
load_before = open(os.path.join(out, "uptime-before.txt")).read().split("load average:")[1].strip()
load_after = open(os.path.join(out, "uptime-after.txt")).read().split("load average:")[1].strip()
elapsed = int(open(os.path.join(out, "elapsed-secs.txt")).read())
print(f"{os.cpu_count()} cores shared by sluice-bench (at nice {os.environ.get('SCALE_CLIENT_NICE', '10')}), every sluice and redis-server; load {load_before} "
      f"before, {load_after} after; {elapsed} s of fills and measurements; medians of "
      f"{os.environ.get('SCALE_ROUNDS', '1')} round(s); raw JSON in {out}")

# The chart: CPU µs per decision (sluice + Redis) against scale, one line per backend and
# setting, of the current tree only (the docs show the current truth; a before build is compared
# in the table).
series = []
def write(name, title, points):
    if not points:
        return
    path = f"{name}.dat"
    with open(os.path.join(out, path), "w") as f:
        for x, y in points:
            f.write(f"{x} {y}\n")
    series.append((path, title))

for backend, title in [("memory-none", "memory"), ("redis-off", "Redis")]:
    points = [(e, s["sluice_us"] + s["redis_us"]) for (bk, bb, n), (e, s) in sorted(window.items())
              if bk == backend and bb == "after"]
    write(f"window-{backend}", title, points)
window_series, series = series, []
for backend, title in [("memory-none", "memory"), ("redis-off", "Redis, cache off"),
                       ("redis-on", "Redis, cache on")]:
    points = [(k, s["sluice_us"] + s["redis_us"]) for (bk, bb, k), s in sorted(flood.items())
              if bk == backend and bb == "after"]
    write(f"flood-{backend}", title, points)
flood_series = series


def plot(entries):
    styles = []
    for path, title in entries:
        styles.append(f"'{path}' using 1:2 with linespoints lw 2 pt 7 title '{title}'")
    return "plot " + ", \\\n     ".join(styles)


with open(os.path.join(out, "scale.gp"), "w") as f:
    f.write(f"""set terminal pngcairo size 1400,560 font 'sans,11' noenhanced
set output 'scale.png'
set multiplot layout 1,2 title 'sluice: CPU per decision (sluice + Redis) against scale (scripts/bench/scale.sh)'
set logscale xy
set grid
set key top left
set ylabel 'CPU µs per decision'
set xlabel 'entries in the one key''s window'
{plot(window_series)}
set xlabel 'distinct over-limit keys'
{plot(flood_series)}
unset multiplot
""")
