#!/usr/bin/env bash
# Prepares what ms2m's tests need on this machine, idempotently:
#   - a running RabbitMQ with the stream plugin (AMQP on 5672, streams on 5552);
#   - a broker user for processes outside loopback (guest may only use loopback);
#   - the management plugin (HTTP API on 15672), enabled on the running broker
#     without a restart, and an administrator for it ($MS2M_BROKER_ADMIN_USER),
#     with which the controller and the tests provision per-namespace broker
#     users (docs/security.md);
#   - Debian's python3-pika, for the unmodified Python consumer;
#   - a running nats-server (Debian's, 2.9) with JetStream on 127.0.0.1:4222.
#   - TLS listeners on the same broker (AMQP 5671, streams 5551) with a test CA
#     under $MS2M_STATE_DIR/tls, and EXTERNAL auth for a client certificate,
#     started at run time (the broker is shared: it is never restarted) and
#     written to rabbitmq.conf for its next boot.
#   - a JDK 17 and Maven, for the Spring Boot consumer (make consumer-spring).
# With the argument "node" (make node-setup) it prepares a real node instead:
#   - Debian's runc, containernetworking-plugins (bridge, host-local,
#     loopback in /usr/lib/cni), iproute2 and nftables.
# Under CI=true anything missing fails the run; elsewhere it warns loudly and
# the tests that need it skip.
set -uo pipefail

MS2M_BROKER_USER=${MS2M_BROKER_USER:-ms2m}
MS2M_BROKER_PASSWORD=${MS2M_BROKER_PASSWORD:-ms2m-test}
MS2M_BROKER_ADMIN_USER=${MS2M_BROKER_ADMIN_USER:-ms2m-admin}
MS2M_BROKER_ADMIN_PASSWORD=${MS2M_BROKER_ADMIN_PASSWORD:-ms2m-admin-test}
MS2M_STATE_DIR=${MS2M_STATE_DIR:-/var/lib/ms2m}
MS2M_TLS_CLIENT=ms2m-tls-client # the client certificate's CN and its EXTERNAL broker user
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

mgmt_up() { # does the management API answer on 127.0.0.1:15672?
	local line
	{ exec 3<>/dev/tcp/127.0.0.1/15672; } 2>/dev/null || return 1
	printf 'GET /api/overview HTTP/1.0\r\n\r\n' >&3
	IFS= read -r -t 5 line <&3 || line=
	exec 3<&- 3>&-
	[[ $line == HTTP/1.* ]]
}

# setup_rabbitmq_management enables the management plugin on the running
# broker (rabbitmq-plugins enable works online: others' connections stay up)
# and makes the administrator that provisions per-namespace broker users
# through its HTTP API. Only that administrator, never a tenant's user, has
# a tag that opens the API.
setup_rabbitmq_management() {
	if ! rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_management; then
		say "enabling the rabbitmq_management plugin (HTTP API on 15672, no restart)"
		rabbitmq-plugins enable rabbitmq_management >/dev/null 2>&1 ||
			{ fail "the rabbitmq_management plugin" "rabbitmq-plugins enable rabbitmq_management"; return; }
	fi
	local deadline=$((SECONDS + 60))
	until mgmt_up; do
		[ $SECONDS -lt $deadline ] || { fail "the RabbitMQ management API on 127.0.0.1:15672" \
			"rabbitmq-plugins enable rabbitmq_management, then check rabbitmq-diagnostics listeners"; return; }
		sleep 0.5
	done
	if ! rabbitmqctl -q list_users 2>/dev/null | awk '{print $1}' | grep -qx "$MS2M_BROKER_ADMIN_USER"; then
		say "creating broker administrator $MS2M_BROKER_ADMIN_USER (management API)"
		rabbitmqctl -q add_user "$MS2M_BROKER_ADMIN_USER" "$MS2M_BROKER_ADMIN_PASSWORD" >/dev/null 2>&1 ||
			{ fail "broker administrator $MS2M_BROKER_ADMIN_USER" "rabbitmqctl add_user $MS2M_BROKER_ADMIN_USER <password>"; return; }
	fi
	{ rabbitmqctl -q set_user_tags "$MS2M_BROKER_ADMIN_USER" administrator &&
		rabbitmqctl -q set_permissions -p / "$MS2M_BROKER_ADMIN_USER" '.*' '.*' '.*'; } >/dev/null 2>&1 ||
		fail "the administrator tag and permissions of $MS2M_BROKER_ADMIN_USER" \
			"rabbitmqctl set_user_tags $MS2M_BROKER_ADMIN_USER administrator; rabbitmqctl set_permissions -p / $MS2M_BROKER_ADMIN_USER '.*' '.*' '.*'"
	say "RabbitMQ management ready: http://127.0.0.1:15672, administrator $MS2M_BROKER_ADMIN_USER"
}

