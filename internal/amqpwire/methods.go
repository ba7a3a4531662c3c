package amqpwire

// The decoded methods. Each comment gives the argument list in wire order;
// "reserved" arguments are skipped on decode and written as zero or empty on
// encode. Unused bits of a bit octet are ignored on decode and written as 0.

// ConnectionStartOk is connection.start-ok (10, 11), the client's choice of
// mechanism and its credentials.
//
//	client-properties table, mechanism shortstr, response longstr,
//	locale shortstr
//
// ClientProperties is the table's encoded body (without its length), kept
// as the client sent it so that a rewrite of the credentials leaves the
// rest byte for byte; on decode it aliases the payload.
type ConnectionStartOk struct {
	ClientProperties []byte // client-properties, encoded
	Mechanism        string // mechanism
	Response         []byte // response; for PLAIN "\x00user\x00password"
	Locale           string // locale
}

func (*ConnectionStartOk) ID() (class, method uint16) { return ClassConnection, 11 }

func (m *ConnectionStartOk) AppendArgs(dst []byte) []byte {
	dst = appendLongstr(dst, m.ClientProperties)
	dst = appendShortstr(dst, m.Mechanism)
	dst = appendLongstr(dst, m.Response)
	return appendShortstr(dst, m.Locale)
}

func (m *ConnectionStartOk) decodeArgs(d *decoder) {
	props := d.bytes(uint64(d.u32("client-properties")), "client-properties")
	if d.err == nil {
		if _, err := readTable(props, 1); err != nil {
			d.fail(err.Code, "client-properties", "%s", err.Text)
			return
		}
	}
	m.ClientProperties = props
	m.Mechanism = d.shortstr("mechanism")
	m.Response = d.bytes(uint64(d.u32("response")), "response")
	m.Locale = d.shortstr("locale")
}

// ConnectionOpen is connection.open (10, 40), the client's choice of
// virtual host.
//
//	virtual-host shortstr, reserved-1 shortstr, reserved-2 bit
type ConnectionOpen struct {
	VirtualHost string // virtual-host
}

func (*ConnectionOpen) ID() (class, method uint16) { return ClassConnection, 40 }

func (m *ConnectionOpen) AppendArgs(dst []byte) []byte {
	dst = appendShortstr(dst, m.VirtualHost)
	return append(dst, 0, 0) // reserved-1 "", reserved-2 false
}

func (m *ConnectionOpen) decodeArgs(d *decoder) {
	m.VirtualHost = d.shortstr("virtual-host")
	d.shortstr("reserved-1")
	d.u8("reserved-2")
}

// ConnectionTune is connection.tune (10, 30), the server's proposed limits.
//
//	channel-max short, frame-max long, heartbeat short
type ConnectionTune struct {
	ChannelMax uint16 // channel-max
	FrameMax   uint32 // frame-max
	Heartbeat  uint16 // heartbeat
}

func (*ConnectionTune) ID() (class, method uint16) { return ClassConnection, 30 }

func (m *ConnectionTune) AppendArgs(dst []byte) []byte {
	return appendTune(dst, m.ChannelMax, m.FrameMax, m.Heartbeat)
}

func (m *ConnectionTune) decodeArgs(d *decoder) {
	m.ChannelMax, m.FrameMax, m.Heartbeat = decodeTune(d)
}

// ConnectionTuneOk is connection.tune-ok (10, 31), the client's chosen limits.
//
//	channel-max short, frame-max long, heartbeat short
type ConnectionTuneOk struct {
	ChannelMax uint16 // channel-max
	FrameMax   uint32 // frame-max
	Heartbeat  uint16 // heartbeat
}

func (*ConnectionTuneOk) ID() (class, method uint16) { return ClassConnection, 31 }

func (m *ConnectionTuneOk) AppendArgs(dst []byte) []byte {
	return appendTune(dst, m.ChannelMax, m.FrameMax, m.Heartbeat)
}

