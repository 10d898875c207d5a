#!/usr/bin/env bash
# A Spark standalone cluster on this one machine whose workers are separate hosts.
#
# Each worker runs in a Linux network namespace of its own, with its own address on a
# bridge (veth pairs), so that what tasks send each other really crosses interfaces. The
# master (and the driver that submits to it) is on the bridge's own address, in this
# machine's namespace. Files are shared: every "host" sees the same file system, so a
# checkpoint directory under /tmp is a shared path.
#
#   scripts/cluster.sh up            start the master and the workers, wait until all registered
#   scripts/cluster.sh down          kill everything, remove the namespaces, the bridge, the files
#   scripts/cluster.sh status        what is running
#   scripts/cluster.sh env           MASTER=..., DRIVER_HOST=..., WORKERS=... (for scripts)
#   scripts/cluster.sh kill-worker N|ADDRESS    lose a worker host: SIGKILL every process on it
#   scripts/cluster.sh start-worker N|ADDRESS   start a lost worker again
#   scripts/cluster.sh cut-link N|ADDRESS       lose a worker host's link (its processes live on)
#   scripts/cluster.sh heal-link N|ADDRESS      give it back
#
# Settings (environment variables):
#   CUTLINE_CLUSTER_NAME     prefix of the bridge and namespace names  (default: cutline)
#   CUTLINE_CLUSTER_SUBNET   the /24 on the bridge: .1 is the master, .11, .12, ... the workers
#                            (default: 10.77.0)
#   CUTLINE_CLUSTER_WORKERS  number of workers (default: 3)
#   CUTLINE_CLUSTER_CORES    task slots per worker (default: 1)
#   CUTLINE_CLUSTER_MEMORY   memory per worker for executors (default: 1g)
#   CUTLINE_CLUSTER_DIR      logs, process ids, work directories
#                            (default: /tmp/cutline-cluster-NAME)
#   PYTHON                   the Python whose PySpark is started (default: .venv/bin/python)
#
# Needs Linux, iproute2 and root (CAP_NET_ADMIN and CAP_SYS_ADMIN): `up` refuses with a
# message, exit code 3, where network namespaces cannot be made.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${CUTLINE_CLUSTER_NAME:-cutline}"
subnet="${CUTLINE_CLUSTER_SUBNET:-10.77.0}"
workers="${CUTLINE_CLUSTER_WORKERS:-3}"
cores="${CUTLINE_CLUSTER_CORES:-1}"
memory="${CUTLINE_CLUSTER_MEMORY:-1g}"
dir="${CUTLINE_CLUSTER_DIR:-/tmp/cutline-cluster-$name}"
python="${PYTHON:-$here/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3 || true)"

bridge="${name}-br"
marker=".cutline-cluster"
master_ip="$subnet.1"
master_port=7077
master_ui=8080

say() { echo "cluster: $*" >&2; }
die() { say "$1"; exit "${2:-1}"; }

