package lab

import (
	"context"
	"fmt"
	"os"

	"github.com/ms2m/ms2m/internal/brokeruser"
)

// BrokerUserPrefix starts the names of the local cluster's per-namespace
// broker users (ms2m-lab.default), apart from those of tests that share the
// broker.
const BrokerUserPrefix = "ms2m-lab."

// ManagementURL is the broker's management API as the lab reaches it from
// this host, and the administrator hack/setup.sh makes for it
// (MS2M_BROKER_ADMIN_USER and MS2M_BROKER_ADMIN_PASSWORD override them).
const ManagementURL = "http://127.0.0.1:15672"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// ProvisionBrokerUser gives namespace ns of the cluster its own broker user,
// confined to the namespace's replay logs, and the Secret ms2m-broker-user
// the sidecars read, as `migrator broker-users ensure` does (the chart's
// brokerUsers.provision=manual). Idempotent.
func (l *Lab) ProvisionBrokerUser(ctx context.Context, ns, streamAddr string) error {
	addr, err := brokeruser.ParseStreamAddress("rabbitmq-stream://" + streamAddr + "/")
	if err != nil {
		return err
	}
	p := &brokeruser.Provisioner{
		Management: &brokeruser.Management{
			URL:      envOr("MS2M_TEST_MANAGEMENT_URL", ManagementURL),
			Username: envOr("MS2M_BROKER_ADMIN_USER", "ms2m-admin"),
			Password: envOr("MS2M_BROKER_ADMIN_PASSWORD", "ms2m-admin-test"),
		},
		Secrets:    l.Client.CoreV1(),
		Stream:     addr,
		UserPrefix: BrokerUserPrefix,
	}
	if _, err := p.Ensure(ctx, ns); err != nil {
		return fmt.Errorf("the broker user of namespace %s (bash hack/setup.sh enables the management API and makes its administrator): %w", ns, err)
	}
	return nil
}
