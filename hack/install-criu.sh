#!/usr/bin/env bash
# Installs CRIU >= 4.2 into a private folder, for ms2m's checkpoint tests and
# for the runc that a real node's containerd drives.
#
#   hack/install-criu.sh [PREFIX]        (default: bin/criu in the repo)
#
# Result: PREFIX/criu, an executable that runs CRIU as root. Debian 12 ships
# criu 3.17, which fails on recent kernels, and trixie's 4.1 cannot dump a
# process with an inet socket on kernels >= 6.16, so by default the package
# comes from Debian's forky suite. Its criu needs forky's libc, so PREFIX/criu
# is a small wrapper that starts the private criu through the private ld.so
# with the private libraries only; nothing on the system is replaced.
#
# The system's apt state is never touched: package lists, cache and an empty
# dpkg status live in a scratch folder under PREFIX, packages are only
# downloaded and unpacked with dpkg-deb -x, and the scratch folder is removed.
#
# If the system already has a criu >= 4.2, PREFIX/criu is a symlink to it.
# A second run with a working install only checks it (well under a second).
#
# Environment:
#   CRIU_SUITE    Debian suite to take criu from      (default: forky)
#   CRIU_MIRROR   Debian mirror URL                   (default: the first
#                 Debian archive in the system's own apt sources)
#   CRIU_KEYRING  keyring that signs that suite       (default: Debian's archive keyring)
#   CRIU_MIN      lowest acceptable criu version      (default: 4.2)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${1:-$repo/bin/criu}
SUITE=${CRIU_SUITE:-forky}
KEYRING=${CRIU_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
MIN=${CRIU_MIN:-4.2}
ARCH_TRIPLET=x86_64-linux-gnu

say() { printf 'install-criu: %s\n' "$*"; }
die() {
	printf 'install-criu: ERROR: %s\n' "$1" >&2
	[ $# -lt 2 ] || printf 'install-criu: how to fix: %s\n' "$2" >&2
	exit 1
}

# version_ok VERSION: true when VERSION >= MIN.
version_ok() {
	[ -n "$1" ] && [ "$(printf '%s\n%s\n' "$MIN" "$1" | sort -V | head -n1)" = "$MIN" ]
}

# criu_version BIN: the "Version:" line of BIN --version, or nothing.
criu_version() {
	"$1" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -n1
}

# criu_works BIN: BIN is at least MIN and `criu check` is happy on this kernel.
criu_works() {
	local v
	v=$(criu_version "$1")
	version_ok "$v" || return 1
	case "$("$1" check 2>&1)" in *'Looks good'*) printf '%s' "$v" ;; *) return 1 ;; esac
}

# --- preconditions ----------------------------------------------------------

[ "$(id -u)" = 0 ] ||
	die "must run as root: CRIU only runs as root, and this script verifies the install with 'criu check'" \
		"run it as root, e.g. sudo make criu"

arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
case "$arch" in
amd64 | x86_64) ;;
*) die "only amd64 is supported (this machine is $arch)" "install criu >= $MIN from your distribution and put it on PATH; this script then links to it" ;;
esac

mkdir -p "$PREFIX"
PREFIX=$(cd "$PREFIX" && pwd)
WRAPPER=$PREFIX/criu

# One install at a time per PREFIX; a second caller waits, then finds it done.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$PREFIX/.lock"
	flock 9
fi

# --- already installed? -----------------------------------------------------

if [ -x "$WRAPPER" ]; then
	if v=$(criu_works "$WRAPPER"); then
		say "criu $v ready: $WRAPPER (criu check: Looks good.)"
		exit 0
	fi
	say "$WRAPPER exists but does not pass 'criu check' (or is older than $MIN); installing again"
fi

# --- a system criu that is new enough --------------------------------------

