package outbox

import "encoding/json"

// validJSON reports whether b is one JSON value, as json.Valid does, for
// every payload the relay publishes in structured mode (it decides whether
// the data goes in inline or as data_base64). json.Valid's scanner calls a
// function per byte, a measurable part of a small message's cost in a
// drain; this loop takes a fraction of that. FuzzValidJSON holds it to
// json.Valid's answer. Values nested
// deeper than it keeps track of are left to json.Valid.
func validJSON(b []byte) bool {
	var open [64]byte // the containers open, innermost last: '{' or '['
	depth := 0
	i := skipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if depth == len(open) {
				return json.Valid(b)
			}
			open[depth] = c
			depth++
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' is '{'+2, ']' is '['+2
				depth--
				i++
				break
			}
			if c == '{' {
				if i = objectKey(b, i); i < 0 {
					return false
				}
			}
			continue
		case c == '"':
			if i = skipString(b, i); i < 0 {
				return false
			}
		case c == 't':
			if i = skipLiteral(b, i, "true"); i < 0 {
				return false
			}
		case c == 'f':
			if i = skipLiteral(b, i, "false"); i < 0 {
				return false
			}
		case c == 'n':
			if i = skipLiteral(b, i, "null"); i < 0 {
				return false
			}
		default:
			if i = skipNumber(b, i); i < 0 {
				return false
			}
		}
		// A value ended at i: what may follow it.
		for {
			i = skipSpace(b, i)
			if depth == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := open[depth-1]
			if b[i] == top+2 {
				depth--
				i++
				continue
			}
			if b[i] != ',' {
				return false
			}
			i = skipSpace(b, i+1)
			if top == '{' {
				if i = objectKey(b, i); i < 0 {
					return false
				}
			}
			break
		}
	}
}

// objectKey skips a member's name and its colon, and the space after it;
// -1 if there are none.
func objectKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = skipString(b, i); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipSpace(b, i+1)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString skips the string that starts at b[i] (a quote); -1 if it is
// not one. Like json.Valid, it does not ask for valid UTF-8.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func skipLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// skipNumber skips the number that starts at b[i]; -1 if there is none.
func skipNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
