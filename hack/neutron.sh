#!/usr/bin/env bash
# Runs a real OpenStack Neutron API server on 127.0.0.1, without Keystone,
# message queue or agents, so that the neutron backend is tested against the
# real API rather than a fake of it.
#
#   hack/neutron.sh start [--fresh] [STATE_DIR]
#   hack/neutron.sh stop [STATE_DIR]
#
# start installs Debian's python3-neutron if it is missing, starts the server
# with its configuration, SQLite database and logs in STATE_DIR (default
# /tmp/netop-neutron), waits until it answers and prints exactly one line,
# NEUTRON_URL=http://127.0.0.1:PORT/, on stdout; everything else goes to
# stderr. A STATE_DIR that already has a database is started again on the
# same database and port (for outage tests), unless --fresh is given.
# NEUTRON_PORT chooses the port of a fresh start; by default the kernel
# picks a free one. If the server of STATE_DIR is already running, start
# only prints its URL. With NEUTRON_WATCH_PID set, the server is stopped
# once that process is gone (test binaries set it to their own pid).
#
# stop kills the server and its worker processes and waits for them to be
# gone. It is idempotent.
#
# SQLite cannot run Neutron's migrations, so the schema is made from the
# models, as Neutron's own unit tests do; that template is built once per
# package version under NETOP_NEUTRON_CACHE (default /var/cache/netop-neutron)
# and copied for each fresh start.
set -euo pipefail

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/$(basename "${BASH_SOURCE[0]}")"
readonly SCRIPT
readonly PY=/usr/bin/python3
readonly DEFAULT_STATE_DIR=/tmp/netop-neutron
readonly CACHE_DIR="${NETOP_NEUTRON_CACHE:-/var/cache/netop-neutron}"
readonly READY_TIMEOUT=60
readonly STOP_TIMEOUT=15

log() { printf 'neutron.sh: %s\n' "$*" >&2; }
die() {
	printf 'neutron.sh: error: %s\n' "$*" >&2
	exit 1
}
usage() {
	printf 'usage: %s start [--fresh] [STATE_DIR] | stop [STATE_DIR]\n' "$0" >&2
	exit 2
}

# neutron_installed is true when python3-neutron is installed and importable
# by the system python.
neutron_installed() {
	[[ "$(dpkg-query -W -f='${Status}' python3-neutron 2>/dev/null || true)" == "install ok installed" ]] &&
		"$PY" -c 'import neutron' 2>/dev/null
}

install_neutron() {
	if neutron_installed; then
		return 0
	fi
	[[ "$(id -u)" == 0 ]] || die "python3-neutron is not installed and installing it needs root (apt-get install --no-install-recommends python3-neutron)"
	command -v apt-get >/dev/null || die "python3-neutron is not installed and there is no apt-get to install it"
	mkdir -p "$CACHE_DIR"
	# Test binaries start servers in parallel: one installs, the others wait.
	exec {lock}>"$CACHE_DIR/install.lock"
	flock "$lock"
	if neutron_installed; then
		exec {lock}>&-
		return 0
	fi
	log "installing python3-neutron with apt (about a minute, once)"
	export DEBIAN_FRONTEND=noninteractive
	local attempt updated=0
	local -a apt=(apt-get -q -o DPkg::Lock::Timeout=120 -o Acquire::Retries=3)
	for attempt in 1 2 3; do
		# Package lists that already know python3-neutron spare the update
		# on the first attempt; stale ones make it fail and update next.
		if [[ "$updated" == 0 ]] && { ((attempt > 1)) || ! apt-cache show python3-neutron >/dev/null 2>&1; }; then
			if "${apt[@]}" update >&2; then
				updated=1
			else
				log "apt-get update failed (attempt $attempt of 3)"
				sleep 3
				continue
			fi
		fi
		# A concurrent apt run elsewhere on the machine can make dpkg fail
		# with "cannot stat .deb"; another attempt then succeeds. No fsync
		# for each file: a crash mid-install is repaired by the next one.
		if "${apt[@]}" -o Dpkg::Options::=--force-unsafe-io install -y --no-install-recommends python3-neutron >&2; then
			break
		fi
		log "apt-get install python3-neutron failed (attempt $attempt of 3)"
		sleep 3
	done
	exec {lock}>&-
	neutron_installed || die "could not install python3-neutron with apt-get (see the apt output above)"
}

