package amqpwire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Table is an AMQP field table, as used for method arguments and the
// headers property.
//
// The field-value types are RabbitMQ's (the 0-9-1 errata that all real
// clients and brokers use). Decoding yields these Go types, and encoding
// accepts them:
//
//	't' bool          'b' int8     'B' uint8     's' int16     'u' uint16
//	'I' int32         'i' uint32   'l' int64     'f' float32   'd' float64
//	'D' Decimal       'S' string   'x' []byte    'A' []any     'T' time.Time
//	'F' Table         'V' nil
//
// Encoding also accepts int (as 'l') and map[string]any (as 'F'). Any other
// Go type cannot be encoded (ErrInvalidValue).
//
// Wire layout: a 32-bit byte count, then that many bytes of entries, each a
// shortstr name followed by a field value (a type octet and the value).
// Arrays ('A') are a 32-bit byte count followed by field values. Encoding
// writes entries in ascending byte order of their names, so the output is
// deterministic. Empty tables, arrays and byte arrays decode as nil.
type Table map[string]any

// Decimal is the 'D' field value: Value / 10^Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// MaxNesting is the deepest nesting of tables and arrays that is decoded or
// encoded; a table inside an array inside the headers table is depth 3. It
// bounds the recursion for hostile input and cyclic values.
const MaxNesting = 100

// Validate reports whether t can be encoded, as an error wrapping
// ErrInvalidValue that names the offending entry.
func (t Table) Validate() (err error) {
	defer catchEncode(&err)
	appendTable(nil, t, 1)
	return nil
}

// AppendTable appends t in wire layout (its 32-bit length included). On
// error it returns dst unchanged and an error wrapping ErrInvalidValue.
func AppendTable(dst []byte, t Table) (out []byte, err error) {
	out = dst
	defer catchEncode(&err)
	out = appendTable(dst, t, 1)
	return out, nil
}

// DecodeTable decodes a field table in wire layout (its 32-bit length
// included) that fills all of b.
func DecodeTable(b []byte) (Table, error) {
	d := decoder{b: b, obj: "field table"}
	t := d.table("")
	if err := d.finish(); err != nil {
		return nil, err
	}
	return t, nil
}

func truncated(what string, need uint64, left int) *Error {
	return frameErrorf("%s needs %d bytes, %d left", what, need, left)
}

// within prefixes e's text with where the failing value sits.
func within(e *Error, format string, args ...any) *Error {
	return &Error{Code: e.Code, Text: fmt.Sprintf(format, args...) + ": " + e.Text}
}

// readTable decodes the entries of a table whose content (after the 32-bit
// length) is exactly b.
func readTable(b []byte, depth int) (Table, *Error) {
	if depth > MaxNesting {
		return nil, &Error{Code: SyntaxError, Text: "field tables nested deeper than " + strconv.Itoa(MaxNesting)}
	}
	var t Table
	for len(b) > 0 {
		n := uint64(b[0])
		if uint64(len(b)-1) < n {
			return nil, truncated("field name", n, len(b)-1)
		}
		name := string(b[1 : 1+n])
		b = b[1+n:]
		v, rest, err := readValue(b, depth)
		if err != nil {
			return nil, within(err, "field %q", name)
		}
		b = rest
		if t == nil {
			t = make(Table)
		}
		t[name] = v
	}
	return t, nil
}

// readArray decodes the values of an array whose content is exactly b.
func readArray(b []byte, depth int) ([]any, *Error) {
	if depth > MaxNesting {
		return nil, &Error{Code: SyntaxError, Text: "field arrays nested deeper than " + strconv.Itoa(MaxNesting)}
	}
	var a []any
	for len(b) > 0 {
		v, rest, err := readValue(b, depth)
		if err != nil {
			return nil, within(err, "array element %d", len(a))
		}
		b = rest
		a = append(a, v)
	}
	return a, nil
}

