package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/lab/journal"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// Consumer describes a sample consumer pod.
type Consumer struct {
	Name   string
	Queue  string
	Node   string
	WorkMS int    // per message; 50 is the paper's μ = 20/s
	Image  string // a key of Lab.Images: "consumer" (Go), "consumer-python" or "consumer-spring"
	// Mutate, if set, changes the pod as its user would write it, before
	// admission: another broker configuration, say.
	Mutate func(*corev1.Pod)
	// ReadOnlyRoot runs the app with a read-only root filesystem
	// (securityContext.readOnlyRootFilesystem), as the sample consumers
	// allow: they write nothing to it. A live checkpoint then thaws the
	// app as soon as CRIU's dump is done (migrate.ThawAuto).
	ReadOnlyRoot bool
	// StateMiB is extra state the Go consumer holds in memory (STATE_MB),
	// for the benchmarks' memory sweep; 0 for none.
	StateMiB int
	// NATSMode is, for the "consumer-nats" image, push or pull: it
	// consumes the durable consumer "worker" of the stream Queue names.
	NATSMode string
}

// AppPort is where the sample consumers serve their state in the pod.
const AppPort = 8080

// Pod returns c's pod as a user would write it, before admission.
func (l *Lab) Pod(c Consumer) (*corev1.Pod, error) {
	if c.Image == "" {
		c.Image = "consumer"
	}
	ref, ok := l.Images[c.Image]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoImage, c.Image)
	}
	grace, root := int64(1), int64(0)
	// CRIU reads the rlimits of what it dumps, which takes the same uid or
	// CAP_SYS_RESOURCE; root on this machine lacks the latter, so the app
	// runs as root here.
	sc := &corev1.SecurityContext{RunAsUser: &root, RunAsGroup: &root}
	if c.ReadOnlyRoot {
		sc.ReadOnlyRootFilesystem = &c.ReadOnlyRoot
	}
	broker := []corev1.EnvVar{{Name: "AMQP_URL", Value: fmt.Sprintf("amqp://%s:%s@%s/", BrokerUser, BrokerPassword, l.BrokerAMQP)}}
	if c.Image == "consumer-spring" { // Spring's own settings, as a Spring service is configured
		broker = []corev1.EnvVar{
			{Name: "SPRING_RABBITMQ_ADDRESSES", Value: l.BrokerAMQP},
			{Name: "SPRING_RABBITMQ_USERNAME", Value: BrokerUser},
			{Name: "SPRING_RABBITMQ_PASSWORD", Value: BrokerPassword},
		}
	}
	var extra []corev1.EnvVar
	if c.Image == "consumer-nats" {
		broker = []corev1.EnvVar{{Name: "NATS_URL", Value: "nats://" + l.NATSAddr}}
		extra = []corev1.EnvVar{{Name: "STREAM", Value: c.Queue}, {Name: "CONSUMER", Value: "worker"}, {Name: "MODE", Value: c.NATSMode}, {Name: "PREFETCH", Value: "10"}}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: Namespace, Labels: map[string]string{"app": c.Name},
			Annotations: map[string]string{contract.AnnotationInject: "true"}},
		Spec: corev1.PodSpec{
			NodeName:                      c.Node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "app",
				Image:           ref,
				SecurityContext: sc,
				Env: append(broker,
					append(extra,
						corev1.EnvVar{Name: "QUEUE", Value: c.Queue},
						corev1.EnvVar{Name: "WORK_MS", Value: fmt.Sprint(c.WorkMS)},
						corev1.EnvVar{Name: "HTTP_ADDR", Value: fmt.Sprintf("0.0.0.0:%d", AppPort)})...,
				),
				Resources: stateResources(c.StateMiB),
			}},
		},
	}
	if c.StateMiB > 0 {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "STATE_MB", Value: strconv.Itoa(c.StateMiB)})
	}
	if c.Mutate != nil {
		c.Mutate(p)
	}
	return p, nil
}

// stateResources asks the scheduler for room for mib MiB of extra state
// (and a margin for the rest of the consumer), so that a node too small for
// it is found at scheduling, not by the kernel's OOM killer mid-restore.
func stateResources(mib int) corev1.ResourceRequirements {
	if mib == 0 {
		return corev1.ResourceRequirements{}
	}
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceMemory: *resource.NewQuantity(int64(mib+64)<<20, resource.BinarySI),
	}}
}

