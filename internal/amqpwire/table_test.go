package amqpwire

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// allFieldTypes holds one value of every field-value type, keyed by type.
func allFieldTypes() Table {
	return Table{
		"t": true,
		"b": int8(-2),
		"B": uint8(200),
		"s": int16(-300),
		"u": uint16(65000),
		"I": int32(-70000),
		"i": uint32(4000000000),
		"l": int64(math.MinInt64),
		"f": float32(1.5),
		"d": 2.5,
		"D": Decimal{Scale: 2, Value: -12345},
		"S": "héllo",
		"x": []byte{0, 1, 0xFF},
		"A": []any{int32(1), "a", nil, []any{false}, Table{"in": uint8(1)}},
		"T": time.Unix(1700000000, 0).UTC(),
		"F": Table{"nested": Table{"deeper": "yes"}},
		"V": nil,
	}
}

func TestFieldValues(t *testing.T) {
	tests := map[string]struct {
		value     any
		wantValue []byte // type octet and value, as on the wire
	}{
		"t true":       {true, []byte{'t', 1}},
		"t false":      {false, []byte{'t', 0}},
		"b int8":       {int8(-2), []byte{'b', 0xFE}},
		"B uint8":      {uint8(200), []byte{'B', 200}},
		"s int16":      {int16(-300), []byte{'s', 0xFE, 0xD4}},
		"u uint16":     {uint16(65000), []byte{'u', 0xFD, 0xE8}},
		"I int32":      {int32(-70000), []byte{'I', 0xFF, 0xFE, 0xEE, 0x90}},
		"i uint32":     {uint32(4000000000), []byte{'i', 0xEE, 0x6B, 0x28, 0x00}},
		"l int64":      {int64(-1), []byte{'l', 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}},
		"f float32":    {float32(1.5), []byte{'f', 0x3F, 0xC0, 0x00, 0x00}},
		"d float64":    {2.5, []byte{'d', 0x40, 0x04, 0, 0, 0, 0, 0, 0}},
		"D decimal":    {Decimal{Scale: 2, Value: 12345}, []byte{'D', 2, 0x00, 0x00, 0x30, 0x39}},
		"S longstr":    {"hé", []byte{'S', 0, 0, 0, 3, 'h', 0xC3, 0xA9}},
		"S empty":      {"", []byte{'S', 0, 0, 0, 0}},
		"x bytes":      {[]byte{0, 1, 2}, []byte{'x', 0, 0, 0, 3, 0, 1, 2}},
		"x empty":      {[]byte(nil), []byte{'x', 0, 0, 0, 0}},
		"A array":      {[]any{int32(1), "a", nil}, cat([]byte{'A'}, u32(12), []byte{'I', 0, 0, 0, 1}, []byte{'S', 0, 0, 0, 1, 'a'}, []byte{'V'})},
		"A empty":      {[]any(nil), []byte{'A', 0, 0, 0, 0}},
		"T timestamp":  {time.Unix(1700000000, 0).UTC(), cat([]byte{'T'}, u64(1700000000))},
		"T before1970": {time.Unix(-86400, 0).UTC(), cat([]byte{'T'}, u64(math.MaxUint64-86400+1))},
		"F table":      {Table{"n": true}, cat([]byte{'F'}, ls(string(cat(ss("n"), []byte{'t', 1}))))},
		"F empty":      {Table(nil), []byte{'F', 0, 0, 0, 0}},
		"V void":       {nil, []byte{'V'}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wire := ls(string(cat(ss("key"), tc.wantValue)))
			got, err := AppendTable(nil, Table{"key": tc.value})
			if err != nil {
				t.Fatalf("AppendTable: %v", err)
			}
			if diff := cmp.Diff(wire, got); diff != "" {
				t.Errorf("AppendTable (-want +got):\n%s", diff)
			}
			decoded, err := DecodeTable(wire)
			if err != nil {
				t.Fatalf("DecodeTable: %v", err)
			}
			if diff := cmp.Diff(Table{"key": tc.value}, decoded); diff != "" {
				t.Errorf("DecodeTable (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTableRoundTrip(t *testing.T) {
	tests := map[string]struct {
		table Table
		want  Table // after encode and decode
	}{
		"every field type": {table: allFieldTypes(), want: allFieldTypes()},
		"nil":              {table: nil, want: nil},
		"empty":            {table: Table{}, want: nil},
		"int is encoded as int64": {
			table: Table{"n": 7, "a": []any{-1}},
			want:  Table{"n": int64(7), "a": []any{int64(-1)}},
		},
		"map[string]any is encoded as a table": {
			table: Table{"m": map[string]any{"k": "v"}},
			want:  Table{"m": Table{"k": "v"}},
		},
		"x-death as RabbitMQ writes it": {
			table: Table{"x-death": []any{Table{
				"count": int64(1), "reason": "rejected", "queue": "q", "time": time.Unix(1700000000, 0).UTC(),
				"exchange": "", "routing-keys": []any{"q"},
			}}},
			want: Table{"x-death": []any{Table{
				"count": int64(1), "reason": "rejected", "queue": "q", "time": time.Unix(1700000000, 0).UTC(),
				"exchange": "", "routing-keys": []any{"q"},
			}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wire, err := AppendTable(nil, tc.table)
			if err != nil {
				t.Fatalf("AppendTable: %v", err)
			}
			got, err := DecodeTable(wire)
			if err != nil {
				t.Fatalf("DecodeTable: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decode(encode(table)) (-want +got):\n%s", diff)
			}
			again, err := AppendTable(nil, got)
			if err != nil {
				t.Fatalf("AppendTable again: %v", err)
			}
			if diff := cmp.Diff(wire, again); diff != "" {
				t.Errorf("encode(decode(wire)) (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTableEncodingIsSorted(t *testing.T) {
	got, err := AppendTable(nil, Table{"b": true, "a": false, "ab": uint8(1)})
	if err != nil {
		t.Fatalf("AppendTable: %v", err)
	}
	want := ls(string(cat(ss("a"), []byte{'t', 0}, ss("ab"), []byte{'B', 1}, ss("b"), []byte{'t', 1})))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AppendTable (-want +got):\n%s", diff)
	}
}

// nestedArrays returns a field table holding arrays nested to the given
// total depth (the table itself is depth 1), in wire layout and as a Table.
func nestedArrays(depth int) ([]byte, Table) {
	wire := []byte{'A', 0, 0, 0, 0}
	var value any = []any(nil)
	for range depth - 2 {
		wire = cat([]byte{'A'}, u32(uint32(len(wire))), wire)
		value = []any{value}
	}
	return ls(string(cat(ss("a"), wire))), Table{"a": value}
}

func TestTableEncodeErrors(t *testing.T) {
	cyclic := Table{}
	cyclic["self"] = cyclic
	_, tooDeep := nestedArrays(MaxNesting + 1)
	_, deepest := nestedArrays(MaxNesting)
	tests := map[string]struct {
		table   Table
		wantErr bool
	}{
		"uint64 has no field type":        {table: Table{"n": uint64(1)}, wantErr: true},
		"struct has no field type":        {table: Table{"s": struct{}{}}, wantErr: true},
		"[]string has no field type":      {table: Table{"a": []string{"x"}}, wantErr: true},
		"bad value inside an array":       {table: Table{"a": []any{1, uint(2)}}, wantErr: true},
		"field name over 255 bytes":       {table: Table{strings.Repeat("k", 256): true}, wantErr: true},
		"field name of 255 bytes":         {table: Table{strings.Repeat("k", 255): true}},
		"table inside itself":             {table: cyclic, wantErr: true},
		"nesting deeper than MaxNesting":  {table: tooDeep, wantErr: true},
		"nesting exactly MaxNesting deep": {table: deepest},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dst := []byte("prefix")
			got, err := AppendTable(dst, tc.table)
			if gotErr := errors.Is(err, ErrInvalidValue); gotErr != tc.wantErr {
				t.Fatalf("AppendTable error = %v, want an ErrInvalidValue: %v", err, tc.wantErr)
			}
			if err := tc.table.Validate(); errors.Is(err, ErrInvalidValue) != tc.wantErr {
				t.Errorf("Validate = %v, want an ErrInvalidValue: %v", err, tc.wantErr)
			}
			if tc.wantErr && string(got) != "prefix" {
				t.Errorf("AppendTable returned %q on error, want dst unchanged", got)
			}
		})
	}
}

func TestDecodeTableErrors(t *testing.T) {
	tooDeep, _ := nestedArrays(MaxNesting + 1)
	deepest, _ := nestedArrays(MaxNesting)
	tests := map[string]struct {
		wire     []byte
		wantCode uint16
	}{
		"nesting exactly MaxNesting deep": {wire: deepest},
		"nesting deeper than MaxNesting":  {wire: tooDeep, wantCode: SyntaxError},
		"unknown field type":              {wire: ls(string(cat(ss("k"), []byte{'Q', 0}))), wantCode: SyntaxError},
		"AMQP 0-9-1 spec's 'L' is not RabbitMQ's": {
			wire: ls(string(cat(ss("k"), []byte{'L'}, u64(1)))), wantCode: SyntaxError,
		},
		"longstr length of 4 GiB": {
			wire: cat(u32(10), ss("k"), []byte{'S'}, u32(math.MaxUint32), []byte("ab")), wantCode: FrameError,
		},
		"table length beyond the input": {wire: cat(u32(100), ss("k"), []byte{'V'}), wantCode: FrameError},
		"field name beyond the table":   {wire: cat(u32(2), []byte{5, 'a'}), wantCode: FrameError},
		"value missing":                 {wire: ls(string(ss("k"))), wantCode: FrameError},
		"bytes after the table":         {wire: cat(ls(string(cat(ss("k"), []byte{'V'}))), []byte{0}), wantCode: FrameError},
		"array element cut":             {wire: ls(string(cat(ss("k"), []byte{'A'}, u32(3), []byte{'I', 0, 0}))), wantCode: FrameError},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeTable(tc.wire)
			if got := errCode(t, err); got != tc.wantCode {
				t.Errorf("DecodeTable error %v has code %d, want %d", err, got, tc.wantCode)
			}
		})
	}
}

func TestDecodeTableTruncated(t *testing.T) {
	wire, err := AppendTable(nil, allFieldTypes())
	if err != nil {
		t.Fatalf("AppendTable: %v", err)
	}
	for n := range len(wire) {
		if _, err := DecodeTable(wire[:n]); errCode(t, err) != FrameError {
			t.Errorf("DecodeTable(wire[:%d]) error = %v, want a FrameError", n, err)
		}
	}
}