func (m *ConnectionTuneOk) decodeArgs(d *decoder) {
	m.ChannelMax, m.FrameMax, m.Heartbeat = decodeTune(d)
}

func appendTune(dst []byte, channelMax uint16, frameMax uint32, heartbeat uint16) []byte {
	dst = appendU16(dst, channelMax)
	dst = appendU32(dst, frameMax)
	return appendU16(dst, heartbeat)
}

func decodeTune(d *decoder) (channelMax uint16, frameMax uint32, heartbeat uint16) {
	return d.u16("channel-max"), d.u32("frame-max"), d.u16("heartbeat")
}

// ConnectionClose is connection.close (10, 50).
//
//	reply-code short, reply-text shortstr, class-id short, method-id short
type ConnectionClose struct {
	ReplyCode uint16 // reply-code
	ReplyText string // reply-text
	ClassID   uint16 // class-id: the failing method's class, or 0
	MethodID  uint16 // method-id: the failing method, or 0
}

func (*ConnectionClose) ID() (class, method uint16) { return ClassConnection, 50 }

func (m *ConnectionClose) AppendArgs(dst []byte) []byte {
	return appendClose(dst, m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID)
}

func (m *ConnectionClose) decodeArgs(d *decoder) {
	m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID = decodeClose(d)
}

// ConnectionCloseOk is connection.close-ok (10, 51); it has no arguments.
type ConnectionCloseOk struct{}

func (*ConnectionCloseOk) ID() (class, method uint16)   { return ClassConnection, 51 }
func (*ConnectionCloseOk) AppendArgs(dst []byte) []byte { return dst }
func (*ConnectionCloseOk) decodeArgs(*decoder)          {}

// ConnectionBlocked is connection.blocked (10, 60), a RabbitMQ extension.
//
//	reason shortstr
type ConnectionBlocked struct {
	Reason string // reason
}

func (*ConnectionBlocked) ID() (class, method uint16) { return ClassConnection, 60 }

func (m *ConnectionBlocked) AppendArgs(dst []byte) []byte { return appendShortstr(dst, m.Reason) }

func (m *ConnectionBlocked) decodeArgs(d *decoder) { m.Reason = d.shortstr("reason") }

// ConnectionUnblocked is connection.unblocked (10, 61), a RabbitMQ
// extension; it has no arguments.
type ConnectionUnblocked struct{}

func (*ConnectionUnblocked) ID() (class, method uint16)   { return ClassConnection, 61 }
func (*ConnectionUnblocked) AppendArgs(dst []byte) []byte { return dst }
func (*ConnectionUnblocked) decodeArgs(*decoder)          {}

// ChannelOpen is channel.open (20, 10).
//
//	reserved-1 shortstr
type ChannelOpen struct{}

func (*ChannelOpen) ID() (class, method uint16)   { return ClassChannel, 10 }
func (*ChannelOpen) AppendArgs(dst []byte) []byte { return append(dst, 0) }
func (*ChannelOpen) decodeArgs(d *decoder)        { d.shortstr("reserved-1") }

// ChannelOpenOk is channel.open-ok (20, 11).
//
//	reserved-1 longstr
type ChannelOpenOk struct{}

func (*ChannelOpenOk) ID() (class, method uint16)   { return ClassChannel, 11 }
func (*ChannelOpenOk) AppendArgs(dst []byte) []byte { return append(dst, 0, 0, 0, 0) }
func (*ChannelOpenOk) decodeArgs(d *decoder)        { d.bytes(uint64(d.u32("reserved-1")), "reserved-1") }

// ChannelFlow is channel.flow (20, 20).
//
//	active bit
type ChannelFlow struct {
	Active bool // active
}

func (*ChannelFlow) ID() (class, method uint16)     { return ClassChannel, 20 }
func (m *ChannelFlow) AppendArgs(dst []byte) []byte { return append(dst, bit(m.Active, 0)) }
func (m *ChannelFlow) decodeArgs(d *decoder)        { m.Active = d.u8("active")&1 != 0 }

