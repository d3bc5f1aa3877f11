#!/bin/sh
# Rebuild prometheusrule.yaml from ../rules.yaml (run from anywhere).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out="$here/prometheusrule.yaml"
sed -n '1,/^spec:$/p' "$out" > "$out.new"
sed -n '/^groups:/,$p' "$here/../rules.yaml" | sed 's/^/  /; s/^  $//' >> "$out.new"
mv "$out.new" "$out"
