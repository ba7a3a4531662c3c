// Package charttest tests the Helm chart in charts/ms2m. It has no code of
// its own, only tests:
//
//   - the chart rendered with the Helm Go SDK for its main value
//     combinations, with what each object must say checked field by field,
//     and the custom resources (cert-manager, Prometheus Operator) decoded
//     strictly into their projects' Go types;
//   - the helm command line built from this module (`make helm-bin`):
//     lint, template, and bad values files that the schema must refuse
//     with a message naming the field;
//   - every rendered object applied to a real kube-apiserver (envtest,
//     `make k8s-bin`) by server-side apply with strict field validation,
//     a real `helm install` and `helm upgrade` there, the RBAC checked
//     both ways with SubjectAccessReviews, and the real webhook binary run
//     with the chart's configuration and identity, injecting a pod.
//
// `make chart-test` runs it. It lives in the hack/helm tools module so that
// the product's go.mod does not carry Helm.
package charttest