// ChannelFlowOk is channel.flow-ok (20, 21).
//
//	active bit
type ChannelFlowOk struct {
	Active bool // active
}

func (*ChannelFlowOk) ID() (class, method uint16)     { return ClassChannel, 21 }
func (m *ChannelFlowOk) AppendArgs(dst []byte) []byte { return append(dst, bit(m.Active, 0)) }
func (m *ChannelFlowOk) decodeArgs(d *decoder)        { m.Active = d.u8("active")&1 != 0 }

// ChannelClose is channel.close (20, 40).
//
//	reply-code short, reply-text shortstr, class-id short, method-id short
type ChannelClose struct {
	ReplyCode uint16 // reply-code
	ReplyText string // reply-text
	ClassID   uint16 // class-id: the failing method's class, or 0
	MethodID  uint16 // method-id: the failing method, or 0
}

func (*ChannelClose) ID() (class, method uint16) { return ClassChannel, 40 }

func (m *ChannelClose) AppendArgs(dst []byte) []byte {
	return appendClose(dst, m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID)
}

func (m *ChannelClose) decodeArgs(d *decoder) {
	m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID = decodeClose(d)
}

func appendClose(dst []byte, code uint16, text string, class, method uint16) []byte {
	dst = appendU16(dst, code)
	dst = appendShortstr(dst, text)
	dst = appendU16(dst, class)
	return appendU16(dst, method)
}

func decodeClose(d *decoder) (code uint16, text string, class, method uint16) {
	return d.u16("reply-code"), d.shortstr("reply-text"), d.u16("class-id"), d.u16("method-id")
}

// ChannelCloseOk is channel.close-ok (20, 41); it has no arguments.
type ChannelCloseOk struct{}

func (*ChannelCloseOk) ID() (class, method uint16)   { return ClassChannel, 41 }
func (*ChannelCloseOk) AppendArgs(dst []byte) []byte { return dst }
func (*ChannelCloseOk) decodeArgs(*decoder)          {}

// QueueDeclare is queue.declare (50, 10).
//
//	reserved-1 short, queue shortstr, passive bit, durable bit,
//	exclusive bit, auto-delete bit, no-wait bit, arguments table
type QueueDeclare struct {
	Queue      string // queue; "" asks the server to name it
	Passive    bool   // passive
	Durable    bool   // durable
	Exclusive  bool   // exclusive
	AutoDelete bool   // auto-delete
	NoWait     bool   // no-wait
	Arguments  Table  // arguments
}

func (*QueueDeclare) ID() (class, method uint16) { return ClassQueue, 10 }

func (m *QueueDeclare) AppendArgs(dst []byte) []byte {
	dst = append(dst, 0, 0) // reserved-1
	dst = appendShortstr(dst, m.Queue)
	dst = append(dst, bit(m.Passive, 0)|bit(m.Durable, 1)|bit(m.Exclusive, 2)|bit(m.AutoDelete, 3)|bit(m.NoWait, 4))
	return appendTable(dst, m.Arguments, 1)
}

func (m *QueueDeclare) decodeArgs(d *decoder) {
	d.u16("reserved-1")
	m.Queue = d.shortstr("queue")
	bits := d.u8("passive/durable/exclusive/auto-delete/no-wait")
	m.Passive = bits&1 != 0
	m.Durable = bits&2 != 0
	m.Exclusive = bits&4 != 0
	m.AutoDelete = bits&8 != 0
	m.NoWait = bits&16 != 0
	m.Arguments = d.table("arguments")
}

// QueueDeclareOk is queue.declare-ok (50, 11).
//
//	queue shortstr, message-count long, consumer-count long
type QueueDeclareOk struct {
	Queue         string // queue
	MessageCount  uint32 // message-count
	ConsumerCount uint32 // consumer-count
}

