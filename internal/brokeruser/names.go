package brokeruser

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ms2m/ms2m/internal/contract"
)

// Permissions are a user's regular expressions on one vhost, as RabbitMQ
// matches them against resource names (queues, streams, exchanges).
type Permissions struct {
	Configure string `json:"configure"`
	Write     string `json:"write"`
	Read      string `json:"read"`
}

var userPrefixPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.$`)

// CheckUserPrefix refuses a user prefix that does not end in a dot (a
// namespace's name has none, so no two namespaces' users, nor two
// prefixes' users, share a name) or holds other than letters, digits, '-',
// '_' and dots, or is over 64 bytes.
func CheckUserPrefix(p string) error {
	if len(p) > 64 || !userPrefixPattern.MatchString(p) {
		return fmt.Errorf("broker user prefix %q: want letters, digits, '-', '_' and dots, ending in a dot, at most 64 bytes (e.g. %s or ms2m-ns.prod-eu.)", p, contract.BrokerUserPrefix)
	}
	return nil
}

// PermissionsFor confines a user to the streams of namespace ns: names that
// start with ns and a dot. The namespace is quoted, so that no character of
// it means anything to the broker's regular expressions (a namespace name
// has only [a-z0-9-] today; the quoting keeps that an assumption of no
// consequence), and the dot is literal: "shop" does not reach "shop-eu.x"
// nor "shopx.y".
func PermissionsFor(ns string) Permissions {
	re := "^" + regexp.QuoteMeta(ns) + `\.`
	return Permissions{Configure: re, Write: re, Read: re}
}

// CheckNamespace refuses a name that is not a namespace's: users and
// permissions are derived from it.
func CheckNamespace(ns string) error {
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return fmt.Errorf("namespace %q: %v", ns, msgs)
	}
	return nil
}

// passwordBytes is the randomness of a password: 256 bits.
const passwordBytes = 32

// passwordPattern is what NewPassword makes: unpadded base64url, which
// needs no escaping in a URI's user info.
var passwordPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// NewPassword returns a random password from r (crypto/rand when nil).
func NewPassword(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	b := make([]byte, passwordBytes)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("make a broker password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// wellFormed reports whether p is a password NewPassword could have made.
// A Secret's content is the tenant's to change: anything else in it is
// replaced, never sent to the broker.
func wellFormed(p string) bool { return passwordPattern.MatchString(p) }
