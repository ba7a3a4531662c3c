package upstream

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Addresses is a broker list as an app writes it, parsed.
type Addresses struct {
	// Hosts are host:port, in the order written, without duplicates.
	Hosts []string
	// TLS is set when an entry is amqps://.
	TLS bool
	// Username and Password are the first entry's user info, if any.
	Username, Password string
	HasCredentials     bool
	// VirtualHost is the first entry's path, if any.
	VirtualHost    string
	HasVirtualHost bool
}

// ParseAddresses parses a comma-separated list of brokers: host:port,
// amqp:// or amqps:// URIs (user info and path percent-encoded), or
// Spring's user:password@host:port/vhost. A port left out is 5672, or 5671
// for amqps:// and when defaultTLS is set (Spring's default with
// spring.rabbitmq.ssl.enabled). Errors never show a password: they name the entry by its
// position and host.
func ParseAddresses(s string, defaultTLS bool) (Addresses, error) {
	var a Addresses
	tlsSeen, plainSeen := false, false
	for i, raw := range strings.Split(s, ",") {
		e := strings.TrimSpace(raw)
		if e == "" {
			continue
		}
		en, err := parseEntry(i+1, e, defaultTLS)
		if err != nil {
			return Addresses{}, err
		}
		switch strings.ToLower(en.scheme) {
		case "amqp":
			plainSeen = true
		case "amqps":
			tlsSeen = true
		}
		hp := net.JoinHostPort(en.host, en.port)
		if !slices.Contains(a.Hosts, hp) {
			a.Hosts = append(a.Hosts, hp)
		}
		if len(a.Hosts) > 1 || a.HasCredentials || a.HasVirtualHost {
			continue // user info and vhost of the first entry only
		}
		if err := a.setUserInfoAndVHost(i+1, en); err != nil {
			return Addresses{}, err
		}
	}
	if len(a.Hosts) == 0 {
		return Addresses{}, fmt.Errorf("no broker address")
	}
	if tlsSeen && plainSeen {
		return Addresses{}, fmt.Errorf("the broker addresses mix amqp:// and amqps://: use one")
	}
	a.TLS = tlsSeen
	return a, nil
}

// brokerEntry is one entry of a broker list, cut into its parts.
type brokerEntry struct {
	scheme    string // as written: "", or amqp or amqps in any case
	hasScheme bool
	userinfo  string // user[:password], still percent-encoded when hasScheme
	host      string
	port      string // checked to be 1 to 65535; the default when left out
	path      string // from the first '/', '?' or '#' on
}

// parseEntry cuts entry n (from 1) of a broker list, e, into its parts, and
// checks its scheme, host and port.
func parseEntry(n int, e string, defaultTLS bool) (brokerEntry, error) {
	var en brokerEntry
	var rest string
	en.scheme, rest, en.hasScheme = strings.Cut(e, "://")
	if !en.hasScheme {
		rest, en.scheme = e, ""
	}
	switch strings.ToLower(en.scheme) {
	case "", "amqp", "amqps":
	default:
		return brokerEntry{}, fmt.Errorf("broker address %d: scheme %q: want amqp:// or amqps://", n, en.scheme)
	}
	authority := rest
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		authority, en.path = rest[:j], rest[j:]
	}
	hostport := authority
	if k := strings.LastIndex(authority, "@"); k >= 0 {
		en.userinfo, hostport = authority[:k], authority[k+1:]
	}
	var err error
	if en.host, en.port, err = net.SplitHostPort(hostport); err != nil {
		en.host, en.port = strings.Trim(hostport, "[]"), "5672"
		if strings.EqualFold(en.scheme, "amqps") || (defaultTLS && !strings.EqualFold(en.scheme, "amqp")) {
			en.port = "5671"
		}
	}
	if en.host == "" {
		return brokerEntry{}, fmt.Errorf("broker address %d names no host", n)
	}
	if p, err := strconv.ParseUint(en.port, 10, 16); err != nil || p == 0 {
		return brokerEntry{}, fmt.Errorf("broker address %d (%s): port %q is not 1 to 65535", n, en.host, en.port)
	}
	return en, nil
}

// setUserInfoAndVHost takes the user info and the virtual host of entry n,
// the first, decoding them when the entry is a URI. An empty path of a URI
// names no virtual host; Spring's "host/" names "/".
func (a *Addresses) setUserInfoAndVHost(n int, en brokerEntry) error {
	var err error
	if en.userinfo != "" {
		user, pass, _ := strings.Cut(en.userinfo, ":")
		if en.hasScheme {
			if user, err = url.PathUnescape(user); err != nil {
				return fmt.Errorf("broker address %d (%s): the user name is not percent-encoded right", n, en.host)
			}
			if pass, err = url.PathUnescape(pass); err != nil {
				return fmt.Errorf("broker address %d (%s): the password is not percent-encoded right (it is not shown)", n, en.host)
			}
		}
		a.Username, a.Password, a.HasCredentials = user, pass, true
	}
	if p, _, _ := strings.Cut(en.path, "?"); strings.HasPrefix(p, "/") && (len(p) > 1 || !en.hasScheme) {
		v := p[1:]
		if en.hasScheme {
			if v, err = url.PathUnescape(v); err != nil {
				return fmt.Errorf("broker address %d (%s): the virtual host is not percent-encoded right", n, en.host)
			}
		}
		if v == "" {
			v = "/"
		}
		a.VirtualHost, a.HasVirtualHost = v, true
	}
	return nil
}
