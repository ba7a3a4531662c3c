// Package contract is what the webhook, the migrator's controller, the
// migrator itself and the tools around them agree on, declared once: every
// annotation and label key under ms2m.io/ (keys.go), the strategies and
// ms2m-cutoff's stop rules with their parse functions (strategy.go), the
// phases a requested migration goes through (phase.go), the reasons of
// the Events they emit (reasons.go), and the naming of the
// pending-migration ConfigMap that a StatefulSet strategy leaves for the
// webhook (pending.go), and what a node agent reports that its node can do
// (node.go).
//
// It holds names and their checks only: no I/O, no Kubernetes client, and
// it imports no other ms2m package, so that every one of them can import
// it. docs/webhook.md and docs/usage.md list the same keys, strategies
// and reasons; TestDocsMatchContract fails when they drift apart.
package contract
