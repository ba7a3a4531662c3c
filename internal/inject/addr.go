package inject

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// defaultAMQPPort is the broker port a URL or Spring setting implies when it
// names none.
const defaultAMQPPort = 5672

// maskedPassword replaces passwords in everything ms2m writes or says.
const maskedPassword = "xxxxx"

// brokerAddr is one broker address as the app wrote it: an AMQP URI
// (amqp://user:password@host:port/vhost?query) or, without a scheme,
// [user:password@]host[:port][/vhost] (Spring's addresses, host:port).
//
// The parts are slices of the original text, so that a rewrite changes the
// host and port and nothing else: the user, the password (which may hold
// $(VAR) references), the vhost and the query stay byte for byte.
type brokerAddr struct {
	scheme   string // as written, "" when the value had none
	userinfo string // "user:password@" as written, or ""
	host     string // without IPv6 brackets
	port     string // digits, or "" when the value had none
	rest     string // "/vhost?query#fragment" as written, or ""
}

// parseBrokerAddr parses s. A scheme other than amqp or amqps is an error.
func parseBrokerAddr(s string) (brokerAddr, error) {
	var a brokerAddr
	rest := s
	if i := strings.Index(s, "://"); i >= 0 {
		a.scheme, rest = s[:i], s[i+3:]
		switch strings.ToLower(a.scheme) {
		case "amqp", "amqps":
		default:
			return a, fmt.Errorf("the scheme %q is neither amqp:// nor amqps://", a.scheme)
		}
	}
	authority := rest
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		authority, a.rest = rest[:j], rest[j:]
	}
	hostport := authority
	if k := strings.LastIndex(authority, "@"); k >= 0 {
		a.userinfo, hostport = authority[:k+1], authority[k+1:]
	}
	if strings.HasPrefix(hostport, "[") {
		end := strings.Index(hostport, "]")
		if end < 0 {
			return a, fmt.Errorf("the IPv6 address has no closing ]")
		}
		a.host = hostport[1:end]
		after := hostport[end+1:]
		switch {
		case after == "":
		case strings.HasPrefix(after, ":"):
			a.port = after[1:]
			if a.port == "" {
				return a, fmt.Errorf("the port is empty")
			}
		default:
			return a, fmt.Errorf("%q follows the IPv6 address", after)
		}
		if net.ParseIP(a.host) == nil {
			return a, fmt.Errorf("%q is not an IPv6 address", a.host)
		}
	} else {
		a.host = hostport
		if c := strings.LastIndex(hostport, ":"); c >= 0 {
			a.host, a.port = hostport[:c], hostport[c+1:]
			if a.port == "" {
				return a, fmt.Errorf("the port is empty")
			}
		}
	}
	if strings.Contains(a.host, "$(") || strings.Contains(a.port, "$(") {
		return a, fmt.Errorf("the broker address uses a $(VAR) reference, known only at run time")
	}
	if a.host == "" {
		return a, fmt.Errorf("it names no broker host")
	}
	if a.port != "" {
		if _, err := parsePort(a.port); err != nil {
			return a, err
		}
	}
	if net.ParseIP(a.host) == nil && len(validation.IsDNS1123Subdomain(strings.ToLower(strings.TrimSuffix(a.host, ".")))) > 0 {
		return a, fmt.Errorf("%q is not a host name or IP address", a.host)
	}
	return a, nil
}

// parsePort parses a TCP port number, 1 to 65535.
func parsePort(s string) (int32, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a port number (1 to 65535)", s)
	}
	return int32(n), nil
}

// defaultAMQPSPort is the broker port of an amqps:// URL that names none.
const defaultAMQPSPort = 5671

// isTLS says whether the address is amqps://.
func (a brokerAddr) isTLS() bool { return strings.EqualFold(a.scheme, "amqps") }

// upstream is the address's broker as host:port, the host in lower case,
// the port defaulted (5671 for amqps): what the sidecar dials.
func (a brokerAddr) upstream() string { return a.upstreamWithDefault(a.isTLS()) }

// upstreamWithDefault is upstream with the default port of TLS or not.
func (a brokerAddr) upstreamWithDefault(tls bool) string {
	port := a.port
	if port == "" {
		port = strconv.Itoa(defaultAMQPPort)
		if tls {
			port = strconv.Itoa(defaultAMQPSPort)
		}
	}
	return net.JoinHostPort(strings.ToLower(a.host), port)
}

// plain is the address as the app writes it to reach the sidecar: its
// host and port replaced, amqps:// turned into amqp:// (TLS is the
// sidecar's now), every other part as written.
func (a brokerAddr) plain(host string, port int32) brokerAddr {
	a = a.withHostPort(host, port)
	if a.isTLS() {
		a.scheme = a.scheme[:4]
	}
	return a
}

// isLoopback says whether the address is the pod itself.
func (a brokerAddr) isLoopback() bool {
	if strings.EqualFold(a.host, "localhost") {
		return true
	}
	ip := net.ParseIP(a.host)
	return ip != nil && ip.IsLoopback()
}

// withHostPort is the address with its host and port replaced and every
// other part as written.
func (a brokerAddr) withHostPort(host string, port int32) brokerAddr {
	a.host, a.port = host, strconv.Itoa(int(port))
	return a
}

// String is the address as written (with the host and port it now has).
func (a brokerAddr) String() string {
	var b strings.Builder
	if a.scheme != "" {
		b.WriteString(a.scheme)
		b.WriteString("://")
	}
	b.WriteString(a.userinfo)
	if a.port == "" {
		b.WriteString(a.hostText())
	} else {
		b.WriteString(net.JoinHostPort(a.host, a.port))
	}
	b.WriteString(a.rest)
	return b.String()
}

func (a brokerAddr) hostText() string {
	if strings.Contains(a.host, ":") {
		return "[" + a.host + "]"
	}
	return a.host
}

// masked is String with the password, if any, replaced by xxxxx.
func (a brokerAddr) masked() string {
	if i := strings.Index(a.userinfo, ":"); i >= 0 {
		a.userinfo = a.userinfo[:i+1] + maskedPassword + "@"
	}
	return a.String()
}

// maskValue masks the password in a value that may be one or more broker
// addresses (comma separated), for messages. What does not parse is kept,
// except after an "@", which might be a password.
func maskValue(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		parts[i] = maskOne(p)
	}
	return strings.Join(parts, ",")
}

func maskOne(s string) string {
	rest, prefix := s, ""
	if i := strings.Index(s, "://"); i >= 0 {
		prefix, rest = s[:i+3], s[i+3:]
	}
	end := len(rest)
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		end = j
	}
	k := strings.LastIndex(rest[:end], "@")
	if k < 0 {
		return s
	}
	if c := strings.Index(rest[:k], ":"); c >= 0 {
		return prefix + rest[:c+1] + maskedPassword + rest[k:]
	}
	return s
}