func (*QueueDeclareOk) ID() (class, method uint16) { return ClassQueue, 11 }

func (m *QueueDeclareOk) AppendArgs(dst []byte) []byte {
	dst = appendShortstr(dst, m.Queue)
	dst = appendU32(dst, m.MessageCount)
	return appendU32(dst, m.ConsumerCount)
}

func (m *QueueDeclareOk) decodeArgs(d *decoder) {
	m.Queue = d.shortstr("queue")
	m.MessageCount = d.u32("message-count")
	m.ConsumerCount = d.u32("consumer-count")
}

// BasicQos is basic.qos (60, 10).
//
//	prefetch-size long, prefetch-count short, global bit
type BasicQos struct {
	PrefetchSize  uint32 // prefetch-size
	PrefetchCount uint16 // prefetch-count
	Global        bool   // global
}

func (*BasicQos) ID() (class, method uint16) { return ClassBasic, 10 }

func (m *BasicQos) AppendArgs(dst []byte) []byte {
	dst = appendU32(dst, m.PrefetchSize)
	dst = appendU16(dst, m.PrefetchCount)
	return append(dst, bit(m.Global, 0))
}

func (m *BasicQos) decodeArgs(d *decoder) {
	m.PrefetchSize = d.u32("prefetch-size")
	m.PrefetchCount = d.u16("prefetch-count")
	m.Global = d.u8("global")&1 != 0
}

// BasicQosOk is basic.qos-ok (60, 11); it has no arguments.
type BasicQosOk struct{}

func (*BasicQosOk) ID() (class, method uint16)   { return ClassBasic, 11 }
func (*BasicQosOk) AppendArgs(dst []byte) []byte { return dst }
func (*BasicQosOk) decodeArgs(*decoder)          {}

// BasicConsume is basic.consume (60, 20).
//
//	reserved-1 short, queue shortstr, consumer-tag shortstr,
//	no-local bit, no-ack bit, exclusive bit, no-wait bit, arguments table
type BasicConsume struct {
	Queue       string // queue
	ConsumerTag string // consumer-tag
	NoLocal     bool   // no-local
	NoAck       bool   // no-ack
	Exclusive   bool   // exclusive
	NoWait      bool   // no-wait
	Arguments   Table  // arguments
}

func (*BasicConsume) ID() (class, method uint16) { return ClassBasic, 20 }

func (m *BasicConsume) AppendArgs(dst []byte) []byte {
	dst = append(dst, 0, 0) // reserved-1
	dst = appendShortstr(dst, m.Queue)
	dst = appendShortstr(dst, m.ConsumerTag)
	dst = append(dst, bit(m.NoLocal, 0)|bit(m.NoAck, 1)|bit(m.Exclusive, 2)|bit(m.NoWait, 3))
	return appendTable(dst, m.Arguments, 1)
}

func (m *BasicConsume) decodeArgs(d *decoder) {
	d.u16("reserved-1")
	m.Queue = d.shortstr("queue")
	m.ConsumerTag = d.shortstr("consumer-tag")
	bits := d.u8("no-local/no-ack/exclusive/no-wait")
	m.NoLocal = bits&1 != 0
	m.NoAck = bits&2 != 0
	m.Exclusive = bits&4 != 0
	m.NoWait = bits&8 != 0
	m.Arguments = d.table("arguments")
}

// BasicConsumeOk is basic.consume-ok (60, 21).
//
//	consumer-tag shortstr
type BasicConsumeOk struct {
	ConsumerTag string // consumer-tag
}

func (*BasicConsumeOk) ID() (class, method uint16) { return ClassBasic, 21 }

func (m *BasicConsumeOk) AppendArgs(dst []byte) []byte { return appendShortstr(dst, m.ConsumerTag) }

func (m *BasicConsumeOk) decodeArgs(d *decoder) { m.ConsumerTag = d.shortstr("consumer-tag") }