seen=" "
for c in $(type -ap criu 2>/dev/null) /usr/local/sbin/criu /usr/sbin/criu; do
	[ -x "$c" ] || continue
	c=$(readlink -f "$c")
	case "$seen" in *" $c "*) continue ;; esac
	seen="$seen$c "
	case "$c" in "$PREFIX"/*) continue ;; esac
	if v=$(criu_works "$c"); then
		rm -rf "$PREFIX/root" "$PREFIX/PACKAGES" "$WRAPPER"
		ln -s "$c" "$WRAPPER"
		echo "system $c" >"$PREFIX/SOURCE"
		say "using the system's criu $v: $WRAPPER -> $c"
		exit 0
	fi
	say "the system's $c is criu $(criu_version "$c") or fails 'criu check'; not using it"
done

# --- download and unpack from Debian ----------------------------------------

for tool in apt-get dpkg-deb gpgv; do
	command -v "$tool" >/dev/null 2>&1 ||
		die "$tool is missing (needed to fetch and unpack Debian packages)" "apt-get install apt dpkg gpgv"
done
[ -r "$KEYRING" ] ||
	die "cannot read the archive keyring $KEYRING" "apt-get install debian-archive-keyring, or set CRIU_KEYRING"

# The mirror: the first Debian archive (not -security) in the system's own
# apt sources, in either the deb822 or the one-line format.
system_mirror() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		awk '
			function flush() {
				if (uris != "" && types ~ /(^|[ \t])deb([ \t]|$)/ && enabled != "no" && suites !~ /-security/)
					{ split(uris, u, /[ \t]+/); print u[1]; found = 1; exit }
				uris = ""; types = ""; suites = ""; enabled = ""
			}
			/^[ \t]*$/           { flush(); next }
			/^[ \t]*#/           { next }
			tolower($1) == "uris:"    { sub(/^[^:]*:[ \t]*/, ""); uris = $0 }
			tolower($1) == "types:"   { sub(/^[^:]*:[ \t]*/, ""); types = $0 }
			tolower($1) == "suites:"  { sub(/^[^:]*:[ \t]*/, ""); suites = $0 }
			tolower($1) == "enabled:" { sub(/^[^:]*:[ \t]*/, ""); enabled = tolower($0) }
			END { if (!found) flush() }
		' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && $3 !~ /-security/ { print $2 }'
	done
}
mirror_from="the system's apt sources"
[ -z "${CRIU_MIRROR:-}" ] || mirror_from=CRIU_MIRROR
MIRROR=${CRIU_MIRROR:-$(system_mirror | grep -m1 -E '^(https?|file):' || true)}
MIRROR=${MIRROR%/}
[ -n "$MIRROR" ] ||
	die "found no Debian archive in /etc/apt/sources.list or /etc/apt/sources.list.d/" \
		"set CRIU_MIRROR to a Debian mirror URL (the folder that holds dists/ and pool/)"

say "installing criu >= $MIN from Debian $SUITE into $PREFIX (about 10 s, up to 40 s on a busy machine; most of it is downloading)"
say "mirror $MIRROR (from $mirror_from); the system's apt and dpkg state stay untouched"

work=$PREFIX/.work
rm -rf "$work"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/etc/parts" "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$work/pkgs"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" >"$work/etc/sources.list"
: >"$work/status" # no package counts as installed, so apt resolves the whole closure

apt_private=(
	-o Dir::Etc::SourceList="$work/etc/sources.list"
	-o Dir::Etc::SourceParts="$work/etc/parts"
	-o Dir::Etc::Preferences=/dev/null
	-o Dir::Etc::PreferencesParts="$work/etc/parts"
	-o Dir::State="$work"
	-o Dir::State::Lists="$work/lists"
	-o Dir::State::status="$work/status"
	-o Dir::State::extended_states="$work/extended_states"
	-o Dir::Cache="$work/cache"
	-o Dir::Cache::pkgcache=
	-o Dir::Cache::srcpkgcache=
	-o APT::Architectures::=amd64
	-o APT::Install-Recommends=false
	-o Acquire::Languages=none
	-o APT::Sandbox::User=root
	-o Debug::NoLocking=true
	-q
)

if ! apt-get "${apt_private[@]}" update >"$work/update.log" 2>&1 || grep -qE '^(W|E):' "$work/update.log"; then
	cat "$work/update.log" >&2
	die "could not fetch the package lists of Debian $SUITE from $MIRROR" \
		"check that this machine reaches that mirror; set CRIU_MIRROR to another Debian mirror or CRIU_SUITE to another suite"
fi

