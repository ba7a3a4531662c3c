package inject

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// envGoDebug is the Go runtime's settings variable.
const envGoDebug = "GODEBUG"

// mptcpOff is the GODEBUG setting that makes Go listen on plain TCP.
const mptcpOff = "multipathtcp=0"

// checkpointable makes the app's sockets ones CRIU can checkpoint. Go 1.24
// and later listen on Multipath TCP by default where the kernel has it, and
// CRIU cannot dump an MPTCP socket ("Unsupported proto 262"), so a Go app
// with an HTTP server could never be checkpointed. GODEBUG=multipathtcp=0
// turns that off; other runtimes ignore the variable. It returns the line
// for the status, or a skip reason when GODEBUG cannot be changed.
func checkpointable(app *corev1.Container) (rewritten, skipped string) {
	for i, e := range app.Env {
		if e.Name != envGoDebug {
			continue
		}
		if e.ValueFrom != nil {
			return "", fmt.Sprintf("%s: comes from a reference, left alone; if the app is a Go program (1.24 or later), add %s to it, or CRIU cannot checkpoint its listening sockets", envGoDebug, mptcpOff)
		}
		for _, kv := range strings.Split(e.Value, ",") {
			if strings.HasPrefix(strings.TrimSpace(kv), "multipathtcp=") {
				return "", "" // the app chose; leave it
			}
		}
		old := e.Value
		if old == "" {
			app.Env[i].Value = mptcpOff
		} else {
			app.Env[i].Value = old + "," + mptcpOff
		}
		return fmt.Sprintf("%s: %s → %s (CRIU cannot checkpoint the Multipath TCP sockets Go listens on by default)", envGoDebug, orUnset(old), app.Env[i].Value), ""
	}
	app.Env = append(app.Env, corev1.EnvVar{Name: envGoDebug, Value: mptcpOff})
	return fmt.Sprintf("%s: (unset) → %s (CRIU cannot checkpoint the Multipath TCP sockets Go listens on by default)", envGoDebug, mptcpOff), ""
}