check_names() {
    [[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] \
        || die "CUTLINE_CLUSTER_NAME must be 1-8 lower-case letters or digits, not '$name'" 2
    [[ "$subnet" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] \
        || die "CUTLINE_CLUSTER_SUBNET must be the first three numbers of a /24 (e.g. 10.77.0), not '$subnet'" 2
    [[ "$workers" =~ ^[1-9]$ ]] || die "CUTLINE_CLUSTER_WORKERS must be 1 to 9, not '$workers'" 2
    [[ "$cores" =~ ^[1-9][0-9]?$ ]] || die "CUTLINE_CLUSTER_CORES must be 1 to 99, not '$cores'" 2
}

# The namespace, the host-side veth and the address of worker $1 (1-based).
ns_of() { echo "${name}-w$1"; }
veth_of() { echo "${name}-v$1"; }
ip_of() { echo "$subnet.$((10 + $1))"; }

# Worker number from "N" or an address.
worker_arg() {
    local arg="${1:-}" i
    [[ -n "$arg" ]] || die "which worker? give its number (1..$workers) or its address" 2
    for ((i = 1; i <= 9; i++)); do
        if [[ "$arg" == "$i" || "$arg" == "$(ip_of "$i")" ]]; then
            ip netns list 2>/dev/null | grep -qw "^$(ns_of "$i")" \
                || die "there is no worker $arg in cluster '$name' (is it up?)" 2
            echo "$i"
            return
        fi
    done
    die "there is no worker '$arg': give its number (1..$workers) or its address ($(ip_of 1), ...)" 2
}

preflight() {
    [[ "$(uname -s)" == Linux ]] \
        || die "network namespaces are not available: this is $(uname -s), and the test cluster needs Linux (ip netns)" 3
    command -v ip >/dev/null \
        || die "network namespaces are not available: the 'ip' command (iproute2) is missing; install it (apt-get install iproute2)" 3
    local probe="${name}-probe$$" out
    if ! out="$(ip netns add "$probe" 2>&1)"; then
        die "network namespaces are not available here: 'ip netns add' failed: ${out}. The test cluster needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), e.g. sudo scripts/cluster.sh up" 3
    fi
    ip netns del "$probe"
    local version=""
    command -v java >/dev/null \
        || die "Spark needs Java 17 or newer, and there is no java here; see the README" 3
    version="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1 || true)"
    [[ -n "$version" && "$version" -ge 17 ]] \
        || die "Spark needs Java 17 or newer (found: ${version:-none}); see the README" 3
    [[ -n "$python" ]] || die "no Python found: run 'make test' or 'make demo' first (they create .venv)" 3
    spark_home="$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" \
        || die "$python cannot import pyspark: run 'make test' or 'make demo' first (they create .venv), or set PYTHON" 3
}

# Start a Spark daemon class in namespace $1 ("" = this one) with SPARK_LOCAL_IP $2; log to $3.
start_daemon() {
    local ns="$1" local_ip="$2" log="$3"
    shift 3
    local run=()
    [[ -n "$ns" ]] && run=(ip netns exec "$ns")
    # (the daemons start faster with the client compiler and one GC thread: a test cluster)
    env SPARK_HOME="$spark_home" SPARK_LOCAL_IP="$local_ip" SPARK_CONF_DIR="$dir/conf" \
        SPARK_NO_DAEMONIZE=1 PYSPARK_PYTHON="$python" \
        SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}" \
        "${run[@]}" setsid "$spark_home/bin/spark-class" "$@" >"$log" 2>&1 </dev/null &
    echo $!
}

wait_for_port() {  # host port seconds
    local deadline=$((SECONDS + $3))
    until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# Workers that registered with the master since it started (from its log).
registered_workers() {
    local n=0
    n="$(grep -c "Registering worker" "$dir/master/master.log" 2>/dev/null)" || true
    echo "${n:-0}"
}

# The files of the cluster, and only if they are ours (the marker file says so).
remove_dir() {
    if [[ -e "$dir/$marker" ]]; then
        rm -rf "$dir"
    elif [[ -d "$dir" ]]; then
        rmdir "$dir" 2>/dev/null || true
    fi
}

alive_workers() {
    "$python" - "$master_ip" "$master_ui" <<'PY' 2>/dev/null || echo 0
import json, sys, urllib.request
with urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/json/", timeout=2) as answer:
    print(json.load(answer).get("aliveworkers", 0))
PY
}

start_worker() {
    local i="$1" ns ip
    ns="$(ns_of "$i")"
    ip="$(ip_of "$i")"
    mkdir -p "$dir/w$i/work"
    start_daemon "$ns" "$ip" "$dir/w$i/worker.log" org.apache.spark.deploy.worker.Worker \
        --host "$ip" --cores "$cores" --memory "$memory" --work-dir "$dir/w$i/work" \
        --webui-port 8081 "spark://$master_ip:$master_port" >"$dir/w$i/pid"
}

cmd_up() {
    check_names
    preflight
    if ip link show "$bridge" >/dev/null 2>&1; then
        die "cluster '$name' is already up (scripts/cluster.sh down first)" 2
    fi
    if [[ -e "$dir" && ! -e "$dir/$marker" && -n "$(ls -A "$dir" 2>/dev/null)" ]]; then
        die "$dir holds files that are not a test cluster's: set CUTLINE_CLUSTER_DIR to an empty or new directory" 2
    fi
    trap 'say "setting up failed; tearing down"; cmd_down >/dev/null 2>&1 || true' ERR
    trap 'say "interrupted; tearing down"; cmd_down >/dev/null 2>&1 || true; exit 130' INT TERM
    remove_dir
    mkdir -p "$dir/conf" "$dir/master"
    touch "$dir/$marker"
    # Spark's log lines go to each daemon's log file, at WARN
    cat >"$dir/conf/log4j2.properties" <<'CONF'
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.master.name = org.apache.spark.deploy.master.Master
logger.master.level = info
logger.worker.name = org.apache.spark.deploy.worker.Worker
logger.worker.level = info
CONF
    ip link add "$bridge" type bridge
    ip addr add "$master_ip/24" dev "$bridge"
    ip link set "$bridge" up
    local i ns veth
    for ((i = 1; i <= workers; i++)); do
        ns="$(ns_of "$i")"
        veth="$(veth_of "$i")"
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$bridge" up
        ip -n "$ns" addr add "$(ip_of "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$master_ip"
        # `ip netns exec` shows /etc/netns/NS/* in place of /etc/*: the host's own name and
        # address, and a resolver that fails at once (there is no DNS server on the bridge;
        # Java's look-up of the machine's name would otherwise wait 10 s for one)
        mkdir -p "/etc/netns/$ns"
        printf '127.0.0.1 localhost\n::1 localhost\n%s %s %s\n' \
            "$(ip_of "$i")" "$(hostname)" "$ns" >"/etc/netns/$ns/hosts"
        printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
    done
    start_daemon "" "$master_ip" "$dir/master/master.log" org.apache.spark.deploy.master.Master \
        --host "$master_ip" --port "$master_port" --webui-port "$master_ui" >"$dir/master/pid"
    wait_for_port "$master_ip" "$master_port" 60 \
        || { tail -n 20 "$dir/master/master.log" >&2; false; }
    for ((i = 1; i <= workers; i++)); do
        start_worker "$i"
    done
    local deadline=$((SECONDS + 120)) alive=0
    while alive="$(registered_workers)"; ((alive < workers)); do
        if ((SECONDS >= deadline)); then
            say "only $alive of $workers workers registered within 120 s; their logs:"
            for ((i = 1; i <= workers; i++)); do tail -n 10 "$dir/w$i/worker.log" >&2; done
            false
        fi
        sleep 0.5
    done
    trap - ERR INT TERM
    cmd_env | tee "$dir/cluster.env"
    say "up: master spark://$master_ip:$master_port, $workers workers with $cores slot(s) each"
}

cmd_env() {
    local list=() i
    for ((i = 1; i <= workers; i++)); do list+=("$(ip_of "$i")"); done
    echo "MASTER=spark://$master_ip:$master_port"
    echo "DRIVER_HOST=$master_ip"
    echo "WORKERS=$(IFS=,; echo "${list[*]}")"
    echo "CLUSTER_DIR=$dir"
}

kill_namespace() {
    local pids
    pids="$(ip netns pids "$1" 2>/dev/null || true)"
    [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
}

cmd_down() {
    check_names
    local i ns pid deadline
    for ((i = 1; i <= 9; i++)); do kill_namespace "$(ns_of "$i")"; done
    if [[ -f "$dir/master/pid" ]]; then
        pid="$(cat "$dir/master/pid")"
        # (only if it still is our master: a pid may have been reused since)
        if grep -qa "deploy.master.Master" "/proc/$pid/cmdline" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    for ((i = 1; i <= 9; i++)); do
        ns="$(ns_of "$i")"
        ip netns list 2>/dev/null | grep -qw "^$ns" || { ip link del "$(veth_of "$i")" 2>/dev/null || true; continue; }
        # a process that was forking while we killed may have been missed: until none is left
        deadline=$((SECONDS + 10))
        while [[ -n "$(ip netns pids "$ns" 2>/dev/null)" ]] && ((SECONDS < deadline)); do
            kill_namespace "$ns"
            sleep 0.1
        done
        # the pair goes with its host side (the kernel may keep an emptied namespace a while)
        ip link del "$(veth_of "$i")" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    for ((i = 1; i <= 9; i++)); do rm -rf "/etc/netns/$(ns_of "$i")"; done
    ip link del "$bridge" 2>/dev/null || true
    remove_dir
    say "down: cluster '$name' removed"
}

cmd_status() {
    check_names
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        echo "cluster '$name' is down"
        return 0
    fi
    echo "master spark://$master_ip:$master_port (ui http://$master_ip:$master_ui)"
    local i n ns link
    for ((i = 1; i <= 9; i++)); do
        ns="$(ns_of "$i")"
        ip netns list | grep -qw "^$ns" || continue
        n="$(ip netns pids "$ns" | wc -l)"
        link="$(ip -br link show "$(veth_of "$i")" 2>/dev/null | awk '{print $2}' || true)"
        echo "worker $i  $(ip_of "$i")  namespace $ns  link $link  processes $n"
    done
    echo "alive workers registered with the master: $(alive_workers)"
}

command="${1:-}"
shift || true
case "$command" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) check_names; cmd_env ;;
    kill-worker)
        check_names
        i="$(worker_arg "${1:-}")"
        kill_namespace "$(ns_of "$i")"
        say "worker $i ($(ip_of "$i")) lost: every process on it killed"
        ;;
    start-worker)
        check_names
        preflight
        i="$(worker_arg "${1:-}")"
        kill_namespace "$(ns_of "$i")"
        start_worker "$i"
        say "worker $i ($(ip_of "$i")) started"
        ;;
    cut-link)
        check_names
        i="$(worker_arg "${1:-}")"
        ip link set "$(veth_of "$i")" down
        say "worker $i ($(ip_of "$i")) cut off: its link is down"
        ;;
    heal-link)
        check_names
        i="$(worker_arg "${1:-}")"
        ip link set "$(veth_of "$i")" up
        say "worker $i ($(ip_of "$i")) link up again"
        ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
