#!/bin/sh
# The `cargo xtask vmtest --systemd` suite, run by vmtest.service once
# systemd (PID 1) reached multi-user.target: installs the .deb as a user
# would, starts hostprof.service as shipped (its hardening untouched; only
# shorter intervals through /etc/hostprof/hostprof.env, the documented place
# for local settings), and prints one `VMTEST check=NAME key=value ...
# detail=TEXT` line per check on the console; xtask judges them. Powers off.
say() { echo "VMTEST $*"; }
sink=/run/otlp-sink.log
# requests: how many export requests with samples the sink received.
requests() { awk '$1 == "request" && $3 > 0 { n++ } END { print n + 0 }' "$sink" 2>/dev/null || echo 0; }
# wait_until SECONDS COMMAND...: until COMMAND succeeds, polling.
wait_until() {
    limit=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -ge "$limit" ] && return 1
        sleep 0.2
    done
}
# prog_ids FILE: the ids of the loaded BPF programs, sorted, into FILE.
prog_ids() { bpftool prog show 2>/dev/null | sed -n 's/^\([0-9]*\): .*/\1/p' | sort >"$1"; }
journal() { journalctl -q -o cat -u hostprof.service; }

say boot kernel=$(uname -r) systemd=$(systemctl --version | sed -n '1s/systemd \([0-9]*\).*/\1/p') state=$(systemctl is-system-running)

dpkg -i /root/hostprof.deb >/run/dpkg.log 2>&1
rc=$?
say check=install exit=$rc detail="$(tail -n 1 /run/dpkg.log)"
cat >>/etc/hostprof/hostprof.env <<'EOF'
HOSTPROF_REPORT_INTERVAL=3
HOSTPROF_STATUS_INTERVAL=3
EOF
systemctl daemon-reload

# A CPU-bound workload, so there are samples; the receiver listens where
# the shipped hostprof.env points (localhost:4317).
/usr/local/bin/otlp_spin 600 &
systemctl start otlp-sink.service
prog_ids /run/progs.before
systemctl start hostprof.service
rc=$?
# TCG is slow: loading and verifying the programs takes a minute or more.
wait_until 300 sh -c "[ \$(awk '\$1 == \"request\" && \$3 > 0' $sink | wc -l) -ge 2 ]"
pid=$(systemctl show -p MainPID --value hostprof.service)
# The agent's own words, for the console log (not parsed).
journal | tail -n 25 | sed 's/^/[hostprof.service] /'
systemctl status --no-pager hostprof.service 2>&1 | tail -n 5 | sed 's/^/[status] /'
say check=start exit=$rc active=$(systemctl is-active hostprof.service) requests=$(requests) detail="$(journal | tail -n 1)"

# The hardening in force on the running agent, once it dropped what it
# needs only for setup: its capability sets, its read-only view of /, its
# private /tmp and /dev, its cgroup's memory limit.
wait_until 60 sh -c "journalctl -q -o cat -u hostprof.service | grep -q 'setup done'"
status=/proc/$pid/status
capbnd=$(sed -n 's/^CapBnd:\t//p' $status)
capeff=$(sed -n 's/^CapEff:\t//p' $status)
root_ro=$(awk '$5 == "/" { print ($6 ~ /(^|,)ro(,|$)/) ? 1 : 0; exit }' /proc/$pid/mountinfo)
tmp_private=$(awk '$5 == "/tmp" { found = 1 } END { print found + 0 }' /proc/$pid/mountinfo)
dev_private=$([ "$(ls /proc/$pid/root/dev | wc -l)" -lt "$(ls /dev | wc -l)" ] && echo 1 || echo 0)
cgroup=$(sed -n 's/^0:://p' /proc/$pid/cgroup)
memory_max=$(cat /sys/fs/cgroup$cgroup/memory.max 2>/dev/null || echo "none:$cgroup")
mdwe=$(systemctl show -p MemoryDenyWriteExecute --value hostprof.service)
say check=hardening capbnd=$capbnd capeff=$capeff root_ro=$root_ro tmp_private=$tmp_private dev_private=$dev_private memory_max=$memory_max mdwe=$mdwe protect_system=$(systemctl show -p ProtectSystem --value hostprof.service)

wait_until 60 sh -c "journalctl -q -o cat -u hostprof.service | grep -q 'status samples='"
say check=journal status_lines=$(journal | grep -c 'status samples=') detail="$(journal | grep 'status samples=' | tail -n 1)"

prog_ids /run/progs.during
# Loaded since hostprof started: its programs (and systemd's device filter
# for the unit's PrivateDevices).
comm -13 /run/progs.before /run/progs.during >/run/progs.ours
sent=$(requests)
systemctl stop hostprof.service
rc=$?
prog_ids /run/progs.after
left=$(comm -12 /run/progs.ours /run/progs.after | wc -l)
# The agent's last line: exported N requests ... dropped M.
last=$(journal | grep 'hostprof agent stopped' | tail -n 1)
exported=$(printf '%s' "$last" | sed -n 's/.*exported \([0-9]*\) requests.*/\1/p')
dropped=$(printf '%s' "$last" | sed -n 's/.*dropped \([0-9]*\).*/\1/p')
received=$(awk '$1 == "request"' $sink | wc -l)
say check=stop exit=$rc result=$(systemctl show -p Result --value hostprof.service) before_stop=$sent after_stop=$(requests) exported=${exported:-0} received=$received dropped=${dropped:-0} programs=$(wc -l </run/progs.ours) left=$left detail="$last"

systemctl --force --force poweroff
