#!/usr/bin/env bash
# Lints every Lua file of the repository with luacheck (settings: .luacheckrc): the scripts that
# sluice runs inside Redis (src/limiter/redis/lua/) and any other .lua file. Fails on any warning,
# and fails loudly if luacheck is missing (Debian and Ubuntu: `apt-get install lua-check`).
#
#   bash scripts/ci/lua-lint.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v luacheck >/dev/null 2>&1; then
  echo "lua-lint.sh: luacheck is not installed (apt-get install lua-check); the Lua is not checked" >&2
  exit 1
fi
mapfile -t files < <(find . -name '*.lua' -not -path './target/*' -not -path './.git/*' | sort)
if [ "${#files[@]}" -eq 0 ]; then
  echo "lua-lint.sh: found no .lua file to check" >&2
  exit 1
fi
luacheck --codes --no-color "${files[@]}"