// StartConsumer admits and creates c's pod, and waits until it runs.
func (l *Lab) StartConsumer(ctx context.Context, c Consumer) (*corev1.Pod, error) {
	p, err := l.Pod(c)
	if err != nil {
		return nil, err
	}
	admitted := p
	if !l.WebhookRunning() { // else the webhook injects it
		if admitted, err = l.Admit(p); err != nil {
			return nil, fmt.Errorf("inject: %w", err)
		}
	}
	if err := l.DeletePods(ctx, c.Name); err != nil {
		return nil, err
	}
	if _, err := l.Client.CoreV1().Pods(Namespace).Create(ctx, admitted, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return migrate.WaitRunning(ctx, l.Client, Namespace, c.Name, 2*time.Minute)
}

// DeletePods deletes the named pods at once and waits until they are gone.
func (l *Lab) DeletePods(ctx context.Context, names ...string) error {
	zero := int64(0)
	for _, n := range names {
		if err := l.Client.CoreV1().Pods(Namespace).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", n, err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		left := 0
		for _, n := range names {
			if _, err := l.Client.CoreV1().Pods(Namespace).Get(ctx, n, metav1.GetOptions{}); err == nil {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of pods %v still there after a minute", left, names)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// AppState is the sample consumer's GET /state.
type AppState struct {
	Count        int     `json:"count"`
	Hash         string  `json:"hash"`
	Last         string  `json:"last"`
	Connected    bool    `json:"connected"`
	Reconnects   int     `json:"reconnects"`
	MaxLatencyMS float64 `json:"max_latency_ms"`
	Skipped      int     `json:"skipped_redeliveries"`
}

// GetAppState reads the state of the consumer in pod.
func GetAppState(pod *corev1.Pod) (AppState, error) { return GetAppStateOn(pod, AppPort) }

// GetAppStateOn reads the state of the consumer in pod that serves it on
// port (a second consumer in the pod serves on another).
func GetAppStateOn(pod *corev1.Pod, port int) (AppState, error) {
	var st AppState
	// No keep-alive: an idle connection into the pod would be one more TCP
	// socket for CRIU to deal with at a checkpoint.
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://%s:%d/state", pod.Status.PodIP, port))
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Producer is the sample producer running on the host.
type Producer struct {
	cmd         *exec.Cmd
	out, errOut bytes.Buffer
	done        chan error
	Want        ProducerResult
	finished    bool
}

// ProducerResult is the producer's last line: what it sent.
type ProducerResult struct {
	Count int    `json:"count"`
	Hash  string `json:"hash"`
}

// StartProducer runs the sample producer binary bin on the host against
// the broker's loopback address: n messages to queue at rate per second.
func StartProducer(bin, queue string, rate float64, n int) (*Producer, error) {
	return StartProducerFrom(bin, queue, rate, 1, n)
}

// StartProducerFrom is StartProducer whose first message is msg-first. Its
// result's hash is of its own messages only; PrefixHash is that of
// msg-1..msg-n.
func StartProducerFrom(bin, queue string, rate float64, first, n int) (*Producer, error) {
	p := &Producer{done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "-queue", queue, "-rate", fmt.Sprint(rate), "-start", fmt.Sprint(first), "-count", fmt.Sprint(n))
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errOut
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p, nil
}

// Wait waits for the producer to finish and returns what it sent.
func (p *Producer) Wait(ctx context.Context) (ProducerResult, error) {
	if p.finished {
		return p.Want, nil
	}
	select {
	case err := <-p.done:
		p.finished = true
		if err != nil {
			return ProducerResult{}, fmt.Errorf("producer: %v\n%s", err, p.errOut.String())
		}
	case <-ctx.Done():
		return ProducerResult{}, fmt.Errorf("the producer did not finish: %w", ctx.Err())
	}
	if err := json.Unmarshal(p.out.Bytes(), &p.Want); err != nil {
		return ProducerResult{}, fmt.Errorf("producer output %q: %w", p.out.String(), err)
	}
	return p.Want, nil
}

// Stop kills the producer if it still runs.
func (p *Producer) Stop() {
	if !p.finished && p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
	}
}

// WaitFor polls the consumer in pod until it has folded want.Count
// messages ending with the last one, or timeout passes, and returns its
// last state.
func WaitFor(pod *corev1.Pod, want ProducerResult, timeout time.Duration) AppState {
	return WaitForOn(pod, AppPort, want, timeout)
}

// WaitForOn is WaitFor for the consumer in pod that serves its state on
// port.
func WaitForOn(pod *corev1.Pod, port int, want ProducerResult, timeout time.Duration) AppState {
	var got AppState
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if st, err := GetAppStateOn(pod, port); err == nil {
			got = st
			if st.Count >= want.Count && st.Last == fmt.Sprintf("msg-%d", want.Count) {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return got
}

// Fold is one entry of the sample Go consumer's GET /folds: a folded
// message's id, its latency from the producer's send, and when it was sent
// and folded.
type Fold = journal.Fold

// GetFolds reads the journal of the Go consumer in pod, oldest first, and
// how many older folds it dropped.
func GetFolds(pod *corev1.Pod) ([]Fold, int, error) {
	var body struct {
		Folds   []Fold `json:"folds"`
		Dropped int    `json:"dropped"`
	}
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://%s:%d/folds", pod.Status.PodIP, AppPort))
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("GET /folds of pod %s: %s", pod.Name, resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	return body.Folds, body.Dropped, err
}
