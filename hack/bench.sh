#!/usr/bin/env bash
# Runs the project's Go benchmarks and prints one line per figure:
#
#   bench: NAME VALUE UNIT
#   bench: NAME-ratio R
#
# NAME is the benchmark's name without the "Benchmark" prefix (SelectorMatch/resclass).
# Within one benchmark, a sub-benchmark named baseline-* is the baseline measured in
# the same run; every sibling gets a ratio line, ours / baseline in ns/op, so a
# ratio below 1 means faster than the baseline.
#
# A benchmark that measures something other than time suppresses ns/op
# (b.ReportMetric(0, "ns/op")); its siblings then get one ratio line per custom
# unit that both report (B/op, allocs/op and MB/s aside), with the unit:
#
#   bench: NAME-ratio R UNIT
#
# A benchmark that compares against a reference it computes itself (an
# optimum found by exhaustive search, say) reports the quotient with the unit
# "ratio", printed as
#
#   bench: NAME-ratio R
#
# and gets no ratio computed against a baseline-* sibling: its own is taken
# against baselines measured around it (SchedulingThroughput's interleaved
# rounds), a quotient of the siblings' figures would compare runs minutes apart.
#
#   hack/bench.sh               every benchmark
#   hack/bench.sh SelectorMatch one benchmark (with its sub-benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:-}
pattern=.
[ -n "$name" ] && pattern="^Benchmark${name%%/*}\$"

pkgs=$(grep -rl --include='*_test.go' -E "^func Benchmark${name%%/*}" . | xargs -r -n1 dirname | sort -u)
[ -n "$pkgs" ] || { echo "no benchmark named ${name:-*}" >&2; exit 1; }

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
# shellcheck disable=SC2086
# Failures, and what benchmarks log (a breakdown, why a run was refused), go to
# stderr: the lines that start with FAIL, panic or ---, and the indented lines
# that follow them, and the lines a long benchmark prints itself ("log: ...",
# benchLog in e2e/scheduler_bench_test.go).
go test -run='^$' -bench="$pattern" -benchmem -count=1 -timeout=60m $pkgs | tee "$raw" |
  awk '/^log: / { print; fflush(); next } /^(FAIL|panic|---)/ { p = 1; print; next } /^[ \t]/ { if (p) print; next } { p = 0 }' >&2 || true
grep -q '^FAIL' "$raw" && exit 1

awk '
/^Benchmark/ {
  n = $1; sub(/^Benchmark/, "", n); sub(/-[0-9]+$/, "", n)
  for (i = 3; i < NF; i += 2) {
    if ($(i+1) == "ratio") { printf "bench: %s-ratio %s\n", n, $i; own[n] = 1; continue }
    printf "bench: %s %s %s\n", n, $i, $(i+1)
    if ($(i+1) == "ns/op") ns[n] = $i
    else if ($(i+1) !~ /^(B\/op|allocs\/op|MB\/s)$/) { units[n] = units[n] " " $(i+1); val[n, $(i+1)] = $i }
  }
  order[++count] = n
}
END {
  for (k = 1; k <= count; k++) {
    n = order[k]; parent = n; sub(/\/[^\/]*$/, "", parent)
    if (parent == n || n ~ /\/baseline-/ || n in own) continue
    for (j = 1; j <= count; j++) {
      b = order[j]
      if (index(b, parent "/baseline-") != 1) continue
      if (ns[b] > 0) {
        printf "bench: %s-ratio %.4f\n", n, ns[n] / ns[b]
        continue
      }
      m = split(units[b], u, " ")
      for (i = 1; i <= m; i++)
        if ((n, u[i]) in val && val[b, u[i]] > 0)
          printf "bench: %s-ratio %.4f %s\n", n, val[n, u[i]] / val[b, u[i]], u[i]
    }
  }
}' "$raw"
