package amqpwire

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// methodCase is a method with its hand-built wire arguments.
type methodCase struct {
	m          Method
	wantClass  uint16
	wantMethod uint16
	wantArgs   []byte
}

// methodCases covers every decoded method, with bits set in distinct
// patterns so that a wrong bit position shows.
func methodCases() map[string]methodCase {
	return map[string]methodCase{
		"connection.start-ok": {
			&ConnectionStartOk{ClientProperties: cat(ss("product"), []byte{'S'}, ls("go")), Mechanism: "PLAIN", Response: []byte("\x00u\x00p"), Locale: "en_US"},
			10, 11, cat(ls(string(cat(ss("product"), []byte{'S'}, ls("go")))), ss("PLAIN"), ls("\x00u\x00p"), ss("en_US")),
		},
		"connection.open": {
			&ConnectionOpen{VirtualHost: "/prod"},
			10, 40, cat(ss("/prod"), ss(""), u8(0)),
		},
		"queue.declare": {
			&QueueDeclare{Queue: "", Durable: true, AutoDelete: true, Arguments: Table{"x-queue-type": "classic"}},
			50, 10, cat(u16(0), ss(""), u8(2|8), u32(uint32(len(cat(ss("x-queue-type"), []byte{'S'}, ls("classic"))))), ss("x-queue-type"), []byte{'S'}, ls("classic")),
		},
		"queue.declare exclusive": {
			&QueueDeclare{Queue: "q", Passive: true, Exclusive: true, NoWait: true},
			50, 10, cat(u16(0), ss("q"), u8(1|4|16), u32(0)),
		},
		"queue.declare-ok": {
			&QueueDeclareOk{Queue: "amq.gen-x", MessageCount: 7, ConsumerCount: 1},
			50, 11, cat(ss("amq.gen-x"), u32(7), u32(1)),
		},
		"connection.tune": {
			&ConnectionTune{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 60},
			10, 30, cat(u16(2047), u32(131072), u16(60)),
		},
		"connection.tune-ok": {
			&ConnectionTuneOk{ChannelMax: 1, FrameMax: 4096, Heartbeat: 0},
			10, 31, cat(u16(1), u32(4096), u16(0)),
		},
		"connection.close": {
			&ConnectionClose{ReplyCode: 320, ReplyText: "CONNECTION_FORCED - shutdown", ClassID: 60, MethodID: 40},
			10, 50, cat(u16(320), ss("CONNECTION_FORCED - shutdown"), u16(60), u16(40)),
		},
		"connection.close-ok": {&ConnectionCloseOk{}, 10, 51, nil},
		"connection.blocked": {
			&ConnectionBlocked{Reason: "low on memory"},
			10, 60, ss("low on memory"),
		},
		"connection.unblocked": {&ConnectionUnblocked{}, 10, 61, nil},
		"channel.open":         {&ChannelOpen{}, 20, 10, ss("")},
		"channel.open-ok":      {&ChannelOpenOk{}, 20, 11, ls("")},
		"channel.flow on":      {&ChannelFlow{Active: true}, 20, 20, u8(1)},
		"channel.flow off":     {&ChannelFlow{}, 20, 20, u8(0)},
		"channel.flow-ok":      {&ChannelFlowOk{Active: true}, 20, 21, u8(1)},
		"channel.close": {
			&ChannelClose{ReplyCode: 404, ReplyText: "NOT_FOUND - no queue 'q'", ClassID: 50, MethodID: 10},
			20, 40, cat(u16(404), ss("NOT_FOUND - no queue 'q'"), u16(50), u16(10)),
		},
		"channel.close-ok": {&ChannelCloseOk{}, 20, 41, nil},
		"basic.qos": {
			&BasicQos{PrefetchSize: 0, PrefetchCount: 250, Global: true},
			60, 10, cat(u32(0), u16(250), u8(1)),
		},
		"basic.qos-ok": {&BasicQosOk{}, 60, 11, nil},
		"basic.consume": {
			&BasicConsume{
				Queue: "orders", ConsumerTag: "ctag-1", NoAck: true, NoWait: true,
				Arguments: Table{"x-priority": int32(10), "x-stream-offset": "first"},
			},
			60, 20, cat(u16(0), ss("orders"), ss("ctag-1"), u8(0b1010),
				ls(string(cat(ss("x-priority"), u8('I'), u32(10), ss("x-stream-offset"), u8('S'), ls("first"))))),
		},
		"basic.consume other bits": {
			&BasicConsume{Queue: "q", NoLocal: true, Exclusive: true},
			60, 20, cat(u16(0), ss("q"), ss(""), u8(0b0101), u32(0)),
		},
		"basic.consume-ok": {&BasicConsumeOk{ConsumerTag: "amq.ctag-XYZ"}, 60, 21, ss("amq.ctag-XYZ")},
		"basic.cancel": {
			&BasicCancel{ConsumerTag: "ctag-1", NoWait: true},
			60, 30, cat(ss("ctag-1"), u8(1)),
		},
		"basic.cancel-ok": {&BasicCancelOk{ConsumerTag: "ctag-1"}, 60, 31, ss("ctag-1")},
		"basic.publish": {
			&BasicPublish{Exchange: "amq.direct", RoutingKey: "rk", Immediate: true},
			60, 40, cat(u16(0), ss("amq.direct"), ss("rk"), u8(0b10)),
		},
		"basic.publish mandatory": {
			&BasicPublish{RoutingKey: "rk", Mandatory: true},
			60, 40, cat(u16(0), ss(""), ss("rk"), u8(0b01)),
		},
		"basic.return": {
			&BasicReturn{ReplyCode: 312, ReplyText: "NO_ROUTE", Exchange: "ex", RoutingKey: "nowhere"},
			60, 50, cat(u16(312), ss("NO_ROUTE"), ss("ex"), ss("nowhere")),
		},
		"basic.deliver": {
			&BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 1<<40 + 7, Redelivered: true, Exchange: "ex", RoutingKey: "rk"},
			60, 60, cat(ss("ctag"), u64(1<<40+7), u8(1), ss("ex"), ss("rk")),
		},
		"basic.get": {&BasicGet{Queue: "q", NoAck: true}, 60, 70, cat(u16(0), ss("q"), u8(1))},
		"basic.get-ok": {
			&BasicGetOk{DeliveryTag: 9, Redelivered: true, Exchange: "", RoutingKey: "q", MessageCount: 1234},
			60, 71, cat(u64(9), u8(1), ss(""), ss("q"), u32(1234)),
		},
		"basic.get-empty":     {&BasicGetEmpty{}, 60, 72, ss("")},
		"basic.ack":           {&BasicAck{DeliveryTag: 77, Multiple: true}, 60, 80, cat(u64(77), u8(1))},
		"basic.reject":        {&BasicReject{DeliveryTag: 78, Requeue: true}, 60, 90, cat(u64(78), u8(1))},
		"basic.recover-async": {&BasicRecoverAsync{Requeue: true}, 60, 100, u8(1)},
		"basic.recover":       {&BasicRecover{Requeue: true}, 60, 110, u8(1)},
		"basic.recover-ok":    {&BasicRecoverOk{}, 60, 111, nil},
		"basic.nack requeue":  {&BasicNack{DeliveryTag: 79, Requeue: true}, 60, 120, cat(u64(79), u8(0b10))},
		"basic.nack multiple": {&BasicNack{DeliveryTag: 80, Multiple: true}, 60, 120, cat(u64(80), u8(0b01))},
		"confirm.select":      {&ConfirmSelect{NoWait: true}, 85, 10, u8(1)},
		"confirm.select-ok":   {&ConfirmSelectOk{}, 85, 11, nil},
	}
}

