#!/usr/bin/env bash
# Issue 23's queue measurement: 20 tiny CPU entries (tests/fixtures/entries.py) reproduced on the
# single-node Slurm (scripts/slurm_single_node.sh start, as root), the queue stopped with SIGTERM after
# KILL_AFTER run records and started again; prints where the figures are.
#
#   scripts/measure_queue.sh [WORK_DIR] [KILL_AFTER]     # defaults: /var/tmp/pgolf-queue-measure 27
#
# Outputs under WORK_DIR: entries/, data/, out/ledger.jsonl, ledger_at_kill.jsonl, q1.out/q1.err (the
# first queue, killed), q2.out/q2.err (the restart: the verdicts, the summary and the chain).
set -u
Q="${1:-/var/tmp/pgolf-queue-measure}"; KILL_AFTER="${2:-27}"
cd "$(dirname "$0")/.."
export PATH="${PGOLF_SLURM_DIR:-/var/tmp/pgolf-slurm}/bin:$PATH"
mkdir -p "$Q"
python -c "
from data.build import build_dataset
from data.embedded import embedded_documents
docs = [d[:4000] for d in embedded_documents()[:40]]
build_dataset(docs, '$Q/data', val_docs=4, tokenizer='byte260', shard_tokens=50_000, overwrite=True)" >/dev/null
[ -d "$Q/entries" ] || python -m tests.fixtures.entries "$Q/entries" --data "$Q/data" >"$Q/entries.txt"
queue() { python -m harness.cli queue "$Q/entries" --executor slurm --cpus 1 --time-min 20 --data "$Q/data" --out "$Q/out"; }
t1=$(date +%s)
queue >"$Q/q1.out" 2>"$Q/q1.err" &
qp=$!
while kill -0 "$qp" 2>/dev/null; do
  n=$(grep -c '"pg-repro-run"' "$Q/out/ledger.jsonl" 2>/dev/null); n=${n:-0}
  if [ "$n" -ge "$KILL_AFTER" ]; then
    echo "SIGTERM to the queue after $n run records, $(( $(date +%s) - t1 )) s"; kill -TERM "$qp"; break
  fi
  sleep 5
done
wait "$qp"; echo "first queue: exit $?"
cp "$Q/out/ledger.jsonl" "$Q/ledger_at_kill.jsonl"
t2=$(date +%s)
queue >"$Q/q2.out" 2>"$Q/q2.err"
echo "second queue: exit $? in $(( $(date +%s) - t2 )) s; verdicts, summary and chain: $Q/q2.out"