// BasicCancel is basic.cancel (60, 30), sent by the client or, with
// RabbitMQ's consumer_cancel_notify, by the server.
//
//	consumer-tag shortstr, no-wait bit
type BasicCancel struct {
	ConsumerTag string // consumer-tag
	NoWait      bool   // no-wait
}

func (*BasicCancel) ID() (class, method uint16) { return ClassBasic, 30 }

func (m *BasicCancel) AppendArgs(dst []byte) []byte {
	dst = appendShortstr(dst, m.ConsumerTag)
	return append(dst, bit(m.NoWait, 0))
}

func (m *BasicCancel) decodeArgs(d *decoder) {
	m.ConsumerTag = d.shortstr("consumer-tag")
	m.NoWait = d.u8("no-wait")&1 != 0
}

// BasicCancelOk is basic.cancel-ok (60, 31).
//
//	consumer-tag shortstr
type BasicCancelOk struct {
	ConsumerTag string // consumer-tag
}

func (*BasicCancelOk) ID() (class, method uint16) { return ClassBasic, 31 }

func (m *BasicCancelOk) AppendArgs(dst []byte) []byte { return appendShortstr(dst, m.ConsumerTag) }

func (m *BasicCancelOk) decodeArgs(d *decoder) { m.ConsumerTag = d.shortstr("consumer-tag") }

// BasicPublish is basic.publish (60, 40).
//
//	reserved-1 short, exchange shortstr, routing-key shortstr,
//	mandatory bit, immediate bit
type BasicPublish struct {
	Exchange   string // exchange
	RoutingKey string // routing-key
	Mandatory  bool   // mandatory
	Immediate  bool   // immediate
}

func (*BasicPublish) ID() (class, method uint16) { return ClassBasic, 40 }

func (m *BasicPublish) AppendArgs(dst []byte) []byte {
	dst = append(dst, 0, 0) // reserved-1
	dst = appendShortstr(dst, m.Exchange)
	dst = appendShortstr(dst, m.RoutingKey)
	return append(dst, bit(m.Mandatory, 0)|bit(m.Immediate, 1))
}

func (m *BasicPublish) decodeArgs(d *decoder) {
	d.u16("reserved-1")
	m.Exchange = d.shortstr("exchange")
	m.RoutingKey = d.shortstr("routing-key")
	bits := d.u8("mandatory/immediate")
	m.Mandatory = bits&1 != 0
	m.Immediate = bits&2 != 0
}

// BasicReturn is basic.return (60, 50).
//
//	reply-code short, reply-text shortstr, exchange shortstr, routing-key shortstr
type BasicReturn struct {
	ReplyCode  uint16 // reply-code
	ReplyText  string // reply-text
	Exchange   string // exchange
	RoutingKey string // routing-key
}

func (*BasicReturn) ID() (class, method uint16) { return ClassBasic, 50 }

func (m *BasicReturn) AppendArgs(dst []byte) []byte {
	dst = appendU16(dst, m.ReplyCode)
	dst = appendShortstr(dst, m.ReplyText)
	dst = appendShortstr(dst, m.Exchange)
	return appendShortstr(dst, m.RoutingKey)
}

func (m *BasicReturn) decodeArgs(d *decoder) {
	m.ReplyCode = d.u16("reply-code")
	m.ReplyText = d.shortstr("reply-text")
	m.Exchange = d.shortstr("exchange")
	m.RoutingKey = d.shortstr("routing-key")
}

// BasicDeliver is basic.deliver (60, 60).
//
//	consumer-tag shortstr, delivery-tag longlong, redelivered bit,
//	exchange shortstr, routing-key shortstr
type BasicDeliver struct {
	ConsumerTag string // consumer-tag
	DeliveryTag uint64 // delivery-tag
	Redelivered bool   // redelivered
	Exchange    string // exchange
	RoutingKey  string // routing-key
}

