package amqpwire

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// allProperties has every basic property set.
func allProperties() Properties {
	return Properties{
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		Headers:         allFieldTypes(),
		DeliveryMode:    2,
		Priority:        9,
		CorrelationID:   "corr-1",
		ReplyTo:         "amq.rabbitmq.reply-to",
		Expiration:      "60000",
		MessageID:       "msg-1",
		Timestamp:       time.Unix(1700000000, 0).UTC(),
		Type:            "order.created",
		UserID:          "guest",
		AppID:           "shop",
		ClusterID:       "c1",
		Flags:           0xFFFC,
	}
}

// allPropertiesWire is a content header payload with every property, built
// by hand from the spec layout, with a small headers table.
func allPropertiesWire() ([]byte, *ContentHeader) {
	headers := ls(string(cat(ss("a"), []byte{'S'}, ls("x"), ss("b"), []byte{'I'}, u32(5))))
	payload := cat(
		u16(60), u16(0), u64(1<<33), // class basic, weight, body-size
		u16(0xFFFC), // every property flag
		ss("text/plain"), ss("utf-8"), headers, u8(2), u8(5),
		ss("corr"), ss("reply"), ss("1000"), ss("id"), u64(1700000000),
		ss("type"), ss("user"), ss("app"), ss("cluster"),
	)
	want := &ContentHeader{
		ClassID:  60,
		BodySize: 1 << 33,
		Props: Properties{
			ContentType: "text/plain", ContentEncoding: "utf-8",
			Headers:      Table{"a": "x", "b": int32(5)},
			DeliveryMode: 2, Priority: 5,
			CorrelationID: "corr", ReplyTo: "reply", Expiration: "1000", MessageID: "id",
			Timestamp: time.Unix(1700000000, 0).UTC(),
			Type:      "type", UserID: "user", AppID: "app", ClusterID: "cluster",
			Flags: 0xFFFC,
		},
		RawProps: payload[12:],
	}
	return payload, want
}

func TestContentHeaderKnownBytes(t *testing.T) {
	allWire, allWant := allPropertiesWire()
	tests := map[string]struct {
		payload []byte
		want    *ContentHeader
	}{
		"no properties": {
			payload: []byte{0x00, 0x3C, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00},
			want:    &ContentHeader{ClassID: 60, RawProps: []byte{0, 0}},
		},
		"content-type and delivery-mode": {
			payload: []byte{
				0x00, 0x3C, // class 60 basic
				0x00, 0x00, // weight
				0, 0, 0, 0, 0, 0, 0, 0x05, // body-size 5
				0x90, 0x00, // flags: content-type, delivery-mode
				0x0A, 't', 'e', 'x', 't', '/', 'p', 'l', 'a', 'i', 'n',
				0x02, // delivery-mode persistent
			},
			want: &ContentHeader{
				ClassID: 60, BodySize: 5,
				Props: Properties{ContentType: "text/plain", DeliveryMode: 2, Flags: FlagContentType | FlagDeliveryMode},
				RawProps: []byte{
					0x90, 0x00, 0x0A, 't', 'e', 'x', 't', '/', 'p', 'l', 'a', 'i', 'n', 0x02,
				},
			},
		},
		"timestamp and cluster-id only": {
			payload: cat(u16(60), u16(0), u64(0), u16(0x0044), u64(0), ss("c")),
			want: &ContentHeader{
				ClassID:  60,
				Props:    Properties{Timestamp: time.Unix(0, 0).UTC(), ClusterID: "c", Flags: FlagTimestamp | FlagClusterID},
				RawProps: cat(u16(0x0044), u64(0), ss("c")),
			},
		},
		"every property": {payload: allWire, want: allWant},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeContentHeader(tc.payload)
			if err != nil {
				t.Fatalf("DecodeContentHeader: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("DecodeContentHeader (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.payload, AppendHeaderPayload(nil, got)); diff != "" {
				t.Errorf("AppendHeaderPayload(decoded) (-want +got):\n%s", diff)
			}
			size, err := ContentHeaderBodySize(tc.payload)
			if err != nil || size != tc.want.BodySize {
				t.Errorf("ContentHeaderBodySize = %d, %v; want %d, nil", size, err, tc.want.BodySize)
			}
			raw, err := ContentHeaderRawProps(tc.payload)
			if err != nil {
				t.Fatalf("ContentHeaderRawProps: %v", err)
			}
			if diff := cmp.Diff(tc.want.RawProps, raw); diff != "" {
				t.Errorf("ContentHeaderRawProps (-want +got):\n%s", diff)
			}
			props, err := DecodeProperties(raw)
			if err != nil {
				t.Fatalf("DecodeProperties: %v", err)
			}
			if diff := cmp.Diff(tc.want.Props, props); diff != "" {
				t.Errorf("DecodeProperties (-want +got):\n%s", diff)
			}
		})
	}
}