# Everything criu needs, as apt would install it on an empty system.
mapfile -t closure < <(apt-get "${apt_private[@]}" -s install criu 2>"$work/resolve.log" | awk '$1 == "Inst" { print $2 }')
[ ${#closure[@]} -gt 0 ] || {
	cat "$work/resolve.log" >&2
	die "Debian $SUITE has no installable criu package" "set CRIU_SUITE to a suite that ships criu >= $MIN (forky or sid)"
}
if ! (cd "$work/debs" && apt-get "${apt_private[@]}" download "${closure[@]}") >"$work/download.log" 2>&1; then
	cat "$work/download.log" >&2
	die "downloading ${#closure[@]} packages from $MIRROR failed" "try again; if it keeps failing set CRIU_MIRROR to another Debian mirror"
fi

# Unpack every package into a folder of its own, so that the libraries the
# loader resolves below tell which packages are really needed.
for deb in "$work"/debs/*.deb; do
	name=$(basename "$deb" .deb)
	name=${name%%_*}
	dpkg-deb -x "$deb" "$work/pkgs/$name"
done

criu_bin=$work/pkgs/criu/usr/sbin/criu
loader=$(find "$work/pkgs/libc6" -name ld-linux-x86-64.so.2 -path "*/$ARCH_TRIPLET/*" 2>/dev/null | head -n1)
[ -x "$criu_bin" ] || die "the criu package of $SUITE has no usr/sbin/criu" "report this; set CRIU_SUITE to another suite"
[ -n "$loader" ] || die "the libc6 package of $SUITE has no ld-linux-x86-64.so.2" "report this; set CRIU_SUITE to another suite"

libpath=$(find "$work/pkgs" -type d -path "*/$ARCH_TRIPLET" | tr '\n' ':')
"$loader" --library-path "$libpath" --list "$criu_bin" >"$work/ldd.txt" 2>&1 || true
if grep -q 'not found' "$work/ldd.txt"; then
	grep 'not found' "$work/ldd.txt" >&2
	die "criu from $SUITE needs libraries that its dependencies do not provide" "set CRIU_SUITE to another suite"
fi
mapfile -t needed < <(
	{ echo "criu"; echo "libc6"; grep -oE "$work/pkgs/[^/]+/" "$work/ldd.txt" | sed "s|^$work/pkgs/||; s|/$||"; } | sort -u
)

root=$PREFIX/root
rm -rf "$root" "$WRAPPER" "$PREFIX/SOURCE" "$PREFIX/PACKAGES"
mkdir -p "$root"
for p in "${needed[@]}"; do
	cp -a "$work/pkgs/$p/." "$root/"
	basename "$(ls "$work"/debs/"${p}"_*.deb)" >>"$PREFIX/PACKAGES"
done

loader_rel=${loader#"$work/pkgs/libc6/"}
libdir_rel=${loader_rel%/*}

# Every library must now resolve inside the private root, never on the system.
if "$root/$loader_rel" --library-path "$root/$libdir_rel" --list "$root/usr/sbin/criu" 2>&1 |
	grep -v -e linux-vdso -e "$root/" >&2; then
	die "the libraries above resolve outside $root" "report this; set CRIU_SUITE to another suite"
fi

cat >"$WRAPPER.tmp" <<EOF
#!/bin/sh
# criu from Debian $SUITE, installed by hack/install-criu.sh. It runs through
# its own loader with its own libraries, found next to this wrapper, so the
# system's libc is never mixed in.
here=\$(dirname "\$(readlink -f "\$0")")
exec "\$here/root/$loader_rel" --argv0 criu --library-path "\$here/root/$libdir_rel" "\$here/root/usr/sbin/criu" "\$@"
EOF
chmod 755 "$WRAPPER.tmp"
mv "$WRAPPER.tmp" "$WRAPPER"
echo "debian $SUITE $MIRROR" >"$PREFIX/SOURCE"

v=$(criu_version "$WRAPPER")
version_ok "$v" ||
	die "the installed criu reports version '${v:-none}', below $MIN" "set CRIU_SUITE to a newer suite (sid)"
if ! "$WRAPPER" check >"$work/check.log" 2>&1 || ! grep -q 'Looks good' "$work/check.log"; then
	cat "$work/check.log" >&2
	die "criu $v is installed at $WRAPPER but 'criu check' fails on this kernel" "read the output above; the kernel may lack a feature CRIU needs"
fi
say "installed criu $v from $SUITE (${#needed[@]} of ${#closure[@]} packages): $WRAPPER (criu check: Looks good.)"
