"""ncu_sum.py — sums an Nsight Compute CSV (--csv --metrics gpu__time_duration.sum) by kernel
name: total microseconds, calls, mean; largest first. Used by scripts/device/profile.sh."""
import collections
import csv
import sys

hdr, data = None, []
for r in csv.reader(open(sys.argv[1])):
    if "Kernel Name" in r and "Metric Value" in r:
        hdr = r
    elif hdr and len(r) == len(hdr):
        data.append(dict(zip(hdr, r)))
agg, tot = collections.OrderedDict(), 0.0
for d in data:
    if d.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(d["Metric Value"].replace(",", ""))
    unit = d.get("Metric Unit", "ns")
    v = v / 1000 if unit in ("nsecond", "ns") else v if unit in ("usecond", "us") else v * 1000
    a = agg.setdefault(d["Kernel Name"][:60], [0, 0.0])
    a[0] += 1
    a[1] += v
    tot += v
for n, (c, v) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{v:10.1f} us {c:5d}x {v / c:8.2f} us  {n}")
print(f"{tot:10.1f} us total over {sum(a[0] for a in agg.values())} kernels")
