package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"time"

	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/ociimage/debianjre"
)

// SpringJVMFlags are the JVM options of the Spring consumer's image, chosen
// for CRIU and a small node: the serial collector and a small heap (few
// threads, few pages to dump), no hsperfdata file mapped from /tmp (a
// mapping CRIU would have to find again on the target), and the C1
// compiler only, which starts faster on a loaded machine.
var SpringJVMFlags = []string{"-XX:+UseSerialGC", "-Xms32m", "-Xmx128m", "-XX:-UsePerfData", "-XX:TieredStopAtLevel=1"}

// springJar is where the image keeps the app.
const springJar = "/app/consumer-spring.jar"

// PushSpring builds the Spring Boot consumer's jar (make consumer-spring:
// nothing when it is up to date), its image from this host's Debian JRE and
// the jar, and pushes it as "consumer-spring"; once per lab.
func (l *Lab) PushSpring(ctx context.Context) error {
	if _, ok := l.Images["consumer-spring"]; ok {
		return nil
	}
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, "make", "-s", "--no-print-directory", "consumer-spring")
	cmd.Dir = l.Opts.RepoDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make consumer-spring: %w\n%s", err, out)
	}
	jar, err := os.ReadFile(filepath.Join(l.Opts.RepoDir, "examples", "consumer-spring", "target", "consumer-spring.jar"))
	if err != nil {
		return fmt.Errorf("the Spring consumer's jar (make consumer-spring): %w", err)
	}
	fo, err := debianjre.Options("")
	if err != nil {
		return err
	}
	fo.Files = append(fo.Files, ociimage.File{Path: springJar, Data: jar})
	fo.Entrypoint = append(append([]string{path.Join(debianjre.DefaultHome, "bin", "java")}, SpringJVMFlags...), "-jar", springJar)
	fo.WorkingDir = "/app"
	fo.Labels = map[string]string{"org.opencontainers.image.title": "consumer-spring"}
	im, err := ociimage.Files(fo)
	if err != nil {
		return fmt.Errorf("image consumer-spring: %w", err)
	}
	if err := l.push(ctx, "consumer-spring", im); err != nil {
		return err
	}
	fmt.Fprintf(l.log, "lab: consumer-spring image built and pushed in %s\n", time.Since(t0).Round(time.Millisecond))
	return nil
}
