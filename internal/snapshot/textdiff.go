package snapshot

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aymanbagabas/go-udiff/lcs"
	"golang.org/x/sys/unix"
)

// Bounds of the text diffs one daemon computes, whatever a jail writes.
const (
	// maxTextDiff is the largest file (either side) that gets a text diff.
	maxTextDiff = 1 << 20
	// maxTextOutput bounds the unified diffs of one Diff call, added up;
	// files past it are marked instead.
	maxTextOutput = 32 << 20
	// textDiffSlots is how many files the daemon diffs as text at once,
	// across every request.
	textDiffSlots = 2
)

// textDiffTime bounds the time one file's text diff may take (a variable
// for the tests); past it the file is marked instead.
var textDiffTime = 5 * time.Second

// slots holds a token per file being diffed as text: the work, and the
// memory it needs (both sides, their lines and the diff), is bounded by
// textDiffSlots × what one file may use.
var slots = make(chan struct{}, textDiffSlots)

// notText is the diff of a file that is binary, larger than the bounds, or
// took too long: its name and that it changed.
func notText(from, to string) string {
	return fmt.Sprintf("Files %s and %s differ (binary or too large for a text diff)\n", from, to)
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

// Unified returns the unified diff (as diff -u prints it, with context
// lines around each change) turning text a, named from, into text b,
// named to; "" when they are equal. The longest common subsequence is a
// bounded-effort, linear-space one: past a few hundred differences in a
// row it may report a longer edit than the shortest, never a wrong one.
func Unified(from, to, a, b string, context int) string {
	la, lb := splitLines(a), splitLines(b)
	diffs := lcs.DiffLines(la, lb)
	if len(diffs) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", from, to)
	line := func(kind byte, l string) {
		sb.WriteByte(kind)
		sb.WriteString(l)
		if !strings.HasSuffix(l, "\n") {
			sb.WriteString("\n\\ No newline at end of file\n")
		}
	}
	for i := 0; i < len(diffs); {
		// A hunk: diffs i..j, each closer than 2×context kept lines to
		// the one before it.
		j := i
		for j+1 < len(diffs) && diffs[j+1].Start-diffs[j].End <= 2*context {
			j++
		}
		startA := max(diffs[i].Start-context, 0)
		endA := min(diffs[j].End+context, len(la))
		// Kept lines map one to one: b's start is a's shifted by the
		// first diff's offset.
		startB := startA + diffs[i].ReplStart - diffs[i].Start
		endB := endA + diffs[j].ReplEnd - diffs[j].End
		oldN, newN := endA-startA, endB-startB
		oldS, newS := startA+1, startB+1
		if oldN == 0 {
			oldS--
		}
		if newN == 0 {
			newS--
		}
		fmt.Fprintf(&sb, "@@ -%d,%d +%d,%d @@\n", oldS, oldN, newS, newN)
		at := startA
		for _, d := range diffs[i : j+1] {
			for ; at < d.Start; at++ {
				line(' ', la[at])
			}
			for _, l := range la[d.Start:d.End] {
				line('-', l)
			}
			for _, l := range lb[d.ReplStart:d.ReplEnd] {
				line('+', l)
			}
			at = d.End
		}
		for ; at < endA; at++ {
			line(' ', la[at])
		}
		i = j + 1
	}
	return sb.String()
}

// textBudget is what is left of one Diff call's text output.
type textBudget struct{ left int }

// isRegular is true for a regular file and for an absent side (nil).
func isRegular(e *entry) bool {
	return e == nil || e.st.Mode&unix.S_IFMT == unix.S_IFREG
}

// textDiff is the unified diff of a regular file between two entries (nil:
// absent), "" when either side is something else; a file that is binary, larger than maxTextDiff, past the call's
// output budget or slower than textDiffTime gets notText. It waits for a
// daemon-wide slot first (ctx ends the wait: the file gets notText).
func textDiff(ctx context.Context, p string, a, b *entry, budget *textBudget) string {
	if !isRegular(a) || !isRegular(b) {
		return ""
	}
	from, to := "a"+p, "b"+p
	if a == nil {
		from = "/dev/null"
	}
	if b == nil {
		to = "/dev/null"
	}
	if budget.left <= 0 {
		return notText(from, to)
	}
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return notText(from, to)
	}
	old, ok1 := readText(ctx, a)
	cur, ok2 := readText(ctx, b)
	if !ok1 || !ok2 {
		<-slots
		return notText(from, to)
	}
	done := make(chan string, 1)
	go func() {
		// The slot is held until the work ends, even when the caller
		// stopped waiting: slow diffs still count against the bound.
		defer func() { <-slots }()
		done <- Unified(from, to, string(old), string(cur), 3)
	}()
	t := time.NewTimer(textDiffTime)
	defer t.Stop()
	select {
	case d := <-done:
		if len(d) > budget.left {
			budget.left = 0
			return notText(from, to)
		}
		budget.left -= len(d)
		return d
	case <-t.C:
	case <-ctx.Done():
	}
	return notText(from, to)
}
