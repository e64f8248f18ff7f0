#!/bin/sh
# Verify the systemd unit (and the example drop-ins) with `systemd-analyze verify`.
#
#   deploy/check.sh DATADISTD_EXECUTABLE
#
# verify insists that ExecStart= points at an existing executable, and the unit names the installed
# path (/usr/local/bin/datadistd), which a build machine does not have. So this renders a temporary
# copy of the unit with ExecStart= pointing at DATADISTD_EXECUTABLE (e.g. .venv/bin/datadistd) and
# verifies that copy, first alone, then with each deploy/*.conf drop-in applied. Any warning
# systemd-analyze prints (unknown key, bad value, ...) fails the check, not only a non-zero exit.
# Exit 77 when systemd-analyze is not installed (the automake "skipped" code).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
exe=${1:?usage: $0 DATADISTD_EXECUTABLE}
unit="$here/datadistd.service"

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "deploy-check: systemd-analyze not found; skipped" >&2
    exit 77
fi
case "$exe" in /*) ;; *) exe="$(pwd)/$exe" ;; esac
if [ ! -x "$exe" ]; then
    echo "deploy-check: $exe is not an executable (run make venv first)" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

verify() {
    # $1: what is being checked; the rendered unit is $tmp/datadistd.service
    out=$(systemd-analyze verify "$tmp/datadistd.service" 2>&1) || { echo "$out" >&2; echo "deploy-check: $1: FAILED" >&2; exit 1; }
    if [ -n "$out" ]; then
        echo "$out" >&2
        echo "deploy-check: $1: warnings (treated as errors)" >&2
        exit 1
    fi
    echo "deploy-check: $1: ok"
}

sed "s#^ExecStart=[^ ]*#ExecStart=$exe#" "$unit" > "$tmp/datadistd.service"
grep -q "^ExecStart=$exe" "$tmp/datadistd.service" || { echo "deploy-check: no ExecStart= line in $unit" >&2; exit 1; }
verify "datadistd.service"

for dropin in "$here"/*.conf; do
    [ -e "$dropin" ] || continue
    grep -q '^\[Service\]' "$dropin" || continue   # only systemd drop-ins (sysusers/tmpfiles files have no sections)
    rm -rf "$tmp/datadistd.service.d"
    mkdir "$tmp/datadistd.service.d"
    cp "$dropin" "$tmp/datadistd.service.d/"
    verify "datadistd.service + $(basename "$dropin")"
done

# The sysusers snippet: parsed by systemd-sysusers against an empty root (nothing is written).
if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$tmp/root/etc"
    out=$(systemd-sysusers --dry-run --root="$tmp/root" "$here/datadist.sysusers.conf" 2>&1) \
        || { echo "$out" >&2; echo "deploy-check: datadist.sysusers.conf: FAILED" >&2; exit 1; }
    echo "deploy-check: datadist.sysusers.conf: ok"
fi
