package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/webhook"
)

const (
	// WebhookConfigName is the MutatingWebhookConfiguration the lab
	// registers for its webhook.
	WebhookConfigName = "ms2m-lab-webhook"
	// WebhookPort is the port the lab's webhook prefers; another free one
	// is taken if it is busy.
	WebhookPort = 9443
	// webhookPIDAnnotation on the registration records the webhook
	// process's pid, so that a later lab can tell a registration whose
	// webhook is gone (its test binary was killed) from a live one.
	webhookPIDAnnotation = "lab.ms2m.io/webhook-pid"
)

// Webhook is the admission webhook binary (cmd/webhook) running on the
// host for the lab, and its registration.
//
// It runs with the self-signed bootstrap: at start it makes a CA and a
// serving certificate for HostIP and sets the caBundle of the lab's
// registration itself. That is the path a first installation takes (no
// cert-manager), and the one with moving parts that only a real API server
// exercises: patching a registration it does not own, and /readyz waiting
// for that patch.
type Webhook struct {
	// URL is what the API server calls.
	URL string
	// HealthAddr serves /healthz and /readyz, MetricsAddr /metrics, both
	// on loopback.
	HealthAddr, MetricsAddr string
	// Dir holds the binary and the certificates; LogFile the process's
	// JSON log.
	Dir, LogFile string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done is closed
}

// PID is the webhook process's id.
func (w *Webhook) PID() int { return w.cmd.Process.Pid }

// WebhookRunning reports whether the lab's webhook runs, or the lab is on
// an external cluster with ms2m installed, or InstallChart or Install
// installed it: then the webhook, not Admit, injects pods and turns
// migration targets into restores.
func (l *Lab) WebhookRunning() bool {
	if l.External || l.chart || l.installed {
		return true
	}
	if l.webhook == nil {
		return false
	}
	select {
	case <-l.webhook.done:
		return false
	default:
		return true
	}
}

// StartWebhook builds cmd/webhook, runs it on the host and registers it
// with the API server by URL, then waits until the webhook reports ready
// (its certificate made, the caBundle set, the namespace cache synced). It
// injects what Admit injects: the sidecar image and the Secret keys of
// l.Inject; the sidecar's resources and log retention are the webhook's
// defaults. StopWebhook, or Down, stops it and removes the registration.
func (l *Lab) StartWebhook(ctx context.Context) (*Webhook, error) {
	if l.WebhookRunning() {
		return l.webhook, nil
	}
	if err := l.dropStaleWebhook(ctx); err != nil {
		return nil, err
	}
	w := &Webhook{
		Dir:     filepath.Join(l.Cluster.StateDir(), "webhook"),
		LogFile: filepath.Join(l.Cluster.StateDir(), "logs", "webhook.log"),
		done:    make(chan struct{}),
	}
	port, err := webhookPort()
	if err != nil {
		return nil, err
	}
	if w.HealthAddr, err = freeLoopbackAddr(); err != nil {
		return nil, err
	}
	if w.MetricsAddr, err = freeLoopbackAddr(); err != nil {
		return nil, err
	}
	bin, env, err := l.prepareWebhook(ctx, w, WebhookConfigName, port)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !l.WebhookRunning() {
			if err := l.deleteWebhookConfig(WebhookConfigName); err != nil {
				fmt.Fprintf(l.log, "lab: %v\n", err)
			}
		}
	}()

	if err := os.MkdirAll(filepath.Dir(w.LogFile), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(w.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "---- lab: webhook starting at %s, %s\n", time.Now().UTC().Format(time.RFC3339), w.URL)
	w.cmd = exec.Command(bin)
	w.cmd.Env = env
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	// The webhook dies with the test binary that started it, so that a
	// killed test leaves no webhook behind (its registration is removed by
	// the next lab's Start, see dropStaleWebhook). The kernel sends the
	// signal when the thread that started the child exits, not the
	// process, so the goroutine that starts it keeps its thread until the
	// child is gone.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := w.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	l.webhook = w

	if err := l.setWebhookPID(ctx, w.PID()); err != nil {
		return nil, errors.Join(err, l.StopWebhook())
	}
	if err := w.waitReady(ctx, 2*time.Minute); err != nil {
		return nil, errors.Join(err, l.StopWebhook())
	}
	fmt.Fprintf(l.log, "lab: webhook pid %d ready at %s (log %s)\n", w.PID(), w.URL, w.LogFile)
	return w, nil
}

