package shadowqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// ErrBadRecord is wrapped by every DecodeRecord error: the bytes are not a
// record this version of the codec wrote.
var ErrBadRecord = errors.New("shadowqueue: malformed record")

// recordVersion is the first byte of every encoded Record. Version 0 is never
// a record: StreamLog uses it for its own markers (see markerVersion).
const recordVersion = 1

// Flag bits of an encoded record.
const (
	flagRedelivered = 1 << 0
	flagTime        = 1 << 1 // a time field follows; absent for the zero time.Time
	knownFlags      = flagRedelivered | flagTime
)

// AppendRecord appends the encoding of r to dst and returns the extended
// slice. The encoding is one stream message body:
//
//	+---------+------+-------+---------+-----------+--------------+
//	| version | kind | flags | ID      | Epoch     | time         |
//	| 1 byte  | 1    | 1     | uvarint | uvarint   | 8, BE int64  |
//	|   = 1   |      |       |         |           | (if flagTime)|
//	+---------+------+-------+---------+-----------+--------------+
//	| Queue | Exchange | RoutingKey | ConsumerTag | Properties | Body |
//	+-------+----------+------------+-------------+------------+------+
//	  each: uvarint length, then that many bytes
//
// flags: bit 0 Redelivered, bit 1 time present. Time is Unix nanoseconds,
// so it must lie between the years 1678 and 2262; the zero time.Time is
// encoded as "no time" and decodes as the zero time.Time again. The encoding
// of a record is unique: DecodeRecord rejects every other spelling of it.
func AppendRecord(dst []byte, r *Record) []byte {
	var flags byte
	if r.Redelivered {
		flags |= flagRedelivered
	}
	if !r.Time.IsZero() {
		flags |= flagTime
	}
	dst = append(dst, recordVersion, byte(r.Kind), flags)
	dst = binary.AppendUvarint(dst, r.ID)
	dst = binary.AppendUvarint(dst, r.Epoch)
	if flags&flagTime != 0 {
		dst = binary.BigEndian.AppendUint64(dst, uint64(r.Time.UnixNano()))
	}
	dst = appendString(dst, r.Queue)
	dst = appendString(dst, r.Exchange)
	dst = appendString(dst, r.RoutingKey)
	dst = appendString(dst, r.ConsumerTag)
	dst = appendBytes(dst, r.Properties)
	dst = appendBytes(dst, r.Body)
	return dst
}

// encodedRecordLen is the exact length of AppendRecord's output for r.
func encodedRecordLen(r *Record) int {
	n := 3 + uvarintLen(r.ID) + uvarintLen(r.Epoch)
	if !r.Time.IsZero() {
		n += 8
	}
	n += fieldLen(len(r.Queue)) + fieldLen(len(r.Exchange)) + fieldLen(len(r.RoutingKey))
	n += fieldLen(len(r.ConsumerTag)) + fieldLen(len(r.Properties)) + fieldLen(len(r.Body))
	return n
}

// fieldLen is the encoded length of a length-prefixed field of l bytes.
func fieldLen(l int) int { return uvarintLen(uint64(l)) + l }

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// DecodeRecord decodes one record that AppendRecord encoded. It checks every
// length against the bytes left and rejects unknown versions, kinds and
// flags, non-minimal varints and trailing bytes; every error wraps
// ErrBadRecord.
//
// Buffer lifetime: the returned Properties and Body alias b (capacity capped,
// so appending to them cannot overwrite b). The caller must not change b
// while it uses them. Strings are copied. Empty Properties and Body decode
// as nil.
func DecodeRecord(b []byte) (Record, error) {
	d := decoder{buf: b}
	var r Record
	version := d.readByte("version")
	if d.err == nil && version != recordVersion {
		return Record{}, fmt.Errorf("%w: version %d, want %d", ErrBadRecord, version, recordVersion)
	}
	r.Kind = Kind(d.readByte("kind"))
	if d.err == nil && (r.Kind < KindDelivery || r.Kind > KindResume) {
		return Record{}, fmt.Errorf("%w: unknown kind %d", ErrBadRecord, r.Kind)
	}
	flags := d.readByte("flags")
	if d.err == nil && flags&^knownFlags != 0 {
		return Record{}, fmt.Errorf("%w: unknown flags %#x", ErrBadRecord, flags)
	}
	r.Redelivered = flags&flagRedelivered != 0
	r.ID = d.readUvarint("ID")
	r.Epoch = d.readUvarint("Epoch")
	if flags&flagTime != 0 {
		r.Time = time.Unix(0, int64(d.readUint64("Time")))
	}
	r.Queue = string(d.readBytes("Queue"))
	r.Exchange = string(d.readBytes("Exchange"))
	r.RoutingKey = string(d.readBytes("RoutingKey"))
	r.ConsumerTag = string(d.readBytes("ConsumerTag"))
	r.Properties = d.readBytes("Properties")
	r.Body = d.readBytes("Body")
	if d.err != nil {
		return Record{}, d.err
	}
	if len(d.buf) != 0 {
		return Record{}, fmt.Errorf("%w: %d trailing bytes after Body", ErrBadRecord, len(d.buf))
	}
	return r, nil
}

// decoder reads fields off the front of buf. After the first error every
// read returns a zero value and err keeps that first error.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: field %s: %s", ErrBadRecord, field, fmt.Sprintf(format, args...))
	}
	d.buf = nil
}

func (d *decoder) readByte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.buf) < 1 {
		d.fail(field, "truncated")
		return 0
	}
	v := d.buf[0]
	d.buf = d.buf[1:]
	return v
}

func (d *decoder) readUint64(field string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.buf) < 8 {
		d.fail(field, "need 8 bytes, have %d", len(d.buf))
		return 0
	}
	v := binary.BigEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v
}

func (d *decoder) readUvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if problem := uvarintProblem(v, n); problem != "" {
		d.fail(field, "%s", problem)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// uvarintProblem says what is wrong with binary.Uvarint's result, or "".
func uvarintProblem(v uint64, n int) string {
	switch {
	case n == 0:
		return "truncated varint"
	case n < 0:
		return "varint overflows 64 bits"
	case n != uvarintLen(v):
		return "non-minimal varint"
	}
	return ""
}

// readBytes reads a length-prefixed field and returns it aliasing the input.
func (d *decoder) readBytes(field string) []byte {
	if d.err != nil {
		return nil
	}
	l, n := binary.Uvarint(d.buf)
	if problem := uvarintProblem(l, n); problem != "" {
		d.fail(field+" length", "%s", problem)
		return nil
	}
	d.buf = d.buf[n:]
	if l > uint64(len(d.buf)) {
		d.fail(field, "length %d exceeds the %d bytes left", l, len(d.buf))
		return nil
	}
	if l == 0 {
		return nil
	}
	v := d.buf[:l:l]
	d.buf = d.buf[l:]
	return v
}
