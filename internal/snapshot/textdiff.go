package snapshot

import (
	"fmt"
	"strings"
)

// maxDiffLines bounds the lines a text diff compares; larger files get a
// diff that replaces every line.
const maxDiffLines = 20000

// op is one line of an edit script: ' ' kept, '-' removed, '+' added.
type op struct {
	kind byte
	line string
}

// splitLines splits s into lines, each keeping its newline.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// editScript returns a shortest edit script from a to b (Myers' greedy
// algorithm: for growing edit distance d, the furthest point reachable on
// every diagonal k, then a walk back through the recorded frontiers).
func editScript(a, b []string) []op {
	n, m := len(a), len(b)
	if n+m > maxDiffLines {
		out := make([]op, 0, n+m)
		for _, l := range a {
			out = append(out, op{'-', l})
		}
		for _, l := range b {
			out = append(out, op{'+', l})
		}
		return out
	}
	maxD := n + m
	off := maxD + 1
	v := make([]int, 2*maxD+3)
	var trace [][]int
	done := false
	for d := 0; d <= maxD && !done; d++ {
		trace = append(trace, append([]int(nil), v...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				done = true
				break
			}
		}
	}
	var rev []op
	x, y := n, m
	for d := len(trace) - 1; d >= 0; d-- {
		vd := trace[d]
		k := x - y
		var prevK int
		if k == -d || (k != d && vd[off+k-1] < vd[off+k+1]) {
			prevK = k + 1
		} else {
			prevK = k - 1
		}
		prevX := vd[off+prevK]
		prevY := prevX - prevK
		for x > prevX && y > prevY {
			rev = append(rev, op{' ', a[x-1]})
			x--
			y--
		}
		if d > 0 {
			if x == prevX {
				rev = append(rev, op{'+', b[y-1]})
			} else {
				rev = append(rev, op{'-', a[x-1]})
			}
		}
		x, y = prevX, prevY
	}
	out := make([]op, len(rev))
	for i := range rev {
		out[i] = rev[len(rev)-1-i]
	}
	return out
}

// Unified returns the unified diff (as diff -u prints it, with context
// lines around each change) turning text a, named from, into text b,
// named to; "" when they are equal.
func Unified(from, to, a, b string, context int) string {
	ops := editScript(splitLines(a), splitLines(b))
	var changes []int
	for i, o := range ops {
		if o.kind != ' ' {
			changes = append(changes, i)
		}
	}
	if len(changes) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", from, to)
	// Line numbers (1-based) of the old and new side at each op.
	oldAt, newAt := make([]int, len(ops)+1), make([]int, len(ops)+1)
	oldAt[0], newAt[0] = 1, 1
	for i, o := range ops {
		oldAt[i+1], newAt[i+1] = oldAt[i], newAt[i]
		if o.kind != '+' {
			oldAt[i+1]++
		}
		if o.kind != '-' {
			newAt[i+1]++
		}
	}
	for i := 0; i < len(changes); {
		start := max(changes[i]-context, 0)
		j := i
		for j+1 < len(changes) && changes[j+1]-changes[j] <= 2*context {
			j++
		}
		end := min(changes[j]+context+1, len(ops))
		oldN, newN := oldAt[end]-oldAt[start], newAt[end]-newAt[start]
		oldS, newS := oldAt[start], newAt[start]
		if oldN == 0 {
			oldS--
		}
		if newN == 0 {
			newS--
		}
		fmt.Fprintf(&sb, "@@ -%d,%d +%d,%d @@\n", oldS, oldN, newS, newN)
		for _, o := range ops[start:end] {
			sb.WriteByte(o.kind)
			sb.WriteString(o.line)
			if !strings.HasSuffix(o.line, "\n") {
				sb.WriteString("\n\\ No newline at end of file\n")
			}
		}
		i = j + 1
	}
	return sb.String()
}