func (*BasicDeliver) ID() (class, method uint16) { return ClassBasic, 60 }

func (m *BasicDeliver) AppendArgs(dst []byte) []byte {
	dst = appendShortstr(dst, m.ConsumerTag)
	dst = appendU64(dst, m.DeliveryTag)
	dst = append(dst, bit(m.Redelivered, 0))
	dst = appendShortstr(dst, m.Exchange)
	return appendShortstr(dst, m.RoutingKey)
}

func (m *BasicDeliver) decodeArgs(d *decoder) {
	m.ConsumerTag = d.shortstr("consumer-tag")
	m.DeliveryTag = d.u64("delivery-tag")
	m.Redelivered = d.u8("redelivered")&1 != 0
	m.Exchange = d.shortstr("exchange")
	m.RoutingKey = d.shortstr("routing-key")
}

// BasicGet is basic.get (60, 70).
//
//	reserved-1 short, queue shortstr, no-ack bit
type BasicGet struct {
	Queue string // queue
	NoAck bool   // no-ack
}

func (*BasicGet) ID() (class, method uint16) { return ClassBasic, 70 }

func (m *BasicGet) AppendArgs(dst []byte) []byte {
	dst = append(dst, 0, 0) // reserved-1
	dst = appendShortstr(dst, m.Queue)
	return append(dst, bit(m.NoAck, 0))
}

func (m *BasicGet) decodeArgs(d *decoder) {
	d.u16("reserved-1")
	m.Queue = d.shortstr("queue")
	m.NoAck = d.u8("no-ack")&1 != 0
}

// BasicGetOk is basic.get-ok (60, 71).
//
//	delivery-tag longlong, redelivered bit, exchange shortstr,
//	routing-key shortstr, message-count long
type BasicGetOk struct {
	DeliveryTag  uint64 // delivery-tag
	Redelivered  bool   // redelivered
	Exchange     string // exchange
	RoutingKey   string // routing-key
	MessageCount uint32 // message-count
}

func (*BasicGetOk) ID() (class, method uint16) { return ClassBasic, 71 }

func (m *BasicGetOk) AppendArgs(dst []byte) []byte {
	dst = appendU64(dst, m.DeliveryTag)
	dst = append(dst, bit(m.Redelivered, 0))
	dst = appendShortstr(dst, m.Exchange)
	dst = appendShortstr(dst, m.RoutingKey)
	return appendU32(dst, m.MessageCount)
}

func (m *BasicGetOk) decodeArgs(d *decoder) {
	m.DeliveryTag = d.u64("delivery-tag")
	m.Redelivered = d.u8("redelivered")&1 != 0
	m.Exchange = d.shortstr("exchange")
	m.RoutingKey = d.shortstr("routing-key")
	m.MessageCount = d.u32("message-count")
}

// BasicGetEmpty is basic.get-empty (60, 72).
//
//	reserved-1 shortstr
type BasicGetEmpty struct{}

func (*BasicGetEmpty) ID() (class, method uint16)   { return ClassBasic, 72 }
func (*BasicGetEmpty) AppendArgs(dst []byte) []byte { return append(dst, 0) }
func (*BasicGetEmpty) decodeArgs(d *decoder)        { d.shortstr("reserved-1") }

// BasicAck is basic.ack (60, 80), from the client or, in confirm mode, from
// the server.
//
//	delivery-tag longlong, multiple bit
type BasicAck struct {
	DeliveryTag uint64 // delivery-tag
	Multiple    bool   // multiple
}

func (*BasicAck) ID() (class, method uint16) { return ClassBasic, 80 }

func (m *BasicAck) AppendArgs(dst []byte) []byte {
	dst = appendU64(dst, m.DeliveryTag)
	return append(dst, bit(m.Multiple, 0))
}

func (m *BasicAck) decodeArgs(d *decoder) {
	m.DeliveryTag = d.u64("delivery-tag")
	m.Multiple = d.u8("multiple")&1 != 0
}

