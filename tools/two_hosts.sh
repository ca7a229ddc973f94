#!/bin/bash
# Two "hosts" on one machine, so that Open MPI's multi-host path runs: its ssh launch, its TCP
# transport between nodes, and each rank on a machine of its own name with its own /tmp.
# docs/distributed.md, "Several machines, emulated".
#
# mwnode1 is this machine's network namespace; mwnode2 is a second namespace (its own hostname
# and its own /tmp, bound to a directory under $WORK) joined by a veth pair, with an sshd in each.
# Open MPI sees two nodes (OMPI_COMM_WORLD_LOCAL_SIZE 1 on each) and moves every collective over
# TCP. Needs root, iproute2, util-linux's unshare and openssh-server (apt-get install
# openssh-server). It changes /etc/hosts and root's ~/.ssh; `down` undoes what it made.
#
#   bash tools/two_hosts.sh up            # namespaces, sshd, /tmp/mw_hostfile
#   bash tools/two_hosts.sh check [BIN]   # DP runs on two hosts against one process
#   bash tools/two_hosts.sh down
set -euo pipefail

WORK=${WORK:-/tmp/mw_two_hosts}
HOSTFILE=/tmp/mw_hostfile
NS=mwtest
MPIRUN=(mpirun --allow-run-as-root --hostfile "$HOSTFILE" -np 2
  --mca plm_rsh_args "-o StrictHostKeyChecking=no -o BatchMode=yes"
  --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)

up() {
  mkdir -p "$WORK/node2tmp" && chmod 1777 "$WORK/node2tmp"
  ip netns add "$NS"
  ip link add mwveth0 type veth peer name mwveth1
  ip link set mwveth1 netns "$NS"
  ip addr add 10.77.0.1/24 dev mwveth0 && ip link set mwveth0 up
  ip netns exec "$NS" ip addr add 10.77.0.2/24 dev mwveth1
  ip netns exec "$NS" ip link set mwveth1 up
  ip netns exec "$NS" ip link set lo up
  grep -q mwnode2 /etc/hosts || printf '10.77.0.1 mwnode1\n10.77.0.2 mwnode2\n' >>/etc/hosts
  mkdir -p /root/.ssh && chmod 700 /root/.ssh
  [ -f /root/.ssh/id_ed25519 ] || ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519
  grep -qf /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys 2>/dev/null ||
    cat /root/.ssh/id_ed25519.pub >>/root/.ssh/authorized_keys
  chmod 600 /root/.ssh/authorized_keys
  mkdir -p /run/sshd && ssh-keygen -A >/dev/null
  /usr/sbin/sshd -o ListenAddress=10.77.0.1 -o PermitRootLogin=prohibit-password
  ip netns exec "$NS" unshare -u -m --propagation private sh -c \
    "hostname mwnode2; mount --bind '$WORK/node2tmp' /tmp; /usr/sbin/sshd -o ListenAddress=10.77.0.2 -o PermitRootLogin=prohibit-password"
  printf 'mwnode1 slots=1\nmwnode2 slots=1\n' >"$HOSTFILE"
  "${MPIRUN[@]}" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname), ranks on its host: $OMPI_COMM_WORLD_LOCAL_SIZE"'
}

losses() { grep -o '"loss":[0-9.e+-]*' "$1" | cut -d: -f2 | tr '\n' ' '; }

# Each ZeRO stage and Gemini over the two hosts against one process on the same global batch, then
# a checkpoint written by the two hosts resumed by one process.
check() {
  local bin=${1:-./build/apps/gpt2_train}
  local common=(--model small --batch 4 --seq 64 --steps 3 --threads 1 --dropout 0)
  mkdir -p "$WORK/out" && rm -rf "$WORK/out"/*
  "$bin" "${common[@]}" --log "$WORK/out/one.jsonl" >"$WORK/out/one.txt" 2>&1
  echo "one process:          $(losses "$WORK/out/one.jsonl")"
  for z in 0 1 2 3; do
    "${MPIRUN[@]}" "$bin" "${common[@]}" --zero "$z" --log "$WORK/out/z$z.jsonl" >"$WORK/out/z$z.txt" 2>&1
    echo "two hosts, --zero $z: $(losses "$WORK/out/z$z.jsonl")"
  done
  "${MPIRUN[@]}" "$bin" "${common[@]}" --zero 2 --offload nvme --fraction 1.0 \
    --checkpoint-dir "$WORK/out/ck" --checkpoint-every 2 --log "$WORK/out/nvme.jsonl" >"$WORK/out/nvme.txt" 2>&1
  echo "two hosts, --zero 2 --offload nvme (states in each host's own /tmp): $(losses "$WORK/out/nvme.jsonl")"
  "$bin" "${common[@]}" --zero 2 --offload nvme --fraction 1.0 --resume "$WORK/out/ck/step_000002" \
    --log "$WORK/out/resumed.jsonl" >"$WORK/out/resumed.txt" 2>&1
  echo "its step-2 checkpoint resumed by one process, step 3: $(losses "$WORK/out/resumed.jsonl")"
  "${MPIRUN[@]}" "$bin" "${common[@]}" --zero 3 --device sim:1GiB --gemini auto \
    --log "$WORK/out/gemini.jsonl" >"$WORK/out/gemini.txt" 2>&1
  echo "two hosts, --gemini auto --zero 3: $(losses "$WORK/out/gemini.jsonl")"
}

down() {
  pkill -f 'sshd -o ListenAddress=10.77.0' || true
  ip netns del "$NS" 2>/dev/null || true
  ip link del mwveth0 2>/dev/null || true
  sed -i '/mwnode[12]$/d' /etc/hosts
  rm -f "$HOSTFILE"
}

case "${1:-}" in
  up) up ;;
  check) check "${2:-}" ;;
  down) down ;;
  *) echo "usage: $0 up|check [gpt2_train]|down" >&2; exit 2 ;;
esac
