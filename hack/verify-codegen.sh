#!/usr/bin/env bash
# Fails when the committed generated code or CRD manifests differ from what
# hack/update-codegen.sh makes from the current API types. It regenerates in a
# copy of the tree, so that it never touches the working tree.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cd "$root"
# The files git knows of plus new ones it does not ignore: the tree as it is.
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$tmp"

(cd "$tmp" && bash hack/update-codegen.sh >/dev/null)

status=0
for dir in pkg/generated pkg/apis config/crd; do
  if ! diff -Nru "$root/$dir" "$tmp/$dir"; then status=1; fi
done
if [ "$status" -ne 0 ]; then
  echo "generated files are stale: run hack/update-codegen.sh" >&2
  exit 1
fi
echo "generated files are current"
