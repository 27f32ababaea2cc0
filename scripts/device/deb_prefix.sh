# deb_prefix.sh — sourced by the GPU-machine scripts (from the repository root): unpacks the
# Debian packages that scripts/device/deps.sh fetched into .deb/ into a private prefix and
# exports CFLAGS / LDLIBS so that `make CUDA=1` builds and links against them (that machine has
# the CUDA toolkit but not libmicrohttpd, jansson, PCRE2 or utf8proc).
ds_deb_prefix() {
  local p=/tmp/ds-prefix f
  local lib=$p/usr/lib/x86_64-linux-gnu
  mkdir -p "$p"
  for f in .deb/*.deb; do [ -f "$f" ] && dpkg -x "$f" "$p"; done
  export CFLAGS="-I$p/usr/include"
  export LDLIBS="-L$lib -Wl,-rpath,$lib -Wl,-rpath-link,$lib"
}
