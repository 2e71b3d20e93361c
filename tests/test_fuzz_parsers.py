"""Every parser fuzzed (issue 9, point 4): a parsed result or its documented error, nothing else, no hang.

Inputs come from scratch (``st.text`` / ``st.binary``) and, far more productive, from the real captures in
tests/fixtures mutated the way broken exports are broken: byte flips, truncation, duplicated and deleted
lines, repeated headers, injected ``N/A``/``NaN``/sentinel/odd-digit tokens. Each parser is one
:class:`Target`: how to call it and which errors it documents. ``make test`` runs a few hundred inputs per
parser; ``--soak`` (or ``IPLEDGER_SOAK=1``) runs 10,000 mutated inputs and 2,000 from scratch per parser.

Documented errors: importers raise ``ledger.importers.common.InputError`` (``FILE: PLACE: what``, one line);
the DCGM report parser returns :class:`DcgmError` or raises :class:`DcgmParseError`; the nvidia-smi and
amd-smi source parsers raise ``ValueError`` (their callers turn it into an ``unparsed: ...`` value); the spool
parser never raises (bad lines become ``errors``/``torn``); the scontrol/environment parsers never raise (a
field they cannot read is None); config, contract and SKU-table loading raise ConfigError / ContractError /
SkuError naming the file. The end-to-end half (no partial write through the CLI) is in tests/test_bad_input.py.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ledger.ingest import sacct as accounting
from ledger.base import config as config_mod
from ledger.chain import contracts
from ledger.capture import spool
from ledger.capture.hooks import slurm
from ledger.importers import amdsmi, dmon, nvidia_smi, prometheus, synth
from ledger.importers.common import InputError, decode_text
from ledger.method import skus
from ledger.capture.sources import amd_snapshots as amd_src, dcgm, nvml

pytestmark = pytest.mark.soak
FIX = Path(__file__).parent / "fixtures"
T0 = synth.DEFAULT_START
DEADLINE = timedelta(seconds=5)   # per example; the inputs are a few KB, a parse takes milliseconds


def _read(*parts: str) -> str:
    return (FIX.joinpath(*parts)).read_text(encoding="utf-8")


def _synth_seeds() -> dict[str, str]:
    """Small exports in the formats the fixtures lack (long CSV, OpenMetrics, JSON Lines, XML)."""
    kw = dict(n_gpus=2, hours=0.05, cadence=60, jobs="slurm", metrics=synth.DEFAULT_METRICS[:4])
    with tempfile.TemporaryDirectory() as d:
        csv_text = synth.write_csv(Path(d) / "x.csv", **kw).read_text()
        om = synth.write_openmetrics(Path(d) / "x.om", **kw).read_text()
        qr = [p.read_text() for p in synth.write_query_range(Path(d) / "qr", **kw)]
    jsonl = "\n".join(" ".join(t.split()) for t in qr[:2]) + "\n"
    xml = ('<?xml version="1.0" ?>\n<nvidia_smi_log><timestamp>Thu Jan  1 00:00:00 2026</timestamp>'
           '<driver_version>550.54.15</driver_version><gpu id="00000000:18:00.0"><product_name>NVIDIA H100'
           '</product_name><uuid>GPU-abc</uuid><minor_number>0</minor_number><fb_memory_usage><used>1024 MiB</used>'
           '</fb_memory_usage><utilization><gpu_util>87 %</gpu_util><memory_util>N/A</memory_util></utilization>'
           '<clocks_event_reasons><clocks_event_reason_gpu_idle>Not Active</clocks_event_reason_gpu_idle>'
           '</clocks_event_reasons><processes><process_info><pid>1</pid></process_info></processes></gpu>'
           '</nvidia_smi_log>\n')
    return {"csv": csv_text, "openmetrics": om, "query_range": qr[0], "jsonl": jsonl, "xml": xml + xml}


SYNTH = _synth_seeds()
NV_CSV = ("timestamp, index, uuid, name, utilization.gpu [%], power.draw [W], clocks_event_reasons.active\n"
          "2026/01/01 00:00:00.000, 0, GPU-x, NVIDIA H100, 97 %, 650.12 W, 0x0000000000000004\n"
          "2026/01/01 00:00:01.000, 0, GPU-x, NVIDIA H100, [N/A], 640.00 W, 0x0000000000000000\n")
AMD_MONITOR = ("GPU  POWER  GPU_TEMP  MEM_TEMP  GFX_UTIL  GFX_CLOCK  MEM_UTIL  MEM_CLOCK  VRAM_USED\n"
               "  0  500 W     70 \u00b0C     60 \u00b0C      93 %   2100 MHz      30 %   1300 MHz   1024 MB\n")
AMD_CSV = "timestamp,gpu,power_usage,gfx,mem,single_bit_ecc\n1767225600,0,300,50,10,0\n1767225610,0,N/A,60,11,0\n"
AMD_JSON = ('[{"gpu": 0, "energy": {"total_energy_consumption": {"value": 12.5, "unit": "J"}}, '
            '"ecc": {"total_correctable_count": 0, "total_uncorrectable_count": "N/A"}, '
            '"throttle": {"accumulation_counter": 5}}]')
SCONTROL = ("JobId=2 JobName=wrap UserId=root(0) Account=tenant QOS=(null) JobState=COMPLETING Restarts=0 "
            "ExitCode=0:15 RunTime=00:00:03 StartTime=2026-11-30T04:28:38 EndTime=2026-11-30T04:28:44 "
            "SuspendTime=2026-11-30T04:28:43 SecsPreSuspend=2 Partition=gpu NodeList=vm TRES=cpu=1,gres/gpu=2 "
            "JOB_GRES=gpu:1   Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)")
SPOOL = ('{"kind": "allocation_started", "ts": "2026-01-01T00:00:00Z", "payload": {"account": "a"}}\n'
         '{"kind": "allocation_ended", "ts": "2026-01-01T01:00:00Z", "payload": {}}\n')
CONFIG = ('db = "sqlite:////var/lib/ipledger/ledger.db"\nspool = "/var/spool/ipledger"\ncluster = "c1"\n'
          'hook_timeout_s = 5\n[commands]\nnvidia-smi = "/usr/bin/nvidia-smi"\ndcgmi = "/usr/bin/dcgmi"\n')
CONTRACT = ('id = "acme"\nversion = "2"\ncurrency = "EUR"\naccounts = ["a", "b"]\nunknown_policy = "hold"\n'
            'billing_granularity_s = 60\n[skus.default]\nrate_per_gpu_hour = "2.10"\n'
            '[skus.H100]\ncapex_price = "24000"\ncapex_years = 4\ncapex_residual = 100\npue = 1.3\n')
SKUS = ('[skus.H100-SXM5-80GB]\ntdp_w = 650\n[skus.MYGPU]\nvendor = "nvidia"\nrated_sm_clock_mhz = 1500\n'
        'tdp_w = 300\npeak_bf16_dense_tflops = 100.5\nmatch = ["My GPU", "mygpu"]\n')

# Values real exports put where a number should be, and a few no export should (odd Unicode digits, huge
# exponents, control characters).
INJECT = ("N/A", "[N/A]", "N/W", "Not Supported", "[Not Supported]", "NaN", "nan", "inf", "-inf", "-1", "1e309",
          "9223372036854775807", "2147483632", "140737488355328.0", "<<<NULL>>>", "Insf. Permission", "", " ",
          "\u00b2", "\u0663", "\uff11", "0x", "0xZZ", "1" * 5000, "\x00", "\x1b[31m", "=cmd|' /C calc'!A0",
          '"', "'", ",", "{", "[", "]", "}", "\\", "\n", "\r", "\u2028", "99999999999999999999", "-0", "1e-400")


def _mutate(text: str, ops: list[tuple[int, int, int]]) -> str:
    """Apply (op, a, b) mutations; a and b are positions/choices taken modulo the current size."""
    data = text
    for op, a, b in ops:
        lines = data.split("\n")
        if op == 0 and data:                                    # byte flip (as text: one character replaced)
            i = a % len(data)
            data = data[:i] + chr(b % 0x110000 if b % 7 else b % 128) + data[i + 1:]
        elif op == 1 and data:                                  # truncation
            data = data[: a % (len(data) + 1)]
        elif op == 2:                                           # a line duplicated
            i = a % len(lines)
            lines.insert(b % (len(lines) + 1), lines[i])
            data = "\n".join(lines)
        elif op == 3:                                           # the header (first line) repeated somewhere
            lines.insert(a % (len(lines) + 1), lines[0])
            data = "\n".join(lines)
        elif op == 4 and data:                                  # a token replaced by N/A, NaN, a sentinel, ...
            toks = data.split(" ") if b % 2 else data.split(",")
            i = a % len(toks)
            toks[i] = INJECT[b % len(INJECT)]
            data = (" " if b % 2 else ",").join(toks)
        elif op == 5 and len(lines) > 1:                        # a line deleted
            del lines[a % len(lines)]
            data = "\n".join(lines)
        elif op == 6:                                           # a line's order swapped with another
            i, j = a % len(lines), b % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
            data = "\n".join(lines)
        elif op == 7:                                           # an injected token at a random place
            i = a % (len(data) + 1)
            data = data[:i] + INJECT[b % len(INJECT)] + data[i:]
        elif op == 8:                                           # a field's value (after = or :) replaced
            seps = [i for i, ch in enumerate(data) if ch in "=:"]
            if seps:
                i = seps[a % len(seps)] + 1
                j = i
                while j < len(data) and data[j] not in " ,\n|":
                    j += 1
                data = data[:i] + INJECT[b % len(INJECT)] + data[j:]
    return data


_OPS = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2**20), st.integers(0, 2**21)), min_size=1, max_size=6)


@dataclass(frozen=True)
class Target:
    name: str
    call: Callable[[str], object]              # text -> parsed result (raises only the documented errors)
    documented: tuple[type[BaseException], ...]
    seeds: tuple[str, ...]
    needs_path: bool = False                   # the error must name the file (and so start with it)

    def check(self, text: str) -> None:
        try:
            self.call(text)
        except self.documented as exc:
            msg = str(exc)
            assert "\n" not in msg and msg, f"{self.name}: error is not one line: {msg!r}"
            if self.needs_path:
                assert msg.startswith(PATH), f"{self.name}: error does not name the file: {msg!r}"


PATH = "in.txt"


def _importer(parse: Callable[..., object], **kw) -> Callable[[str], object]:
    """Text through the same bytes -> text step as ``read`` (binary, empty and non-UTF-8 input refused there)."""
    return lambda text: parse(decode_text(text.encode("utf-8", "surrogatepass"), PATH), PATH, **kw)


def _in_file(loader: Callable[[str], object], suffix: str) -> Callable[[str], object]:
    def call(text: str) -> object:
        fd, name = tempfile.mkstemp(suffix=suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8", "surrogatepass"))
            return loader(name)
        finally:
            os.unlink(name)
    return call


def _config(path: str):
    return config_mod.load_values(path, environ={})


def _skus(path: str):
    return skus.site_table({"skus_file": path})


def _scontrol(text: str):
    return slurm.job_record(slurm.parse_scontrol_oneline(text))


def _environ(text: str):
    pairs = (ln.partition("=") for ln in text.splitlines())
    return slurm.job_env({k: v for k, _, v in pairs})


ENV_SEED = ("SLURM_JOB_ID=77\nSLURM_JOB_RESTART_COUNT=1\nSLURM_JOB_GPUS=0-2,5\nSLURM_JOB_EXIT_CODE2=0:15\n"
            "SLURM_JOB_EXIT_CODE=-1\nSLURM_JOB_ACCOUNT=tenant\nSLURMD_NODENAME=n1\n")

TARGETS = [
    Target("prometheus.parse", _importer(prometheus.parse, default_ts=T0), (InputError,),
           (_read("pathb", "api_v1_query_range_matrix_format_prometheus_docs.json"),
            _read("pathb", "metrics_scrape_t4_prof_pod_labels_dcgm_issue191.prom"),
            _read("pathb", "metrics_scrape_readme_quickstart_sentinel_nvidia_docs.prom"),
            SYNTH["query_range"], SYNTH["jsonl"], SYNTH["openmetrics"], SYNTH["csv"]), needs_path=True),
    Target("prometheus.parse_csv", _importer(prometheus.parse_csv), (InputError,), (SYNTH["csv"],), needs_path=True),
    Target("prometheus.parse_jsonl", _importer(prometheus.parse_jsonl), (InputError,), (SYNTH["jsonl"],),
           needs_path=True),
    Target("dmon.parse", _importer(dmon.parse, start=T0, interval=1.0, node="n1"), (InputError,),
           (_read("pathb", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"),), needs_path=True),
    Target("dmon.parse (metadata line)", _importer(dmon.parse), (InputError,),
           ("# ipledger: start=2026-01-01T00:00:00Z interval_ms=1000 node=n1\n"
            + _read("pathb", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"),), needs_path=True),
    Target("nvidia_smi.parse", _importer(nvidia_smi.parse, start=T0, interval=1.0, node="n1"), (InputError,),
           (_read("pathb", "nvidia_smi_query_gpu_csv_1line_h100_aicr.txt"), NV_CSV, SYNTH["xml"]), needs_path=True),
    Target("amdsmi.parse", _importer(amdsmi.parse, start=T0, interval=1.0, node="mi"), (InputError,),
           tuple(_read("pathb", "amd_smi", f) for f in ("L0034_amd_smi_metric_throttle.txt",
                                                          "L0079_amd_smi_monitor_violation.txt",
                                                          "L0107_amd_smi_metric_usage.txt",
                                                          "L1635_amd_smi_metric_p_json.txt"))
           + (AMD_MONITOR, AMD_CSV, AMD_JSON), needs_path=True),
    Target("dcgm.parse_stats", dcgm.parse_stats, (dcgm.DcgmParseError,),
           (_read("dcgmi_stats", "dcgmi_stats_j_summary_mig_a100_dcgm_issue93.txt"),
            _read("dcgmi_stats", "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt"))),
    Target("dcgm.parse_discovery", dcgm.parse_discovery, (),
           (_read("dcgmi_stats", "dcgmi_discovery_l_4xh100_null_names_dcgm_issue229.txt"),)),
    Target("dcgm.parse_group_create", dcgm.parse_group_create, (),
           ('Successfully created group "ipledger-77" with a group ID of 23\n',)),
    Target("nvml.parse_query_csv", nvml.parse_query_csv, (ValueError,),
           (_read("nvidia_smi", "nvidia_smi_query_gpu_csv_1line_h100_aicr.txt"), NV_CSV)),
    Target("nvml.parse_inventory_csv", nvml.parse_inventory_csv, (ValueError,),
           ("0, 0, GPU-1a2b, NVIDIA H100 80GB HBM3, 00000000:18:00.0\n1, 1, [N/A], [N/A], 00000000:2A:00.0\n",)),
    Target("nvml.parse_list", nvml.parse_list, (), (_read("nvidia_smi", "nvidia_smi_L_4xh100_mig_dcgm_issue229.txt"),)),
    Target("nvml.parse_clock_event_reasons", nvml.parse_clock_event_reasons, (),
           (_read("nvidia_smi", "nvidia_smi_q_d_PERFORMANCE_driver495_mangohud636.txt"),)),
    Target("sources.amd_snapshots.parse_metric_json", amd_src.parse_metric_json, (ValueError,),
           (AMD_JSON, _read("pathb", "amd_smi", "L1635_amd_smi_metric_p_json.txt"))),
    Target("sources.amd_snapshots.parse_metric_text", amd_src.parse_metric_text, (),
           (_read("pathb", "amd_smi", "L0034_amd_smi_metric_throttle.txt"),
            _read("pathb", "amd_smi", "L0107_amd_smi_metric_usage.txt"))),
    Target("sources.amd_snapshots.parse_list_json", amd_src.parse_list_json, (ValueError,),
           ('[{"gpu": 0, "bdf": "0000:0c:00.0", "uuid": "2fff74a1-0000-1000-80e9-b4f1c5e23a3b"}, '
            '{"gpu": {"value": 1}, "bdf": "N/A", "uuid": "N/A"}]',)),
    Target("sources.amd_snapshots.parse_static_market_names", amd_src.parse_static_market_names, (ValueError,),
           ('{"gpu_data": [{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X"}}, {"gpu": 1, "asic": {}}]}',)),
    Target("prometheus.read (file, streamed)", _in_file(lambda p: prometheus.read(p, default_ts=T0), ".txt"),
           (InputError,), (SYNTH["csv"], SYNTH["jsonl"], SYNTH["openmetrics"], SYNTH["query_range"])),
    Target("dmon.read (file, streamed)", _in_file(lambda p: dmon.read(p, start=T0, interval=1.0), ".txt"),
           (InputError,), (_read("pathb", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"),)),
    Target("spool.parse", lambda t: spool.parse(t, Path(PATH)), (), (SPOOL,)),
    Target("slurm.scontrol", _scontrol, (), (SCONTROL,)),
    Target("slurm.job_env", _environ, (), (ENV_SEED,)),
    Target("slurm.parse_index_list", slurm.parse_index_list, (), ("0-3,5,7-7", "NoDevFiles")),
    Target("accounting.parse (sacct)", lambda t: accounting.runs_of(accounting.parse(t)), (),
           (_read("sacct", "requeue_cancel.txt"),)),
    Target("config.load_values", _in_file(_config, ".toml"), (config_mod.ConfigError,), (CONFIG,)),
    Target("contracts.read_contract", _in_file(contracts.read_contract, ".toml"), (contracts.ContractError,),
           (CONTRACT,)),
    Target("skus.site_table", _in_file(_skus, ".toml"), (skus.SkuError,), (SKUS,)),
]
BY_NAME = {t.name: t for t in TARGETS}


def _examples(soak: bool, quick: int, full: int = 10_000) -> settings:
    return settings(max_examples=full if soak else quick, deadline=DEADLINE, derandomize=not soak,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("name", list(BY_NAME))
def test_mutated_fixtures_give_a_result_or_the_documented_error(name, soak):
    target = BY_NAME[name]

    @_examples(soak, 60)
    @given(seed=st.sampled_from(target.seeds), ops=_OPS)
    def run(seed, ops):
        target.check(_mutate(seed, ops))

    run()


@pytest.mark.parametrize("name", list(BY_NAME))
def test_inputs_from_scratch_give_a_result_or_the_documented_error(name, soak):
    target = BY_NAME[name]

    @_examples(soak, 20, 2_000)
    @given(text=st.one_of(st.text(max_size=400), st.binary(max_size=400).map(lambda b: b.decode("latin-1")),
                          st.lists(st.sampled_from(INJECT + ("\n", ",", " ", "=", ":", "|", "GPU", "#Entity")),
                                   max_size=40).map("".join)))
    def run(text):
        target.check(text)

    run()


@pytest.mark.parametrize("name", ["prometheus.parse", "dmon.parse", "nvidia_smi.parse", "amdsmi.parse"])
def test_binary_input_is_refused_with_the_file_and_byte(name, soak):
    """``read``'s bytes -> text step: NUL bytes and invalid UTF-8 are one-line errors naming the byte."""

    @_examples(soak, 20, 2_000)
    @given(data=st.binary(min_size=1, max_size=300))
    def run(data):
        try:
            decode_text(data, PATH)
        except InputError as exc:
            assert str(exc).startswith(PATH) and "\n" not in str(exc)

    run()


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 100_000, "{" * 50_000 + "\n{}\n"])
def test_deeply_nested_json_is_an_error_not_a_recursion_crash(text):
    for name in ("prometheus.parse", "prometheus.parse_jsonl", "amdsmi.parse", "sources.amd_snapshots.parse_metric_json",
                 "sources.amd_snapshots.parse_list_json", "spool.parse"):
        BY_NAME[name].check(text)