func TestContentHeaderRoundTrip(t *testing.T) {
	tests := map[string]*ContentHeader{
		"every property, every header field type": {
			ClassID: 60, BodySize: 123456789, Props: allProperties(),
		},
		"no properties":       {ClassID: 60, BodySize: 0},
		"headers only, empty": {ClassID: 60, Props: Properties{Flags: FlagHeaders}},
		"persistent json": {
			ClassID: 60, BodySize: 42,
			Props: Properties{ContentType: "application/json", DeliveryMode: 2, Flags: FlagContentType | FlagDeliveryMode},
		},
	}
	for name, h := range tests {
		t.Run(name, func(t *testing.T) {
			payload := AppendHeaderPayload(nil, h)
			got, err := DecodeContentHeader(payload)
			if err != nil {
				t.Fatalf("DecodeContentHeader: %v", err)
			}
			want := *h
			want.RawProps = payload[12:]
			if diff := cmp.Diff(&want, got); diff != "" {
				t.Errorf("decode(encode(header)) (-want +got):\n%s", diff)
			}

			frame := AppendHeaderFrame(nil, 3, h)
			if diff := cmp.Diff(cat(u8(2), u16(3), u32(uint32(len(payload))), payload, u8(0xCE)), frame); diff != "" {
				t.Errorf("AppendHeaderFrame (-want +got):\n%s", diff)
			}
			raw := AppendRawHeaderFrame(nil, 3, h.ClassID, h.BodySize, got.RawProps)
			if diff := cmp.Diff(frame, raw); diff != "" {
				t.Errorf("AppendRawHeaderFrame (-want +got):\n%s", diff)
			}
			if err := h.Props.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestPropertiesOnlyFlagged checks that encoding writes only the properties
// whose flag is set, whatever the other fields hold.
func TestPropertiesOnlyFlagged(t *testing.T) {
	p := allProperties()
	p.Flags = FlagMessageID | 0x0003 // the continuation and unused bits are dropped
	got := AppendProperties(nil, &p)
	if diff := cmp.Diff(cat(u16(FlagMessageID), ss("msg-1")), got); diff != "" {
		t.Errorf("AppendProperties (-want +got):\n%s", diff)
	}
}

func TestPropertiesValidate(t *testing.T) {
	tests := map[string]struct {
		props   Properties
		wantErr bool
	}{
		"long content-type, not flagged": {props: Properties{ContentType: strings.Repeat("x", 300)}},
		"long content-type, flagged": {
			props: Properties{ContentType: strings.Repeat("x", 300), Flags: FlagContentType}, wantErr: true,
		},
		"bad header, not flagged": {props: Properties{Headers: Table{"u": uint64(1)}}},
		"bad header, flagged": {
			props: Properties{Headers: Table{"u": uint64(1)}, Flags: FlagHeaders}, wantErr: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := tc.props.Validate(); errors.Is(err, ErrInvalidValue) != tc.wantErr {
				t.Errorf("Validate = %v, want an ErrInvalidValue: %v", err, tc.wantErr)
			}
		})
	}
}

func TestDecodeContentHeaderErrors(t *testing.T) {
	tests := map[string]struct {
		payload  []byte
		wantCode uint16
	}{
		"empty":                {payload: nil, wantCode: FrameError},
		"no flags word":        {payload: cat(u16(60), u16(0), u64(1)), wantCode: FrameError},
		"continuation bit set": {payload: cat(u16(60), u16(0), u64(1), u16(0x8001), ss("a"), u16(0)), wantCode: FrameError},
		"unused bit 0x0002":    {payload: cat(u16(60), u16(0), u64(1), u16(0x0002)), wantCode: FrameError},
		"bytes after the last property": {
			payload: cat(u16(60), u16(0), u64(1), u16(FlagPriority), u8(1), u8(0)), wantCode: FrameError,
		},
		"flagged property missing": {payload: cat(u16(60), u16(0), u64(1), u16(FlagTimestamp), u32(0)), wantCode: FrameError},
		"class queue":              {payload: cat(u16(50), u16(0), u64(1), u16(0)), wantCode: SyntaxError},
		"unknown header type": {
			payload: cat(u16(60), u16(0), u64(1), u16(FlagHeaders), ls(string(cat(ss("k"), []byte{'?'})))), wantCode: SyntaxError,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, err := DecodeContentHeader(tc.payload)
			if got := errCode(t, err); got != tc.wantCode || h != nil {
				t.Errorf("DecodeContentHeader = %v, %v (code %d); want nil and code %d", h, err, got, tc.wantCode)
			}
		})
	}
}

func TestDecodeContentHeaderTruncated(t *testing.T) {
	h := &ContentHeader{ClassID: 60, BodySize: 7, Props: allProperties()}
	payload := AppendHeaderPayload(nil, h)
	for n := range len(payload) {
		if _, err := DecodeContentHeader(payload[:n]); errCode(t, err) != FrameError {
			t.Errorf("DecodeContentHeader(payload[:%d]) error = %v, want a FrameError", n, err)
		}
	}
	for n := range contentHeaderMin {
		if _, err := ContentHeaderBodySize(payload[:n]); errCode(t, err) != FrameError {
			t.Errorf("ContentHeaderBodySize(payload[:%d]) error = %v, want a FrameError", n, err)
		}
		if _, err := ContentHeaderRawProps(payload[:n]); errCode(t, err) != FrameError {
			t.Errorf("ContentHeaderRawProps(payload[:%d]) error = %v, want a FrameError", n, err)
		}
	}
}
