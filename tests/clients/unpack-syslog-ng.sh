#!/bin/sh
# Unpack Debian's syslog-ng with its Kafka destination (syslog-ng-core, syslog-ng-mod-rdkafka)
# into DIR for tests/test_clients_syslog.py, and install the libraries they link (as root).
# `make test-tools` runs it. Unpacked rather than installed: syslog-ng-core conflicts with
# rsyslog (each is the system's log daemon, and installing one removes the other), and the
# rsyslog omkafka test needs rsyslog. The test runs DIR/usr/sbin/syslog-ng with
# LD_LIBRARY_PATH=DIR/usr/lib/syslog-ng and --module-path=DIR/usr/lib/syslog-ng/<version>.
set -eu
dir=$1
packages="syslog-ng-core syslog-ng-mod-rdkafka"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# apt-get download writes as the _apt user when it can: let it
chmod 777 "$work"
apt-get download $packages >/dev/null 2>&1 ||
	{ apt-get update -q >/dev/null 2>&1 && apt-get download $packages >/dev/null; }
# their Depends, first alternative, without versions, minus syslog-ng itself and the init
# script's helpers (the test starts the daemon itself)
deps=$(for deb in ./*.deb; do dpkg-deb -f "$deb" Depends; done |
	tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/ //g' |
	grep -v -e '^syslog-ng' -e '^sysvinit-utils$' -e '^lsb-base$' -e '^$' | sort -u)
# shellcheck disable=SC2086 # one package name per word
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $deps >/dev/null
rm -rf "$dir.new"
mkdir -p "$dir.new"
for deb in ./*.deb; do dpkg-deb -x "$deb" "$dir.new"; done
rm -rf "$dir"
mv "$dir.new" "$dir"
