package sidecar_test

import (
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/testenv"
)

// TestBrokerCloseWhileTheAppHoldsADelivery: as
// TestBrokerLossWhileTheAppHoldsADelivery, but the broker closes the
// connection itself (an operator closes it in the management API:
// connection.close 320 CONNECTION_FORCED, as a graceful broker shutdown
// sends) while the app works on a delivery. The sidecar answers the close,
// keeps the app's connection until it acked the delivery, then passes the
// close on; the app reconnects and the broker's redelivery is absorbed:
// each message folded once, the producer's hash. Before, the close went to
// the app at once, its ack failed and it folded the redelivery too (13 of
// 12).
func TestBrokerCloseWhileTheAppHoldsADelivery(t *testing.T) {
	mgmt := testenv.RequireManagement(t)
	cutWhileTheAppHoldsADelivery(t, "ms2m-test-brokerclose", func(name string) func() {
		var upstream []string
		testenv.Eventually(t, 30*time.Second, "the management API to list the sidecar's connection for the app", func() bool {
			var err error
			upstream, err = mgmt.ConnectionsNamed(name)
			return err == nil && len(upstream) == 1
		})
		return func() {
			if err := mgmt.CloseConnection(upstream[0], "ms2m test: closed while the app holds a delivery"); err != nil {
				t.Fatal(err)
			}
		}
	})
}