# template_db prints the path of the empty database of this neutron
# version, building it first if needed.
template_db() {
	local version dir db tmp
	version="$(dpkg-query -W -f='${Version}' python3-neutron)"
	dir="$CACHE_DIR/${version//[^A-Za-z0-9.+~-]/_}"
	db="$dir/neutron.sqlite"
	if [[ -s "$db" ]]; then
		printf '%s\n' "$db"
		return 0
	fi
	mkdir -p "$dir"
	exec {lock}>"$dir/build.lock"
	flock "$lock"
	if [[ ! -s "$db" ]]; then
		log "building the database schema for neutron $version (once)"
		tmp="$(mktemp "$dir/neutron.sqlite.XXXXXX")"
		if ! "$PY" - "$tmp" >&2 <<'EOF'; then
import sys
import sqlalchemy
from neutron.db.migration.models import head
engine = sqlalchemy.create_engine("sqlite:///" + sys.argv[1])
head.get_metadata().create_all(engine)
engine.dispose()
EOF
			rm -f "$tmp"
			die "could not create the Neutron database schema"
		fi
		chmod 0644 "$tmp"
		mv -f "$tmp" "$db"
	fi
	exec {lock}>&-
	printf '%s\n' "$db"
}

# listen_port prints the TCP port that process pid listens on, if any. It
# reads /proc rather than relying on ss, which minimal images lack.
listen_port() {
	"$PY" - "$1" <<'EOF' 2>/dev/null || true
import os, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
with open(f"/proc/{pid}/net/tcp") as f:
    for line in f.readlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            print(int(fields[1].split(":")[1], 16))
            break
EOF
}

