#!/usr/bin/env bash
# Installs the NATS client library of a sample NATS consumer into its ignored
# folder; make consumer-nats-python and make consumer-nats-node run it when
# their stamp is missing or older than what pins the version.
#
#   install.sh python VERSION  nats-py==VERSION from PyPI with Debian's
#                              python3's pip (--target, no dependencies: nats-py
#                              needs none) into examples/consumer-nats-python/pylib
#   install.sh node            nats.js at the version package.json pins, by
#                              npm ci from package-lock.json (which names no
#                              registry) into examples/consumer-nats-node/node_modules
#
# Each writes its stamp only after a whole install: a failed or interrupted
# one is tried again by the next make. Under CI=true a missing tool or a
# failed install fails; elsewhere it warns loudly, and the tests that need
# the client skip (they fail under CI=true).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
what=${1:-}
missing() {
	printf '\n%s: ********************************************************\n' "consumer-nats-$what" >&2
	printf '%s: %s\n' "consumer-nats-$what" "$1" >&2
	printf '%s: ********************************************************\n\n' "consumer-nats-$what" >&2
	if [ "${CI:-}" = true ]; then exit 1; fi
	echo "consumer-nats-$what: continuing without it; its NATS tests will SKIP (they fail under CI=true)" >&2
	exit 0
}
start=$(date +%s)
case "$what" in
python)
	version=${2:?usage: install.sh python VERSION}
	dir=$root/examples/consumer-nats-python/pylib
	stamp=$dir/.installed-nats-py-$version
	[ -f "$stamp" ] && exit 0
	py=/usr/bin/python3
	"$py" -m pip --version >/dev/null 2>&1 || missing "MISSING: pip for $py; as root: apt-get install python3-pip"
	rm -rf "$dir.new"
	if ! "$py" -m pip install --disable-pip-version-check --no-input --quiet --no-deps --no-compile \
		--target "$dir.new" "nats-py==$version" >/tmp/ms2m-consumer-nats-python-install.log 2>&1; then
		cat /tmp/ms2m-consumer-nats-python-install.log >&2
		rm -rf "$dir.new"
		missing "FAILED: pip install nats-py==$version (output above)"
	fi
	rm -rf "$dir" && mv "$dir.new" "$dir" && touch "$stamp" || exit 1
	echo "consumer-nats-python: installed nats-py $version into $dir in $(($(date +%s) - start)) s"
	;;
node)
	dir=$root/examples/consumer-nats-node
	stamp=$dir/node_modules/.ms2m-installed
	command -v npm >/dev/null 2>&1 || missing "MISSING: npm (and node); as root: apt-get install nodejs npm"
	# npm ci removes node_modules first, the stamp with it.
	if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/tmp/ms2m-consumer-nats-node-install.log 2>&1); then
		cat /tmp/ms2m-consumer-nats-node-install.log >&2
		missing "FAILED: npm ci in $dir (output above)"
	fi
	touch "$stamp" || exit 1
	echo "consumer-nats-node: installed nats.js $(cd "$dir" && node -p 'require("nats/package.json").version') into $dir/node_modules in $(($(date +%s) - start)) s"
	;;
*)
	echo "usage: install.sh python VERSION | install.sh node" >&2
	exit 2
	;;
esac
