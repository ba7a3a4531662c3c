package inject

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// springConfigNames are the files Spring Boot reads from a config folder.
var springConfigNames = []string{"application.properties", "application.yml", "application.yaml"}

// envSpringConfigLocations are the vars that point Spring at more config.
var envSpringConfigLocations = []string{"SPRING_CONFIG_LOCATION", "SPRING_CONFIG_ADDITIONAL_LOCATION"}

// fromAppSettings is the fallback for an app that sets no broker var in
// env: its broker is in envFrom sources or a mounted Spring configuration
// file, which the webhook cannot read. The sidecar gets the same sources
// (envFrom under the MS2M_APP_ prefix, the same volume mounted read-only)
// and resolves the broker itself (MS2M_UPSTREAM empty); the app gets env
// vars that point it at the sidecar with placeholder credentials, which
// beat envFrom in Kubernetes and config files in Spring. ok is false when
// the app has neither.
func fromAppSettings(pod *corev1.Pod, app *corev1.Container, listenPort int32) (r brokerRewrite, ok bool) {
	for _, ef := range app.EnvFrom {
		if ef.SecretRef == nil && ef.ConfigMapRef == nil {
			continue
		}
		c := *ef.DeepCopy()
		c.Prefix = appEnvPrefix + ef.Prefix
		r.envFrom = append(r.envFrom, c)
		r.rewritten = append(r.rewritten, fmt.Sprintf("envFrom %s: the sidecar gets it too, under the prefix %s, and reads the broker from it", refObject(ef), c.Prefix))
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	var locations []string
	for _, e := range app.Env {
		for _, name := range envSpringConfigLocations {
			if e.Name == name && e.ValueFrom == nil {
				locations = append(locations, splitList(e.Value)...)
			}
		}
	}
	var files []string
	for _, m := range app.VolumeMounts {
		v, found := volumes[m.Name]
		if !found || (v.ConfigMap == nil && v.Secret == nil && v.Projected == nil) {
			continue
		}
		base := path.Base(m.MountPath)
		var fs []string
		switch {
		case isSpringConfigName(base):
			fs = []string{m.MountPath}
		case base == "config" || mentions(locations, m.MountPath):
			for _, n := range springConfigNames {
				fs = append(fs, path.Join(m.MountPath, n))
			}
		default:
			continue
		}
		mount := *m.DeepCopy()
		mount.ReadOnly = true
		mount.MountPropagation = nil
		r.mounts = append(r.mounts, mount)
		files = append(files, fs...)
		r.rewritten = append(r.rewritten, fmt.Sprintf("volume %s at %s: mounted into the sidecar too, which reads the broker from its Spring configuration", m.Name, m.MountPath))
	}
	if len(r.envFrom) == 0 && len(files) == 0 {
		return brokerRewrite{}, false
	}
	listen := fmt.Sprint(listenPort)
	r.env = append([]corev1.EnvVar(nil), app.Env...)
	set := func(name, value, why string) {
		r.env = append(r.env, corev1.EnvVar{Name: name, Value: value})
		r.rewritten = append(r.rewritten, fmt.Sprintf("%s: (unset) → %s (%s)", name, maskValue(value), why))
	}
	spring := "it beats the app's configuration files and envFrom"
	set(envSpringAddresses, "ms2m-placeholder:ms2m-placeholder@"+localhost+":"+listen, spring)
	set(envSpringSSL, "false", "TLS to the broker is the sidecar's")
	if len(r.envFrom) > 0 {
		for _, name := range []string{envAMQPURL, envRabbitMQURL} {
			set(name, placeholderURL+":"+listen+"/", "it beats envFrom")
		}
	}
	r.upstream = []corev1.EnvVar{{Name: envUpstream, Value: ""}}
	if len(files) > 0 {
		r.upstream = append(r.upstream, corev1.EnvVar{Name: envAppConfigFiles, Value: strings.Join(files, ",")})
	}
	return r, true
}

func isSpringConfigName(name string) bool {
	for _, n := range springConfigNames {
		if name == n {
			return true
		}
	}
	return false
}

// mentions says whether a Spring config location names dir (as a folder,
// optional: and file: prefixes allowed).
func mentions(locations []string, dir string) bool {
	for _, l := range locations {
		l = strings.TrimPrefix(strings.TrimPrefix(l, "optional:"), "file:")
		if strings.TrimSuffix(l, "/") == strings.TrimSuffix(dir, "/") {
			return true
		}
	}
	return false
}

func refObject(ef corev1.EnvFromSource) string {
	if ef.SecretRef != nil {
		return "Secret " + ef.SecretRef.Name
	}
	return "ConfigMap " + ef.ConfigMapRef.Name
}

// springAbove finds Spring broker settings that rank above env vars in
// Spring Boot (SPRING_APPLICATION_JSON, -D system properties, --
// command-line arguments): the app would use them, not the rewritten vars,
// and talk to the broker past the sidecar. It returns the fatal reason for
// settings it can see, and a warning for SPRING_APPLICATION_JSON from a
// reference, which it cannot read.
func springAbove(app *corev1.Container) (fatal, warning string) {
	const key = "spring.rabbitmq."
	var where []string
	for _, e := range app.Env {
		switch {
		case e.Name == "SPRING_APPLICATION_JSON" && e.ValueFrom != nil:
			warning = "SPRING_APPLICATION_JSON comes from " + valueSource(e.ValueFrom) + " and cannot be read: if it holds spring.rabbitmq settings, they beat the rewritten vars and the app bypasses the sidecar"
		case e.Name == "SPRING_APPLICATION_JSON" && strings.Contains(e.Value, "rabbitmq"):
			where = append(where, "SPRING_APPLICATION_JSON")
		case (e.Name == "JAVA_TOOL_OPTIONS" || e.Name == "JDK_JAVA_OPTIONS" || e.Name == "JAVA_OPTS") && strings.Contains(e.Value, "-D"+key):
			where = append(where, e.Name+" (-D"+key+"…)")
		}
	}
	for _, a := range append(append([]string(nil), app.Command...), app.Args...) {
		if strings.Contains(a, "-D"+key) || strings.Contains(a, "--"+key) {
			where = append(where, "the container's command or args ("+a[:strings.Index(a, key)]+key+"…)")
			break
		}
	}
	if len(where) > 0 {
		fatal = fmt.Sprintf("container %q sets the broker in %s, which Spring ranks above env vars: the app would bypass the sidecar; move the spring.rabbitmq settings into env (valueFrom for a Secret) or application.properties",
			app.Name, strings.Join(where, " and "))
	}
	return fatal, warning
}
