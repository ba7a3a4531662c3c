// Package pullsecret finds the credentials for one image among a pod's
// imagePullSecrets, the way the kubelet would pull it: the Secrets the pod
// names (kubernetes.io/dockerconfigjson or the older kubernetes.io/dockercfg),
// in the pod's namespace and no other, their keys matched against the
// image's registry and repository. The migrator sends what it finds to the
// target node's agent for the pre-pull of the app's image, so that the
// agent never reads a Secret itself. Nothing here logs or quotes a
// credential, nor a Secret's content in an error.
package pullsecret
