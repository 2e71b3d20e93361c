#!/bin/bash
# The H200 capture: NVML/GPM sampler, nvidia-smi CSV, XML and dmon loops, beside load.py's phases.
# Run by the device tool from the repository root: bash tools/device_capture/run.sh  (writes into $OUT).
set -u
D=tools/device_capture
W=/tmp/cap; mkdir -p $W
export TZ=UTC PYTHONUNBUFFERED=1
{ nvidia-smi; nvidia-smi -L; nvidia-smi --version; which dcgmi nv-hostengine; python3 -c "import pynvml;print(pynvml.__file__)"; } > $W/env.txt 2>&1
nvidia-smi --help-query-gpu > $W/help_query_gpu.txt 2>&1
nvidia-smi -q > $W/nvidia_smi_q_idle.txt 2>&1
nvidia-smi -q -d PERFORMANCE > $W/nvidia_smi_q_performance_idle.txt 2>&1
# query fields: those this driver knows, of the ones the importer maps plus identity
want="timestamp index uuid name pci.bus_id utilization.gpu utilization.memory power.draw power.draw.instant power.draw.average power.limit enforced.power.limit temperature.gpu temperature.memory clocks.sm clocks.mem clocks.max.sm memory.used memory.total pstate clocks_event_reasons.active clocks_event_reasons.sw_power_cap clocks_event_reasons.hw_slowdown clocks_event_reasons.sw_thermal_slowdown clocks_event_reasons.hw_thermal_slowdown clocks_event_reasons.hw_power_brake_slowdown ecc.errors.corrected.volatile.total ecc.errors.uncorrected.volatile.total ecc.errors.corrected.aggregate.total ecc.errors.uncorrected.aggregate.total total_energy_consumption"
q=""; for f in $want; do grep -q "\"$f\"" $W/help_query_gpu.txt && q="$q,$f"; done; q=${q#,}
echo "query: $q" >> $W/env.txt
python3 $D/sampler.py $OUT/nvml_gpm_1s.csv 1.0 & SP=$!
nvidia-smi --query-gpu=$q --format=csv -lms 1000 > $OUT/nvidia_smi_query_1s.csv 2>&1 & QP=$!
nvidia-smi -q -x -l 5 > $OUT/nvidia_smi_q_x_loop_5s.xml 2>&1 & XP=$!
nvidia-smi dmon -s pucvmet -o DT -d 1 > $OUT/nvidia_smi_dmon_1s.txt 2>&1 & DP=$!
if command -v dcgmi >/dev/null; then
  (nv-hostengine -n >/dev/null 2>&1 &) ; sleep 3
  dcgmi dmon -e 100,101,140,150,155,156,203,204,252,310,311,312,313,1001,1002,1003,1004,1005,1006,1007,1008,1009,1010 -d 1000 > $W/dcgmi_dmon.txt 2>&1 & CP=$!
fi
sleep 2
python3 $D/load.py $OUT/phases.json "${SCALE:-1}" > $W/load.log 2>&1
nvidia-smi -q -d PERFORMANCE > $W/nvidia_smi_q_performance_end.txt 2>&1
sleep 2
kill $QP $XP $DP ${CP:-} 2>/dev/null; kill -TERM $SP; wait $SP
cp $OUT/nvml_gpm_1s.csv.errors $W/ 2>/dev/null; rm -f $OUT/nvml_gpm_1s.csv.errors
tar -C /tmp -czf $OUT/extras.tar.gz cap
cat $W/env.txt $W/load.log $W/nvml_gpm_1s.csv.errors 2>/dev/null | tail -40; cat $OUT/phases.json | head -80
ls -la $OUT
