#!/bin/sh
# offline_test.sh — the online `clocher` commands without a daemon: --help, bad flags (exit 2),
# and a daemon that is not there (exit 5 with a message naming the address), over a Unix
# socket path that does not exist and a TCP port nobody listens on.
set -u
bin="$CLOCHER_BUILD_DIR/client/clocher"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect CODE DESCRIPTION -- COMMAND...: runs it with stdin from /dev/null, output in $tmp/out
expect() {
  want=$1; what=$2; shift 3
  "$@" </dev/null >"$tmp/out" 2>&1
  got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: $what: exit $got, expected $want: $*"
    sed 's/^/    /' "$tmp/out"
    fails=$((fails + 1))
  fi
}
# contains TEXT DESCRIPTION: the last command's output contains TEXT
contains() {
  if ! grep -qF -- "$1" "$tmp/out"; then
    echo "FAIL: $2: output lacks '$1':"
    sed 's/^/    /' "$tmp/out"
    fails=$((fails + 1))
  fi
}

[ -x "$bin" ] || { echo "FAIL: $bin is not built"; exit 1; }

expect 0 "clocher --help" -- "$bin" --help
cmds="generate batch adapters health metrics bench"
for c in $cmds; do
  contains "$c" "clocher --help lists $c"
done
for c in $cmds; do
  expect 0 "$c --help" -- "$bin" $c --help
  contains "usage: clocher $c" "$c --help"
  contains "--addr" "$c --help lists the connection flags"
  expect 2 "$c with an unknown flag" -- "$bin" $c --no-such-flag
  contains "--no-such-flag" "$c names the unknown flag"
  expect 2 "$c --timeout without a number" -- "$bin" $c --timeout abc
  contains "--timeout" "$c names the bad flag"
done
expect 2 "generate --top-p not a number" -- "$bin" generate --top-p x hello
contains "--top-p" "generate names --top-p"
expect 2 "generate --prompt-ids garbage" -- "$bin" generate --prompt-ids "1 two"
contains "two" "generate names the bad id"
expect 2 "generate --priority bad" -- "$bin" generate --priority urgent hi
expect 2 "generate with ids and text" -- "$bin" generate --prompt-ids 1 hello
expect 2 "generate empty prompt" -- "$bin" generate
contains "empty prompt" "generate with an empty stdin"

expect 2 "adapters without an action" -- "$bin" adapters
expect 2 "adapters bad action" -- "$bin" adapters frobnicate
contains "frobnicate" "adapters names the action"
expect 2 "adapters load without a path" -- "$bin" adapters load x
expect 2 "bench without a prompt" -- "$bin" bench
expect 2 "bench --duration and --requests" -- "$bin" bench -d 1 -n 1 hi
expect 2 "bench --concurrency 0" -- "$bin" bench -c 0 hi
expect 2 "batch --chunk 0" -- "$bin" batch --chunk 0
expect 3 "batch, missing input file" -- "$bin" batch "$tmp/missing.jsonl"
contains "missing.jsonl" "batch names the input file"
expect 2 "metrics --http without a port" -- "$bin" metrics --http localhost

# a batch of invalid lines only needs no daemon: each line gets its error, exit 1
printf '{"prompt": 1}\n\nnot json\n' >"$tmp/bad.jsonl"
expect 1 "batch of invalid lines" -- "$bin" batch --addr "unix:$tmp/none.sock" "$tmp/bad.jsonl"
contains '{"index":0,"error":{"code":"INVALID_ARGUMENT","message":' "batch line 0"
contains 'bad.jsonl line 3: not JSON' "batch names the line"

# nothing at this Unix socket
sock="unix:$tmp/none.sock"
expect 5 "health, no daemon (unix)" -- "$bin" health --addr "$sock"
contains "cannot reach clocherd at $sock" "health names the address"
expect 5 "generate, no daemon (unix)" -- "$bin" generate --addr "$sock" hello
contains "cannot reach clocherd at $sock" "generate names the address"
expect 5 "generate, no daemon (env)" -- env CLOCHER_ADDR="$sock" "$bin" generate hello
contains "$sock" "generate takes \$CLOCHER_ADDR"
expect 5 "health --wait, no daemon" -- "$bin" health --addr "$sock" --wait 0.5
contains "cannot reach clocherd" "health --wait says why at the end"
for c in "adapters list" metrics "bench -n 1 hi"; do
  expect 5 "$c, no daemon" -- "$bin" $c --addr "$sock"
  contains "cannot reach clocherd at $sock" "$c names the address"
done
printf '{"prompt": "x"}\n' >"$tmp/one.jsonl"
expect 5 "batch, no daemon" -- "$bin" batch --addr "$sock" "$tmp/one.jsonl"
expect 5 "health -q, no daemon" -- "$bin" health -q --addr "$sock"
[ -s "$tmp/out" ] && { echo "FAIL: health -q printed:"; cat "$tmp/out"; fails=$((fails + 1)); }

# nothing on this TCP port (bound then released: free, and nobody else's)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
expect 5 "health, no daemon (tcp)" -- "$bin" health --addr "127.0.0.1:$port"
contains "127.0.0.1:$port" "health names the TCP address"
expect 5 "metrics --http, nothing listening" -- "$bin" metrics --http "127.0.0.1:$port"
contains "127.0.0.1:$port" "metrics names the endpoint"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "offline: all checks passed"
