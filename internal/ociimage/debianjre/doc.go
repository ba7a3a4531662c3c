// Package debianjre describes an image that runs Java programs on the host's
// own Debian JRE, with no container registry and no Docker: the runtime's
// folder under /usr/lib/jvm less what a headless server never loads (the
// JDK's tools, sources, headers, jmods, the GUI and sound libraries), the
// configuration files its symlinks point at, and the shared libraries that
// the launcher and the kept native libraries load. The Spring Boot sample
// consumer's image is built from it at test time (e2e/lab).
package debianjre