def test_a_gpu_range_cannot_exhaust_memory():
    """``SLURM_JOB_GPUS=0-99999999999`` is not a list of GPUs to build (the hook has a time budget)."""
    assert slurm.parse_index_list("0-99999999999")[0] == []
    assert slurm.parse_index_list("0-3,4-99999999999,7")[0] == [0, 1, 2, 3, 7]


# The crashes the fuzzing found, kept as plain cases (each crashed before its fix).
REGRESSIONS = [
    ("slurm.scontrol", SCONTROL.replace("Restarts=0", "Restarts=\u00b2")),
    ("slurm.scontrol", SCONTROL.replace("SecsPreSuspend=2", "SecsPreSuspend=\u00b2")),
    ("slurm.scontrol", SCONTROL.replace("ExitCode=0:15", "ExitCode=" + "1" * 5000 + ":1")),
    ("slurm.scontrol", SCONTROL.replace("RunTime=00:00:03", "RunTime=" + "1" * 5000 + ":00:00")),
    ("slurm.job_env", ENV_SEED.replace("RESTART_COUNT=1", "RESTART_COUNT=\u00b2")),
    ("slurm.job_env", ENV_SEED.replace("EXIT_CODE=-1", "EXIT_CODE=--1")),
    ("dcgm.parse_discovery", "| " + "1" * 5000 + " | Name: x |\n"),
    ("dcgm.parse_stats", "Successfully retrieved statistics for job: 7.\n| Summary |\n| PID | \u00b2 |\n"),
    ("nvml.parse_inventory_csv", "[N/A], 0, GPU-1, H100, 00000000:18:00.0\n"),
    ("sources.amd_snapshots.parse_metric_json", '["x"]'),
    ("sources.amd_snapshots.parse_list_json", '[{"bdf": "x"}]'),
    ("sources.amd_snapshots.parse_static_market_names", "7"),
    ("prometheus.parse_csv", SYNTH["csv"].replace("\n", '\n"', 1)),
    ("prometheus.parse", '{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, '
                         '"values": [[' + "1" * 5000 + ', "1"]]}]}}'),
    ("config.load_values", "hook_timeout_s = " + "1" * 5000 + "\n"),
    ("contracts.read_contract", 'id = "a"\nversion = ' + "1" * 5000 + "\n"),
    ("skus.site_table", "[skus.X]\ntdp_w = " + "1" * 5000 + "\n"),
    ("dmon.parse", _read("pathb", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt").replace("GPU 0 ", "GPU \u00b2 ")),
    ("nvidia_smi.parse", NV_CSV.replace(", 0, GPU-x", ", \u00b2, GPU-x")),
    ("amdsmi.parse", AMD_CSV.replace("\n1767225600,0,", "\n1767225600,\u00b2,")),
]


@pytest.mark.parametrize("name,text", REGRESSIONS)
def test_inputs_that_crashed_a_parser(name, text):
    BY_NAME[name].check(text)


def test_an_error_quoting_the_input_stays_one_line():
    with pytest.raises(InputError) as exc:
        prometheus.parse_csv('a,"b\nc",d\n1,2,3\n', PATH)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(f"{PATH}: line 1: wrong columns")
