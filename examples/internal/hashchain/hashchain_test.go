package hashchain

import "testing"

// The want values were computed with Python's hashlib, independently of this
// package.
func TestChain(t *testing.T) {
	var c Chain
	steps := []struct {
		body     string
		wantHash string
	}{
		{"", "0000000000000000000000000000000000000000000000000000000000000000"},
		{"msg-1", "8d04eca07af490f36bfc4da73b228dcb8c44ad8bbe8060dffeee58ef9b34a28a"},
		{"msg-2", "22ff5d847c21b44d950a6665c14e1b012abf6f4b7e8c44b66919a106600cc9c1"},
		{"", "34fb2bc939245862a8c3c6b5da8d752e6a3c6c3f7b6515b52e75124bcadb58d8"},
	}
	for i, s := range steps {
		if i > 0 {
			c.Fold([]byte(s.body))
		}
		if got := c.Hex(); got != s.wantHash {
			t.Fatalf("after step %d (body %q): hash = %s, want %s", i, s.body, got, s.wantHash)
		}
	}
}
