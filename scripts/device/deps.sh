#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian packages our binary links but the GPU machine
# lacks, into .deb/ (git-ignored). scripts/device/check.sh unpacks them there with dpkg -x.
# Run once before a device run that carries .deb.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deb
cd .deb
PKGS="libmicrohttpd12 libmicrohttpd-dev libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev
libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc2 libutf8proc-dev
libgnutls30 libnettle8 libhogweed6 libp11-kit0 libidn2-0 libtasn1-6 libunistring2 libgmp10 libffi8
libzmq3-dev libzmq5 libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0 libgssapi-krb5-2 libkrb5-3
libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libmsgpack-dev libmsgpackc2"
for p in $PKGS; do
  ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p" >/dev/null
done
ls -1 *.deb | wc -l
