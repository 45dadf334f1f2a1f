#!/usr/bin/env bash
# Mutation testing of the pure core with cargo-mutants (crates.io): each mutant (an operator
# flipped, a function body replaced by a default value, a match arm deleted, ...) is built and
# the library's unit tests run against it; a mutant no test fails is "missed". docs/testing.md
# holds the table per file and how each missed mutant was handled.
#
# Usage: scripts/quality/mutants.sh [FILE...]   (default: every file of the pure core below)
#
# One file at a time, one job (a 2-core machine shared with others: 5 to 20 s per mutant,
# most of it the rebuild), in a copy of the tree (never --in-place: the working tree is never
# touched), with a target directory of its own (SLUICE_MUTANTS_TARGET, default target/mutants:
# its first build compiles every dependency once, later runs reuse it). The tests are the
# library's unit tests (`cargo test --lib`): the pure core is tested there, and they take
# seconds; the integration suites (real Redis, Envoy) would take minutes per mutant. For the
# files under src/config/, the loader's fixture tests (`tests/it/config_errors.rs`) too. Results
# per file go to SLUICE_MUTANTS_OUT (default target/mutants-out/<file>/), and a summary line
# per file is printed at the end. Exit status 2 if any mutant was missed or timed out.
#
# CI does not run this: the core's ~500 mutants take about an hour on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."

CORE=(
  src/descriptor.rs
  src/headers.rs
  src/limiter/window.rs
  src/limiter/algorithms.rs
  src/limiter/log.rs
  src/limiter/leases.rs
  src/config/tree.rs
  src/config/validate/mod.rs
  src/config/validate/rate_limit.rs
  src/decision/engine.rs
  src/decision/resolve.rs
  src/decision/limits.rs
)

command -v cargo-mutants >/dev/null 2>&1 || cargo install --locked cargo-mutants
files=("$@")
[ "${#files[@]}" -gt 0 ] || files=("${CORE[@]}")

export CARGO_TARGET_DIR="${SLUICE_MUTANTS_TARGET:-$PWD/target/mutants}"
out_root="${SLUICE_MUTANTS_OUT:-$PWD/target/mutants-out}"
summaries=()
status=0
for file in "${files[@]}"; do
  [ -f "$file" ] || { echo "no such file: $file" >&2; exit 1; }
  out="$out_root/$(echo "${file#src/}" | tr '/' '_')"
  mkdir -p "$out"
  echo "== cargo mutants --file $file"
  # Exit 2: missed mutants, 3: timeouts (reported below); anything else is a failure to run.
  rc=0
  # --lib for the build too (cargo test --no-run): integration tests are neither built nor run,
  # except the config loader's fixtures (one bad file per validation rule, no server: seconds),
  # which are the validator's tests of record. They are the `config_errors` module of the one
  # integration-test crate, so that crate is built and nextest picks the unit tests and that
  # module out of it (a libtest name filter would apply to the unit tests too).
  targets=(--cargo-arg=--lib)
  case $file in
    src/config/*)
      targets+=(--test-tool=nextest --cargo-arg=--test=it
        --cargo-test-arg=-E "--cargo-test-arg=kind(lib) | test(/^config_errors::/)") ;;
  esac
  cargo mutants --file "$file" --jobs 1 "${targets[@]}" --output "$out" || rc=$?
  case $rc in 0 | 2 | 3) ;; *) echo "cargo mutants failed on $file (exit $rc)" >&2; exit "$rc" ;; esac
  [ "$rc" -eq 0 ] || status=2
  summaries+=("$(python3 - "$file" "$out/mutants.out/outcomes.json" <<'PY'
import json, sys
file, path = sys.argv[1], sys.argv[2]
data = json.load(open(path))
counts = {"CaughtMutant": 0, "MissedMutant": 0, "Timeout": 0, "Unviable": 0}
for o in data["outcomes"]:
    if o["scenario"] != "Baseline" and o["summary"] in counts:
        counts[o["summary"]] += 1
viable = counts["CaughtMutant"] + counts["MissedMutant"] + counts["Timeout"]
# A mutant that makes the tests hang is detected too (the runner fails a hung test).
detected = counts["CaughtMutant"] + counts["Timeout"]
score = f"{100 * detected / viable:.0f} %" if viable else "-"
print(f"| `{file}` | {sum(counts.values())} | {counts['CaughtMutant']} | {counts['MissedMutant']} "
      f"| {counts['Timeout']} | {counts['Unviable']} | {score} |")
PY
)")
done
echo
echo "| file | mutants | caught | missed | timeouts | unviable | detected of viable |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
printf '%s\n' "${summaries[@]}"
exit "$status"
