package amqpwire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// decoder reads the fields of one method's arguments or one property list
// in order. The first failure sticks: later reads return zero values, and
// finish reports the failure. Errors name the object (obj) and the field.
type decoder struct {
	b   []byte // bytes not yet read
	obj string // what is being decoded, e.g. "basic.deliver"
	err *Error
}

func (d *decoder) fail(code uint16, field, format string, args ...any) {
	if d.err == nil {
		where := d.obj + ": "
		if field != "" {
			where += field + ": "
		}
		d.err = &Error{Code: code, Text: where + fmt.Sprintf(format, args...)}
	}
	d.b = nil
}

// has reports whether n more bytes are available, failing if not.
func (d *decoder) has(n uint64, field string) bool {
	if d.err != nil {
		return false
	}
	if uint64(len(d.b)) < n {
		d.fail(FrameError, field, "needs %d bytes, %d left in the payload", n, len(d.b))
		return false
	}
	return true
}

func (d *decoder) u8(field string) uint8 {
	if !d.has(1, field) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u16(field string) uint16 {
	if !d.has(2, field) {
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}

func (d *decoder) u32(field string) uint32 {
	if !d.has(4, field) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64(field string) uint64 {
	if !d.has(8, field) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// bytes returns the next n bytes, aliasing the input.
func (d *decoder) bytes(n uint64, field string) []byte {
	if !d.has(n, field) {
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) shortstr(field string) string {
	n := d.u8(field)
	return string(d.bytes(uint64(n), field))
}

func (d *decoder) table(field string) Table {
	n := d.u32(field)
	b := d.bytes(uint64(n), field)
	if d.err != nil {
		return nil
	}
	t, err := readTable(b, 1)
	if err != nil {
		d.fail(err.Code, field, "%s", err.Text)
		return nil
	}
	return t
}

// finish reports the first failure, or a FrameError if bytes are left over.
func (d *decoder) finish() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail(FrameError, "end", "%d bytes left over after the last field", len(d.b))
	}
	if d.err != nil {
		return d.err
	}
	return nil
}

func bit(v bool, n uint) uint8 {
	if v {
		return 1 << n
	}
	return 0
}

func appendU16(dst []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(dst, v) }
func appendU32(dst []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(dst, v) }
func appendU64(dst []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(dst, v) }

// appendShortstr appends s as a shortstr: a length octet and the bytes.
func appendShortstr(dst []byte, s string) []byte {
	if len(s) > math.MaxUint8 {
		invalidValue("shortstr of %d bytes exceeds 255: %.40q...", len(s), s)
	}
	dst = append(dst, byte(len(s)))
	return append(dst, s...)
}

// appendLongstr appends s as a longstr: a 32-bit length and the bytes.
func appendLongstr[T string | []byte](dst []byte, s T) []byte {
	if uint64(len(s)) > math.MaxUint32 {
		invalidValue("longstr of %d bytes exceeds 2^32-1", len(s))
	}
	dst = appendU32(dst, uint32(len(s)))
	return append(dst, s...)
}
