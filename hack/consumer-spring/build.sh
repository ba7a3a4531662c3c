#!/usr/bin/env bash
# Builds the Spring Boot sample consumer's jar with Maven into
# examples/consumer-spring/target/consumer-spring.jar (ignored by git).
# make consumer-spring runs it when a source file is newer than the jar.
# Maven's local repository is Maven's default (~/.m2/repository), outside the
# checkout. Once the repository holds what the build needs the build runs
# offline (-o); a build that fails offline is tried once online, which also
# fetches anything new after a change of the pom. Under CI=true a missing
# Maven or a failed build fails; elsewhere it warns, and the tests that need
# the jar skip.
set -uo pipefail
dir=$(cd "$(dirname "$0")/../../examples/consumer-spring" && pwd)
missing() {
	printf '\nconsumer-spring: ********************************************************\n' >&2
	printf 'consumer-spring: %s\n' "$1" >&2
	printf 'consumer-spring: ********************************************************\n\n' >&2
	if [ "${CI:-}" = true ]; then exit 1; fi
	echo "consumer-spring: continuing without the jar; the Spring consumer's tests will SKIP (they fail under CI=true)" >&2
	exit 0
}
command -v mvn >/dev/null 2>&1 || missing "MISSING: Maven (mvn); run make setup, or as root: apt-get install openjdk-17-jdk-headless maven"
cd "$dir" || exit 1
start=$(date +%s)
# The jar carries the pom's fixed build timestamp as its mtime: touch it, so
# that make sees it newer than the sources.
jar=target/consumer-spring.jar
if mvn -B -q -o package >/tmp/ms2m-consumer-spring-build.log 2>&1 && touch "$jar"; then
	echo "consumer-spring: built $dir/target/consumer-spring.jar offline in $(($(date +%s) - start)) s"
	exit 0
fi
echo "consumer-spring: the offline build failed (a cold Maven repository?); building online"
if mvn -B -q package && touch "$jar"; then
	echo "consumer-spring: built $dir/target/consumer-spring.jar in $(($(date +%s) - start)) s"
	exit 0
fi
missing "FAILED: mvn package in $dir (output above)"
