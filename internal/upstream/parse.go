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
		scheme, rest, hasScheme := strings.Cut(e, "://")
		if !hasScheme {
			rest, scheme = e, ""
		}
		switch strings.ToLower(scheme) {
		case "", "amqp":
			plainSeen = plainSeen || scheme != ""
		case "amqps":
			tlsSeen = true
		default:
			return Addresses{}, fmt.Errorf("broker address %d: scheme %q: want amqp:// or amqps://", i+1, scheme)
		}
		authority, path := rest, ""
		if j := strings.IndexAny(rest, "/?#"); j >= 0 {
			authority, path = rest[:j], rest[j:]
		}
		userinfo, hostport := "", authority
		if k := strings.LastIndex(authority, "@"); k >= 0 {
			userinfo, hostport = authority[:k], authority[k+1:]
		}
		host, port, err := net.SplitHostPort(hostport)
		if err != nil {
			host, port = strings.Trim(hostport, "[]"), "5672"
			if strings.EqualFold(scheme, "amqps") || (defaultTLS && !strings.EqualFold(scheme, "amqp")) {
				port = "5671"
			}
		}
		if host == "" {
			return Addresses{}, fmt.Errorf("broker address %d names no host", i+1)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return Addresses{}, fmt.Errorf("broker address %d (%s): port %q is not 1 to 65535", i+1, host, port)
		}
		hp := net.JoinHostPort(host, port)
		if !slices.Contains(a.Hosts, hp) {
			a.Hosts = append(a.Hosts, hp)
		}
		if len(a.Hosts) > 1 || a.HasCredentials || a.HasVirtualHost {
			continue // user info and vhost of the first entry only
		}
		if userinfo != "" {
			user, pass, _ := strings.Cut(userinfo, ":")
			if hasScheme {
				if user, err = url.PathUnescape(user); err != nil {
					return Addresses{}, fmt.Errorf("broker address %d (%s): the user name is not percent-encoded right", i+1, host)
				}
				if pass, err = url.PathUnescape(pass); err != nil {
					return Addresses{}, fmt.Errorf("broker address %d (%s): the password is not percent-encoded right (it is not shown)", i+1, host)
				}
			}
			a.Username, a.Password, a.HasCredentials = user, pass, true
		}
		if p, _, _ := strings.Cut(path, "?"); strings.HasPrefix(p, "/") && (len(p) > 1 || !hasScheme) {
			v := p[1:]
			if hasScheme {
				if v, err = url.PathUnescape(v); err != nil {
					return Addresses{}, fmt.Errorf("broker address %d (%s): the virtual host is not percent-encoded right", i+1, host)
				}
			}
			if v == "" {
				v = "/"
			}
			a.VirtualHost, a.HasVirtualHost = v, true
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
