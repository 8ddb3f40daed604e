#!/bin/sh
# Configure a new FoundationDB database once (docker-compose.yml's fdb-init service).
# Succeeds when the database is configured now or already existed; any other failure
# (after retries while the coordinator comes up) exits non-zero, so the brokers, which
# wait for this container to complete successfully, do not start against a broken store.
CLUSTER_FILE="${FDB_CLUSTER_FILE:-/var/fdb/fdb.cluster}"
ATTEMPTS="${FDB_INIT_ATTEMPTS:-30}"
DELAY="${FDB_INIT_DELAY:-2}"
CONFIG="${FDB_INIT_CONFIG:-configure new single ssd}"

i=0
until [ -f "$CLUSTER_FILE" ]; do
    i=$((i + 1))
    if [ "$i" -ge "$ATTEMPTS" ]; then
        echo "fdb-init: no cluster file at $CLUSTER_FILE" >&2
        exit 1
    fi
    sleep "$DELAY"
done

i=0
while :; do
    i=$((i + 1))
    out=$(fdbcli -C "$CLUSTER_FILE" --timeout 30 --exec "$CONFIG" 2>&1)
    rc=$?
    echo "$out"
    if [ "$rc" -eq 0 ]; then
        case "$out" in
            *ERROR*) ;;  # some fdbcli versions exit 0 after printing an error
            *) echo "fdb-init: database configured"; exit 0 ;;
        esac
    fi
    case "$out" in
        *"already exists"*) echo "fdb-init: database already exists"; exit 0 ;;
    esac
    if [ "$i" -ge "$ATTEMPTS" ]; then
        echo "fdb-init: '$CONFIG' failed after $i attempts (exit $rc)" >&2
        exit 1
    fi
    sleep "$DELAY"
done
