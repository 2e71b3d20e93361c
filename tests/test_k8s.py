"""Pods as runs: the collector against a stand-in kubelet serving the real pod-resources v1 proto over a unix
socket (pod churn, MIG, time-slicing with 4 pods, a restarted pod, the socket going away), then ship, the
receipt of a pod by its job id, and the device ids the ledger names."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ledger.proofcheck as pc
from ledger.chain import db as db_mod
from ledger.capture import k8s, spool
from ledger.chain.entries import Kind
from ledger.method import BUCKETS, shares
from ledger.method.attribution import DeviceAccount
from ledger.capture.sources.kubelet import Assignment, PodResourcesClient, physical_device
from ledger.chain.store import iter_entries

from reports import focus
from tests.focus_validator import Unavailable as FocusUnavailable
from tests.focus_validator import validate as validate_focus
from tests.services import unavailable

try:   # grpcio: the `kubernetes` extra (in `dev`); without it the stand-in kubelet cannot start
    from tests.kubelet_standin import StandinKubelet, pod
except ImportError as exc:
    StandinKubelet = pod = None
    NO_GRPC = f"grpcio is not installed: {exc}"

T0 = 1767225600.0
GPU_A = "GPU-1d4b2c6e-8c0f-4a35-9f1e-0a1b2c3d4e5f"            # time-sliced: 4 replicas
GPU_B = "GPU-7a8b9c0d-1e2f-4a3b-8c5d-6e7f8a9b0c1d"            # whole, pod churn
MIG_1 = "MIG-4f2a9d1e-3b7c-5e8f-a0b1-c2d3e4f5a6b7"            # a MIG slice
ALLOC = {"nvidia.com/gpu": [f"{GPU_A}::{n}" for n in range(4)] + [GPU_B], "nvidia.com/mig-1g.10gb": [MIG_1]}


@pytest.fixture
def kubelet(tmp_path):
    if StandinKubelet is None:
        unavailable(NO_GRPC)
    k = StandinKubelet(str(tmp_path / "kubelet.sock"), ALLOC).start()
    yield k
    k.stop()


@given(st.lists(st.integers(0, 10**12), min_size=len(BUCKETS), max_size=len(BUCKETS)), st.integers(2, 64))
def test_shares_of_a_device_sum_to_its_paid_time(buckets, n):
    paid = sum(buckets)
    acc = DeviceAccount(paid_nanohours=paid, buckets=np.array(buckets, dtype=np.int64), suspended_nanohours=0)
    parts = [shares.scale_account(acc, Fraction(1, n)) for _ in range(n)]
    for p in parts:
        assert int(p.buckets.sum()) == p.paid_nanohours == paid // n
        assert all(0 <= int(b) <= int(a) for a, b in zip(acc.buckets, p.buckets))
    left = shares.remainder_nanohours(paid, [Fraction(1, n)] * n)
    assert sum(p.paid_nanohours for p in parts) + left == paid and 0 <= left < n
    assert shares.share_of({"sharers": n}) == ("equal", Fraction(1, n))
    assert shares.share_of({"sharers": n, "declared_share": "1/3"}) == ("declared", Fraction(1, 3))
    assert shares.share_of({"sharers": 1}) is None and shares.share_of({}) is None


def _records(sp):
    return [r for p in sorted(spool.pending_files(sp)) for r in spool.read(p).records]


def test_client_reads_list_allocatable_and_get(kubelet):
    kubelet.set_pods([pod("team-a", "train-0", {"nvidia.com/gpu": [f"{GPU_A}::2"]})])
    with PodResourcesClient(kubelet.socket) as c:
        (a,) = c.list()
        assert (a.namespace, a.pod, a.container, a.device, a.replica) == ("team-a", "train-0", "main", GPU_A, 2)
        assert ("nvidia.com/mig-1g.10gb", MIG_1) in c.allocatable()
        assert c.get("team-a", "train-0") == (a,)
    kubelet.serve_get = False
    with PodResourcesClient(kubelet.socket) as c:
        assert c.get("team-a", "train-0") is None          # Get not served: None, not an error
    assert kubelet.calls.count("Get") == 2


@given(st.text(alphabet="0123456789abcdef-", min_size=1, max_size=40), st.integers(0, 4096))
def test_a_replica_id_names_its_physical_gpu(uuid, n):
    assert physical_device(f"GPU-{uuid}::{n}") == (f"GPU-{uuid}", n)
    assert physical_device(f"GPU-{uuid}") == (f"GPU-{uuid}", None)


def test_socket_gone_records_nothing_then_the_hole(kubelet, tmp_path):
    sp = tmp_path / "spool"
    cfg = k8s.PodRunsConfig(spool=str(sp), node="gpu-node-1", socket=kubelet.socket, max_gap_s=180)
    kubelet.set_pods([pod("team-a", "train-0", {"nvidia.com/gpu": [GPU_B]})])
    assert k8s.collect_tick(cfg, now=lambda: T0).started == 1
    kubelet.stop()
    rep = k8s.collect_tick(cfg, now=lambda: T0 + 60)
    assert rep.error.startswith("kubelet_unavailable") and rep.spool_file is None
    kubelet.start()
    rep = k8s.collect_tick(cfg, now=lambda: T0 + 600)
    assert rep.error is None and rep.gaps == 1 and rep.started == 0
    gap = [r for r in _records(sp) if r["kind"] == Kind.UNKNOWN_INTERVAL][0]
    assert (gap["job_id"], gap["device"], json.loads(gap["payload"])["cause"]) == ("k8s:team-a/train-0", GPU_B,
                                                                                  "collector_down")


def test_collect_source_none_needs_a_kubelet_socket(runner, cli, tmp_path):
    r = runner.invoke(cli, ["collect", "--source", "none", "--once", "--spool", str(tmp_path / "sp")],
                      env={"IPLEDGER_CONFIG": ""})
    assert r.exit_code != 0 and "--kubelet-socket" in r.output and "Traceback" not in r.output


def _churn(kubelet, cli, runner, conf, sp):
    """Six ticks a minute apart: 4 time-sliced pods, a MIG pod, a whole-GPU pod that restarts."""
    sliced = [pod("team-a", f"train-{n}", {"nvidia.com/gpu": [f"{GPU_A}::{n}"]}) for n in range(4)]
    mig = pod("team-b", "infer-0", {"nvidia.com/mig-1g.10gb": [MIG_1]})
    whole = pod("team-c", "batch-0", {"nvidia.com/gpu": [GPU_B]})
    ticks = [sliced + [mig, whole], sliced + [mig, whole], sliced + [mig], sliced + [mig, whole],
             sliced + [whole], []]
    for k, pods in enumerate(ticks):
        kubelet.set_pods(pods)
        r = runner.invoke(cli, ["--config", str(conf), "collect", "--kubelet-socket", kubelet.socket, "--source",
                                "none", "--once", "--node", "gpu-node-1", "--json"],
                          env={"IPLEDGER_SPOOL": ""})
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["kubelet"]["error"] is None


def test_pods_become_runs_through_ship_and_receipt(kubelet, runner, cli, tmp_path, monkeypatch, sqlite_url):
    sp = tmp_path / "spool"
    conf = tmp_path / "c.toml"
    conf.write_text(f'spool = "{sp}"\ncluster = "prod-k8s"\n')
    clock = iter(T0 + 60 * k for k in range(100))
    monkeypatch.setattr(k8s, "clock", lambda: next(clock))
    _churn(kubelet, cli, runner, conf, sp)
    recs = _records(sp)
    started = [r for r in recs if r["kind"] == Kind.ALLOCATION_STARTED]
    ended = [r for r in recs if r["kind"] == Kind.ALLOCATION_ENDED]
    bound = [r for r in recs if r["kind"] == Kind.DEVICE_BOUND]
    runs = sorted((r["job_id"], r["run"]) for r in started)
    assert runs == sorted([(f"k8s:team-a/train-{n}", 0) for n in range(4)] + [
        ("k8s:team-b/infer-0", 0), ("k8s:team-c/batch-0", 0), ("k8s:team-c/batch-0", 1)])
    assert all(r["cluster"] == "prod-k8s" and json.loads(r["payload"])["account"] == r["job_id"][4:10]
               for r in started)
    assert len(ended) == 7
    # receipts name the physical device, never the replica id
    assert {r["device"] for r in bound} == {GPU_A, MIG_1, GPU_B}
    sliced = [json.loads(r["payload"]) for r in bound if r["device"] == GPU_A]
    assert sorted(p["device_id"] for p in sliced) == [f"{GPU_A}::{n}" for n in range(4)]
    assert {(p["sharers"], p["share_rule"]) for p in sliced} == {(4, "equal")}
    assert {json.loads(r["payload"])["share_rule"] for r in bound if r["device"] == MIG_1} == {"mig_slice"}

    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "ship", "--spool", str(sp), "--json",
                            "--no-receipts"])
    assert r.exit_code == 0, r.output
    eng = db_mod.make_engine(sqlite_url)
    try:
        kinds = [ce.entry.kind for ce in iter_entries(eng)]
        assert kinds.count(Kind.ALLOCATION_STARTED) == 7
    finally:
        eng.dispose()
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "receipt", "k8s:team-a/train-0",
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert rec["window"] == {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:05:00Z"}
    assert (rec["job"]["account"], rec["job"]["cluster"], rec["job"]["run"]) == ("team-a", "prod-k8s", 0)
    assert [d["uuid"] for d in rec["job"]["devices"]] == [GPU_A] == [d["uuid"] for d in rec["devices"]]
    (line,) = rec["devices"]
    assert line["share"] == {"rule": "equal", "ratio": "1/4", "device_paid_gpu_hours": 0.083333333}
    # four pods time-sliced on one GPU each pay a quarter; the four plus the remainder are the device's paid time
    paid_nanohours = []
    for n in range(4):
        rn = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", f"k8s:team-a/train-{n}", "--format",
                                            "json"]).output)
        paid_nanohours.append(round(rn["gpu_hours"]["paid"] * 1e9))
        assert rn["devices"][0]["uuid"] == GPU_A and rn["devices"][0]["share"]["ratio"] == "1/4"
    device_nanohours = round(line["share"]["device_paid_gpu_hours"] * 1e9)
    assert paid_nanohours == [device_nanohours // 4] * 4
    assert sum(paid_nanohours) + shares.remainder_nanohours(device_nanohours, [Fraction(1, 4)] * 4) == device_nanohours
    # issued, the shared receipts replay byte-identically (ipledger verify)
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "issue", "--all", "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "verify"])
    assert r.exit_code == 0, r.output
    eng = db_mod.make_engine(sqlite_url)
    try:
        issued = [ce.entry for ce in iter_entries(eng) if ce.entry.kind == Kind.RECEIPT_ISSUED]
        assert sorted((e.job_id, e.run) for e in issued) == runs
    finally:
        eng.dispose()
    # FOCUS: each time-sliced pod's charge carries its split (AllocatedRatio); per device the ratios sum to 1
    out = tmp_path / "jan.focus.csv"
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "export", "monthly", "--month", "2026-01",
                            "--format", "focus", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    df = focus.read_focus(out)
    usage = df[df.ChargeCategory == "Usage"]
    split = usage[usage.AllocatedMethodId.notna()]
    assert sorted(split.x_JobId) == [f"k8s:team-a/train-{n}" for n in range(4)]
    assert set(split.AllocatedMethodId) == {"ipledger-device-share-equal"}
    ratios: dict[str, float] = {}
    for d in split.AllocatedMethodDetails:
        for el in json.loads(d)["Elements"]:
            ratios[el["x_Device"]] = ratios.get(el["x_Device"], 0.0) + el["AllocatedRatio"]
    assert ratios == {GPU_A: 1.0}
    assert usage[usage.AllocatedMethodId.isna()].AllocatedMethodDetails.isna().all()
    assert focus.validate(df) == []
    try:
        v = validate_focus(out)
    except FocusUnavailable as exc:
        unavailable(str(exc))
    assert v.failed == [], v.summary()
    # a tenant's offline check (ledger/proofcheck.py, the second implementation) recomputes the shared receipt
    key, head, bundle = tmp_path / "site.key", tmp_path / "head.json", tmp_path / "bundle.json"
    for args in (["keygen", "--out", str(key)], ["checkpoint", "--key", str(key), "--out", str(head)],
                 ["receipt", "k8s:team-a/train-1", "--proof", "--head", str(head), "--out", str(bundle)]):
        r = runner.invoke(cli, ["--db", sqlite_url, *args])
        assert r.exit_code == 0, r.output
    assert pc.main([str(bundle), "--pubkey", str(key) + ".pub"]) == 0
    # the MIG slice and the whole GPU are held alone: no share block, the whole device-time
    r0 = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "k8s:team-b/infer-0", "--format",
                                        "json"]).output)
    assert "share" not in r0["devices"][0] and r0["devices"][0]["uuid"] == MIG_1
    assert r0["gpu_hours"]["paid"] == pytest.approx(4 / 60, abs=1e-9)     # gone at the fifth tick
    assert GPU_A in json.dumps(rec) and f"{GPU_A}::" not in json.dumps(rec)
    # the restarted pod: two runs, each its own window
    r1 = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "k8s:team-c/batch-0", "--run", "1",
                                        "--format", "json"]).output)
    assert r1["window"] == {"start": "2026-01-01T00:03:00Z", "end": "2026-01-01T00:05:00Z"}


# --- issue 32: sharers that change (pods joining and leaving a GPU at any tick) ---

def _plain_split(holds, step):
    """Second by second (in steps of ``step`` s): each pod gets 1/n of every step n pods hold the device."""
    got = {p: Fraction(0) for p in holds}
    paid = Fraction(0)
    ends = [e for _s, e in holds.values()]
    t = min(s for s, _e in holds.values())
    while t < max(ends):
        on = [p for p, (s, e) in holds.items() if s <= t < e]
        if on:
            paid += step
            for p in on:
                got[p] += Fraction(step, len(on))
        t += step
    per_s = Fraction(1_000_000_000, 3600)
    return {p: v * per_s for p, v in got.items()}, paid * per_s


_holds = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=6).map(
    lambda xs: {f"pod-{i}": (a, a + d) for i, (a, d) in enumerate(xs)})


@given(_holds)
def test_changing_sharers_split_each_second_among_the_pods_holding_it(holds):
    # on a grid of 108 s (3e7 nh, divisible by 1..6) the split is exact: each pod's share is the plain one
    h = {p: (a * 108, b * 108) for p, (a, b) in holds.items()}
    pods, left, paid = shares.split_device(h)
    want, want_paid = _plain_split(h, 108)
    assert paid == want_paid and pods == {p: int(v) for p, v in want.items()} and left == 0
    # at any seconds, the identity holds to the nanohour and each pod is within a nanohour an interval
    h = {p: (a * 7.5 + 0.25, b * 7.5 + 0.25) for p, (a, b) in holds.items()}
    pods, left, paid = shares.split_device(h)
    n_iv = len(shares.membership_intervals(h))
    assert sum(pods.values()) + left == paid and 0 <= left <= 6 * n_iv
    want, _ = _plain_split({p: (Fraction(a), Fraction(b)) for p, (a, b) in h.items()}, Fraction(1, 4))
    assert all(abs(pods[p] - want[p]) <= n_iv + 1 for p in h)


def test_a_pod_joining_later_shares_from_then_on(kubelet, runner, cli, tmp_path, monkeypatch, sqlite_url):
    """train-0 alone on GPU_A for 2 ticks, then train-1 joins for 2, then train-0 leaves (108 s ticks)."""
    sp = tmp_path / "spool"
    conf = tmp_path / "c.toml"
    conf.write_text(f'spool = "{sp}"\n')
    clock = iter(T0 + 108 * k for k in range(100))
    monkeypatch.setattr(k8s, "clock", lambda: next(clock))
    p0 = pod("team-a", "train-0", {"nvidia.com/gpu": [f"{GPU_A}::0"]})
    p1 = pod("team-a", "train-1", {"nvidia.com/gpu": [f"{GPU_A}::1"]})
    whole = pod("team-c", "batch-0", {"nvidia.com/gpu": [GPU_B]})
    for pods in ([p0, whole], [p0, whole], [p0, p1, whole], [p0, p1, whole], [p1, whole], [p1, whole], []):
        kubelet.set_pods(pods)
        r = runner.invoke(cli, ["--config", str(conf), "collect", "--kubelet-socket", kubelet.socket, "--source",
                                "none", "--once", "--node", "gpu-node-1", "--json"], env={"IPLEDGER_SPOOL": ""})
        assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "ship", "--spool", str(sp), "--json",
                            "--no-receipts"])
    assert r.exit_code == 0, r.output
    got = {}
    for j in ("train-0", "train-1"):
        r = runner.invoke(cli, ["--db", sqlite_url, "receipt", f"k8s:team-a/{j}", "--format", "json"])
        assert r.exit_code == 0, r.output
        got[f"pod-{j[-1]}"] = json.loads(r.output)
    w = {p: (got[p]["window"]["start"], got[p]["window"]["end"]) for p in got}
    assert w == {"pod-0": ("2026-01-01T00:00:00Z", "2026-01-01T00:07:12Z"),
                 "pod-1": ("2026-01-01T00:03:36Z", "2026-01-01T00:10:48Z")}
    holds = {"pod-0": (0, 4 * 108), "pod-1": (2 * 108, 6 * 108)}
    want, device_nanohours = _plain_split(holds, 108)
    paid = {p: round(got[p]["gpu_hours"]["paid"] * 1e9) for p in got}
    assert paid == {p: int(v) for p, v in want.items()}
    pods, left, dev = shares.split_device(holds)
    assert pods == paid and sum(paid.values()) + left == dev == int(device_nanohours)
    assert [s["ratio"] for s in got["pod-0"]["devices"][0]["share"]["segments"]] == ["1/1", "1/2"]
    assert [s["ratio"] for s in got["pod-1"]["devices"][0]["share"]["segments"]] == ["1/2", "1/1"]
    # the GPU one pod held throughout: no share block, the whole device-time
    rb = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "k8s:team-c/batch-0", "--format",
                                        "json"]).output)
    assert "share" not in rb["devices"][0]
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "issue", "--all", "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(conf), "verify"])
    assert r.exit_code == 0, r.output
    # the tenant's offline checker (ledger/proofcheck.py) recomputes the segmented shares to the same bytes
    key, head = tmp_path / "site.key", tmp_path / "head.json"
    for j in ("train-0", "train-1"):
        bundle = tmp_path / f"{j}.json"
        for args in (["keygen", "--out", str(key)], ["checkpoint", "--key", str(key), "--out", str(head)],
                     ["receipt", f"k8s:team-a/{j}", "--proof", "--head", str(head), "--out", str(bundle)]):
            if args[0] == "keygen" and key.exists():
                continue
            r = runner.invoke(cli, ["--db", sqlite_url, *args])
            assert r.exit_code == 0, r.output
        assert pc.main([str(bundle), "--pubkey", str(key) + ".pub"]) == 0