func TestMethodRoundTrip(t *testing.T) {
	for name, tc := range methodCases() {
		t.Run(name, func(t *testing.T) {
			wantPayload := cat(u16(tc.wantClass), u16(tc.wantMethod), tc.wantArgs)

			gotPayload := AppendMethodPayload(nil, tc.m)
			if diff := cmp.Diff(wantPayload, gotPayload); diff != "" {
				t.Errorf("AppendMethodPayload (-want +got):\n%s", diff)
			}
			got, err := DecodeMethod(wantPayload)
			if err != nil {
				t.Fatalf("DecodeMethod: %v", err)
			}
			if diff := cmp.Diff(tc.m, got); diff != "" {
				t.Errorf("DecodeMethod (-want +got):\n%s", diff)
			}

			class, method, err := MethodID(wantPayload)
			if err != nil || class != tc.wantClass || method != tc.wantMethod {
				t.Errorf("MethodID = %d, %d, %v; want %d, %d, nil", class, method, err, tc.wantClass, tc.wantMethod)
			}
			if got, want := MethodName(class, method), strings.Fields(name)[0]; got != want {
				t.Errorf("MethodName = %q, want %q", got, want)
			}

			wantFrame := frame(FrameMethod, 513, wantPayload)
			prefix := []byte("keep")
			gotFrame := AppendMethodFrame(prefix, 513, tc.m)
			if diff := cmp.Diff(cat([]byte("keep"), wantFrame), gotFrame); diff != "" {
				t.Errorf("AppendMethodFrame (-want +got):\n%s", diff)
			}
			if err := ValidateMethod(tc.m); err != nil {
				t.Errorf("ValidateMethod: %v", err)
			}
		})
	}
}

