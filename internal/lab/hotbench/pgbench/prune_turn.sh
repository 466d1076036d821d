#!/bin/bash
# prune_turn.sh KIND: one turn of docs/performance.md's "Outbox prune" table. The hot campaign
# (function.sql beside this file, 8 clients, campaign HOT) for 20 s, beside KIND:
#   alone   nothing
#   old     00035's prune statement back to back (the coupon row updated; shared/outbox's
#           prune_wal_test.go keeps it as prune00035, here with $1 720h and $2 1000)
#   new     couponctl outbox prune (the default pause); new250: --pause 250ms; new0: --pause 0
# The database is libpq's (PGHOST, PGPORT, PGUSER, PGDATABASE) and DATABASE_URL for couponctl,
# migrated, with a history and a campaign HOT of 1 stripe; COUPONCTL names the binary. Prints one
# line: issued/s, p50 and p99 in ms, rows pruned and per second, WAL of the turn, checkpoints,
# load. Run the kinds in alternating turns (alone old new alone old new ...).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${PG_BIN_DIR:-/usr/lib/postgresql/15/bin}
k=$1 d=20
q() { "$bin/psql" -X -q -At -c "$1"; }
closed="SELECT count(*) FROM notification_outbox WHERE sent_at IS NOT NULL OR skipped_at IS NOT NULL"
old=$(sed -n '/^const prune00035 = `/,/FROM marked`$/p' "$here/../../../../shared/outbox/prune_wal_test.go" |
  sed '1d; s/`$/;/; s/\$1::interval/'"'720h'"'::interval/; s/\$2/1000/')
n0=$(q "$closed"); l0=$(q "SELECT pg_current_wal_lsn()"); c0=$(q "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
case $k in
  alone) ;;
  old) (for _ in $(seq 1 2000); do echo "$old"; done | timeout "$d" "$bin/psql" -X -q >/dev/null 2>&1 || true) & ;;
  new) (timeout -s INT "$d" "$COUPONCTL" outbox prune --older-than 720h >/dev/null 2>&1 || true) & ;;
  new250) (timeout -s INT "$d" "$COUPONCTL" outbox prune --older-than 720h --pause 250ms >/dev/null 2>&1 || true) & ;;
  new0) (timeout -s INT "$d" "$COUPONCTL" outbox prune --older-than 720h --pause 0 >/dev/null 2>&1 || true) & ;;
  *) echo "prune_turn.sh: unknown kind $k" >&2; exit 2 ;;
esac
logs=$(mktemp -d)
out=$(cd "$logs" && "$bin/pgbench" -n -M prepared -c 8 -j 2 -T "$d" -D campaign=HOT -f "$here/function.sql" -l 2>&1)
wait
pct() { cat "$logs"/pgbench_log.* | awk '{print $3}' | sort -n | awk -v p="$1" '{a[NR]=$1} END {print a[int(NR*p)]/1000}'; }
n1=$(q "$closed"); l1=$(q "SELECT pg_current_wal_lsn()"); c1=$(q "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
wal=$(q "SELECT pg_wal_lsn_diff('$l1', '$l0')::bigint")
echo "$(date -u +%H:%M:%S) $k tps=$(echo "$out" | awk '/^tps/ {print $3; exit}') p50ms=$(pct 0.5) p99ms=$(pct 0.99)" \
  "pruned=$((n0 - n1)) pruned/s=$(((n0 - n1) / d)) wal_MB=$((wal / 1048576)) checkpoints=$((c1 - c0)) load=$(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$logs"
