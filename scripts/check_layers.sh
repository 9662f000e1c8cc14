#!/usr/bin/env bash
# Fails when a crate depends on one its layer must not see (normal, build
# or dev dependencies, direct or not). The host reaches devices only
# through insitu-client's DeviceClient; the contract, the model, the
# kernels and the wire types stay below everything that does I/O.
set -euo pipefail
cd "$(dirname "$0")/.."

# crate : insitu crates it may depend on (space-separated)
rules=(
  "insitu-host:insitu-wire insitu-model insitu-stage insitu-link insitu-client insitu-calibrate insitu-format insitu-kernels"
  "insitu-client:insitu-wire insitu-link"
  "insitu-model:insitu-wire"
  "insitu-wire:"
  "insitu-kernels:"
  "insitu-link:"
  # Nothing below the CLI reaches up to the session crate or the binary.
  "insitu-flight:insitu-wire insitu-device insitu-client insitu-host insitu-ingest insitu-link insitu-format insitu-extsort insitu-stage insitu-kernels insitu-calibrate insitu-model"
)

status=0
for rule in "${rules[@]}"; do
  crate="${rule%%:*}"
  allowed=" ${rule#*:} "
  tree=$(cargo tree -p "$crate" -e normal,build,dev --prefix none --format '{p}')
  deps=$(awk '{print $1}' <<<"$tree" | grep '^insitu-' | sort -u | grep -vx "$crate" || true)
  for dep in $deps; do
    if [[ "$allowed" != *" $dep "* ]]; then
      echo "layer check: $crate depends on $dep (allowed: ${rule#*:})" >&2
      status=1
    fi
  done
done
exit $status
