package shadowqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// ErrBadRecord is wrapped by every DecodeRecord error: the bytes are not a
// record this version of the codec wrote.
var ErrBadRecord = errors.New("shadowqueue: malformed record")

// FieldError is the error of a decoder that rejects one field of a record,
// a fragment header or a batch: its length, its value or the bytes left for
// it. It wraps ErrBadRecord; errors.As finds it behind the reader's context.
type FieldError struct {
	Field   string // the field, as the layout diagrams name it: "RoutingKey", "fragment total"
	Problem string // what is wrong with it
}

func (e *FieldError) Error() string {
	return ErrBadRecord.Error() + ": field " + e.Field + ": " + e.Problem
}

func (e *FieldError) Unwrap() error { return ErrBadRecord }

// maxShortstr is the longest AMQP 0-9-1 short string. A replaying sidecar
// sends a record's Exchange and RoutingKey back to the app in basic.deliver
// and basic.get-ok, where they are short strings; Queue and ConsumerTag are
// short strings wherever AMQP carries them. DecodeRecord holds all four to
// it, so that no record read from a log can make a sidecar build a frame it
// cannot encode.
const maxShortstr = 255

// minProperties is the length of the shortest non-empty property list: the
// 16-bit property flags.
const minProperties = 2

// recordVersion is the first byte of every encoded Record. Version 0 is never
// a record: StreamLog uses it for its own markers (see markerVersion),
// version 2 starts a fragment of a record (see fragmentVersion) and version
// 3 a batch of records (see batchVersion).
const recordVersion = 1

// minRecordLen is the length of the shortest encoded Record: version, kind
// and flags, a one-byte ID and Epoch, no time, and six empty fields.
const minRecordLen = 3 + 1 + 1 + 6

// Flag bits of an encoded record.
const (
	flagRedelivered = 1 << 0
	flagTime        = 1 << 1 // a time field follows; absent for the zero time.Time
	flagFor         = 1 << 2 // a For field follows the time; absent when For is 0
	flagRepeats     = 1 << 3 // a Repeats field follows For; absent when Repeats is 0
	knownFlags      = flagRedelivered | flagTime | flagFor | flagRepeats
)

