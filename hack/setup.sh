#!/usr/bin/env bash
# Prepares what ms2m's tests need on this machine, idempotently:
#   - a running RabbitMQ with the stream plugin (AMQP on 5672, streams on 5552);
#   - a broker user for processes outside loopback (guest may only use loopback);
#   - Debian's python3-pika, for the unmodified Python consumer;
#   - a JDK 17 and Maven, for the Spring Boot consumer (make consumer-spring).
# With the argument "node" (make node-setup) it prepares a real node instead:
#   - Debian's runc, containernetworking-plugins (bridge, host-local,
#     loopback in /usr/lib/cni), iproute2 and nftables.
# Under CI=true anything missing fails the run; elsewhere it warns loudly and
# the tests that need it skip.
set -uo pipefail

MS2M_BROKER_USER=${MS2M_BROKER_USER:-ms2m}
MS2M_BROKER_PASSWORD=${MS2M_BROKER_PASSWORD:-ms2m-test}
failed=0

say()  { printf 'setup: %s\n' "$*"; }
fail() {
	printf '\nsetup: ********************************************************\n' >&2
	printf 'setup: MISSING: %s\n' "$1" >&2
	printf 'setup: how to get it: %s\n' "$2" >&2
	printf 'setup: ********************************************************\n\n' >&2
	failed=1
}
as_root() { [ "$(id -u)" = 0 ]; }

apt_install() {
	as_root || return 1
	if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
}

wait_port() { # node check: wait until RabbitMQ listens on port $1, up to $2 seconds
	local deadline=$((SECONDS + $2))
	while [ $SECONDS -lt $deadline ]; do
		rabbitmq-diagnostics -q check_port_listener "$1" >/dev/null 2>&1 && return 0
		sleep 1
	done
	return 1
}

setup_rabbitmq() {
	if ! command -v rabbitmq-server >/dev/null 2>&1; then
		say "installing rabbitmq-server from Debian's packages"
		apt_install rabbitmq-server || { fail "rabbitmq-server" "run as root: apt-get install rabbitmq-server"; return; }
	fi
	if ! rabbitmq-diagnostics -q check_port_listener 5672 >/dev/null 2>&1; then
		say "starting RabbitMQ"
		rabbitmq-server -detached >/dev/null 2>&1 || true
		wait_port 5672 90 || { fail "a RabbitMQ listening on 127.0.0.1:5672" "start it with: rabbitmq-server -detached"; return; }
	fi
	if ! rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_stream; then
		say "enabling the rabbitmq_stream plugin"
		rabbitmq-plugins enable rabbitmq_stream >/dev/null 2>&1 || { fail "the rabbitmq_stream plugin" "rabbitmq-plugins enable rabbitmq_stream"; return; }
	fi
	# ms2m's stream client always dials the configured address (it ignores
	# the node's advertised host), so no advertised_host change is needed.
	wait_port 5552 60 || { fail "the RabbitMQ stream listener on port 5552" "rabbitmq-plugins enable rabbitmq_stream, then check rabbitmq-diagnostics listeners"; return; }
	if ! rabbitmqctl -q list_users 2>/dev/null | awk '{print $1}' | grep -qx "$MS2M_BROKER_USER"; then
		say "creating broker user $MS2M_BROKER_USER"
		rabbitmqctl -q add_user "$MS2M_BROKER_USER" "$MS2M_BROKER_PASSWORD" >/dev/null 2>&1 ||
			{ fail "broker user $MS2M_BROKER_USER" "rabbitmqctl add_user $MS2M_BROKER_USER <password>"; return; }
	fi
	rabbitmqctl -q set_permissions -p / "$MS2M_BROKER_USER" '.*' '.*' '.*' >/dev/null 2>&1 ||
		fail "permissions for $MS2M_BROKER_USER" "rabbitmqctl set_permissions -p / $MS2M_BROKER_USER '.*' '.*' '.*'"
	say "RabbitMQ ready: amqp 127.0.0.1:5672, stream 127.0.0.1:5552, user $MS2M_BROKER_USER"
}

setup_pika() {
	if /usr/bin/python3 -c 'import pika' >/dev/null 2>&1; then
		return
	fi
	say "installing python3-pika from Debian's packages"
	apt_install python3-pika && /usr/bin/python3 -c 'import pika' >/dev/null 2>&1 ||
		fail "Debian's python3-pika for /usr/bin/python3" "run as root: apt-get install python3-pika"
}

setup_java() {
	if command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then
		return
	fi
	say "installing a JDK 17 and Maven from Debian's packages"
	apt_install openjdk-17-jdk-headless maven && command -v mvn >/dev/null 2>&1 ||
		fail "a JDK 17 and Maven, for the Spring Boot consumer" "run as root: apt-get install openjdk-17-jdk-headless maven"
}

# What a real node needs from Debian besides the binaries that make node-bin
# builds and make criu installs: containerd's runc shim calls runc, CRI calls
# the CNI plugins, and the node tests make network namespaces and nft rules.
setup_node_packages() {
	local want=(
		"runc /usr/sbin/runc"
		"containernetworking-plugins /usr/lib/cni/bridge"
		"containernetworking-plugins /usr/lib/cni/host-local"
		"containernetworking-plugins /usr/lib/cni/loopback"
		"iproute2 /usr/sbin/ip"
		"nftables /usr/sbin/nft"
	)
	local missing=() w pkg file
	for w in "${want[@]}"; do
		read -r pkg file <<<"$w"
		[ -x "$file" ] || missing+=("$pkg")
	done
	[ ${#missing[@]} -eq 0 ] || {
		mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
		say "installing ${missing[*]} from Debian's packages"
		apt_install "${missing[@]}" || true
	}
	for w in "${want[@]}"; do
		read -r pkg file <<<"$w"
		[ -x "$file" ] || fail "$file (Debian's $pkg)" "run as root: apt-get install $pkg"
	done
	[ "$failed" = 1 ] || say "node packages ready: $(/usr/sbin/runc --version | head -n1), CNI plugins in /usr/lib/cni, ip, nft"
}

case "${1:-}" in
node) setup_node_packages ;;
'') setup_rabbitmq; setup_pika; setup_java ;;
*) echo "usage: hack/setup.sh [node]" >&2; exit 2 ;;
esac

if [ "$failed" = 1 ]; then
	if [ "${CI:-}" = true ]; then
		echo "setup: failing because CI=true and something the tests need is missing (see above)" >&2
		exit 1
	fi
	echo "setup: continuing without it; the tests that need it will SKIP (they fail under CI=true)" >&2
fi
exit 0
