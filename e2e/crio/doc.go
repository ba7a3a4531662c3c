// Package crio checks that CRI-O, the second runtime a real node is meant
// to run (issue 22), checkpoints and restores a container the way ms2m
// needs: a CRI-O v1.34.0 from bin/crio (make crio-bin) with Debian's conmon
// and runc and CRIU from bin/criu, driven over its CRI socket, restores a
// container in CreateContainer from a checkpoint image that
// internal/ociimage built and pushed to an in-process registry, with the
// crio.conf the local cluster's CRI-O nodes run (cluster.CRIOConfig). It
// runs with MS2M_E2E_CRIO=1 or CI=true (make test), under the real-node lock;
// docs/local-cluster.md lists the settings found here.
package crio
