#!/usr/bin/env bash
# Seeds each target's corpus from the test fixtures (config files; the same bytes also drive the
# key and decision decoders). Run from anywhere; writes fuzz/corpus/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
for target in config_loader descriptor_key decision; do
  mkdir -p "corpus/$target"
  find ../tests/fixtures -type f | while read -r f; do
    cp "$f" "corpus/$target/seed-$(echo "$f" | tr '/.' '__')"
  done
done
echo "seeded fuzz/corpus/{config_loader,descriptor_key,decision} from tests/fixtures"
