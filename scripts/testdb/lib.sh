# Helpers shared by the test database scripts; sourced, not run. The
# sourcing script sets $self (its own name, for messages) first.

say() { echo "$self: $*" >&2; }
die() { say "$*"; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# apt_install installs Debian packages, with sudo when not root.
apt_install() {
	local sudo=
	if ! is_root; then
		command -v sudo >/dev/null 2>&1 || die "not root and no sudo: install $* yourself"
		sudo=sudo
	fi
	say "installing $*"
	$sudo apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}