// BasicReject is basic.reject (60, 90).
//
//	delivery-tag longlong, requeue bit
type BasicReject struct {
	DeliveryTag uint64 // delivery-tag
	Requeue     bool   // requeue
}

func (*BasicReject) ID() (class, method uint16) { return ClassBasic, 90 }

func (m *BasicReject) AppendArgs(dst []byte) []byte {
	dst = appendU64(dst, m.DeliveryTag)
	return append(dst, bit(m.Requeue, 0))
}

func (m *BasicReject) decodeArgs(d *decoder) {
	m.DeliveryTag = d.u64("delivery-tag")
	m.Requeue = d.u8("requeue")&1 != 0
}

// BasicRecoverAsync is basic.recover-async (60, 100), deprecated.
//
//	requeue bit
type BasicRecoverAsync struct {
	Requeue bool // requeue
}

func (*BasicRecoverAsync) ID() (class, method uint16)     { return ClassBasic, 100 }
func (m *BasicRecoverAsync) AppendArgs(dst []byte) []byte { return append(dst, bit(m.Requeue, 0)) }
func (m *BasicRecoverAsync) decodeArgs(d *decoder)        { m.Requeue = d.u8("requeue")&1 != 0 }

// BasicRecover is basic.recover (60, 110).
//
//	requeue bit
type BasicRecover struct {
	Requeue bool // requeue
}

func (*BasicRecover) ID() (class, method uint16)     { return ClassBasic, 110 }
func (m *BasicRecover) AppendArgs(dst []byte) []byte { return append(dst, bit(m.Requeue, 0)) }
func (m *BasicRecover) decodeArgs(d *decoder)        { m.Requeue = d.u8("requeue")&1 != 0 }

// BasicRecoverOk is basic.recover-ok (60, 111); it has no arguments.
type BasicRecoverOk struct{}

func (*BasicRecoverOk) ID() (class, method uint16)   { return ClassBasic, 111 }
func (*BasicRecoverOk) AppendArgs(dst []byte) []byte { return dst }
func (*BasicRecoverOk) decodeArgs(*decoder)          {}

// BasicNack is basic.nack (60, 120), a RabbitMQ extension.
//
//	delivery-tag longlong, multiple bit, requeue bit
type BasicNack struct {
	DeliveryTag uint64 // delivery-tag
	Multiple    bool   // multiple
	Requeue     bool   // requeue
}

func (*BasicNack) ID() (class, method uint16) { return ClassBasic, 120 }

func (m *BasicNack) AppendArgs(dst []byte) []byte {
	dst = appendU64(dst, m.DeliveryTag)
	return append(dst, bit(m.Multiple, 0)|bit(m.Requeue, 1))
}

func (m *BasicNack) decodeArgs(d *decoder) {
	m.DeliveryTag = d.u64("delivery-tag")
	bits := d.u8("multiple/requeue")
	m.Multiple = bits&1 != 0
	m.Requeue = bits&2 != 0
}

// ConfirmSelect is confirm.select (85, 10), a RabbitMQ extension.
//
//	nowait bit
type ConfirmSelect struct {
	NoWait bool // nowait
}

func (*ConfirmSelect) ID() (class, method uint16)     { return ClassConfirm, 10 }
func (m *ConfirmSelect) AppendArgs(dst []byte) []byte { return append(dst, bit(m.NoWait, 0)) }
func (m *ConfirmSelect) decodeArgs(d *decoder)        { m.NoWait = d.u8("nowait")&1 != 0 }

// ConfirmSelectOk is confirm.select-ok (85, 11); it has no arguments.
type ConfirmSelectOk struct{}

func (*ConfirmSelectOk) ID() (class, method uint16)   { return ClassConfirm, 11 }
func (*ConfirmSelectOk) AppendArgs(dst []byte) []byte { return dst }
func (*ConfirmSelectOk) decodeArgs(*decoder)          {}