// TestDecodeKnownFrames decodes whole frames written out byte by byte from
// the spec layout.
func TestDecodeKnownFrames(t *testing.T) {
	tests := map[string]struct {
		frame       []byte
		wantChannel uint16
		want        Method
	}{
		"connection.tune": {
			frame: []byte{
				0x01,       // type: method
				0x00, 0x00, // channel 0
				0x00, 0x00, 0x00, 0x0C, // size 12
				0x00, 0x0A, // class 10 connection
				0x00, 0x1E, // method 30 tune
				0x07, 0xFF, // channel-max 2047
				0x00, 0x02, 0x00, 0x00, // frame-max 131072
				0x00, 0x3C, // heartbeat 60
				0xCE, // frame-end
			},
			wantChannel: 0,
			want:        &ConnectionTune{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 60},
		},
		"basic.deliver": {
			frame: []byte{
				0x01,       // type: method
				0x00, 0x01, // channel 1
				0x00, 0x00, 0x00, 0x16, // size 22
				0x00, 0x3C, // class 60 basic
				0x00, 0x3C, // method 60 deliver
				0x04, 'c', 't', 'a', 'g', // consumer-tag "ctag"
				0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A, // delivery-tag 42
				0x01,           // redelivered
				0x00,           // exchange ""
				0x02, 'q', '1', // routing-key "q1"
				0xCE, // frame-end
			},
			wantChannel: 1,
			want:        &BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 42, Redelivered: true, Exchange: "", RoutingKey: "q1"},
		},
		"basic.ack": {
			frame: []byte{
				0x01, 0x00, 0x05, 0x00, 0x00, 0x00, 0x0D,
				0x00, 0x3C, 0x00, 0x50, // basic.ack
				0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, // delivery-tag 256
				0x01, // multiple
				0xCE,
			},
			wantChannel: 5,
			want:        &BasicAck{DeliveryTag: 256, Multiple: true},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var frames []gotFrame
			if err := NewParser(0).Parse(tc.frame, collect(&frames)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(frames) != 1 {
				t.Fatalf("Parse gave %d frames, want 1", len(frames))
			}
			f := frames[0]
			if f.Type != FrameMethod || f.Channel != tc.wantChannel {
				t.Errorf("frame type %d channel %d, want type 1 channel %d", f.Type, f.Channel, tc.wantChannel)
			}
			got, err := DecodeMethod(f.Payload)
			if err != nil {
				t.Fatalf("DecodeMethod: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("DecodeMethod (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.frame, AppendMethodFrame(nil, tc.wantChannel, got)); diff != "" {
				t.Errorf("re-encoded frame (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecodeMethodTruncated cuts every method's payload at every length:
// each cut is a FrameError, as is a byte too many.
func TestDecodeMethodTruncated(t *testing.T) {
	for name, tc := range methodCases() {
		t.Run(name, func(t *testing.T) {
			payload := cat(u16(tc.wantClass), u16(tc.wantMethod), tc.wantArgs)
			for n := range len(payload) {
				m, err := DecodeMethod(payload[:n])
				if code := errCode(t, err); code != FrameError || m != nil {
					t.Errorf("DecodeMethod(payload[:%d]) = %v, %v; want nil and a FrameError", n, m, err)
				}
			}
			m, err := DecodeMethod(append(payload, 0))
			if code := errCode(t, err); code != FrameError || m != nil {
				t.Errorf("DecodeMethod(payload + 1 byte) = %v, %v; want nil and a FrameError", m, err)
			}
		})
	}
}

func TestDecodeMethodErrors(t *testing.T) {
	tests := map[string]struct {
		payload         []byte
		wantCode        uint16
		wantUnsupported bool
	}{
		"empty": {
			payload:  nil,
			wantCode: FrameError,
		},
		"queue.bind is passed through": {
			payload:         cat(u16(50), u16(20), u16(0), ss("q"), ss("x"), ss("k"), u8(0), u32(0)),
			wantUnsupported: true,
		},
		"connection.start is passed through": {
			payload:         cat(u16(10), u16(10), u8(0), u8(9)),
			wantUnsupported: true,
		},
		"shortstr longer than the payload": {
			payload:  cat(u16(60), u16(21), u8(10), []byte("abc")),
			wantCode: FrameError,
		},
		"table length longer than the payload": {
			payload:  cat(u16(60), u16(20), u16(0), ss("q"), ss("c"), u8(0), u32(0xFFFFFFFF)),
			wantCode: FrameError,
		},
		"table entry running past the table": {
			payload:  cat(u16(60), u16(20), u16(0), ss("q"), ss("c"), u8(0), ls(string(cat(ss("k"), u8('I'), u16(1)))), u16(1)),
			wantCode: FrameError,
		},
		"unknown field type in arguments": {
			payload:  cat(u16(60), u16(20), u16(0), ss("q"), ss("c"), u8(0), ls(string(cat(ss("k"), u8('Z'), u8(1))))),
			wantCode: SyntaxError,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, err := DecodeMethod(tc.payload)
			if m != nil {
				t.Errorf("DecodeMethod returned %#v, want nil", m)
			}
			if got := errors.Is(err, ErrUnsupportedMethod); got != tc.wantUnsupported {
				t.Errorf("errors.Is(%v, ErrUnsupportedMethod) = %v, want %v", err, got, tc.wantUnsupported)
			}
			if got := errCode(t, err); got != tc.wantCode {
				t.Errorf("error %v has code %d, want %d", err, got, tc.wantCode)
			}
		})
	}
}

func TestValidateMethod(t *testing.T) {
	long := strings.Repeat("x", 256)
	tests := map[string]struct {
		m       Method
		wantErr bool
	}{
		"shortstr of 255 bytes": {m: &BasicCancelOk{ConsumerTag: long[:255]}},
		"shortstr of 256 bytes": {m: &BasicCancelOk{ConsumerTag: long}, wantErr: true},
		"argument of an unsupported type": {
			m:       &BasicConsume{Arguments: Table{"x-expires": uint64(1)}},
			wantErr: true,
		},
		"argument names sorted": {m: &BasicConsume{Arguments: Table{"b": 1, "a": time.Unix(0, 0)}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateMethod(tc.m)
			if got := errors.Is(err, ErrInvalidValue); got != tc.wantErr {
				t.Errorf("ValidateMethod = %v, want an ErrInvalidValue: %v", err, tc.wantErr)
			}
			if tc.wantErr {
				defer func() {
					if recover() == nil {
						t.Errorf("AppendMethodFrame did not panic on an invalid method")
					}
				}()
				AppendMethodFrame(nil, 1, tc.m)
			}
		})
	}
}