// AppendRecord appends the encoding of r to dst and returns the extended
// slice. The encoding is one stream message body:
//
//	+---------+------+-------+---------+-----------+--------------+
//	| version | kind | flags | ID      | Epoch     | time         |
//	| 1 byte  | 1    | 1     | uvarint | uvarint   | 8, BE int64  |
//	|   = 1   |      |       |         |           | (if flagTime)|
//	+---------+------+-------+---------+-----------+--------------+
//	| For         | Repeats         | Queue | Exchange | RoutingKey | ConsumerTag | Properties | Body |
//	| uvarint     | uvarint         +-------+----------+------------+-------------+------------+------+
//	| (if flagFor)| (if flagRepeats)|  each: uvarint length, then that many bytes
//	+-------------+-----------------+
//
// flags: bit 0 Redelivered, bit 1 time present, bit 2 For present, bit 3
// Repeats present (neither is ever encoded as zero; Repeats only on a
// delivery, and below its ID). A sidecar older than Repeats rejects a
// record that has it (unknown flag). Time is Unix nanoseconds,
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
	if r.For != 0 {
		flags |= flagFor
	}
	if r.Repeats != 0 {
		flags |= flagRepeats
	}
	dst = append(dst, recordVersion, byte(r.Kind), flags)
	dst = binary.AppendUvarint(dst, r.ID)
	dst = binary.AppendUvarint(dst, r.Epoch)
	if flags&flagTime != 0 {
		dst = binary.BigEndian.AppendUint64(dst, uint64(r.Time.UnixNano()))
	}
	if flags&flagFor != 0 {
		dst = binary.AppendUvarint(dst, r.For)
	}
	if flags&flagRepeats != 0 {
		dst = binary.AppendUvarint(dst, r.Repeats)
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
	if r.For != 0 {
		n += uvarintLen(r.For)
	}
	if r.Repeats != 0 {
		n += uvarintLen(r.Repeats)
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
// length against the bytes left before it copies or slices, and against
// what AMQP allows the field: Queue, Exchange, RoutingKey and ConsumerTag
// at most 255 bytes (a short string), Properties empty or at least its
// 2-byte flags word, a KindPublish Body exactly PublishDigestLen bytes, and
// a KindCutoff Body a list of queues (CutoffBody).
// It rejects unknown versions, kinds and flags, non-minimal varints and
// trailing bytes. Every error wraps ErrBadRecord, and an error about one
// field is a *FieldError naming it. A log holds what any client with the
// stream's credentials wrote, so a record that DecodeRecord returns is one
// a sidecar can replay without further checks on its lengths.
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
	if d.err == nil && (r.Kind < KindDelivery || r.Kind > KindPublish) {
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
	if flags&flagFor != 0 {
		if r.For = d.readUvarint("For"); d.err == nil && r.For == 0 {
			return Record{}, fmt.Errorf("%w: field For: zero is never encoded", ErrBadRecord)
		}
	}
	if flags&flagRepeats != 0 {
		r.Repeats = d.readUvarint("Repeats")
		switch {
		case d.err != nil:
		case r.Repeats == 0:
			return Record{}, fmt.Errorf("%w: field Repeats: zero is never encoded", ErrBadRecord)
		case r.Kind != KindDelivery:
			return Record{}, fmt.Errorf("%w: field Repeats: only a delivery repeats one (kind %d)", ErrBadRecord, r.Kind)
		case r.Repeats >= r.ID:
			return Record{}, fmt.Errorf("%w: field Repeats: %d is not below the record's ID %d (a repeat follows what it repeats)", ErrBadRecord, r.Repeats, r.ID)
		}
	}
	r.Queue = string(d.readShortstr("Queue"))
	r.Exchange = string(d.readShortstr("Exchange"))
	r.RoutingKey = string(d.readShortstr("RoutingKey"))
	r.ConsumerTag = string(d.readShortstr("ConsumerTag"))
	r.Properties = d.readBytes("Properties")
	if d.err == nil && len(r.Properties) > 0 && len(r.Properties) < minProperties {
		d.fail("Properties", "%d byte, want none or at least the %d-byte property flags", len(r.Properties), minProperties)
	}
	r.Body = d.readBytes("Body")
	if d.err == nil && r.Kind == KindPublish && len(r.Body) != PublishDigestLen {
		d.fail("Body", "%d bytes in a publish record, want the %d of a SHA-256 digest", len(r.Body), PublishDigestLen)
	}
	if d.err == nil && r.Kind == KindCutoff {
		if _, err := r.CutoffQueues(); err != nil {
			return Record{}, err
		}
	}
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
		d.err = &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
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
	return d.readField(field, math.MaxUint64)
}

// readShortstr reads a length-prefixed field that AMQP carries as a short
// string, and returns it aliasing the input.
func (d *decoder) readShortstr(field string) []byte {
	return d.readField(field, maxShortstr)
}

// readField reads a length-prefixed field of at most most bytes and
// returns it aliasing the input. It checks the length before it touches
// the bytes.
func (d *decoder) readField(field string, most uint64) []byte {
	if d.err != nil {
		return nil
	}
	l, n := binary.Uvarint(d.buf)
	if problem := uvarintProblem(l, n); problem != "" {
		d.fail(field+" length", "%s", problem)
		return nil
	}
	d.buf = d.buf[n:]
	if l > most {
		d.fail(field, "length %d exceeds the %d bytes of an AMQP short string", l, most)
		return nil
	}
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

// fragmentVersion is the first byte of a stream message that carries one
// fragment of a record whose encoding does not fit one message.
const fragmentVersion = 2

// maxAssembledLen caps the encoded length of a fragmented record: StreamLog
// refuses to write a longer record (ErrRecordTooLarge) and readers refuse a
// fragment set that claims more, before they allocate. RabbitMQ accepts
// messages up to 128 MiB by default, so only a broker whose
// max_message_size is raised above 256 MiB (it allows up to 512 MiB) can
// hand the sidecar a record this large.
const maxAssembledLen = 256 << 20

// maxFragmentHeaderLen bounds a fragment header's length: the version byte,
// a 64-bit ID and three varints below 2^35 (Index < Count <= Total <=
// maxAssembledLen = 2^28), 5 bytes each.
const maxFragmentHeaderLen = 1 + binary.MaxVarintLen64 + 3*5

// fragmentHeader starts every fragment message. A record whose encoding (of
// Total bytes) does not fit one stream message is cut into Count >= 2
// slices, sent as consecutive messages by one Write, in Index order:
//
//	+---------+---------+---------+---------+---------+------------------+
//	| version | ID      | Index   | Count   | Total   | payload          |
//	| 1 byte  | uvarint | uvarint | uvarint | uvarint | rest of message, |
//	|   = 2   |         |         |         |         | at least 1 byte  |
//	+---------+---------+---------+---------+---------+------------------+
//
// The payloads, concatenated in Index order, are AppendRecord's encoding of
// the record with this ID. Fragment 0's payload length is the chunk size:
// every fragment but the last carries exactly that many bytes, the last one
// the 1 to chunk bytes left, so Count is Total divided by the chunk, rounded
// up. Varints are minimal, as in records.
type fragmentHeader struct {
	ID    uint64 // the record's ID, to tell fragment sets apart
	Index uint64 // 0 to Count-1
	Count uint64 // fragments in the set, at least 2
	Total uint64 // length of the record's encoding, at most maxAssembledLen
}

// encodedLen is the length of encode's output.
func (h *fragmentHeader) encodedLen() int {
	return 1 + uvarintLen(h.ID) + uvarintLen(h.Index) + uvarintLen(h.Count) + uvarintLen(h.Total)
}

// encode appends the header (version byte included) to dst and returns the
// extended slice; the payload goes right after it.
func (h *fragmentHeader) encode(dst []byte) []byte {
	dst = append(dst, fragmentVersion)
	dst = binary.AppendUvarint(dst, h.ID)
	dst = binary.AppendUvarint(dst, h.Index)
	dst = binary.AppendUvarint(dst, h.Count)
	return binary.AppendUvarint(dst, h.Total)
}

// decode reads the header at the start of the fragment message src into h
// and returns the payload. It checks what one message can tell: the version,
// minimal varints, 2 <= Count <= Total <= maxAssembledLen, Index < Count and
// a payload of 1 to Total bytes. Whether the payload length suits its set is
// the reassembler's to check. Errors wrap ErrBadRecord, and also
// ErrRecordTooLarge for a Total over maxAssembledLen; h is then zero.
//
// Buffer lifetime: the payload aliases src.
func (h *fragmentHeader) decode(src []byte) (payload []byte, err error) {
	*h = fragmentHeader{}
	d := decoder{buf: src}
	version := d.readByte("version")
	if d.err == nil && version != fragmentVersion {
		return nil, fmt.Errorf("%w: fragment version %d, want %d", ErrBadRecord, version, fragmentVersion)
	}
	var f fragmentHeader
	f.ID = d.readUvarint("fragment ID")
	f.Index = d.readUvarint("fragment index")
	f.Count = d.readUvarint("fragment count")
	f.Total = d.readUvarint("fragment total")
	switch {
	case d.err != nil:
		return nil, d.err
	case f.Total > maxAssembledLen:
		return nil, fmt.Errorf("%w: fragment of record ID %d: the record would be %d bytes, over the %d MiB cap: %w",
			ErrBadRecord, f.ID, f.Total, maxAssembledLen>>20, ErrRecordTooLarge)
	case f.Count < 2 || f.Count > f.Total:
		return nil, fmt.Errorf("%w: fragment of record ID %d: count %d for %d bytes, want 2 to %d",
			ErrBadRecord, f.ID, f.Count, f.Total, f.Total)
	case f.Index >= f.Count:
		return nil, fmt.Errorf("%w: fragment of record ID %d: index %d of %d", ErrBadRecord, f.ID, f.Index, f.Count)
	case len(d.buf) == 0 || uint64(len(d.buf)) > f.Total:
		return nil, fmt.Errorf("%w: fragment %d of %d of record ID %d: %d payload bytes, want 1 to %d",
			ErrBadRecord, f.Index, f.Count, f.ID, len(d.buf), f.Total)
	}
	*h = f
	return d.buf, nil
}

// fragmentCount is the number of fragments of chunk payload bytes that an
// encoding of n bytes takes.
func fragmentCount(n, chunk int) int { return (n + chunk - 1) / chunk }

// fragmentsLen is the length of appendFragments' output for a record with
// this ID whose encoding is n bytes long.
func fragmentsLen(id uint64, n, chunk int) int {
	h := fragmentHeader{ID: id, Count: uint64(fragmentCount(n, chunk)), Total: uint64(n)}
	total := n
	for h.Index = 0; h.Index < h.Count; h.Index++ {
		total += h.encodedLen()
	}
	return total
}

// appendFragments appends the fragment messages of r, with payloads of chunk
// bytes (the last one shorter), to dst, and each message to bodies; it
// returns both extended. It suits a record of any length up to
// maxAssembledLen, though StreamLog only fragments records that do not fit
// one message.
//
// Buffer lifetime: the appended bodies alias the returned dst, capacity
// capped. Beyond them, appendFragments needs no memory of its own: it
// encodes the record into the end of the space the fragments take, then
// moves each slice forward, to just after its header.
func appendFragments(dst []byte, bodies [][]byte, r *Record, chunk int) ([]byte, [][]byte) {
	n := encodedRecordLen(r)
	start := len(dst)
	size := fragmentsLen(r.ID, n, chunk)
	dst = slices.Grow(dst, size)[:start+size]
	enc := start + size - n // where the encoding starts
	// AppendRecord fills dst[enc:] in place: the capacity is there.
	AppendRecord(dst[:enc], r)

	h := fragmentHeader{ID: r.ID, Count: uint64(fragmentCount(n, chunk)), Total: uint64(n)}
	w := start // where the next fragment starts
	for h.Index = 0; h.Index < h.Count; h.Index++ {
		lo := enc + int(h.Index)*chunk
		hi := min(lo+chunk, start+size)
		// The header ends at or before lo: the headers before this one
		// and this one fit in the space left for all of them.
		body := h.encode(dst[w:w])
		body = body[:len(body)+copy(dst[w+len(body):], dst[lo:hi])]
		bodies = append(bodies, body[:len(body):len(body)])
		w += len(body)
	}
	return dst, bodies
}

// batchVersion is the first byte of a stream message that carries several
// whole records.
const batchVersion = 3

// minBatchEntryLen is the length of the shortest entry of a batch: a
// one-byte length and the shortest record.
const minBatchEntryLen = 1 + minRecordLen

// A batch message carries Count >= 2 records, in log order, each as
// AppendRecord encodes it, behind its length:
//
//	+---------+---------+-----------------------------------------------+
//	| version | Count   | Count entries, each:                          |
//	| 1 byte  | uvarint |   +---------+-------------------------------+ |
//	|   = 3   | >= 2    |   | length  | AppendRecord's encoding       | |
//	|         |         |   | uvarint | (length bytes, version 1)     | |
//	|         |         |   +---------+-------------------------------+ |
//	+---------+---------+-----------------------------------------------+
//
// Nothing follows the last entry. Varints are minimal, as in records. A
// batch has at least two records: StreamLog writes a lone record as a
// plain record message, so that every list of records has one encoding.

// batchHeaderLen is the length of the header of a batch of count records.
func batchHeaderLen(count int) int { return 1 + uvarintLen(uint64(count)) }

// batchLen is the length of appendBatch's output for recs.
func batchLen(recs []Record) int {
	n := batchHeaderLen(len(recs))
	for i := range recs {
		n += fieldLen(encodedRecordLen(&recs[i]))
	}
	return n
}

// appendBatch appends the batch message of recs to dst and returns the
// extended slice. recs must hold at least two records, or decodeBatch
// refuses the message.
func appendBatch(dst []byte, recs []Record) []byte {
	dst = append(dst, batchVersion)
	dst = binary.AppendUvarint(dst, uint64(len(recs)))
	for i := range recs {
		dst = binary.AppendUvarint(dst, uint64(encodedRecordLen(&recs[i])))
		dst = AppendRecord(dst, &recs[i])
	}
	return dst
}

// decodeBatch decodes the batch message b and appends its records to dst,
// in order. It checks the version, Count against the bytes there are
// (before it decodes anything), every entry's length against the bytes
// left and every record as DecodeRecord does, and rejects trailing bytes.
// On error, which wraps ErrBadRecord and names the entry at fault, it
// returns dst as it was: a batch is decoded whole or not at all.
//
// Buffer lifetime: as with DecodeRecord, the records' Properties and Body
// alias b.
func decodeBatch(dst []Record, b []byte) ([]Record, error) {
	d := decoder{buf: b}
	version := d.readByte("batch version")
	if d.err == nil && version != batchVersion {
		return dst, fmt.Errorf("%w: batch version %d, want %d", ErrBadRecord, version, batchVersion)
	}
	count := d.readUvarint("batch count")
	if d.err != nil {
		return dst, d.err
	}
	if most := uint64(len(d.buf) / minBatchEntryLen); count < 2 || count > most {
		return dst, fmt.Errorf("%w: batch of %d records in %d bytes: want at least 2 records, of at least %d bytes each",
			ErrBadRecord, count, len(d.buf), minBatchEntryLen)
	}
	n := len(dst)
	fail := func(err error) ([]Record, error) {
		clear(dst[n:]) // drop the references to b
		return dst[:n], err
	}
	for i := range count {
		enc := d.readBytes("batch entry")
		if d.err != nil {
			return fail(fmt.Errorf("record %d of %d in the batch: %w", i, count, d.err))
		}
		r, err := DecodeRecord(enc)
		if err != nil {
			return fail(fmt.Errorf("record %d of %d in the batch: %w", i, count, err))
		}
		dst = append(dst, r)
	}
	if len(d.buf) != 0 {
		return fail(fmt.Errorf("%w: %d trailing bytes after the batch's %d records", ErrBadRecord, len(d.buf), count))
	}
	return dst, nil
}

// reassembler turns the stream's messages, fed to add in log order, back
// into records. It passes whole records through, expands batches into their
// records and skips StreamLog's markers; it buffers a fragment set until its
// last fragment and then decodes the whole. Because one Write sends a
// record's fragments consecutively, and a failed Write is retried from a
// record, a batch or a fragment 0, a set still open when a whole record, a
// batch or another fragment 0 comes was cut short by a failed write and is
// dropped, as is a set still open when the reading stops. A fragment other
// than 0 with no set open belongs to a set whose start the reader did not
// see (retention, or a read that began at an offset mid-set) and is
// skipped. A fragment that does not continue the open set is an error: this
// writer never produces one.
//
// The zero value is ready to use. Its memory is one record's encoding at a
// time. It grows with the payloads that arrive, to at most twice the bytes
// received and never past the set's Total: a fragment header's Total is a
// claim, and a claim of 256 MiB in a message of a few bytes must cost a
// few bytes, not 256 MiB.
type reassembler struct {
	state  assemblyState
	set    fragmentHeader // the open set; Index is the fragment expected next
	chunk  int            // fragment 0's payload length
	buf    []byte         // the payloads so far
	offset int64          // fragment 0's offset
}

type assemblyState uint8

const (
	assemblyIdle       assemblyState = iota // between records: no set open
	assemblyCollecting                      // inside a fragment set
)

// add takes the message at offset, whose body is b, and appends the
// records it yields to dst: the record of a record message, the records of
// a batch, in order, or the reassembled record when b is the last fragment
// of the open set; nothing for a marker or any other fragment. Errors wrap
// ErrBadRecord, dst comes back as it was, and the open set is dropped; an
// error about a set names the offset where the set began, and the caller
// names offset.
//
// Buffer lifetime: the Properties and Body of a record from a record or
// batch message alias b, as with DecodeRecord; a reassembled record's alias
// a buffer of its own.
func (a *reassembler) add(dst []Record, offset int64, b []byte) ([]Record, error) {
	if len(b) == 0 {
		a.reset()
		return dst, fmt.Errorf("%w: empty message", ErrBadRecord)
	}
	switch b[0] {
	case markerVersion:
		return dst, nil
	case recordVersion:
		a.reset()
		r, err := DecodeRecord(b)
		if err != nil {
			return dst, err
		}
		return append(dst, r), nil
	case batchVersion:
		a.reset()
		return decodeBatch(dst, b)
	case fragmentVersion:
		r, ok, err := a.addFragment(offset, b)
		if err != nil || !ok {
			return dst, err
		}
		return append(dst, r), nil
	default:
		a.reset()
		return dst, fmt.Errorf("%w: unknown message version %d: want %d (record), %d (fragment), %d (batch) or %d (marker)",
			ErrBadRecord, b[0], recordVersion, fragmentVersion, batchVersion, markerVersion)
	}
}

// addFragment takes the fragment message at offset, whose body is b. It
// returns ok=true and the record when b is the last fragment of the open
// set.
func (a *reassembler) addFragment(offset int64, b []byte) (r Record, ok bool, err error) {
	var h fragmentHeader
	payload, err := h.decode(b)
	if err != nil {
		a.reset()
		return Record{}, false, err
	}
	if h.Index == 0 {
		return a.begin(offset, h, payload)
	}
	if a.state == assemblyIdle {
		return Record{}, false, nil // its set began before this read did
	}
	if h.ID != a.set.ID || h.Count != a.set.Count || h.Total != a.set.Total || h.Index != a.set.Index {
		err := fmt.Errorf("%w: fragment %d of %d of record ID %d (%d bytes) does not continue the set that began at offset %d, which expects fragment %d of %d of record ID %d (%d bytes)",
			ErrBadRecord, h.Index, h.Count, h.ID, h.Total, a.offset, a.set.Index, a.set.Count, a.set.ID, a.set.Total)
		a.reset()
		return Record{}, false, err
	}
	want := a.chunk
	if h.Index == h.Count-1 {
		want = int(h.Total) - len(a.buf)
	}
	if len(payload) != want {
		err := fmt.Errorf("%w: fragment %d of %d of record ID %d carries %d bytes, want %d",
			ErrBadRecord, h.Index, h.Count, h.ID, len(payload), want)
		a.reset()
		return Record{}, false, err
	}
	a.appendPayload(payload)
	a.set.Index++
	if a.set.Index < a.set.Count {
		return Record{}, false, nil
	}
	buf, first, set := a.buf, a.offset, a.set
	a.reset()
	r, err = DecodeRecord(buf)
	if err != nil {
		return Record{}, false, fmt.Errorf("record ID %d reassembled from offsets %d to %d: %w", set.ID, first, offset, err)
	}
	if r.ID != set.ID {
		return Record{}, false, fmt.Errorf("%w: record reassembled from offsets %d to %d has ID %d, but its fragments say %d",
			ErrBadRecord, first, offset, r.ID, set.ID)
	}
	return r, true, nil
}

// begin opens a set with fragment 0, dropping any set still open.
func (a *reassembler) begin(offset int64, h fragmentHeader, payload []byte) (Record, bool, error) {
	a.reset()
	chunk := uint64(len(payload))
	// Count = ceil(Total / chunk). decode bounded chunk, Count and Total
	// by maxAssembledLen = 2^28, so the products cannot overflow.
	if (h.Count-1)*chunk >= h.Total || h.Count*chunk < h.Total {
		return Record{}, false, fmt.Errorf("%w: fragment 0 of record ID %d carries %d bytes, which makes %d bytes %d fragments, not %d",
			ErrBadRecord, h.ID, chunk, h.Total, fragmentCount(int(h.Total), int(chunk)), h.Count)
	}
	a.state = assemblyCollecting
	a.set = h
	a.set.Index = 1
	a.chunk = int(chunk)
	a.offset = offset
	a.appendPayload(payload)
	return Record{}, false, nil
}

// appendPayload appends the payload of the fragment just checked to buf.
// When buf is full it doubles it, or makes it just large enough for p,
// capped at the set's Total, so that its capacity stays within twice the
// bytes received. The callers have checked that buf and p together do not
// exceed Total.
func (a *reassembler) appendPayload(p []byte) {
	if need := len(a.buf) + len(p); need > cap(a.buf) {
		grown := make([]byte, len(a.buf), min(max(2*cap(a.buf), need), int(a.set.Total)))
		copy(grown, a.buf)
		a.buf = grown
	}
	a.buf = append(a.buf, p...)
}

// reset drops the open set, if any.
func (a *reassembler) reset() { *a = reassembler{} }
