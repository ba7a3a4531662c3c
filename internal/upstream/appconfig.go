package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// AppSettings is the broker as the app would find it in its own settings:
// env vars (URL style or Spring's SPRING_RABBITMQ_*) and Spring
// configuration files. The webhook gives the sidecar the app's envFrom
// sources (under a prefix) and mounts its configuration files, without
// reading either; the sidecar resolves them here.
type AppSettings struct {
	// Env holds the app's vars by their own names (the prefix removed).
	Env map[string]string
	// Files are Spring configuration files (application.properties,
	// application.yml) in the order Spring reads them, later ones winning;
	// a file that does not exist is skipped.
	Files []string
}

// Resolved is the broker the app's settings name.
type Resolved struct {
	// Spec is what MS2M_UPSTREAM would hold: a URL or a Spring address list.
	Spec string
	// TLS is Spring's ssl.enabled.
	TLS bool
	// Username, Password and VirtualHost are Spring's (for a URL they are
	// in Spec).
	Username, Password, VirtualHost string
	// From says where the address came from, for logs (never a value).
	From string
}

// Resolve finds the broker in s: AMQP_URL or RABBITMQ_URL, else Spring's
// spring.rabbitmq.addresses, else host and port, where env vars beat the
// files as in Spring, and later files beat earlier ones. Spring's defaults
// apply (guest, port 5672, 5671 with TLS). Errors name the file, never a
// value.
func (s AppSettings) Resolve() (Resolved, error) {
	for _, k := range []string{"AMQP_URL", "RABBITMQ_URL"} {
		if v := strings.TrimSpace(s.Env[k]); v != "" {
			return Resolved{Spec: v, From: k}, nil
		}
	}
	props := map[string]string{}
	for _, f := range s.Files {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return Resolved{}, fmt.Errorf("read the app's configuration file %s: %w", f, err)
		}
		var kv map[string]string
		if strings.HasSuffix(f, ".yml") || strings.HasSuffix(f, ".yaml") {
			kv, err = yamlProperties(b)
		} else {
			kv = javaProperties(b)
		}
		if err != nil {
			return Resolved{}, fmt.Errorf("the app's configuration file %s: %w", f, err)
		}
		for k, v := range kv {
			props[k] = v
		}
	}
	get := func(prop string) (string, string) {
		// Spring's relaxed binding drops the dashes (SPRING_RABBITMQ_VIRTUALHOST);
		// people also write them as underscores.
		for _, dash := range []string{"", "_"} {
			env := strings.ToUpper(strings.NewReplacer(".", "_", "-", dash).Replace(prop))
			if v, ok := s.Env[env]; ok {
				return strings.TrimSpace(v), env
			}
		}
		if v, ok := props[prop]; ok {
			return strings.TrimSpace(v), prop
		}
		return "", ""
	}
	var r Resolved
	ssl, _ := get("spring.rabbitmq.ssl.enabled")
	r.TLS = strings.EqualFold(ssl, "true")
	r.Username, _ = get("spring.rabbitmq.username")
	r.Password, _ = get("spring.rabbitmq.password")
	r.VirtualHost, _ = get("spring.rabbitmq.virtual-host")
	if r.Username == "" && r.Password == "" {
		r.Username, r.Password = "guest", "guest"
	}
	if v, from := get("spring.rabbitmq.addresses"); v != "" {
		r.Spec, r.From = v, from
		return r, nil
	}
	host, from := get("spring.rabbitmq.host")
	if host == "" {
		return Resolved{}, errors.New("the app's settings name no broker (none of AMQP_URL, RABBITMQ_URL, spring.rabbitmq.addresses, spring.rabbitmq.host)")
	}
	port, _ := get("spring.rabbitmq.port")
	if port == "" {
		port = "5672"
		if r.TLS {
			port = "5671"
		}
	}
	r.Spec, r.From = host+":"+port, from
	return r, nil
}

// javaProperties reads the key=value, key: value and key value lines of a
// .properties file; # and ! start comments, and a trailing backslash joins
// the next line.
func javaProperties(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	var cont string
	for sc.Scan() {
		line := strings.TrimLeft(sc.Text(), " \t\f")
		if cont != "" {
			line = cont + line
			cont = ""
		}
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		if strings.HasSuffix(line, `\`) && !strings.HasSuffix(line, `\\`) {
			cont = strings.TrimSuffix(line, `\`)
			continue
		}
		i := strings.IndexAny(line, "=: \t")
		if i < 0 {
			out[line] = ""
			continue
		}
		k, v := line[:i], strings.TrimLeft(line[i:], " \t")
		if v != "" && (v[0] == '=' || v[0] == ':') {
			v = strings.TrimLeft(v[1:], " \t")
		}
		out[k] = v
	}
	return out
}

// yamlProperties flattens a Spring YAML file into dotted keys. Of several
// documents, those that apply to a profile only
// (spring.config.activate.on-profile) are skipped.
func yamlProperties(b []byte) (map[string]string, error) {
	out := map[string]string{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, errors.New("not valid YAML (its text is not shown)")
		}
		flat := map[string]string{}
		flatten("", doc, flat)
		if _, profiled := flat["spring.config.activate.on-profile"]; profiled {
			continue
		}
		for k, v := range flat {
			out[k] = v
		}
	}
}

func flatten(prefix string, v any, out map[string]string) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			flatten(key, x, out)
		}
	case []any:
		var parts []string
		for _, x := range t {
			parts = append(parts, fmt.Sprint(x))
		}
		out[prefix] = strings.Join(parts, ",")
	case nil:
	default:
		out[prefix] = fmt.Sprint(t)
	}
}
