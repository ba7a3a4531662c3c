package amqpwire

// MethodKey names a method by its class id and method id together, as
// class<<16 | method, so that code can switch on a method frame without
// decoding it. The constants below name every method this package decodes;
// each matches the ID of its method type (TestMethodKeys).
type MethodKey uint32

// Key returns the key of the method with class id class and method id
// method.
func Key(class, method uint16) MethodKey { return MethodKey(class)<<16 | MethodKey(method) }

// KeyOf returns m's key.
func KeyOf(m Method) MethodKey { return Key(m.ID()) }

// PayloadKey reads the key from a method frame's payload; like MethodID, a
// payload shorter than 4 bytes is a *Error with Code FrameError.
func PayloadKey(payload []byte) (MethodKey, error) {
	class, method, err := MethodID(payload)
	return Key(class, method), err
}

// Class returns the key's class id and method id.
func (k MethodKey) Class() (class, method uint16) { return uint16(k >> 16), uint16(k) }

// String returns the spec's name of the method, as MethodName does.
func (k MethodKey) String() string { return MethodName(k.Class()) }

// The keys of the methods this package decodes.
const (
	KeyConnectionStartOk   = MethodKey(ClassConnection)<<16 | 11
	KeyConnectionTune      = MethodKey(ClassConnection)<<16 | 30
	KeyConnectionTuneOk    = MethodKey(ClassConnection)<<16 | 31
	KeyConnectionOpen      = MethodKey(ClassConnection)<<16 | 40
	KeyConnectionClose     = MethodKey(ClassConnection)<<16 | 50
	KeyConnectionCloseOk   = MethodKey(ClassConnection)<<16 | 51
	KeyConnectionBlocked   = MethodKey(ClassConnection)<<16 | 60
	KeyConnectionUnblocked = MethodKey(ClassConnection)<<16 | 61

	KeyChannelOpen    = MethodKey(ClassChannel)<<16 | 10
	KeyChannelOpenOk  = MethodKey(ClassChannel)<<16 | 11
	KeyChannelFlow    = MethodKey(ClassChannel)<<16 | 20
	KeyChannelFlowOk  = MethodKey(ClassChannel)<<16 | 21
	KeyChannelClose   = MethodKey(ClassChannel)<<16 | 40
	KeyChannelCloseOk = MethodKey(ClassChannel)<<16 | 41

	KeyQueueDeclare   = MethodKey(ClassQueue)<<16 | 10
	KeyQueueDeclareOk = MethodKey(ClassQueue)<<16 | 11

	KeyBasicQos          = MethodKey(ClassBasic)<<16 | 10
	KeyBasicQosOk        = MethodKey(ClassBasic)<<16 | 11
	KeyBasicConsume      = MethodKey(ClassBasic)<<16 | 20
	KeyBasicConsumeOk    = MethodKey(ClassBasic)<<16 | 21
	KeyBasicCancel       = MethodKey(ClassBasic)<<16 | 30
	KeyBasicCancelOk     = MethodKey(ClassBasic)<<16 | 31
	KeyBasicPublish      = MethodKey(ClassBasic)<<16 | 40
	KeyBasicReturn       = MethodKey(ClassBasic)<<16 | 50
	KeyBasicDeliver      = MethodKey(ClassBasic)<<16 | 60
	KeyBasicGet          = MethodKey(ClassBasic)<<16 | 70
	KeyBasicGetOk        = MethodKey(ClassBasic)<<16 | 71
	KeyBasicGetEmpty     = MethodKey(ClassBasic)<<16 | 72
	KeyBasicAck          = MethodKey(ClassBasic)<<16 | 80
	KeyBasicReject       = MethodKey(ClassBasic)<<16 | 90
	KeyBasicRecoverAsync = MethodKey(ClassBasic)<<16 | 100
	KeyBasicRecover      = MethodKey(ClassBasic)<<16 | 110
	KeyBasicRecoverOk    = MethodKey(ClassBasic)<<16 | 111
	KeyBasicNack         = MethodKey(ClassBasic)<<16 | 120

	KeyConfirmSelect   = MethodKey(ClassConfirm)<<16 | 10
	KeyConfirmSelectOk = MethodKey(ClassConfirm)<<16 | 11
)
