package brokeruser

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Management is a client of RabbitMQ's HTTP management API, as an
// administrator (a user tagged administrator; the API refuses the
// per-namespace users, which carry no management tag).
type Management struct {
	// URL is the API's base, http(s)://host:15672 (a path prefix, if the
	// API is served under one, included).
	URL      string
	Username string
	Password string
	// Client makes the requests; nil: one with a 30 s timeout.
	Client *http.Client
}

// User is a broker user as the API shows it.
type User struct {
	Name string
	Tags []string
}

// HasTag reports whether u carries tag.
func (u User) HasTag(tag string) bool {
	for _, t := range u.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

// ErrNotFound is a 404 from the API.
var ErrNotFound = errors.New("not found")

// APIError is an answer of the API other than success.
type APIError struct {
	Method, Path string
	Status       int
	Body         string // the broker's own words, cut short
}

func (e *APIError) Error() string {
	hint := ""
	switch e.Status {
	case http.StatusUnauthorized:
		hint = "; check the administrator's user name and password"
	case http.StatusForbidden:
		hint = "; the user needs the administrator tag"
	}
	return fmt.Sprintf("RabbitMQ management API %s %s: %d %s%s", e.Method, e.Path, e.Status, e.Body, hint)
}

func (e *APIError) Is(target error) bool {
	return target == ErrNotFound && e.Status == http.StatusNotFound
}

// GetUser returns the user name; ErrNotFound if there is none.
func (m *Management) GetUser(ctx context.Context, name string) (User, error) {
	var raw struct {
		Name string          `json:"name"`
		Tags json.RawMessage `json:"tags"`
	}
	if err := m.do(ctx, http.MethodGet, "users/"+url.PathEscape(name), nil, &raw); err != nil {
		return User{}, err
	}
	return User{Name: raw.Name, Tags: parseTags(raw.Tags)}, nil
}

// ListUsers returns every user of the broker.
func (m *Management) ListUsers(ctx context.Context) ([]User, error) {
	var raw []struct {
		Name string          `json:"name"`
		Tags json.RawMessage `json:"tags"`
	}
	if err := m.do(ctx, http.MethodGet, "users", nil, &raw); err != nil {
		return nil, err
	}
	users := make([]User, 0, len(raw))
	for _, r := range raw {
		users = append(users, User{Name: r.Name, Tags: parseTags(r.Tags)})
	}
	return users, nil
}

// parseTags reads the tags as RabbitMQ 3.9 and later write them (a list)
// or as older ones did (one comma-separated string).
func parseTags(raw json.RawMessage) []string {
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return list
	}
	var s string
	if json.Unmarshal(raw, &s) != nil || s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// PutUser creates the user or sets its password and tags.
func (m *Management) PutUser(ctx context.Context, name, password string, tags []string) error {
	body := map[string]string{"password": password, "tags": strings.Join(tags, ",")}
	return m.do(ctx, http.MethodPut, "users/"+url.PathEscape(name), body, nil)
}

// DeleteUser deletes the user; one that does not exist is ErrNotFound.
func (m *Management) DeleteUser(ctx context.Context, name string) error {
	return m.do(ctx, http.MethodDelete, "users/"+url.PathEscape(name), nil, nil)
}

// PutPermissions sets the user's permissions on vhost.
func (m *Management) PutPermissions(ctx context.Context, vhost, user string, p Permissions) error {
	return m.do(ctx, http.MethodPut, "permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), p, nil)
}

// GetPermissions returns the user's permissions on vhost; ErrNotFound if
// it has none there.
func (m *Management) GetPermissions(ctx context.Context, vhost, user string) (Permissions, error) {
	var p Permissions
	err := m.do(ctx, http.MethodGet, "permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), nil, &p)
	return p, err
}

// do sends one request under /api/ and decodes a JSON answer into out. The
// request's body (which may hold a password) never appears in an error.
func (m *Management) do(ctx context.Context, method, path string, in, out any) error {
	base := strings.TrimRight(m.URL, "/")
	u, err := url.Parse(base + "/api/" + path)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("RabbitMQ management URL %q: want http(s)://host:15672", m.URL)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.Username, m.Password)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := m.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("RabbitMQ management API %s /api/%s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &APIError{Method: method, Path: "/api/" + path, Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("RabbitMQ management API %s /api/%s: read the answer: %w", method, path, err)
	}
	return nil
}
