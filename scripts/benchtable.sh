#!/usr/bin/env bash
# Reads `go test -bench` output on stdin and prints the metrics of each
# benchmark as a table: one row per metric, with agentjail's median next to
# the reference's and their ratio where the benchmark has a reference
# (units: see test/integration/bench_test.go).
set -euo pipefail

awk '
/^pkg: / {
	pkg = $2
	sub(/.*\//, "", pkg)
}
/^Benchmark/ {
	name = $1
	sub(/-[0-9]+$/, "", name)
	sub(/^Benchmark/, "", name)
	delete m
	order = ""
	for (i = 5; i + 1 <= NF; i += 2) {
		m[$(i + 1)] = $i
		order = order " " $(i + 1)
	}
	n++
	if ("ms" in m) {
		target = ("target-ms" in m) ? m["target-ms"] " ms" : (("target-x" in m) ? m["target-x"] "x" : "-")
		line[n] = sprintf("%-24s %12s %12s %8s %12s", name, m["ms"] " ms", m["ref-ms"] " ms", m["x-ref"] "x", target)
		k = split(order, units, " ")
		for (u = 1; u <= k; u++) {
			if (units[u] !~ /^(ms|ref-ms|x-ref|target-ms|target-x|ns\/op)$/) {
				line[n] = line[n] sprintf("  %s=%s", units[u], m[units[u]])
			}
		}
	} else {
		k = split(order, units, " ")
		extra = ""
		for (u = 1; u <= k; u++) {
			extra = extra sprintf("%s=%s  ", units[u], m[units[u]])
		}
		if (k == 0) {
			# Only the time per operation (e.g. init'"'"'s exec path alone).
			extra = sprintf("%12s  (%s, per operation)", sprintf("%.3f ms", $3 / 1e6), pkg)
		}
		line[n] = sprintf("%-24s %s", name, extra)
	}
}
END {
	if (n == 0) {
		print "benchtable: no benchmark results on stdin" > "/dev/stderr"
		exit 1
	}
	printf "\n%-24s %12s %12s %8s %12s\n", "benchmark (median)", "agentjail", "reference", "ratio", "target"
	for (i = 1; i <= n; i++) {
		print line[i]
	}
}'
