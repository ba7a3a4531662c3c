// Package amqpwire is the AMQP 0-9-1 frame codec of the sidecar's
// transparent proxy: a push Parser that cuts a byte stream into frames
// without copying, append-style encoders for frames, and decoders for the
// small set of methods and the content headers that the proxy has to look
// into (basic.deliver, basic.get-ok, acks, nacks, rejects, consumes,
// cancels, flow control, connection tuning and closing). Everything else is
// meant to be passed through byte for byte, so DecodeMethod reports
// ErrUnsupportedMethod rather than failing for methods it does not know.
//
// # Buffer lifetime
//
// A Frame given to a Parser callback aliases either the caller's input (a
// frame lying wholly inside one chunk passed to Parse) or the Parser's
// internal buffer (a frame split across chunks). Frame.Raw and
// Frame.Payload are valid only until the callback returns; copy them to keep
// them. The Parser never holds on to the caller's chunk after Parse returns:
// it copies the bytes of an incomplete trailing frame.
//
// Decoded methods, properties and field tables own their memory: strings,
// []byte values and tables are copies, except ContentHeader.RawProps and the
// result of ContentHeaderRawProps, which alias the payload passed in.
//
// The Append functions only append to dst and return the extended slice;
// they allocate only when dst must grow, and never keep dst.
//
// # Errors
//
// Wire problems are reported as *Error carrying the AMQP reply code that the
// connection is to be closed with:
//
//   - FrameError (501): the bytes do not fit the layout. A frame larger than
//     the frame-max, an unknown frame type, a bad frame-end octet, a payload
//     too short for the fields it must hold (truncated method arguments,
//     content header or field table, or a length prefix running past the
//     end), bytes left over after the last field, and property flags that
//     announce a layout this package does not know (the continuation bit or
//     the unused bit 0x0002).
//   - SyntaxError (502): the layout is intact but a value is not allowed: an
//     unknown field-value type in a table, a content header for a class other
//     than basic, or tables and arrays nested deeper than MaxNesting.
//
// Encoders report values that cannot be put on the wire (a shortstr over
// 255 bytes, a Go type that has no field-value type) with ErrInvalidValue.
package amqpwire
