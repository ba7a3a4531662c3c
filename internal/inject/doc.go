// Package inject is the webhook's mutation logic, pure: a pod, its
// namespace's labels, any pending migration and the webhook's Config go in;
// a mutated copy of the pod, or the reasons it was left alone, come out. It
// does no I/O, so every case is a golden-file test.
//
// It adds the ms2m sidecar as a native sidecar (an init container with
// restartPolicy Always), points the app's broker settings at it, and — for
// a pod that is the target of a migration — turns the pod into a restore:
// the app's image becomes the checkpoint image, the pod is pinned to the
// target node, and the sidecar replays the source's log.
//
// # How Inject decides
//
// In this order; the first step that ends it wins:
//
//  1. ms2m.io/inject must be "true" or "false" if present, else deny.
//  2. A pod with the ms2m-sidecar init container and the ms2m.io/status
//     annotation is left alone as "already injected" (unless it asks to be
//     the restore target of a migration its status does not record: see
//     below).
//  3. A pod opts in with ms2m.io/inject: "true", or by living in a
//     namespace labelled ms2m.io/inject=enabled without saying "false".
//     A restore target (restore annotations, or a pending migration) is
//     injected whether it opted in or not. Otherwise it is left alone as
//     "not opted in: …".
//  4. A container of the sidecar's name that ms2m did not inject: deny.
//  5. Every ms2m.io/ annotation's value is checked: any bad one denies,
//     with a message naming the annotation, the value and what is allowed.
//     Unknown keys under ms2m.io/ only warn.
//  6. Restore: ms2m.io/restore-image requires the other restore
//     annotations (else deny); without it, a pending migration is used.
//  7. The pod must be able to host the sidecar (no hostNetwork, Linux, no
//     container declaring the sidecar's ports), and the app container's
//     broker settings must be rewritable, all pointing at one broker.
//     Otherwise the pod is left alone with the reasons — or, for a restore
//     target, denied: a restore must never start without its replay.
//
// # Broker settings
//
// The app container (ms2m.io/container, else the first) has its literal
// env vars AMQP_URL, RABBITMQ_URL (amqp:// URLs), SPRING_RABBITMQ_HOST with
// SPRING_RABBITMQ_PORT, SPRING_RABBITMQ_ADDRESSES, and those named in
// ms2m.io/broker-env (URL or host:port) pointed at 127.0.0.1:ListenPort.
// Only the host and port change; user, password, vhost and query stay as
// written. The original broker becomes the sidecar's MS2M_UPSTREAM. A var
// that cannot be rewritten (valueFrom, amqps://, malformed, localhost) is
// listed in Result.Skipped and the rest is still injected; if none can be,
// the pod is left alone. A container that sets none of them but NATS_URL or
// NATS_SERVERS speaks NATS: its first server is pointed at
// 127.0.0.1:NATSListenPort and the sidecar runs with MS2M_BROKER=nats
// (only when Config.NATSURL names the replay log's server). Passwords appear as xxxxx in everything this
// package writes or says.
//
// # Restores
//
// The migrator marks a target pod with ms2m.io/restore-image,
// restore-node, replay-start, replay-cutoff, log-name and migration; a
// StatefulSet's recreated pod instead gets a pending Migration (the pod's
// annotations win if it has both). The app's image becomes the checkpoint
// image, spec.nodeName the target node, and the sidecar gets
// MS2M_REPLAY_START, MS2M_REPLAY_CUTOFF and the source's MS2M_LOG_NAME.
// Status.Restore records the migration, so a second pass is "already
// injected". A copy of an already injected pod that asks for a different
// migration gets only the restore applied to its existing sidecar.
//
// # Tests
//
// testdata/<case>.yaml holds an Input (namespaceLabels, pending, pod);
// testdata/<case>.golden.yaml the Result or the denial. Regenerate the
// goldens with go test ./internal/inject -update.
package inject
