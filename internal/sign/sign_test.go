package sign

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMAC(t *testing.T) {
	key := []byte("0123456789abcdef0123")
	good := MAC(key, "ctx", "shop", "orders")
	for name, tc := range map[string]struct {
		key   []byte
		mac   string
		ctx   string
		parts []string
		want  bool
	}{
		"same":                {key, good, "ctx", []string{"shop", "orders"}, true},
		"other context":       {key, good, "ctx2", []string{"shop", "orders"}, false},
		"parts moved":         {key, good, "ctx", []string{"shopo", "rders"}, false},
		"parts joined":        {key, good, "ctx", []string{"shop\x00orders"}, false},
		"a part more":         {key, good, "ctx", []string{"shop", "orders", ""}, false},
		"other key":           {[]byte("0123456789abcdef0124"), good, "ctx", []string{"shop", "orders"}, false},
		"no key":              {nil, MAC(nil, "ctx", "shop", "orders"), "ctx", []string{"shop", "orders"}, false},
		"empty mac":           {key, "", "ctx", []string{"shop", "orders"}, false},
		"mac of other values": {key, MAC(key, "ctx", "bank", "orders"), "ctx", []string{"shop", "orders"}, false},
	} {
		if got := Valid(tc.key, tc.mac, tc.ctx, tc.parts...); got != tc.want {
			t.Errorf("%s: Valid = %v, want %v", name, got, tc.want)
		}
	}
}

func TestKeys(t *testing.T) {
	k, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(k); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	if err := os.WriteFile(path, append(k, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadKeyFile(path)
	if err != nil || string(got) != string(k) {
		t.Fatalf("ReadKeyFile = %q, %v; want %q", got, err, k)
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKeyFile(path); err == nil {
		t.Fatal("a 5-byte key was accepted")
	}
}