// readValue decodes one field value (type octet and value) at the start of
// b and returns it with the bytes after it.
func readValue(b []byte, depth int) (any, []byte, *Error) {
	if len(b) == 0 {
		return nil, nil, truncated("field value type", 1, 0)
	}
	typ, b := b[0], b[1:]
	size := uint64(0) // size of a fixed-size value
	switch typ {
	case 't', 'b', 'B':
		size = 1
	case 's', 'u':
		size = 2
	case 'I', 'i', 'f':
		size = 4
	case 'D':
		size = 5
	case 'l', 'd', 'T':
		size = 8
	case 'S', 'x', 'A', 'F':
		if len(b) < 4 {
			return nil, nil, truncated("field value length", 4, len(b))
		}
		n := uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
		if uint64(len(b)) < n {
			return nil, nil, truncated(fmt.Sprintf("field value of type '%c'", typ), n, len(b))
		}
		content, rest := b[:n], b[n:]
		switch typ {
		case 'S':
			return string(content), rest, nil
		case 'x':
			if n == 0 {
				return []byte(nil), rest, nil
			}
			return slices.Clone(content), rest, nil
		case 'A':
			a, err := readArray(content, depth+1)
			return a, rest, err
		default: // 'F'
			t, err := readTable(content, depth+1)
			return t, rest, err
		}
	case 'V':
		return nil, b, nil
	default:
		return nil, nil, &Error{Code: SyntaxError, Text: fmt.Sprintf("unknown field value type %q (0x%02X)", rune(typ), typ)}
	}
	if uint64(len(b)) < size {
		return nil, nil, truncated(fmt.Sprintf("field value of type '%c'", typ), size, len(b))
	}
	v, rest := b[:size], b[size:]
	switch typ {
	case 't':
		return v[0] != 0, rest, nil
	case 'b':
		return int8(v[0]), rest, nil
	case 'B':
		return v[0], rest, nil
	case 's':
		return int16(binary.BigEndian.Uint16(v)), rest, nil
	case 'u':
		return binary.BigEndian.Uint16(v), rest, nil
	case 'I':
		return int32(binary.BigEndian.Uint32(v)), rest, nil
	case 'i':
		return binary.BigEndian.Uint32(v), rest, nil
	case 'f':
		return math.Float32frombits(binary.BigEndian.Uint32(v)), rest, nil
	case 'D':
		return Decimal{Scale: v[0], Value: int32(binary.BigEndian.Uint32(v[1:]))}, rest, nil
	case 'l':
		return int64(binary.BigEndian.Uint64(v)), rest, nil
	case 'd':
		return math.Float64frombits(binary.BigEndian.Uint64(v)), rest, nil
	default: // 'T'
		return time.Unix(int64(binary.BigEndian.Uint64(v)), 0).UTC(), rest, nil
	}
}

// appendTable appends t with its 32-bit length. It panics with encodePanic
// on a value that cannot be encoded.
func appendTable(dst []byte, t Table, depth int) []byte {
	if depth > MaxNesting {
		invalidValue("field tables nested deeper than %d (is a table inside itself?)", MaxNesting)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	if len(t) > 0 {
		names := make([]string, 0, len(t))
		for name := range t {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			if len(name) > math.MaxUint8 {
				invalidValue("field name of %d bytes exceeds 255: %.40q...", len(name), name)
			}
			dst = append(dst, byte(len(name)))
			dst = append(dst, name...)
			dst = appendValue(dst, t[name], depth, name, -1)
		}
	}
	return patchLength(dst, start)
}

func appendArray(dst []byte, a []any, depth int) []byte {
	if depth > MaxNesting {
		invalidValue("field arrays nested deeper than %d (is an array inside itself?)", MaxNesting)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	for i, v := range a {
		dst = appendValue(dst, v, depth, "", i)
	}
	return patchLength(dst, start)
}

// patchLength sets the 32-bit length at dst[start:] to the number of bytes
// after it.
func patchLength(dst []byte, start int) []byte {
	n := uint64(len(dst) - start - 4)
	if n > math.MaxUint32 {
		invalidValue("field table or array of %d bytes exceeds 2^32-1", n)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst
}

// appendValue appends v as a field value (type octet and value). v is the
// table entry name, or the array element index if index >= 0.
func appendValue(dst []byte, v any, depth int, name string, index int) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, 'V')
	case bool:
		return append(dst, 't', bit(v, 0))
	case int8:
		return append(dst, 'b', byte(v))
	case uint8:
		return append(dst, 'B', v)
	case int16:
		return appendU16(append(dst, 's'), uint16(v))
	case uint16:
		return appendU16(append(dst, 'u'), v)
	case int32:
		return appendU32(append(dst, 'I'), uint32(v))
	case uint32:
		return appendU32(append(dst, 'i'), v)
	case int64:
		return appendU64(append(dst, 'l'), uint64(v))
	case int:
		return appendU64(append(dst, 'l'), uint64(v))
	case float32:
		return appendU32(append(dst, 'f'), math.Float32bits(v))
	case float64:
		return appendU64(append(dst, 'd'), math.Float64bits(v))
	case Decimal:
		return appendU32(append(dst, 'D', v.Scale), uint32(v.Value))
	case string:
		return appendLongstr(append(dst, 'S'), v)
	case []byte:
		return appendLongstr(append(dst, 'x'), v)
	case []any:
		return appendArray(append(dst, 'A'), v, depth+1)
	case time.Time:
		return appendU64(append(dst, 'T'), uint64(v.Unix()))
	case Table:
		return appendTable(append(dst, 'F'), v, depth+1)
	case map[string]any:
		return appendTable(append(dst, 'F'), v, depth+1)
	}
	if index >= 0 {
		invalidValue("array element %d: Go type %T has no AMQP field value type", index, v)
	}
	invalidValue("field %q: Go type %T has no AMQP field value type", name, v)
	return nil
}
