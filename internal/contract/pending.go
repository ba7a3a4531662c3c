package contract

// The pending-migration record. For the StatefulSet strategies the migrator
// does not create the target pod: it deletes the source, and the StatefulSet
// controller creates a pod of the same name. Before it deletes the source,
// the migrator writes a ConfigMap named PendingConfigMapName(<pod name>) in
// the pod's namespace, labelled LabelMigration, whose data key
// PendingConfigMapKey holds the JSON of an inject.Migration. When a pod
// owned by a StatefulSet is created, the webhook reads that ConfigMap and,
// if it exists, turns the pod into a restore. The webhook never writes or
// deletes it: the migrator deletes it once the restored pod runs, so that a
// later re-creation of the pod does not start from an old checkpoint.
const (
	PendingConfigMapPrefix = "ms2m-migration-"
	PendingConfigMapKey    = "migration"
)

// PendingConfigMapName is the name of the pending-migration ConfigMap for
// the pod named pod.
func PendingConfigMapName(pod string) string { return PendingConfigMapPrefix + pod }
