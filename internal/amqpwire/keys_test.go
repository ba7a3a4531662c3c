package amqpwire

import "testing"

// TestMethodKeys: every key names the method type it decodes to, whose ID
// agrees with it, so that the proxy's switches on keys and DecodeMethod see
// the same method.
func TestMethodKeys(t *testing.T) {
	keys := []MethodKey{}
	seen := map[MethodKey]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Errorf("key %s (%#x) is declared twice", k, uint32(k))
		}
		seen[k] = true
		m, name := newMethod(k.Class())
		if m == nil {
			t.Errorf("key %#x: no method decodes to it", uint32(k))
			continue
		}
		if got := KeyOf(m); got != k {
			t.Errorf("%s: KeyOf = %#x, want %#x", name, uint32(got), uint32(k))
		}
		payload := AppendMethodPayload(nil, m)
		if got, err := PayloadKey(payload); err != nil || got != k {
			t.Errorf("%s: PayloadKey = %#x, %v; want %#x", name, uint32(got), err, uint32(k))
		}
	}
	if _, err := PayloadKey([]byte{0, 60}); err == nil {
		t.Error("PayloadKey of a 2-byte payload: no error")
	}
}