# port_taken is true when something listens on 127.0.0.1:port.
port_taken() {
	! "$PY" -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

write_config() {
	local dir="$1" port="$2"
	mkdir -p "$dir/state" "$dir/lock"
	cat >"$dir/neutron.conf" <<EOF
[DEFAULT]
bind_host = 127.0.0.1
bind_port = $port
auth_strategy = noauth
core_plugin = ml2
service_plugins =
api_paste_config = $dir/api-paste.ini
state_path = $dir/state
transport_url = fake://
api_workers = 0
rpc_workers = 0
rpc_state_report_workers = 0
dhcp_agent_notification = false
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
# SQLite locks the whole database: concurrent requests end in "database is
# locked" after a long hang, so requests are served one at a time. With a
# single green thread, a client's idle keep-alive connection would hold it
# and starve every other connection until client_socket_timeout (900 s):
# close each connection after its response instead.
wsgi_default_pool_size = 1
wsgi_keep_alive = false
debug = false
use_stderr = true

[database]
connection = sqlite:///$dir/neutron.sqlite

[oslo_concurrency]
lock_path = $dir/lock

[oslo_policy]
enforce_scope = false
enforce_new_defaults = false

[quotas]
quota_network = -1
quota_subnet = -1
quota_port = -1
EOF
	cat >"$dir/ml2_conf.ini" <<'EOF'
[ml2]
type_drivers = local,flat,vlan,vxlan
tenant_network_types = vxlan
mechanism_drivers =
extension_drivers = port_security

[ml2_type_vxlan]
vni_ranges = 1:10000
EOF
	# Debian ships no api-paste.ini outside neutron-server: these are the
	# stock pipelines without authtoken (there is no Keystone).
	cat >"$dir/api-paste.ini" <<'EOF'
[composite:neutron]
use = egg:Paste#urlmap
/: neutronversions_composite
/v2.0: neutronapi_v2_0

[composite:neutronapi_v2_0]
use = call:neutron.auth:pipeline_factory
noauth = cors http_proxy_to_wsgi request_id catch_errors extensions neutronapiapp_v2_0
keystone = cors http_proxy_to_wsgi request_id catch_errors keystonecontext extensions neutronapiapp_v2_0

[composite:neutronversions_composite]
use = call:neutron.auth:pipeline_factory
noauth = cors http_proxy_to_wsgi neutronversions
keystone = cors http_proxy_to_wsgi neutronversions

[filter:request_id]
paste.filter_factory = oslo_middleware:RequestId.factory

[filter:catch_errors]
paste.filter_factory = oslo_middleware:CatchErrors.factory

[filter:cors]
paste.filter_factory = oslo_middleware.cors:filter_factory
oslo_config_project = neutron

[filter:http_proxy_to_wsgi]
paste.filter_factory = oslo_middleware.http_proxy_to_wsgi:HTTPProxyToWSGI.factory

[filter:keystonecontext]
paste.filter_factory = neutron.auth:NeutronKeystoneContext.factory

[filter:extensions]
paste.filter_factory = neutron.api.extensions:plugin_aware_extension_middleware_factory

[app:neutronversions]
paste.app_factory = neutron.pecan_wsgi.app:versions_factory

[app:neutronapiapp_v2_0]
paste.app_factory = neutron.api.v2.router:APIRouter.factory
EOF
}

# server_pid prints the pid recorded in dir if that process is still the
# server of dir: a stale pid may since belong to something else.
server_pid() {
	local dir="$1" pid
	[[ -s "$dir/neutron-server.pid" ]] || return 1
	pid="$(<"$dir/neutron-server.pid")"
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	[[ -r "/proc/$pid/cmdline" ]] || return 1
	local cmdline
	cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
	[[ "$cmdline" == *"$dir/neutron.conf"* ]] || return 1
	printf '%s\n' "$pid"
}

# answers is true when Neutron on port answers an API request.
answers() {
	"$PY" -c 'import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2.0/networks?limit=1", timeout=5) as r:
    sys.exit(r.status != 200)' "$1" 2>/dev/null
}

cmd_start() {
	local fresh=0 dir=""
	while (($#)); do
		case "$1" in
		--fresh) fresh=1 ;;
		-*) usage ;;
		*)
			[[ -z "$dir" ]] || usage
			dir="$1"
			;;
		esac
		shift
	done
	dir="${dir:-$DEFAULT_STATE_DIR}"
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd -P)"

	install_neutron

	local pid port
	if pid="$(server_pid "$dir")"; then
		port="$(<"$dir/port")"
		if [[ "$(listen_port "$pid")" == "$port" ]] && answers "$port"; then
			log "already running (pid $pid)"
			printf 'NEUTRON_URL=http://127.0.0.1:%s/\n' "$port"
			return 0
		fi
		log "server pid $pid does not answer: restarting it"
		cmd_stop "$dir"
	fi

	if [[ "$fresh" == 1 || ! -s "$dir/neutron.sqlite" || ! -s "$dir/port" ]]; then
		local db
		db="$(template_db)"
		cp -f "$db" "$dir/neutron.sqlite"
		# Port 0: the kernel picks a free port as the server binds, so
		# servers started at once never race for one.
		port="${NEUTRON_PORT:-0}"
	else
		port="$(<"$dir/port")"
		log "reusing the database and port $port of $dir"
	fi
	[[ "$port" =~ ^[0-9]+$ ]] || die "bad port '$port'"
	write_config "$dir" "$port"

	local logfile="$dir/neutron-server.log"
	printf -- '---- %s: neutron.sh start\n' "$(date '+%F %T')" >>"$logfile"
	# Its own session and process group, so that stop kills the workers it
	# forks too; no inherited stdout, so that a caller reading ours sees EOF.
	setsid "$PY" -c 'import sys; from neutron.cmd.eventlet.server import main; sys.argv[0] = "neutron-server"; sys.exit(main())' \
		--config-file "$dir/neutron.conf" --config-file "$dir/ml2_conf.ini" \
		</dev/null >>"$logfile" 2>&1 &
	pid=$!
	printf '%s\n' "$pid" >"$dir/neutron-server.pid"

	# Only an answer from a port that this server listens on counts: with
	# a fixed port, another process may hold it.
	local deadline=$((SECONDS + READY_TIMEOUT)) actual=""
	until [[ -n "$actual" ]] && answers "$actual"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			start_failed "$dir" "$port" "neutron-server exited during start-up"
		fi
		if ((SECONDS >= deadline)); then
			start_failed "$dir" "$port" "neutron-server did not answer within ${READY_TIMEOUT}s"
		fi
		sleep 0.2
		actual="$(listen_port "$pid")"
		if [[ -n "$actual" && "$port" != 0 && "$actual" != "$port" ]]; then
			cmd_stop "$dir"
			die "neutron-server listens on port $actual, not $port"
		fi
	done
	port="$actual"
	printf '%s\n' "$port" >"$dir/port"
	log "neutron-server pid $pid ready on 127.0.0.1:$port (log: $logfile)"
	if [[ -n "${NEUTRON_WATCH_PID:-}" ]]; then
		start_watcher "$dir" "$NEUTRON_WATCH_PID"
	fi
	printf 'NEUTRON_URL=http://127.0.0.1:%s/\n' "$port"
}