// prepareWebhook builds cmd/webhook into w.Dir, sets w.URL for port, and
// registers it as the MutatingWebhookConfiguration name (replacing an old
// one); it returns the binary and the webhook's whole environment, which
// configures it to inject what l.Inject says, serve w's health and metrics
// addresses, and bootstrap its own certificate.
//
// The registration comes first, without a caBundle, so that the webhook's
// first attempt to set it succeeds. Until then the API server cannot call
// it and, with failurePolicy Fail, refuses pods in the selected
// namespaces: that lasts until the webhook is ready, and its starters do
// not return before.
func (l *Lab) prepareWebhook(ctx context.Context, w *Webhook, name string, port int) (string, []string, error) {
	bin := filepath.Join(w.Dir, "ms2m-webhook")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/webhook")
	build.Dir = l.Opts.RepoDir
	if out, err := build.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("build cmd/webhook: %v\n%s", err, out)
	}
	w.URL = "https://" + net.JoinHostPort(cluster.HostIP, strconv.Itoa(port)) + webhook.Path
	env, err := webhookEnv(l.Inject)
	if err != nil {
		return "", nil, err
	}
	env = append(env,
		// Only what the webhook needs: none of the caller's MS2M_WEBHOOK_*
		// or proxy settings leak in.
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"KUBECONFIG="+l.Cluster.Kubeconfig(),
		"MS2M_WEBHOOK_PORT="+strconv.Itoa(port),
		"MS2M_WEBHOOK_CERT_DIR="+filepath.Join(w.Dir, "certs"),
		"MS2M_WEBHOOK_HEALTH_ADDR="+w.HealthAddr,
		"MS2M_WEBHOOK_METRICS_ADDR="+w.MetricsAddr,
		"MS2M_WEBHOOK_SELF_SIGNED=true",
		// No Service fronts it; the certificate's name that matters is
		// the address the registration's URL uses.
		"MS2M_WEBHOOK_SERVICE_NAMESPACE=ms2m-system",
		"MS2M_WEBHOOK_CERT_HOSTS="+cluster.HostIP,
		"MS2M_WEBHOOK_CONFIG_NAME="+name,
		"MS2M_WEBHOOK_LOG_LEVEL=debug",
	)
	mwc := webhookConfiguration(name, w.URL)
	mwcs := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if err := mwcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return "", nil, fmt.Errorf("delete the old MutatingWebhookConfiguration %s: %w", name, err)
	}
	if _, err := mwcs.Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		return "", nil, fmt.Errorf("register the webhook (MutatingWebhookConfiguration %s): %w", name, err)
	}
	return bin, env, nil
}

// StopWebhook removes the registration, then stops the webhook (SIGTERM,
// SIGKILL after 10 s). It does nothing when no webhook was started.
func (l *Lab) StopWebhook() error {
	w := l.webhook
	if w == nil {
		return nil
	}
	l.webhook = nil
	// The registration goes first: with failurePolicy Fail, a registered
	// webhook that does not answer would refuse every pod.
	err := l.deleteWebhookConfig(WebhookConfigName)
	_ = w.cmd.Process.Signal(syscall.SIGTERM) // fails only if it has exited: w.done is closed then
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
		err = errors.Join(err, fmt.Errorf("the webhook (pid %d) did not stop within 10s of SIGTERM and was killed; see %s", w.PID(), w.LogFile))
	}
	return err
}

func (l *Lab) deleteWebhookConfig(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the MutatingWebhookConfiguration %s: %w; delete it by hand, or no pod can be created in the cluster's namespaces", name, err)
	}
	return nil
}

func (l *Lab) setWebhookPID(ctx context.Context, pid int) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, webhookPIDAnnotation, strconv.Itoa(pid))
	_, err := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, WebhookConfigName, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("record the webhook's pid on MutatingWebhookConfiguration %s: %w", WebhookConfigName, err)
	}
	return nil
}

// dropStaleWebhook deletes a registration of the lab's webhook whose
// process is gone: a test binary that was killed leaves one behind in a
// cluster that stays up, and with failurePolicy Fail it would refuse every
// pod. A registration whose webhook still runs, started by another
// process, is an error: two labs would fight over it.
func (l *Lab) dropStaleWebhook(ctx context.Context) error {
	mwc, err := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, WebhookConfigName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for a MutatingWebhookConfiguration %s left behind: %w", WebhookConfigName, err)
	}
	if pid, err := strconv.Atoi(mwc.Annotations[webhookPIDAnnotation]); err == nil && (l.webhook == nil || l.webhook.PID() != pid) {
		bin := filepath.Join(l.Cluster.StateDir(), "webhook", "ms2m-webhook")
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.SplitN(string(b), "\x00", 2)[0] == bin {
			return fmt.Errorf("the lab's webhook already runs as pid %d, started by another process (MutatingWebhookConfiguration %s); stop that test first", pid, WebhookConfigName)
		}
	}
	fmt.Fprintf(l.log, "lab: removing MutatingWebhookConfiguration %s, left behind by a webhook that is gone\n", WebhookConfigName)
	return l.deleteWebhookConfig(WebhookConfigName)
}

// waitReady polls /readyz until it answers 200, the process exits, or
// timeout passes.
func (w *Webhook) waitReady(ctx context.Context, timeout time.Duration) error {
	return waitHTTP(ctx, "the webhook", "http://"+w.HealthAddr+"/readyz", timeout, w.LogFile, func() (bool, string) {
		select {
		case <-w.done:
			return true, fmt.Sprint(w.err)
		default:
			return false, ""
		}
	})
}

// waitHTTP polls url until it answers 200, exited reports the process gone
// (and how it ended), or timeout passes; its errors quote the end of log.
func waitHTTP(ctx context.Context, what, url string, timeout time.Duration, log string, exited func() (bool, string)) error {
	return waitHTTPWith(ctx, &http.Client{Timeout: 2 * time.Second}, what, url, timeout, log, exited)
}

