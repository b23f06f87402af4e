#!/usr/bin/env bash
# scripts/fetch_debs.sh — run HERE (a machine with Debian's package
# registry): download the .deb files the GPU build needs into .debs/
# (git-ignored), for scripts/device_run.sh to unpack there. The GPU machine
# (Ubuntu 24.04, glibc 2.39) has no registry and no -dev packages; Debian
# 12's headers and shared libraries work on it.
#
#   tokenizer:  PCRE2 (8-bit), utf8proc
#   tools:      jansson (JSON), libmicrohttpd (the server) and, because the
#               latter links GnuTLS, GnuTLS and its libraries, in case the
#               GPU image lacks them (they stay in a private prefix)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
apt-get update -qq
apt-get download \
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
  libutf8proc-dev libutf8proc2 \
  libjansson-dev libjansson4 \
  libmicrohttpd-dev libmicrohttpd12 \
  libgnutls30 libgmp10 libhogweed6 libnettle8 libidn2-0 libp11-kit0 libtasn1-6 libunistring2 libffi8
ls -la
du -sh .
