"""Runs the capture's load phases on GPU 0 with PyTorch and writes each phase's wall-clock bounds and measured rate.

Phases: idle; a bf16 8192^3 matrix-multiply burn (TFLOP/s counted as 2*n^3 per product, timed with CUDA events);
idle; an fp32 (TF32 off) product; a host-starved loop (small products, the host sleeping between them); idle;
a device-to-device copy (GB/s counting bytes read and written); idle. Writes JSON to argv[1].
"""
import json
import sys
import time

import torch

out = sys.argv[1]
scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
dev = torch.device("cuda:0")
phases = []
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}


def idle(name, seconds):
    t0 = time.time()
    time.sleep(seconds * scale)
    phases.append({"phase": name, "start": t0, "end": time.time()})


def matmul(name, seconds, dtype, n=8192, tf32=False):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.time()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    products, gpu_ms, windows = 0, 0.0, []
    while time.time() - t0 < seconds * scale:
        ev0.record()
        k = 10
        for _ in range(k):
            a @ b
        ev1.record()
        ev1.synchronize()
        ms = ev0.elapsed_time(ev1)
        products += k
        gpu_ms += ms
        windows.append(round(2 * n ** 3 * k / (ms / 1e3) / 1e12, 1))
    phases.append({"phase": name, "start": t0, "end": time.time(), "dtype": str(dtype), "n": n, "tf32": tf32,
                   "products": products, "tflops": round(2 * n ** 3 * products / (gpu_ms / 1e3) / 1e12, 1),
                   "tflops_windows_min_max": [min(windows), max(windows)]})
    del a, b
    torch.cuda.empty_cache()


def starved(name, seconds):
    a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    t0 = time.time()
    n = 0
    while time.time() - t0 < seconds * scale:
        a @ a
        torch.cuda.synchronize()
        n += 1
        time.sleep(0.05)
    phases.append({"phase": name, "start": t0, "end": time.time(), "products": n,
                   "note": "1024^3 bf16 product, then the host sleeps 50 ms: GPU held, work starved"})


def copy(name, seconds, gib=4):
    n = gib * (1 << 30) // 4
    src = torch.empty(n, device=dev, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    copies, gpu_ms = 0, 0.0
    while time.time() - t0 < seconds * scale:
        ev0.record()
        for _ in range(10):
            dst.copy_(src)
        ev1.record()
        ev1.synchronize()
        copies += 10
        gpu_ms += ev0.elapsed_time(ev1)
    phases.append({"phase": name, "start": t0, "end": time.time(), "bytes_per_copy_rw": 2 * n * 4, "copies": copies,
                   "gb_per_s_rw": round(2 * n * 4 * copies / (gpu_ms / 1e3) / 1e9, 1)})
    del src, dst
    torch.cuda.empty_cache()


idle("idle_start", 30)
matmul("bf16_matmul_burn", 60, torch.bfloat16)
idle("idle_after_burn", 15)
matmul("fp32_matmul_no_tf32", 20, torch.float32)
idle("idle_before_starved", 5)
starved("host_starved", 20)
idle("idle_before_copy", 10)
copy("d2d_copy_memory_bound", 40)
idle("idle_end", 20)
with open(out, "w") as fh:
    json.dump({"info": info, "phases": phases}, fh, indent=1)