// waitHTTPWith is waitHTTP with client c.
func waitHTTPWith(ctx context.Context, c *http.Client, what, url string, timeout time.Duration, log string, exited func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	var last string // what the last try got
	for {
		resp, err := c.Get(url)
		if err == nil {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b[:n])))
		} else {
			last = err.Error()
		}
		if gone, how := exited(); gone {
			return fmt.Errorf("%s exited before it was ready (%s); the end of its log, %s:\n%s", what, how, log, tail(log, 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is not ready (%s: %s): %w; see %s", what, url, last, ctx.Err(), log)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not ready after %s (%s: %s); the end of its log, %s:\n%s", what, timeout, url, last, log, tail(log, 20))
		}
	}
}

// webhookEnv is the webhook's configuration (docs/webhook.md) for
// injecting what ic says. Fields ic leaves zero take the webhook's
// defaults; for the ports and the user those equal inject's own, for the
// sidecar's resources and the log retention they add limits that inject
// leaves out.
func webhookEnv(ic inject.Config) ([]string, error) {
	if err := ic.Validate(); err != nil {
		return nil, err
	}
	env := []string{
		"MS2M_WEBHOOK_SIDECAR_IMAGE=" + ic.SidecarImage,
		"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET=" + ic.ControlToken.Name,
		"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET_KEY=" + ic.ControlToken.Key,
	}
	if ic.BrokerUsers {
		env = append(env, "MS2M_WEBHOOK_BROKER_USERS=true")
	} else {
		env = append(env, "MS2M_WEBHOOK_STREAM_URI_SECRET="+ic.StreamURI.Name, "MS2M_WEBHOOK_STREAM_URI_SECRET_KEY="+ic.StreamURI.Key)
	}
	set := func(name string, v string, ok bool) {
		if ok {
			env = append(env, name+"="+v)
		}
	}
	set("MS2M_WEBHOOK_SIGNING_KEY", string(ic.RestoreKey), len(ic.RestoreKey) > 0)
	set("MS2M_WEBHOOK_NATS_URL_SECRET", ic.NATSURL.Name, ic.NATSURL.Name != "")
	set("MS2M_WEBHOOK_NATS_URL_SECRET_KEY", ic.NATSURL.Key, ic.NATSURL.Key != "")
	set("MS2M_WEBHOOK_CHECKPOINT_REPOSITORY", ic.CheckpointRepository, ic.CheckpointRepository != "")
	set("MS2M_WEBHOOK_SIDECAR_PULL_POLICY", string(ic.ImagePullPolicy), ic.ImagePullPolicy != "")
	set("MS2M_WEBHOOK_SIDECAR_LISTEN_PORT", strconv.Itoa(int(ic.ListenPort)), ic.ListenPort != 0)
	set("MS2M_WEBHOOK_SIDECAR_CONTROL_PORT", strconv.Itoa(int(ic.ControlPort)), ic.ControlPort != 0)
	set("MS2M_WEBHOOK_SIDECAR_RUN_AS_USER", strconv.FormatInt(ic.RunAsUser, 10), ic.RunAsUser != 0)
	set("MS2M_WEBHOOK_LOG_MAX_AGE", ic.LogMaxAge, ic.LogMaxAge != "")
	set("MS2M_WEBHOOK_LOG_MAX_BYTES", strconv.FormatInt(ic.LogMaxBytes, 10), ic.LogMaxBytes != 0)
	for _, r := range []struct {
		name string
		list corev1.ResourceList
		res  corev1.ResourceName
	}{
		{"MS2M_WEBHOOK_SIDECAR_CPU_REQUEST", ic.Resources.Requests, corev1.ResourceCPU},
		{"MS2M_WEBHOOK_SIDECAR_MEMORY_REQUEST", ic.Resources.Requests, corev1.ResourceMemory},
		{"MS2M_WEBHOOK_SIDECAR_CPU_LIMIT", ic.Resources.Limits, corev1.ResourceCPU},
		{"MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT", ic.Resources.Limits, corev1.ResourceMemory},
	} {
		q, ok := r.list[r.res]
		set(r.name, q.String(), ok)
	}
	return env, nil
}

// webhookConfiguration registers the webhook at url as the chart does
// (webhook.Registration), by URL instead of by Service: every namespace but
// the system's, Fail only for pods that opted in by a label. The caBundle
// is left to the webhook's self-signed bootstrap.
func webhookConfiguration(name, url string) *admissionregistrationv1.MutatingWebhookConfiguration {
	return webhook.Registration{
		Name:              name,
		ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: &url},
		ExcludeNamespaces: []string{"ms2m-system", "kube-system"},
	}.Configuration()
}

// webhookPort is WebhookPort if it is free on every address (the webhook
// listens on all of them), else a port the kernel picks.
func webhookPort() (int, error) {
	for _, addr := range []string{":" + strconv.Itoa(WebhookPort), ":0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		return port, nil
	}
	return 0, errors.New("no free TCP port for the webhook")
}

func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(b), n)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
