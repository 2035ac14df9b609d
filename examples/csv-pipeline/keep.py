"""Stage 2: keep the sales whose revenue is at least --min.

Reads argv[1] (the cleaned CSV), writes argv[2].
"""
import argparse
import csv

p = argparse.ArgumentParser()
p.add_argument("src")
p.add_argument("dst")
p.add_argument("--min", type=float, required=True)
a = p.parse_args()

with open(a.src, newline="") as f, open(a.dst, "w", newline="") as out:
    r = csv.DictReader(f)
    w = csv.DictWriter(out, fieldnames=r.fieldnames)
    w.writeheader()
    total = kept = 0
    for row in r:
        total += 1
        if float(row["revenue"]) >= a.min:
            w.writerow(row)
            kept += 1
print(f"keep: kept {kept} of {total} rows with revenue >= {a.min:g}")
