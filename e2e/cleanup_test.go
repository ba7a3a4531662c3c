package e2e

import "testing"

// logCleanup logs a cleanup step that failed: it changes nothing the test
// asserts, but a pod or stream left behind is worth a line in the log.
func logCleanup(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Logf("cleanup: %s: %v", what, err)
	}
}
