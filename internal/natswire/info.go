package natswire

import (
	"encoding/json"
	"fmt"
)

// clusterFields are the INFO fields through which a server tells clients
// about other servers to (re)connect to. A client behind the proxy that
// learned them would reconnect around it.
var clusterFields = []string{"connect_urls", "ws_connect_urls", "leafnode_urls"}

// Info is what the proxy reads of a server's INFO.
type Info struct {
	MaxPayload   int  `json:"max_payload"`
	Headers      bool `json:"headers"`
	TLSRequired  bool `json:"tls_required"`
	TLSAvailable bool `json:"tls_available"`
	AuthRequired bool `json:"auth_required"`
}

// ParseInfo decodes the fields of an INFO's JSON that the proxy uses.
func ParseInfo(args []byte) (Info, error) {
	var i Info
	if err := json.Unmarshal(args, &i); err != nil {
		return Info{}, fmt.Errorf("decode the server's INFO: %w", err)
	}
	if i.MaxPayload < 0 {
		return Info{}, fmt.Errorf("decode the server's INFO: negative max_payload %d", i.MaxPayload)
	}
	return i, nil
}

// StripClusterURLs returns the INFO JSON args without the fields that
// advertise other servers (connect_urls, ws_connect_urls, leafnode_urls),
// and whether it removed any. When it removed none, it returns args itself,
// so the INFO can pass byte for byte; otherwise a new JSON object, with its
// keys sorted.
func StripClusterURLs(args []byte) ([]byte, bool, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return nil, false, fmt.Errorf("decode the server's INFO: %w", err)
	}
	changed := false
	for _, k := range clusterFields {
		if _, ok := m[k]; ok {
			delete(m, k)
			changed = true
		}
	}
	if !changed {
		return args, false, nil
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, false, fmt.Errorf("encode the stripped INFO: %w", err)
	}
	return out, true, nil
}