# make_test_ca writes a test CA, a server certificate (localhost, 127.0.0.1
# and the local cluster's host address 10.77.0.1) and a client certificate
# (CN $MS2M_TLS_CLIENT) into $1, unless they are there. Test material only:
# the keys are readable by the broker's group.
make_test_ca() {
	local d=$1
	[ -s "$d/ca.pem" ] && [ -s "$d/server.pem" ] && [ -s "$d/client.pem" ] && return 0
	mkdir -p "$d" || return 1
	printf 'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:10.77.0.1\nextendedKeyUsage=serverAuth\n' >"$d/server.ext" &&
	printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext" &&
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=ms2m test CA" \
		-keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1 &&
	openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" >/dev/null 2>&1 &&
	openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
		-extfile "$d/server.ext" -out "$d/server.pem" >/dev/null 2>&1 &&
	openssl req -newkey rsa:2048 -nodes -subj "/CN=$MS2M_TLS_CLIENT" -keyout "$d/client.key" -out "$d/client.csr" >/dev/null 2>&1 &&
	openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
		-extfile "$d/client.ext" -out "$d/client.pem" >/dev/null 2>&1 || return 1
	rm -f "$d"/*.csr
	chmod 0755 "$d"
	chmod 0644 "$d"/*.pem
	chmod 0640 "$d"/*.key
	chgrp rabbitmq "$d"/*.key 2>/dev/null || chmod 0644 "$d"/*.key
}

# tls_listeners_erl is the Erlang that rabbitmqctl eval runs to start the TLS
# listeners on a running broker: the AMQP one through rabbit_networking, the
# stream one as a copy of the plain stream listener's child spec with TLS.
# Each is started only if its port is not listening yet.
tls_listeners_erl() {
	local d=$1
	cat <<ERL
ok = application:set_env(rabbit, ssl_options, [{cacertfile, "$d/ca.pem"}, {certfile, "$d/server.pem"},
	{keyfile, "$d/server.key"}, {verify, verify_peer}, {fail_if_no_peer_cert, false}]),
ok = application:set_env(rabbit, ssl_cert_login_from, common_name),
ok = application:set_env(rabbit, auth_mechanisms, ['PLAIN', 'AMQPLAIN', 'EXTERNAL']),
Ssl = rabbit_networking:ensure_ssl(),
Listening = fun(P) -> lists:any(fun(L) -> element(6, L) =:= P end, rabbit_networking:node_listeners(node())) end,
A = case Listening(5671) of true -> ok; false -> rabbit_networking:start_ssl_listener(5671, Ssl, 10, 1) end,
S = case Listening(5551) of
	true -> ok;
	false ->
		[Id | _] = [I || {I, _, supervisor, _} <- supervisor:which_children(rabbit_stream_sup),
			lists:prefix("rabbit_stream_listener_sup_", atom_to_list(I))],
		{ok, #{start := {M, F, [Ip, _, ranch_tcp, Opts, Sup, Cfg, {SM, SF, [stream, SA]}, {EM, EF, [stream, EA]} | More]}} = Spec} =
			supervisor:get_childspec(rabbit_stream_sup, Id),
		Tls = Spec#{id => list_to_atom("ms2m_stream_tls_5551_" ++ atom_to_list(Id)),
			start => {M, F, [Ip, 5551, ranch_ssl, Opts ++ Ssl, Sup, Cfg#{transport => ssl},
				{SM, SF, ['stream/ssl', SA]}, {EM, EF, ['stream/ssl', EA]} | More]}},
		element(1, supervisor:start_child(rabbit_stream_sup, Tls))
end,
{A, S}.
ERL
}

# setup_rabbitmq_tls gives the running broker TLS listeners for AMQP (5671)
# and streams (5551) without a restart, so that others' connections stay up,
# writes the same settings into rabbitmq.conf for the next boot, and makes
# the broker user of the client certificate (EXTERNAL auth).
setup_rabbitmq_tls() {
	local d="$MS2M_STATE_DIR/tls" conf=/etc/rabbitmq/rabbitmq.conf out
	command -v openssl >/dev/null 2>&1 || apt_install openssl || { fail "openssl, for the test CA" "apt-get install openssl"; return; }
	make_test_ca "$d" || { fail "a test CA in $d" "check that $d is writable (MS2M_STATE_DIR moves it)"; return; }
	if ! rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_auth_mechanism_ssl; then
		say "enabling the rabbitmq_auth_mechanism_ssl plugin (EXTERNAL auth)"
		rabbitmq-plugins enable rabbitmq_auth_mechanism_ssl >/dev/null 2>&1 ||
			{ fail "the rabbitmq_auth_mechanism_ssl plugin" "rabbitmq-plugins enable rabbitmq_auth_mechanism_ssl"; return; }
	fi
	if ! grep -qs '^# ms2m TLS' "$conf"; then
		say "writing the TLS listeners into $conf, for the broker's next boot"
		{
			echo "# ms2m TLS (hack/setup.sh): test CA in $d"
			echo "listeners.ssl.default = 5671"
			echo "stream.listeners.ssl.default = 5551"
			echo "ssl_options.cacertfile = $d/ca.pem"
			echo "ssl_options.certfile = $d/server.pem"
			echo "ssl_options.keyfile = $d/server.key"
			echo "ssl_options.verify = verify_peer"
			echo "ssl_options.fail_if_no_peer_cert = false"
			echo "ssl_cert_login_from = common_name"
			echo "auth_mechanisms.1 = PLAIN"
			echo "auth_mechanisms.2 = AMQPLAIN"
			echo "auth_mechanisms.3 = EXTERNAL"
		} >>"$conf" || { fail "TLS settings in $conf" "check that $conf is writable"; return; }
	fi
	if ! rabbitmq-diagnostics -q check_port_listener 5671 >/dev/null 2>&1 ||
		! rabbitmq-diagnostics -q check_port_listener 5551 >/dev/null 2>&1; then
		say "starting the TLS listeners 5671 and 5551 on the running broker"
		out=$(rabbitmqctl -q eval "$(tls_listeners_erl "$d")" 2>&1) || say "rabbitmqctl eval: $out"
	fi
	wait_port 5671 20 || { fail "the RabbitMQ TLS listener on 5671" "rabbitmqctl eval could not start it ($out); restart the broker to read $conf"; return; }
	wait_port 5551 20 || { fail "the RabbitMQ stream TLS listener on 5551" "rabbitmqctl eval could not start it ($out); restart the broker to read $conf"; return; }
	if ! rabbitmqctl -q list_users 2>/dev/null | awk '{print $1}' | grep -qx "$MS2M_TLS_CLIENT"; then
		say "creating broker user $MS2M_TLS_CLIENT (EXTERNAL auth, no password)"
		{ rabbitmqctl -q add_user "$MS2M_TLS_CLIENT" "$(openssl rand -hex 16)" && rabbitmqctl -q clear_password "$MS2M_TLS_CLIENT"; } >/dev/null 2>&1 ||
			{ fail "broker user $MS2M_TLS_CLIENT" "rabbitmqctl add_user $MS2M_TLS_CLIENT x && rabbitmqctl clear_password $MS2M_TLS_CLIENT"; return; }
	fi
	rabbitmqctl -q set_permissions -p / "$MS2M_TLS_CLIENT" '.*' '.*' '.*' >/dev/null 2>&1 ||
		fail "permissions for $MS2M_TLS_CLIENT" "rabbitmqctl set_permissions -p / $MS2M_TLS_CLIENT '.*' '.*' '.*'"
	say "RabbitMQ TLS ready: amqps 127.0.0.1:5671, stream TLS 127.0.0.1:5551, CA $d/ca.pem, EXTERNAL user $MS2M_TLS_CLIENT"
}

setup_pika() {
	if /usr/bin/python3 -c 'import pika' >/dev/null 2>&1; then
		return
	fi
	say "installing python3-pika from Debian's packages"
	apt_install python3-pika && /usr/bin/python3 -c 'import pika' >/dev/null 2>&1 ||
		fail "Debian's python3-pika for /usr/bin/python3" "run as root: apt-get install python3-pika"
}

# NATS: Debian's nats-server, started in the background with JetStream on
# loopback when nothing listens on its port yet. A server that already runs
# is left alone (other processes may hold connections to it).
NATS_PORT=${MS2M_NATS_PORT:-4222}
NATS_STORE=${MS2M_NATS_STORE:-/var/lib/nats-server}

nats_up() { # is a NATS server answering on 127.0.0.1:$NATS_PORT?
	local line
	{ exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT"; } 2>/dev/null || return 1
	IFS= read -r -t 2 line <&3 || line=
	exec 3<&- 3>&-
	[[ $line == INFO* ]]
}

setup_nats() {
	if ! [ -x /usr/sbin/nats-server ]; then
		say "installing nats-server from Debian's packages"
		apt_install nats-server || { fail "nats-server" "run as root: apt-get install nats-server"; return; }
	fi
	if ! nats_up; then
		say "starting nats-server with JetStream on 127.0.0.1:$NATS_PORT"
		mkdir -p "$NATS_STORE" || { fail "the NATS store folder $NATS_STORE" "create it, or set MS2M_NATS_STORE"; return; }
		start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
			-a 127.0.0.1 -p "$NATS_PORT" -js -sd "$NATS_STORE" >/dev/null 2>&1 || true
		local deadline=$((SECONDS + 30))
		until nats_up; do
			[ $SECONDS -lt $deadline ] || { fail "a nats-server listening on 127.0.0.1:$NATS_PORT" \
				"start it with: nats-server -a 127.0.0.1 -p $NATS_PORT -js -sd $NATS_STORE"; return; }
			sleep 0.2
		done
	fi
	say "NATS ready: nats://127.0.0.1:$NATS_PORT ($(/usr/sbin/nats-server --version 2>/dev/null))"
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
		"conmon /usr/bin/conmon"
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
	[ "$failed" = 1 ] || say "node packages ready: $(/usr/sbin/runc --version | head -n1), $(/usr/bin/conmon --version | head -n1) (for CRI-O), CNI plugins in /usr/lib/cni, ip, nft"
}

case "${1:-}" in
node) setup_node_packages ;;
'') setup_rabbitmq; [ "$failed" = 1 ] || setup_rabbitmq_management; [ "$failed" = 1 ] || setup_rabbitmq_tls; setup_pika; setup_nats; setup_java ;;
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
