#!/bin/sh
# systemd_test.sh — the unit, tmpfiles and sysusers files as installed, checked by systemd's
# own tools (Debian 12: systemd 252):
#  1. `cmake --install` into a scratch root, so /usr/sbin/clocherd and the unit are where the
#     unit says; systemd-sysusers and systemd-tmpfiles --create run against that root and the
#     user and directories must appear with the right modes;
#  2. `systemd-analyze verify` must succeed and print nothing (it only warns about unknown or
#     unparsable directives, with exit status 0);
#  3. `systemd-analyze security --offline=yes` must rate the exposure 2.0 or less;
#  4. the system-call filter must allow the NUMA calls the workers make (sched_setaffinity,
#     set_mempolicy, mbind, get_mempolicy) and memfd_create: every allow-list group must contain
#     them and no deny-list group may.
set -eu
B=${CLOCHER_BUILD_DIR:?}
S=${CLOCHER_SOURCE_DIR:?}
fail() { echo "FAIL: $*" >&2; exit 1; }
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT

cmake --install "$B" --prefix "$R/usr" >/dev/null
unit=$R/usr/lib/systemd/system/clocherd.service
[ -x "$R/usr/sbin/clocherd" ] || fail "clocherd not installed to /usr/sbin"
[ -f "$unit" ] || fail "clocherd.service not installed to /usr/lib/systemd/system"
[ -f "$R/usr/lib/tmpfiles.d/clocherd.conf" ] || fail "tmpfiles not installed"
[ -f "$R/usr/lib/sysusers.d/clocherd.conf" ] || fail "sysusers not installed"

# 1. user and directories
mkdir -p "$R/etc" "$R/bin"
systemd-sysusers --root="$R" "$R/usr/lib/sysusers.d/clocherd.conf" >/dev/null 2>&1 ||
    fail "systemd-sysusers failed"
grep -q '^clocherd:' "$R/etc/passwd" || fail "sysusers did not create the clocherd user"
systemd-tmpfiles --root="$R" --create "$R/usr/lib/tmpfiles.d/clocherd.conf" ||
    fail "systemd-tmpfiles --create failed"
for d in var/lib/clocherd var/lib/clocherd/models var/lib/clocherd/adapters etc/clocherd; do
    [ -d "$R/$d" ] || fail "tmpfiles did not create /$d"
    [ "$(stat -c %a "$R/$d")" = 750 ] || fail "/$d has mode $(stat -c %a "$R/$d"), want 750"
done

# 2. verify: the root needs systemd's own units (sysinit.target, ...) and ExecReload's kill
cp -r /lib/systemd/system/. "$R/usr/lib/systemd/system/"
cp /bin/kill "$R/bin/kill"
out=$(systemd-analyze verify --root="$R" --man=no clocherd.service 2>&1) ||
    fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify printed warnings: $out"

# 3. exposure (the threshold is in tenths)
out=$(systemd-analyze security --offline=yes --threshold=20 "$unit" 2>&1) ||
    fail "exposure above 2.0: $(echo "$out" | tail -1)"
echo "$out" | tail -1

# 4. the system-call filter lets NUMA placement and the shm rings through
need="sched_setaffinity set_mempolicy get_mempolicy mbind memfd_create"
# a group's calls, nested groups (listed as "@name") expanded
expand() {
    systemd-analyze syscall-filter "$1" | sed -n '2,$s/^ *\([@a-z_0-9-]*\)$/\1/p' | while read -r x; do
        case $x in @*) expand "$x" ;; *) echo "$x" ;; esac
    done
}
grep -q '^SystemCallFilter=' "$unit" || fail "no SystemCallFilter= in the unit"
sed -n 's/^SystemCallFilter=//p' "$unit" | while read -r line; do
    case $line in
    "~"*)
        for g in ${line#\~}; do
            calls=$(expand "$g")
            for c in $need; do
                if echo "$calls" | grep -qx "$c"; then fail "SystemCallFilter=~$g denies $c"; fi
            done
        done ;;
    *)
        calls=$(for g in $line; do expand "$g"; done)
        for c in $need; do
            echo "$calls" | grep -qx "$c" || fail "SystemCallFilter=$line does not allow $c"
        done ;;
    esac
done
echo "systemd files: ok"
