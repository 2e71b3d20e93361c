"""deploy/kubernetes and the Containerfile, by structure (no image builder or cluster here; docs/kubernetes.md):
the kustomization names every manifest, the DaemonSet runs only on GPU nodes, as non-root, unprivileged, with no
service-account token, mounts the kubelet's pod-resources directory read-only, and runs the command the
Containerfile runs, which the CLI accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.services import unavailable

try:
    import yaml
except ImportError:   # PyYAML is in the `dev` extra
    yaml = None

ROOT = Path(__file__).parent.parent


@pytest.fixture(autouse=True)
def _needs_yaml():
    if yaml is None:
        unavailable("PyYAML is not installed (the dev extra)")
DEPLOY = ROOT / "deploy" / "kubernetes"


def _docs():
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    out = {}
    for name in kust["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return kust, out


def test_kustomization_names_every_manifest():
    kust, docs = _docs()
    assert kust["kind"] == "Kustomization"
    assert sorted(kust["resources"]) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert {k for k, _ in docs} == {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"}


def test_daemonset_is_least_privilege():
    _, docs = _docs()
    ds = docs[("DaemonSet", "ipledger-collector")]
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["automountServiceAccountToken"] is False
    sa = docs[("ServiceAccount", pod["serviceAccountName"])]
    assert sa["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(vols) == set(mounts)
    host = {n: v["hostPath"]["path"] for n, v in vols.items() if "hostPath" in v}
    assert host == {"pod-resources": "/var/lib/kubelet/pod-resources", "spool": "/var/spool/ipledger"}
    assert mounts["pod-resources"]["readOnly"] is True and mounts["config"]["readOnly"] is True
    # the one writable host path is the spool, and the config's spool is that mount
    writable = [n for n in host if not mounts[n].get("readOnly")]
    assert writable == ["spool"]
    conf = docs[("ConfigMap", "ipledger-collector")]["data"]["config.toml"]
    assert f'spool = "{mounts["spool"]["mountPath"]}"' in conf
    sock = c["args"][c["args"].index("--kubelet-socket") + 1]
    assert sock.startswith(mounts["pod-resources"]["mountPath"] + "/")


def test_containerfile_runs_the_daemonsets_command_as_the_same_user():
    text = (ROOT / "Containerfile").read_text()
    assert re.search(r"^FROM \S*debian:\S+-slim$", text, re.M)
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M)
    assert user and user.group(1) != "0"
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    _, docs = _docs()
    pod = docs[("DaemonSet", "ipledger-collector")]["spec"]["template"]["spec"]
    assert cmd == pod["containers"][0]["args"]
    assert int(user.group(1)) == pod["securityContext"]["runAsUser"]
    assert "ipledger-*.whl" in text and "[kubernetes" in text


def test_the_daemonsets_command_runs_against_a_stand_in_kubelet(runner, cli, tmp_path):
    try:
        from tests.kubelet_standin import StandinKubelet, pod
    except ImportError as exc:
        unavailable(f"grpcio is not installed: {exc}")

    _, docs = _docs()
    args = docs[("DaemonSet", "ipledger-collector")]["spec"]["template"]["spec"]["containers"][0]["args"]
    sock = tmp_path / "kubelet.sock"
    k = StandinKubelet(str(sock), {"nvidia.com/gpu": ["GPU-x"]}).start()
    try:
        k.set_pods([pod("ml", "job-1", {"nvidia.com/gpu": ["GPU-x"]})])
        args = [str(sock) if a == args[args.index("--kubelet-socket") + 1] else a for a in args]
        r = runner.invoke(cli, [*args, "--source", "none", "--once", "--spool", str(tmp_path / "sp"), "--json"],
                          env={"IPLEDGER_CONFIG": ""})
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["kubelet"]["started"] == 1
    finally:
        k.stop()


def test_docs_explain_every_mount():
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    _, docs = _docs()
    pod = docs[("DaemonSet", "ipledger-collector")]["spec"]["template"]["spec"]
    for m in pod["containers"][0]["volumeMounts"]:
        assert f"`{m['mountPath']}`" in text, m["name"]
