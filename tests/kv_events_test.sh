#!/usr/bin/env bash
# KV-cache events end to end: tests/kv_events_test.py (a consumer against a live server) and
# tests/kv_router_test.py (a cache-aware router over CPU replicas), with Debian's python3 and its
# python3-zmq / python3-msgpack (scripts/setup.sh installs them).
set -u
cd "$(dirname "$0")/.."
rc=0
/usr/bin/python3 tests/kv_events_test.py || rc=1
[ -f tests/kv_router_test.py ] && { /usr/bin/python3 tests/kv_router_test.py || rc=1; }
exit $rc
