// Package jsonstr appends strings as JSON string literals without
// reflection or allocation, for the encoders on hot paths (the event
// stream, terminal recordings) that build their lines by hand.
package jsonstr

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// Append appends s as a JSON string literal to dst and returns the
// extended buffer. Quotes, backslashes and control characters are
// escaped; invalid UTF-8 becomes U+FFFD, as encoding/json does. Unlike
// encoding/json it leaves '<', '>', '&', U+2028 and U+2029 as they are:
// the output is JSON, not something to embed in HTML.
func Append[T ~string | ~[]byte](dst []byte, s T) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		// A rune is at most utf8.UTFMax bytes: the conversion of that
		// window does not escape and needs no allocation.
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
