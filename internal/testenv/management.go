package testenv

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// Management is RabbitMQ's HTTP management API and the administrator that
// hack/setup.sh made for it.
type Management struct {
	URL      string // http://127.0.0.1:15672
	Username string // ms2m-admin
	Password string
}

// RequireManagement returns the broker's management API, after checking
// that it answers to the administrator. MS2M_TEST_MANAGEMENT_URL,
// MS2M_BROKER_ADMIN_USER and MS2M_BROKER_ADMIN_PASSWORD override the
// defaults (those of hack/setup.sh).
func RequireManagement(t testing.TB) Management {
	t.Helper()
	Watchdog(t)
	m := Management{
		URL:      envOr("MS2M_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672"),
		Username: envOr("MS2M_BROKER_ADMIN_USER", "ms2m-admin"),
		Password: envOr("MS2M_BROKER_ADMIN_PASSWORD", "ms2m-admin-test"),
	}
	const how = "run `make test` or `bash hack/setup.sh` (it enables rabbitmq_management on the running broker and makes the administrator)"
	req, err := http.NewRequest(http.MethodGet, m.URL+"/api/whoami", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(m.Username, m.Password)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		Missing(t, "RabbitMQ's management API at "+m.URL+" ("+err.Error()+")", how)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		Missing(t, "the broker administrator "+m.Username+" (management API answers "+resp.Status+")", how)
	}
	return m
}

// TransactedConsumers returns, for each consumer of queue (vhost "/"), whether
// its channel is in transaction mode (tx.select), as the broker's
// management API shows it. Its statistics lag by up to the broker's
// collection interval (5 s by default): poll.
func (m Management) TransactedConsumers(queue string) ([]bool, error) {
	var q struct {
		Consumers []struct {
			Channel struct {
				Name string `json:"name"`
			} `json:"channel_details"`
		} `json:"consumer_details"`
	}
	if err := m.get("/api/queues/%2F/"+url.PathEscape(queue), &q); err != nil {
		return nil, err
	}
	var out []bool
	for _, c := range q.Consumers {
		var ch struct {
			Transactional bool `json:"transactional"`
		}
		if err := m.get("/api/channels/"+url.PathEscape(c.Channel.Name), &ch); err != nil {
			return nil, err
		}
		out = append(out, ch.Transactional)
	}
	return out, nil
}

// get decodes the JSON of the API's path into v.
func (m Management) get(path string, v any) error {
	req, err := http.NewRequest(http.MethodGet, m.URL+path, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.Username, m.Password)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// ExpectTransacted fails t unless, within 30 s, queue has one consumer on
// the broker and its channel is in transaction mode (tx.select), as the
// management API shows it.
func ExpectTransacted(t testing.TB, queue string) {
	t.Helper()
	m := RequireManagement(t)
	Eventually(t, 30*time.Second, "queue "+queue+"'s one consumer on a transacted channel (management API)", func() bool {
		got, err := m.TransactedConsumers(queue)
		return err == nil && len(got) == 1 && got[0]
	})
}

// ConnectionsNamed returns the broker's names of its AMQP connections
// (vhost "/" or any) whose client-provided name is clientName, as the
// management API lists them. A new connection shows after a moment: poll.
func (m Management) ConnectionsNamed(clientName string) ([]string, error) {
	var conns []struct {
		Name   string `json:"name"`
		Client struct {
			Name string `json:"connection_name"`
		} `json:"client_properties"`
	}
	if err := m.get("/api/connections?columns=name,client_properties", &conns); err != nil {
		return nil, err
	}
	var out []string
	for _, c := range conns {
		if c.Client.Name == clientName {
			out = append(out, c.Name)
		}
	}
	return out, nil
}

// CloseConnection has the broker close its connection name (as
// ConnectionsNamed gives it) with connection.close 320 CONNECTION_FORCED,
// as an operator does from the management UI.
func (m Management) CloseConnection(name, reason string) error {
	req, err := http.NewRequest(http.MethodDelete, m.URL+"/api/connections/"+url.PathEscape(name), nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.Username, m.Password)
	req.Header.Set("X-Reason", reason)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("DELETE /api/connections/%s: %s", name, resp.Status)
	}
	return nil
}
