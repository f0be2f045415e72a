#!/bin/sh
# Real kubelet scenario (qemu-tests/tests/real_kubelet.rs): the real kubelet v1.20.2
# (/usr/lib/k8s/kubelet), standalone (no apiserver), with containerd's CRI plugin and runc, runs
# a static pod that the Bottlerocket API (apiserver-sim) renders from
# settings.kubernetes.static-pods into /etc/kubernetes/static-pods, its staticPodPath. The pod's
# image and the sandbox image are the real pause (built from Kubernetes v1.20.2's pause.c,
# packed without docker). Times in $E2E_OUT/times.txt.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
t0=$(e2e_uptime)
el() { awk "BEGIN{print $(e2e_uptime) - $t0}"; }
SP=/etc/kubernetes/static-pods

# containerd as Bottlerocket's kubelet-facing one: the CRI plugin on, the real pause imported
e2e_check "containerd with its CRI plugin, pause imported into k8s.io" node_cri_containerd
echo "containerd-cri+pause $(el)" >> "$E2E_OUT/times.txt"

# the Bottlerocket API renders the static pod into the kubelet's folder
cat > /var/tmp/probe.yaml << 'Y'
apiVersion: v1
kind: Pod
metadata:
  name: probe
  namespace: kube-system
spec:
  hostNetwork: true
  containers:
  - name: probe
    image: k8s.gcr.io/pause:3.2
    command: ["/pause"]
Y
printf '{"kubernetes":{"static-pods":{"probe":{"manifest":"%s","enabled":true}}}}\n' \
  "$(openssl base64 -A < /var/tmp/probe.yaml)" > /var/tmp/settings.json
apiserver-sim --socket /run/api.sock --root / --settings /var/tmp/settings.json \
  > "$E2E_OUT/apiserver-sim.log" 2>&1 &
e2e_check "Bottlerocket API rendered the static pod" e2e_wait_for 30 sh -c "ls $SP/* > /dev/null"
ls "$SP" > "$E2E_OUT/static-pods.txt"

t1=$(e2e_uptime)
/usr/lib/k8s/kubelet --container-runtime=remote \
  --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
  --pod-manifest-path="$SP" --cgroup-driver=cgroupfs \
  --fail-swap-on=false --cgroups-per-qos=false --enforce-node-allocatable= \
  --make-iptables-util-chains=false --root-dir=/var/lib/kubelet \
  --pod-infra-container-image=k8s.gcr.io/pause:3.2 --hostname-override=certrotor-e2e \
  --v=2 > "$E2E_OUT/kubelet.log" 2>&1 &
KP=$!
two_running() { [ "$(ctr -n k8s.io tasks ls 2> /dev/null | grep -c RUNNING)" = 2 ]; }
if e2e_wait_for 240 two_running; then
  echo "kubelet-start-to-pod-running $(awk "BEGIN{print $(e2e_uptime) - $t1}")" >> "$E2E_OUT/times.txt"
  e2e_check "real kubelet: pod sandbox and container running" true
else
  e2e_check "real kubelet: pod sandbox and container running (kubelet alive: $(kill -0 $KP && echo yes || echo no))" false
fi
ctr -n k8s.io tasks ls > "$E2E_OUT/tasks.txt" 2>&1
ctr -n k8s.io containers ls > "$E2E_OUT/containers.txt" 2>&1
for pid in $(awk '$3 == "RUNNING" {print $2}' "$E2E_OUT/tasks.txt"); do
  cat "/proc/$pid/comm" >> "$E2E_OUT/task-comms.txt"
done
kill "$KP"
e2e_finish