# start_failed reports why a start failed, leaving no process behind.
start_failed() {
	local dir="$1" port="$2" msg="$3"
	tail -n 30 "$dir/neutron-server.log" >&2 || true
	cmd_stop "$dir"
	if [[ "$port" != 0 ]] && port_taken "$port"; then
		msg="$msg: another process listens on 127.0.0.1:$port"
	fi
	die "$msg (log: $dir/neutron-server.log)"
}

# start_watcher stops the server of dir once process wpid is gone, so that
# a test binary killed by its timeout does not leave a server behind.
start_watcher() {
	local dir="$1" wpid="$2"
	[[ "$wpid" =~ ^[0-9]+$ ]] || die "NEUTRON_WATCH_PID '$wpid' is not a pid"
	stop_watcher "$dir"
	setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done; exec bash "$2" stop "$3"' \
		neutron-watch "$wpid" "$SCRIPT" "$dir" </dev/null >>"$dir/neutron-server.log" 2>&1 &
	printf '%s\n' "$!" >"$dir/watcher.pid"
}

stop_watcher() {
	local dir="$1" wpid cmdline
	[[ -s "$dir/watcher.pid" ]] || return 0
	wpid="$(<"$dir/watcher.pid")"
	rm -f "$dir/watcher.pid"
	# Not when the watcher itself runs stop.
	[[ "$wpid" =~ ^[0-9]+$ && "$wpid" != "$$" ]] || return 0
	cmdline="$(tr '\0' ' ' <"/proc/$wpid/cmdline" 2>/dev/null || true)"
	[[ "$cmdline" == *" $dir "* ]] || return 0
	kill -TERM "$wpid" 2>/dev/null || true
}

# group_alive is true while a process of process group $1 remains, not
# counting zombies, which only wait for their parent to reap them. It reads
# /proc rather than relying on procps, which minimal images lack.
group_alive() {
	local f stat state pgid
	for f in /proc/[0-9]*/stat; do
		read -r stat 2>/dev/null <"$f" || continue
		# The command name, in parentheses, may contain spaces.
		read -r state _ pgid _ <<<"${stat##*) }"
		[[ "$pgid" == "$1" && "$state" != Z ]] && return 0
	done
	return 1
}

cmd_stop() {
	(($# <= 1)) || usage
	local dir="${1:-$DEFAULT_STATE_DIR}"
	[[ -d "$dir" ]] || return 0
	dir="$(cd "$dir" && pwd -P)"
	stop_watcher "$dir"
	local pid
	if ! pid="$(server_pid "$dir")"; then
		rm -f "$dir/neutron-server.pid"
		return 0
	fi
	# setsid made the server the leader of its own process group, which its
	# workers share.
	kill -TERM -- "-$pid" 2>/dev/null || true
	local deadline=$((SECONDS + STOP_TIMEOUT))
	while group_alive "$pid"; do
		if ((SECONDS >= deadline)); then
			log "neutron-server pid $pid did not stop within ${STOP_TIMEOUT}s: killing it"
			kill -KILL -- "-$pid" 2>/dev/null || true
			sleep 0.5
			group_alive "$pid" && die "could not kill process group $pid"
			break
		fi
		sleep 0.1
	done
	rm -f "$dir/neutron-server.pid"
	log "stopped neutron-server pid $pid"
}

main() {
	(($# >= 1)) || usage
	case "$1" in
	start)
		shift
		cmd_start "$@"
		;;
	stop)
		shift
		cmd_stop "$@"
		;;
	*) usage ;;
	esac
}

# Sourcing the script defines its functions only, for testing them.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	main "$@"
fi
